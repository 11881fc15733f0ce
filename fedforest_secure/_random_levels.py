"""Random splits on the coordinator's side (``method="random"``): the level-0 counting round of
the features' marginals, the drawn splits of every level, the nodes' values from the leaves'
totals at the last level, and the forest's soft routing.

No round evaluates a split: every node splits at a (feature, threshold) drawn from the
coordinator's seeded stream within the node's public box, thresholds following the pooled
marginal CDF that the one counting round at level 0 releases
(:mod:`~fedforest_secure._random_splits` has the draws and the values).
:class:`RandomLevels` holds these steps; :class:`~fedforest_secure.coordinator.Coordinator` is
the class that uses it.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _random_splits
from ._candidates import RandomSplits, fixed_width_grid
from ._layouts import CLASS_TOTALS_BLOCK, class_totals_block, counts_block
from ._planner import Frontier, Received, grow
from ._soft_routing import SoftRouting
from ._tree import NodeKind, TreeBuilder
from .errors import ProtocolError
from .protocol import Block, Task, TaskKind

if TYPE_CHECKING:
    from ._release import ReleasePolicy
    from .config import JobConfig

__all__ = ["RandomLevels"]


class RandomLevels:
    """The random-split steps of :class:`~fedforest_secure.coordinator.Coordinator` (a base
    class of it)."""

    if TYPE_CHECKING:  # what these methods use of the coordinator
        config: JobConfig
        policy: ReleasePolicy
        _rng: np.random.Generator
        _rng_missing: np.random.Generator
        _marginal_cdf: np.ndarray | None
        _class_totals: np.ndarray | None
        _count_votes: bool
        _normalised_votes: bool
        decisions: list[dict[str, Any]]

        def _task(self, kind: TaskKind, level: int, params: dict[str, Any],
                  arrays: dict[str, np.ndarray], layout: tuple[Block, ...],
                  disclose: tuple[str, ...] = ()) -> Task: ...

    def _marginals(self, n_roots: int) -> Generator[Task, Received, np.ndarray]:
        """Random splits, level 0: one counting round of every feature's rows in ``n_bins``
        fixed-width bins of its public range, over the first tree's root (every tree holds
        every row, or with disjoint rows over all roots); returns the marginal CDF
        (:func:`~fedforest_secure._random_splits.marginal_cdf`) with, under DP, the count
        noise's standard deviation as the per-bin floor."""
        cfg = self.config
        if cfg.feature_bounds is None:  # pragma: no cover - the policy checks
            raise ProtocolError("internal: random splits need public feature bounds")
        d, nb = cfg.n_features, cfg.n_bins
        nodes = (np.arange(n_roots, dtype=np.int64) if cfg.sampling == "disjoint"
                 else np.zeros(1, dtype=np.int64))
        feats = np.tile(np.arange(d, dtype=np.int64), (nodes.size, 1))
        yield self._task(TaskKind.SKETCH, 0, {"n_nodes": int(n_roots), "totals": False},
                         {"nodes": nodes, "features": feats}, ())
        lohi = np.array(cfg.feature_bounds, dtype=np.float64)
        thr = np.tile(fixed_width_grid(lohi, nb)[None], (nodes.size, 1, 1))
        scale = self.policy.class_totals_scale()
        layout = (counts_block(nodes.size, d, nb),) + (
            (class_totals_block(cfg.n_classes),) if scale else ())
        blocks, _ = yield self._task(TaskKind.HISTOGRAM, 0, {"stats": "count"},
                                     {"nodes": nodes, "features": feats, "thresholds": thr},
                                     layout)
        counts = blocks["counts"].reshape(nodes.size, d, nb).sum(axis=0)
        if scale:  # the classes' row totals: a times over in the vector, 1/a of its noise
            self._class_totals = blocks[CLASS_TOTALS_BLOCK].reshape(-1) / float(scale)
        return _random_splits.marginal_cdf(counts, self.policy.marginal_floor())

    def _grow_random(self, level: int, frontier: Frontier, trees: list[TreeBuilder],
                     feats: np.ndarray) -> tuple[Frontier, dict[str, np.ndarray]]:
        """Random splits: every node of the level splits at its drawn (feature, threshold);
        the children start from zero values (the leaves' totals give every value at the
        end). Returns the next frontier and its routing."""
        if frontier.box_lo is None or frontier.box_hi is None:  # pragma: no cover - policy
            raise ProtocolError("internal: random splits need public feature bounds")
        bounds = (np.array(self.config.feature_bounds, dtype=np.float64)
                  if self._marginal_cdf is not None else None)
        feature, threshold = RandomSplits.draw(self._rng, feats, frontier.box_lo,
                                               frontier.box_hi, self._marginal_cdf, bounds)
        n = frontier.size
        # where missing values go is data-independent too: a coin per node, from a stream of
        # its own (the splits' draws are the same with or without missing values)
        missing_left = (self._rng_missing.random(n) < 0.5) if self.config.has_missing else None
        growth = grow(trees, frontier, np.arange(n), np.ones(n, dtype=bool),
                      np.full(n, NodeKind.NUMERIC, dtype=np.int64), feature, threshold,
                      [[] for _ in range(n)], {}, np.zeros_like(frontier.parent_value),
                      missing_left=missing_left, route_missing=self.config.has_missing)
        self.decisions.append({"level": level, "splits": growth.splits})
        return growth.frontier, growth.routing

    def _random_leaf_values(self, frontier: Frontier, totals: np.ndarray,
                            trees: list[TreeBuilder]) -> None:
        """The last level under random splits: every node's value from the (noisy) leaf
        totals ``totals``, how the forest votes, and which child a missing value takes."""
        cfg = self.config
        # imported here: the DP modules pull in diffprivlib (~1.6 s per process)
        from .privacy import allocation

        vote_noise = self.policy.leaf_vote_noise()
        leaf_weight = 0.0
        if vote_noise is not None:  # rows per tree from the released totals
            n_rows = float(totals.sum()) / max(len(trees), 1)
            self._count_votes = allocation.leaf_votes_are_counts(
                vote_noise, n_rows, cfg.max_depth) or (
                self._class_totals is not None and allocation.CLASS_TOTALS_COUNT_VOTES)
            if not self._count_votes:
                leaf_weight = allocation.leaf_vote_weight(vote_noise, n_rows,
                                                          cfg.max_depth)
        # weighted leaves: the forest's average is normalised per row, as counts are
        self._normalised_votes = self._count_votes or leaf_weight > 0
        _random_splits.values_from_leaves(
            trees, frontier.tree, frontier.node, totals, cfg.task,
            self.policy.leaf_min_count(),
            cfg.target_bound if cfg.task == "regression" else None, cfg.criterion,
            shrink=self.policy.leaf_shrinkage(), count_votes=self._count_votes,
            balanced=allocation.LEAF_VOTE_BALANCED,
            class_prior_noise=self.policy.class_prior_noise(),
            class_totals=self._class_totals,
            class_totals_noise=self.policy.class_totals_noise(),
            leaf_weight=leaf_weight)
        if not cfg.has_missing:  # a missing value at prediction: the larger child
            for tb in trees:
                for nd, (lc, rc) in enumerate(zip(tb.left, tb.right, strict=True)):
                    if lc >= 0:
                        tb.missing_left[nd] = tb.n[lc] > tb.n[rc]

    def _soft_routing(self) -> SoftRouting | None:
        """The forest's soft routing at prediction: the policy's width with the released
        marginal CDF (random-split DP classification), or None (hard splits)."""
        width = self.policy.soft_routing_width()
        if width <= 0 or self._marginal_cdf is None or self.config.feature_bounds is None:
            return None
        return SoftRouting(width, np.array(self.config.feature_bounds, dtype=np.float64),
                           self._marginal_cdf)
