"""Fused levels: a depth level of the forest in one round, for the secure pooled-CDF sketch.

The secure pooled-CDF sketch (:mod:`~fedforest_secure._secure_cdf`) sums the bins' statistics in
grid rounds of its own. From the second level on, the parents' splits predict every node's
weighted row count (:attr:`~fedforest_secure._planner.Frontier.count`; exactly, without DP,
H-splits or abstention: :meth:`FusedLevels._fused`), so the level's first grid can be placed
before the node totals are in: it rides on the level's sketch round (routing, node totals), and
the level takes one round, plus a refinement round where a cell is heavy.
:class:`FusedLevels` holds the coordinator's side of this;
:class:`~fedforest_secure.coordinator.Coordinator` is the class that uses it.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _impurity, _leaves
from ._evaluation import EvaluatedNodes, evaluate_nodes
from ._layouts import totals_block
from ._planner import Frontier, LevelContext, Received, grow
from ._tree import TreeBuilder
from .protocol import Block, Task, TaskKind

if TYPE_CHECKING:
    from ._candidates import CandidateMethod
    from ._release import ReleasePolicy
    from .config import JobConfig

__all__ = ["FusedLevels"]


class FusedLevels:
    """The fused levels of :class:`~fedforest_secure.coordinator.Coordinator` (a base class of
    it): whether a level is fused, the children's predicted counts, and the fused level's
    rounds."""

    if TYPE_CHECKING:  # what these methods use of the coordinator
        config: JobConfig
        policy: ReleasePolicy
        _method: CandidateMethod
        _root_n: np.ndarray
        _grid_lohi: np.ndarray | None
        decisions: list[dict[str, Any]]

        def _task(self, kind: TaskKind, level: int, params: dict[str, Any],
                  arrays: dict[str, np.ndarray], layout: tuple[Block, ...],
                  disclose: tuple[str, ...] = ()) -> Task: ...

        def _sketch_task(self, level: int, n_nodes: int,
                         routing: dict[str, np.ndarray] | None, feats: np.ndarray | None,
                         grouped: bool) -> Task: ...

        def _record_totals(self, frontier: Frontier, totals: np.ndarray,
                           trees: list[TreeBuilder], level: int
                           ) -> tuple[np.ndarray, np.ndarray]: ...

    def _fused(self, level: int, frontier: Frontier) -> bool:
        """Whether the level's sketch round also asks the level's first grid (one round per
        level): the candidate method sums the bins' statistics in its grid rounds (the secure
        pooled-CDF sketch), the parents' splits predict the nodes' counts exactly (no
        abstention, which drops rows after routing; no DP; no H-splits)."""
        return (level > 0 and frontier.count is not None and self._method.fuses_histogram()
                and self.policy.totals_in_sketch(last=False) and not self.policy.h_splits
                and int(self.config.profile.get("abstain_below", 0) or 0) <= 0)

    def _child_counts(self, ok: np.ndarray, found: EvaluatedNodes
                      ) -> dict[int, np.ndarray] | None:
        """Weighted rows of the left and right child of every split ``e`` (``ok[e]``), from the
        histogram that chose it; None unless the next level may be fused."""
        if not self._method.fuses_histogram() or "hist" not in found.blocks \
                or self.policy.h_splits:
            return None
        hist = found.blocks["hist"]
        out: dict[int, np.ndarray] = {}
        for e in np.flatnonzero(ok):
            node = _impurity.counts_of(hist[e, found.slot[e]], self.config.task).sum()
            left = float(_impurity.counts_of(found.left[e], self.config.task))
            out[int(e)] = np.array([left, node - left])
        return out

    def _fused_level(self, level: int, frontier: Frontier,
                     routing: dict[str, np.ndarray] | None, trees: list[TreeBuilder],
                     feats: np.ndarray
                     ) -> Generator[Task, Received, tuple[Frontier, dict[str, np.ndarray],
                                                          float]]:
        """A level in one round: routing, node totals and the first grid of the nodes whose
        predicted count (:attr:`Frontier.count`) allows a split; refinement rounds if a cell
        is heavy. The node totals then decide which nodes may split, as in
        :meth:`Coordinator._split_level
        <fedforest_secure.coordinator.Coordinator._split_level>`."""
        cfg = self.config
        n_nodes = frontier.size
        count = frontier.count if frontier.count is not None else np.zeros(n_nodes)
        ev = np.flatnonzero(_leaves.splittable_noisy(cfg, np.nan_to_num(count)))
        ctx = LevelContext(level=level, feats=feats, totals=np.zeros((n_nodes, cfg.n_stats)),
                           n=count, is_cat=np.array(cfg.kinds) == "categorical",
                           box_lo=frontier.box_lo, box_hi=frontier.box_hi, lohi=self._grid_lohi)
        first: list[Received] = []
        fused: list[Task] = []

        def ask(kind: TaskKind, level: int, params: dict[str, Any],
                arrays: dict[str, np.ndarray], layout: tuple[Block, ...],
                disclose: tuple[str, ...] = ()) -> Task:
            if fused:  # refinement rounds
                return self._task(kind, level, params, arrays, layout, disclose)
            # the first grid rides on the level's sketch round
            grid = {f"grid_{k}": v for k, v in arrays.items()}
            fused.append(self._task(TaskKind.SKETCH, level,
                                    {"n_nodes": int(n_nodes), "totals": True,
                                     "stats": params["stats"]},
                                    {**(routing or {}), **grid},
                                    (totals_block(cfg, n_nodes), *layout)))
            return fused[0]

        found = yield from _tapped(evaluate_nodes(cfg, self._method, False, ctx, ev, ev, {}, ask),
                                   first)
        if first:
            totals = first[0][0]["totals"]
        else:  # nothing to evaluate: the level's routing and totals in a round of their own
            blocks, _ = yield self._sketch_task(level, n_nodes, routing, None, False)
            totals = blocks["totals"]
        values, n = self._record_totals(frontier, totals, trees, level)
        can = _leaves.splittable(cfg, totals)
        ok = (np.isfinite(found.gain) & can[ev]
              & (found.gain / self._root_n[frontier.tree[ev]] + 1e-15
                 >= cfg.min_impurity_decrease))
        growth = grow(trees, frontier, ev, ok, found.kind, found.feature, found.threshold,
                      found.sets, {}, values, gains=found.gain,
                      child_counts=self._child_counts(ok, found))
        self.decisions.append({"level": level, "splits": growth.splits})
        return growth.frontier, growth.routing, float(np.maximum(n[ev][ok], 0.0).sum())


def _tapped(gen: Generator[Task, Received, EvaluatedNodes], first: list[Received],
            keep: tuple[str, ...] = ("totals",)) -> Generator[Task, Received, EvaluatedNodes]:
    """Drive the round generator ``gen``, keeping in ``first`` copies of the blocks ``keep``
    of its first round's answer (not the views that would hold that round's whole sum
    through the level's later rounds)."""
    try:
        task = next(gen)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    while True:
        answer = yield task
        if not first:
            first.append(({k: v.copy() for k, v in answer[0].items() if k in keep},
                          answer[1]))
        try:
            task = gen.send(answer)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
