"""Gain evaluation: the histogram round of a level's nodes and the best split of each.

Gains are exact functions of summed statistics (Theorem 4 of the paper): per-bin histograms
give every numeric threshold's left and right statistics by cumulative sums, and categorical
levels are grouped by :func:`~fedforest_secure._splits.best_grouping`. AvgImp instead sums the
clients' local gains. Splits on the client indicator H are scored from per-client node
summaries (:func:`client_splits`).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass

import numpy as np

from . import _splits
from ._candidates import CandidateMethod, CandidateQuery, box_grid
from ._layouts import categorical_cuts, gain_block, hist_block
from ._planner import AskRound, Disclosures, LevelContext, Received
from ._tree import NodeKind
from .config import JobConfig
from .protocol import Task, TaskKind

__all__ = ["BestSplits", "EvaluatedNodes", "choose_splits", "client_splits", "evaluate_nodes"]


@dataclass(frozen=True)
class BestSplits:
    """The best split per evaluated node (one row per node).

    ``gain`` is -inf where no split is valid. Numeric splits are ``(slot, index)`` into the
    node's candidates; categorical and client splits list the levels or clients that go left.
    """

    gain: np.ndarray  # (E,)
    slot: np.ndarray  # (E,) feature slot
    index: np.ndarray  # (E,) threshold index in the slot's candidates
    left: np.ndarray  # (E, S) left child's statistics ("full" statistics only)
    kind: np.ndarray  # (E,) NodeKind codes
    sets: list[list[int]]


@dataclass
class EvaluatedNodes:
    """Best split per evaluated node (rows in the order of the evaluated nodes)."""

    blocks: dict[str, np.ndarray]  # the histogram round's blocks (ungrouped levels only)
    feats: np.ndarray  # (E, m) features, -1 where not evaluated (Top-L)
    threshold: np.ndarray  # (E,) the chosen numeric threshold
    gain: np.ndarray
    slot: np.ndarray
    left: np.ndarray  # (E, S) left child's statistics
    kind: np.ndarray
    sets: list[list[int]]

    @property
    def feature(self) -> np.ndarray:
        """(E,) the chosen feature, -1 for a client split."""
        chosen = self.feats[np.arange(self.kind.size), self.slot] if self.kind.size \
            else np.zeros(0, dtype=np.int64)
        return np.where(self.kind == NodeKind.CLIENT, -1, chosen)

    @staticmethod
    def concat(parts: Sequence[EvaluatedNodes], E: int, m: int, S: int) -> EvaluatedNodes:
        """The evaluations of a level's node groups as one (``E`` nodes, ``m`` slots)."""
        if not parts:
            z = np.zeros(0, dtype=np.int64)
            return EvaluatedNodes({}, np.zeros((E, m), dtype=np.int64), np.zeros(0),
                                  np.zeros(0), z, np.zeros((0, S)), z, [])
        cat = np.concatenate
        return EvaluatedNodes({}, cat([p.feats for p in parts]),
                              cat([p.threshold for p in parts]), cat([p.gain for p in parts]),
                              cat([p.slot for p in parts]), cat([p.left for p in parts]),
                              cat([p.kind for p in parts]), [s for p in parts for s in p.sets])


def evaluate_nodes(config: JobConfig, method: CandidateMethod, dp: bool, ctx: LevelContext,
                   nodes: np.ndarray, pos: np.ndarray, disc: Disclosures, ask: AskRound
                   ) -> Generator[Task, Received, EvaluatedNodes]:
    """Candidates, the histogram round and the best split of the level's nodes ``nodes``.

    ``disc`` holds the clients' sketch disclosures, the rows of ``nodes`` at ``pos``. The
    result of a node does not depend on which other nodes are evaluated with it. Under DP
    (``dp``) the candidates are fixed-width bins of the nodes' boxes.
    """
    is_cat = ctx.is_cat
    ev_feats = ctx.feats[nodes].copy()
    m = ev_feats.shape[1]
    q = CandidateQuery(ctx, nodes, pos, ev_feats, disc)
    mode = "gain" if method.stats == "gain" and not dp else "full"
    if not dp and method.fuses_histogram():
        # the candidate rounds summed the bins' statistics too: no histogram round
        thr, hist = yield from method.grid_evaluation(q, ask)
        blocks = {"hist": hist}
        bt = thr.shape[2]
    else:
        if dp:
            thr = box_grid(ctx, nodes, ev_feats, config.n_bins)
        else:
            thr = yield from method.candidates(q, ask)
        thr = categorical_cuts(thr, ev_feats, is_cat, config.levels)
        ev_feats = method.shortlist(q)
        for k in disc:  # the sketches are spent: free them before the evaluation round
            for name in ("sketch_points", "unique_vals", "unique_ptr"):
                disc[k].pop(name, None)
        bt = thr.shape[2]
        if mode == "full":
            layout = (hist_block(config, nodes.size, m, bt + 1),)
        else:
            layout = (gain_block(nodes.size, m, bt),)
        task = ask(TaskKind.HISTOGRAM, ctx.level, {"stats": mode},
                   {"nodes": nodes, "features": ev_feats, "thresholds": thr}, layout)
        blocks, _ = yield task
    best = choose_splits(config, blocks, mode, thr, ev_feats, is_cat, ctx.n[nodes])
    chosen = (thr[np.arange(nodes.size), best.slot, best.index] if bt and nodes.size
              else np.zeros(nodes.size))
    return EvaluatedNodes(blocks, ev_feats, chosen, best.gain, best.slot, best.left, best.kind,
                          best.sets)


