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

from . import _impurity, _splits
from ._candidates import CandidateMethod, CandidateQuery, box_grid
from ._layouts import categorical_cuts, gain_block, hist_block, moments_block
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
    missing_left: np.ndarray  # (E,) bool: where the split sends rows missing its feature


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
    missing_left: np.ndarray  # (E,) bool

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
                                  np.zeros(0), z, np.zeros((0, S)), z, [],
                                  np.zeros(0, dtype=bool))
        cat = np.concatenate
        return EvaluatedNodes({}, cat([p.feats for p in parts]),
                              cat([p.threshold for p in parts]), cat([p.gain for p in parts]),
                              cat([p.slot for p in parts]), cat([p.left for p in parts]),
                              cat([p.kind for p in parts]), [s for p in parts for s in p.sets],
                              cat([p.missing_left for p in parts]))


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
        miss = config.has_missing  # one more bin: the rows missing the slot's feature
        ask_mode = mode
        if mode == "full" and config.task == "regression" and not dp:
            # (n, sum y) per bin: a split's gain needs no sum of y^2 (moments_block)
            layout = (moments_block(config, nodes.size, m, bt + 1 + miss),)
            ask_mode = "moments"
        elif mode == "full":
            layout = (hist_block(config, nodes.size, m, bt + 1 + miss),)
        else:
            layout = (gain_block(nodes.size, m, 2 * bt + 1 if miss else bt),)
        task = ask(TaskKind.HISTOGRAM, ctx.level, {"stats": ask_mode},
                   {"nodes": nodes, "features": ev_feats, "thresholds": thr}, layout)
        blocks, _ = yield task
        if miss and mode == "full":
            # a feature that cannot be missing has an empty missing bin (only noise under DP)
            may = np.array(config.may_miss)[np.maximum(ev_feats, 0)] & (ev_feats >= 0)
            blocks = dict(blocks)
            blocks["hist"] = blocks["hist"].copy()
            blocks["hist"][~may, -1] = 0.0
    best = choose_splits(config, blocks, mode, thr, ev_feats, is_cat, ctx.n[nodes])
    padded = np.concatenate([thr, np.full(thr.shape[:2] + (1,), np.inf)], axis=2)
    chosen = (padded[np.arange(nodes.size), best.slot, best.index] if bt and nodes.size
              else np.zeros(nodes.size))
    return EvaluatedNodes(blocks, ev_feats, chosen, best.gain, best.slot, best.left, best.kind,
                          best.sets, best.missing_left)


def choose_splits(config: JobConfig, blocks: dict[str, np.ndarray], mode: str, thr: np.ndarray,
                  feats: np.ndarray, is_cat: np.ndarray, n: np.ndarray) -> BestSplits:
    """The best split per node from the histogram round's ``blocks``.

    ``mode`` "full": per-bin statistics, exact gains of numeric thresholds and categorical
    groupings. ``mode`` "gain": the clients' summed local gains of numeric thresholds
    (AvgImp), valid where both children keep ``min_samples_leaf`` of the node's count ``n``.
    With missing values (``config.has_missing``) every numeric candidate is tried with the
    missing rows sent left and right, and a categorical feature's missing rows are one more
    group (:func:`~fedforest_secure._splits.candidate_lefts`).
    """
    cfg = config
    E, m, bt = thr.shape
    miss = cfg.has_missing
    cat_slot = (feats >= 0) & is_cat[np.maximum(feats, 0)]
    num_slot = (feats >= 0) & ~cat_slot
    split_kind = np.full(E, NodeKind.NUMERIC, dtype=np.int64)
    split_set: list[list[int]] = [[] for _ in range(E)]
    if mode == "full":
        hist = blocks["hist"]
        gain, slot, idx, lstats, miss_left = _splits.best_numeric(
            hist, thr, num_slot, cfg.task, cfg.criterion, cfg.min_samples_leaf, missing=miss)
        for e, s in zip(*np.nonzero(cat_slot), strict=True):
            nl = cfg.levels[feats[e, s]]
            groups = np.concatenate([hist[e, s, :nl], hist[e, s, -1:]]) if miss \
                else hist[e, s, :nl]
            g_cat, left, ls = _splits.best_grouping(groups, cfg.task, cfg.criterion,
                                                    cfg.min_samples_leaf)
            if g_cat > gain[e]:
                gain[e], slot[e], lstats[e] = g_cat, s, ls
                split_kind[e] = NodeKind.CATEGORICAL
                split_set[e] = [v for v in left if v < nl]
                c_left = float(_impurity.counts_of(ls, cfg.task))
                c_all = float(_impurity.counts_of(groups.sum(axis=0), cfg.task))
                has_missing = miss and float(_impurity.counts_of(groups[-1], cfg.task)) > 0
                miss_left[e] = nl in left if has_missing else c_left > c_all - c_left
    elif E == 0:
        z = np.zeros(0, dtype=np.int64)
        gain, slot, idx, lstats = np.zeros(0), z, z, np.zeros((0, cfg.n_stats))
        miss_left = np.zeros(0, dtype=bool)
    else:
        g = blocks["gain"][..., 0]
        nl = blocks["gain"][..., 1]
        nr = n[:, None, None] - nl
        fin = np.isfinite(thr)
        valid = np.concatenate([fin, fin, fin.any(axis=2, keepdims=True)], axis=2) if miss \
            else fin
        ok = ((nl >= cfg.min_samples_leaf) & (nr >= cfg.min_samples_leaf) & (nl > 0)
              & (nr > 0) & valid & num_slot[:, :, None])
        g = np.where(ok, g, -np.inf)
        C = g.shape[2]
        flat = g.reshape(E, -1)
        best = np.argmax(flat, axis=1)
        gain = flat[np.arange(E), best]
        slot, cand = np.divmod(best, max(C, 1))
        idx, miss_left, inf = _splits.decode_candidate(cand, bt, miss)
        idx = np.where(inf, bt, idx)
        if miss:  # no missing rows at the node: the right-going candidate has the same
            # left count as the left-going one; the larger child gets them
            sent = nl[np.arange(E), slot, cand]
            twin = np.where(miss_left, cand - bt, cand + bt)
            same = (~inf) & (nl[np.arange(E), slot, np.clip(twin, 0, C - 1)] == sent)
            miss_left = np.where(same, sent > n - sent, miss_left)
        else:
            sent = nl[np.arange(E), slot, cand]
            miss_left = sent > n - sent
        lstats = np.zeros((E, cfg.n_stats))
        # AvgImp scores are n-weighted averages of local gains; comparable across nodes only
        # through the min_impurity_decrease test, which we apply on the same scale.
    return BestSplits(gain, slot, idx, lstats, split_kind, split_set, miss_left)


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
            found.missing_left[e] = False
            h_left[e] = (ls, per_client[:, i, :].sum(axis=0) - ls)
    return h_left