def choose_splits(config: JobConfig, blocks: dict[str, np.ndarray], mode: str, thr: np.ndarray,
                  feats: np.ndarray, is_cat: np.ndarray, n: np.ndarray) -> BestSplits:
    """The best split per node from the histogram round's ``blocks``.

    ``mode`` "full": per-bin statistics, exact gains of numeric thresholds and categorical
    groupings. ``mode`` "gain": the clients' summed local gains of numeric thresholds
    (AvgImp), valid where both children keep ``min_samples_leaf`` of the node's count ``n``.
    """
    cfg = config
    E, m, bt = thr.shape
    cat_slot = (feats >= 0) & is_cat[np.maximum(feats, 0)]
    num_slot = (feats >= 0) & ~cat_slot
    split_kind = np.full(E, NodeKind.NUMERIC, dtype=np.int64)
    split_set: list[list[int]] = [[] for _ in range(E)]
    if mode == "full":
        hist = blocks["hist"]
        gain, slot, idx, lstats = _splits.best_numeric(
            hist, thr, num_slot, cfg.task, cfg.criterion, cfg.min_samples_leaf)
        for e, s in zip(*np.nonzero(cat_slot), strict=True):
            nl = cfg.levels[feats[e, s]]
            g_cat, left, ls = _splits.best_grouping(hist[e, s, :nl], cfg.task, cfg.criterion,
                                                    cfg.min_samples_leaf)
            if g_cat > gain[e]:
                gain[e], slot[e], lstats[e] = g_cat, s, ls
                split_kind[e] = NodeKind.CATEGORICAL
                split_set[e] = left
    elif E == 0:
        z = np.zeros(0, dtype=np.int64)
        gain, slot, idx, lstats = np.zeros(0), z, z, np.zeros((0, cfg.n_stats))
    else:
        g = blocks["gain"][..., 0]
        nl = blocks["gain"][..., 1]
        nr = n[:, None, None] - nl
        ok = ((nl >= cfg.min_samples_leaf) & (nr >= cfg.min_samples_leaf)
              & np.isfinite(thr) & num_slot[:, :, None])
        g = np.where(ok, g, -np.inf)
        flat = g.reshape(E, -1)
        best = np.argmax(flat, axis=1)
        gain = flat[np.arange(E), best]
        slot, idx = np.divmod(best, max(bt, 1))
        lstats = np.zeros((E, cfg.n_stats))
        # AvgImp scores are n-weighted averages of local gains; comparable across nodes only
        # through the min_impurity_decrease test, which we apply on the same scale.
    return BestSplits(gain, slot, idx, lstats, split_kind, split_set)


def client_splits(config: JobConfig, per_client: np.ndarray, clients: np.ndarray,
                  ev: np.ndarray, found: EvaluatedNodes
                  ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Replace each evaluated node's split by a split on the client indicator H where that
    gains more, scored on the per-client node summaries ``per_client`` (K', n_nodes, S) of
    ``clients``.

    Updates ``found`` in place; returns, per evaluated row ``e`` that now splits on H, the
    summed statistics of its left and right clients.
    """
    cfg = config
    h_left: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for e, i in enumerate(ev):
        g, left_cl, ls = _splits.best_grouping(
            per_client[:, i, :], cfg.task, cfg.criterion, cfg.min_samples_leaf)
        if g > found.gain[e]:
            found.gain[e] = g
            found.kind[e] = NodeKind.CLIENT
            found.sets[e] = [int(clients[c]) for c in left_cl]
            h_left[e] = (ls, per_client[:, i, :].sum(axis=0) - ls)
    return h_left
