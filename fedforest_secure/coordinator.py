"""The server side of one job: level-wise planning over all trees (Algorithm 1 of the paper).

The coordinator never sees a row. Per depth level it issues, for all active nodes of all trees
at once, one SKETCH round (routing through the previous level's splits, node totals, and the
sketch the method needs) and one HISTOGRAM round (per-bin statistics at the candidate
thresholds). The secure pooled-CDF sketch sums the bins' statistics in its own grid rounds
(:mod:`~fedforest_secure._secure_cdf`), and from the second level on its first grid rides on
the sketch round, placed from the node counts the parents' splits predict: one round per level,
plus a refinement round where a cell is heavy. Training T trees of depth M therefore takes O(M)
rounds, whatever T (unless a level is evaluated in groups of nodes to bound memory, which the
in-process driver asks for on large jobs; see :class:`Coordinator`).
Gains are exact functions of summed statistics (Theorem 4); candidate thresholds come from the
pooled sketch CDF (Theorem 1).

It is deterministic given the :class:`~fedforest_secure.config.JobConfig` and the aggregates it
receives, so a restarted server rebuilds it by replaying stored rounds.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _impurity, _leaves, _splits
from ._candidates import RandomSplits, make_method
from ._evaluation import EvaluatedNodes, client_splits, evaluate_nodes
from ._fused_levels import FusedLevels
from ._fused_levels import _tapped as _tapped  # importable from here too
from ._layouts import totals_block
from ._packing import PACKED_KINDS, packs, root_lane_bits
from ._planner import (
    Disclosures,
    Frontier,
    LevelContext,
    NodeGrouping,
    Received,
    grow,
    sample_features,
)
from ._random_levels import RandomLevels
from ._release import ReleasePolicy
from ._tree import NodeKind, TreeBuilder
from .config import JobConfig
from .errors import InvalidMessage, ProtocolError
from .model import ForestModel
from .protocol import Block, StatKind, Task, TaskKind, layout_size, split_blocks
from .protocol.uploads import (
    allowed_disclosures,
    check_disclosures,
    node_rows,
    spread_node_counts,
)
from .secure_sum import entry_scale_bits

if TYPE_CHECKING:
    from .privacy.accountant import PrivacyAccountant

__all__ = ["Coordinator"]


class Coordinator(FusedLevels, RandomLevels):
    """Server side of one job. Drive it with :meth:`next_task` / :meth:`submit`.

    The fused levels of the secure pooled-CDF sketch
    (:class:`~fedforest_secure._fused_levels.FusedLevels`) and the steps of random splits
    (:class:`~fedforest_secure._random_levels.RandomLevels`) are methods of its base classes.

    Parameters
    ----------
    config : the job's configuration
    max_nodes_per_round, max_round_bytes : a level with more nodes than this, or whose
        estimated state (see :meth:`~fedforest_secure._planner.NodeGrouping.groups`) exceeds
        this many bytes, is evaluated in groups of nodes (each within both limits): after the
        level's routing round (node totals), every group gets its own sketch round and
        histogram round, so neither the clients' sorted orders, the coordinator's copy of
        their sketches nor the histogram replies (whose size grows with the number of
        classes) scale with the whole level. The forest is identical; such a level takes
        more rounds. Both None (the default, and what a deployment uses): one sketch and one
        histogram round per level. Ignored under DP and with the secure pooled-CDF sketch.
    total_rows : the number of rows over all clients, if known (the in-process driver knows
        it): bounds the first level's state; without it a byte budget groups the first level.
    executor : threads for the coordinator's heavy steps (the pooled sketch candidates, in
        runs of nodes); None: this thread. The forest is the same either way.

    Raises
    ------
    ProfileError, BudgetError
        The job asks for more than its privacy profile releases
        (:class:`~fedforest_secure._release.ReleasePolicy`).
    """

    def __init__(self, config: JobConfig, *, max_nodes_per_round: int | None = None,
                 max_round_bytes: int | None = None, total_rows: int | None = None,
                 executor: Executor | None = None) -> None:
        self.config = config
        self._grouping = NodeGrouping(max_nodes_per_round, max_round_bytes)
        self._total_rows = total_rows
        #: what the rounds release and with what noise; keeps the DP budget
        self.policy = ReleasePolicy(config)
        self._method = make_method(config, self.policy)
        self._method.executor = executor
        self._rng = np.random.default_rng(np.random.SeedSequence([config.random_state, 0xF0]))
        self._rng_missing = np.random.default_rng(
            np.random.SeedSequence([config.random_state, 0xF1]))
        self._round = 0
        self._root_n = np.zeros(config.n_estimators)  # root counts (min_impurity_decrease)
        #: the roots' pooled sums of w y^2 (regression, exact totals): the packing's bound
        self._root_sumsq: np.ndarray | None = None
        self._model: ForestModel | None = None
        #: the forest votes with summed leaf counts (random-split DP classification, the rule
        #: of :func:`~fedforest_secure.privacy.allocation.leaf_votes_are_counts`)
        self._count_votes = False
        #: the forest's average vote is normalised per row (``vote = "counts"``): summed
        #: counts, or leaves weighted by their rows against the noise
        #: (:func:`~fedforest_secure.privacy.allocation.leaf_vote_weight`)
        self._normalised_votes = False
        self.rounds_by_kind: dict[str, int] = {}
        #: the first round's participants, and whether a later round had fewer (a site left)
        self._first_participants: frozenset[int] | None = None
        self._site_left = False
        #: per level with exact node totals: its nodes' trees, node ids and totals
        self._recorded: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        #: a job that lost a site: the forest before its split nodes took their children's
        #: totals (:func:`~fedforest_secure._leaves.reconcile_split_nodes`), as servers before
        #: that step stored it; None otherwise
        self.unreconciled: ForestModel | None = None
        #: split decisions per level: tree, node, kind, feature, threshold, left set
        self.decisions: list[dict[str, Any]] = []
        self._events_seen = (0, 0)
        # the histogram method's grid range: public bounds, else the clients' disclosed ranges
        self._grid_lohi: np.ndarray | None = (
            np.array(config.feature_bounds, dtype=np.float64)
            if config.feature_bounds is not None else None)
        #: random splits: the features' marginal CDF on the public bounds (set at level 0)
        self._marginal_cdf: np.ndarray | None = None
        #: random-split DP classification at small epsilon: the classes' noisy row totals
        #: released with the marginal counts (None when the plan releases none)
        self._class_totals: np.ndarray | None = None
        #: the pooled weighted rows of the level's nodes (exact node totals only)
        self._level_n: np.ndarray | None = None
        self._gen = self._run()
        self._pending: Task | None = next(self._gen)

    # ------------------------------------------------------------------ public driving API
    def next_task(self) -> Task | None:
        """The task of the current round, or None once the forest is trained."""
        return self._pending

    def submit(self, round_id: int, total: np.ndarray,
               disclosed: Mapping[int, Mapping[str, np.ndarray]] | None = None,
               participants: Sequence[int] | None = None) -> None:
        """Hand in the aggregate of the current round (and any per-client disclosures).

        A ``sketch_counts`` of one count per node (a round stored or logged by a server from
        before per-slot counts) is spread across the node's slots, the weighting that server
        used (:func:`~fedforest_secure.protocol.uploads.spread_node_counts`)."""
        task = self._pending
        if task is None:
            raise ProtocolError("the job is finished; no round is open")
        if round_id != task.round_id:
            raise ProtocolError(f"aggregate for round {round_id}, but round {task.round_id} "
                                "is open")
        total = np.asarray(total, dtype=np.float64)
        if total.shape != (layout_size(task.layout),):
            raise InvalidMessage("aggregate does not match the round's layout")
        if not np.isfinite(total).all():
            raise InvalidMessage("aggregate has non-finite entries")
        disc: dict[int, dict[str, np.ndarray]] = {}
        counts = self._node_counts(task, total) if disclosed else None
        for k, items in (disclosed or {}).items():
            extra = set(items) - allowed_disclosures(task)
            if extra:
                raise ProtocolError(f"client {k} disclosed {sorted(extra)} that were not asked")
            disc[int(k)] = spread_node_counts({name: np.asarray(v) for name, v in items.items()},
                                              task)
            try:
                check_disclosures(disc[int(k)], task, self.config, node_counts=counts)
            except InvalidMessage as exc:
                raise InvalidMessage(f"client {k}: {exc}") from None
        if participants is not None:
            self.policy.check_participants(task.layout, len(participants))
            if self._first_participants is None:
                self._first_participants = frozenset(participants)
            elif not self._first_participants <= set(participants):
                self._site_left = True
        blocks = split_blocks(total, task.layout)
        try:
            self._pending = self._gen.send((blocks, disc))
        except StopIteration as stop:
            self._model = stop.value
            self._pending = None

    def _node_counts(self, task: Task, total: np.ndarray) -> np.ndarray | None:
        """The pooled rows at each node a sketch ``task`` asks distinct values of (no site
        lists more): the round's own node totals, or for a node group the level's; None
        where no exact count is known (under DP)."""
        if "unique" not in task.disclose:
            return None
        counts = node_rows(total, task)
        if counts is None and "nodes" in task.arrays and self._level_n is not None:
            counts = self._level_n[task.arrays["nodes"]]
        return counts

    def result(self) -> ForestModel:
        """The trained forest."""
        if self._model is None:
            raise ProtocolError("training has not finished")
        return self._model

    def pop_events(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """DP spends and split decisions recorded since the last call (for the audit log)."""
        a, b = self._events_seen
        self._events_seen = (len(self.dp_spends), len(self.decisions))
        return self.dp_spends[a:], self.decisions[b:]

    @property
    def done(self) -> bool:
        return self._model is not None

    @property
    def dp_spends(self) -> list[dict[str, Any]]:
        """Every DP release: round, budget share, running totals, noise scales."""
        return self.policy.spends

    @property
    def accountant(self) -> PrivacyAccountant | None:
        """The job's privacy budget (None without DP)."""
        return self.policy.accountant

    # ------------------------------------------------------------------ rounds
    def _task(self, kind: TaskKind, level: int, params: dict[str, Any],
              arrays: dict[str, np.ndarray], layout: tuple[Block, ...],
              disclose: tuple[str, ...] = ()) -> Task:
        """Open the next round (under DP, spending its share of the budget)."""
        self._round += 1
        self.rounds_by_kind[kind.value] = self.rounds_by_kind.get(kind.value, 0) + 1
        if self.policy.dp and layout_size(layout) > 0:
            params = dict(params, dp=self.policy.noise_params(self._round, kind, level, layout))
        bits = self._pack_bits(layout)
        if bits is not None:
            params = dict(params, pack=bits)
        return Task(job_id=self.config.job_id, round_id=self._round, kind=kind, level=level,
                    params=params, arrays=arrays, layout=layout, disclose=disclose)

    def _pack_bits(self, layout: tuple[Block, ...]) -> int | None:
        """The count lane of a round whose grid cells are packed (:mod:`._packing`), from the
        trees' pooled root totals; None: one word per entry."""
        if self._root_sumsq is None or not packs(self.config) or not any(
                tuple(b.kinds) == PACKED_KINDS and b.size for b in layout):
            return None
        return root_lane_bits(self._root_n, self._root_sumsq,
                              entry_scale_bits(self.config, StatKind.SUM), self.config.n_clients)

    def _sketch_task(self, level: int, n_nodes: int, routing: dict[str, np.ndarray] | None,
                     feats: np.ndarray | None, grouped: bool) -> Task:
        """The level's sketch round: routing through the previous level's splits, node
        totals (as the release policy says), per-client node summaries (H-splits), and,
        unless the level is evaluated in groups, the sketch the candidate method needs.
        ``feats`` is None at the last level."""
        arrays: dict[str, np.ndarray] = dict(routing) if routing is not None else {}
        params: dict[str, Any] = {"n_nodes": int(n_nodes)}
        disclose: list[str] = []
        if feats is not None:
            if not grouped:
                request = self._method.sketch_request()
                if self._method.sorts_level():
                    arrays["features"] = feats
                params.update(request.params)
                disclose += request.disclose
            if self._method.needs_range() and self._grid_lohi is None:
                disclose.append("minmax")
        if self.policy.h_splits and feats is not None:
            disclose.append("node_stats")
        release = self.policy.totals_in_sketch(last=feats is None)
        params["totals"] = release
        task = self._task(TaskKind.SKETCH, level, params, arrays,
                          (totals_block(self.config, n_nodes),) if release else (),
                          tuple(disclose))
        if self.policy.noisy_h and "node_stats" in disclose:
            self.policy.spend_node_stats(self._round, level, n_nodes)
        return task

    def _evaluate_level(self, ctx: LevelContext, ev: np.ndarray, disc: Disclosures,
                        grouped: bool) -> Generator[Task, Received, EvaluatedNodes]:
        """The best split of the level's nodes ``ev``: at once, or a group of nodes at a
        time (a sketch round and a histogram round per group)."""
        cfg = self.config
        dp = self.policy.dp
        if not grouped:
            return (yield from evaluate_nodes(cfg, self._method, dp, ctx, ev, ev, disc,
                                              self._task))
        request = self._method.sketch_request()
        m = ctx.feats.shape[1]
        parts = []
        for a, b in self._grouping.groups(ev, ctx.n, m, self._method.node_bytes(m)):
            nodes = ev[a:b]
            task = self._task(TaskKind.SKETCH, ctx.level,
                              {"n_nodes": int(ctx.feats.shape[0]), **request.params,
                               "totals": False},
                              {"nodes": nodes, "features": ctx.feats[nodes]}, (),
                              tuple(request.disclose))
            _, gdisc = yield task
            gdisc = {k: dict(v) for k, v in gdisc.items()}
            parts.append((yield from evaluate_nodes(cfg, self._method, dp, ctx, nodes,
                                                    np.arange(nodes.size), gdisc, self._task)))
            del gdisc
        return EvaluatedNodes.concat(parts, ev.size, m, cfg.n_stats)

    def _grouped(self, n_nodes: int, weight: float, m: int) -> bool:
        """Whether this level's nodes are evaluated in groups: a limit is set and the level
        exceeds it, and neither DP (every histogram round spends budget) nor the secure
        pooled-CDF sketch (its refinement rounds are planned over the whole level) is on.
        ``weight`` bounds the sum of the level's weighted node counts."""
        if not self.policy.groups_allowed or self._method.plans_whole_level():
            return False
        return self._grouping.applies(n_nodes, weight, m, self._method.node_bytes(m))

    # ------------------------------------------------------------------ the level loop
    def _run(self) -> Generator[Task, Received, ForestModel]:
        cfg = self.config
        T = cfg.n_estimators
        n_out = 1 if cfg.task == "regression" else cfg.n_classes
        trees = [TreeBuilder(n_out) for _ in range(T)]
        bounds = (np.array(cfg.feature_bounds, dtype=np.float64)
                  if cfg.feature_bounds is not None else None)
        frontier = Frontier.roots(trees, n_out, bounds)
        routing: dict[str, np.ndarray] | None = None
        # bound on the level's total weight (sum of its nodes' weighted counts): a tree's
        # bootstrap draws as many rows as there are (at most the rows' multiplicities)
        weight = float(T) * self._total_rows if self._total_rows is not None else np.inf
        for level in itertools.count():
            if frontier.size == 0:
                break
            if level == cfg.max_depth and cfg.max_depth > 0:  # 0: no depth limit
                yield from self._leaf_level(level, frontier, routing, trees)
                break
            frontier, routing, weight = yield from self._split_level(
                level, frontier, routing, trees, weight)
        if (self._site_left and not self.policy.random_splits
                and int(cfg.profile.get("abstain_below", 0) or 0) <= 0):
            # exact totals (none are recorded under DP; random splits set their inner nodes
            # from the leaves already): abstention leaves a site's rows out of a node's
            # children by design, a drop only once the site has gone. The model as it was
            # before this step stays known: an older server logged that one
            self.unreconciled = self._forest(trees)
            recorded: list[dict[int, np.ndarray]] = [{} for _ in trees]
            for tree, node, totals in self._recorded:
                for i in range(tree.size):
                    recorded[tree[i]][int(node[i])] = totals[i]
            for tb, totals_of in zip(trees, recorded, strict=True):
                _leaves.reconcile_split_nodes(tb, totals_of, cfg.task, cfg.criterion)
        self._recorded = []
        return self._forest(trees)

    def _forest(self, trees: list[TreeBuilder]) -> ForestModel:
        """The forest of ``trees`` as the job's model."""
        cfg = self.config
        return ForestModel(task=cfg.task, n_features=cfg.n_features, n_classes=cfg.n_classes,
                           n_clients=cfg.n_clients, trees=[t.build() for t in trees],
                           vote="counts" if self._normalised_votes else "proportions",
                           routing=self._soft_routing(),
                           y_offset=cfg.target_offset if cfg.task == "regression" else 0.0,
                           meta={"rounds": self._round,
                                 "rounds_by_kind": dict(self.rounds_by_kind)})

    def _leaf_level(self, level: int, frontier: Frontier,
                    routing: dict[str, np.ndarray] | None, trees: list[TreeBuilder]
                    ) -> Generator[Task, Received, None]:
        """The last level: routing and node totals only; every node is a leaf. Under DP the
        leaves keep the values their parents' noisy histogram gave them; with random splits
        every node's value comes from the (noisy) leaf totals."""
        blocks, _ = yield self._sketch_task(level, frontier.size, routing, None, False)
        if self.policy.totals_in_sketch(last=True):
            self._record_totals(frontier, blocks["totals"], trees, level)
        if self.policy.random_splits:
            self._random_leaf_values(frontier, blocks["totals"], trees)
        elif not self.policy.totals_in_sketch(last=True):
            for i in range(frontier.size):
                trees[frontier.tree[i]].value[frontier.node[i]] = frontier.parent_value[i]

    def _record_totals(self, frontier: Frontier, totals: np.ndarray,
                       trees: list[TreeBuilder], level: int) -> tuple[np.ndarray, np.ndarray]:
        """Node values and counts from exact node totals, stored in the trees."""
        n = _impurity.counts_of(totals, self.config.task)
        if level == 0:
            self._root_n = np.maximum(n, 1e-300)
            if self.config.task == "regression":
                self._root_sumsq = np.asarray(totals, dtype=np.float64)[:, 2].copy()
        values = _leaves.node_values(totals, self.config.task, frontier.parent_value)
        frontier.record(trees, values, n, self._impurity(totals))
        # kept per level, not per node: a site that leaves midway needs them at the end
        self._recorded.append((frontier.tree.copy(), frontier.node.copy(),
                               np.array(totals, dtype=np.float64)))
        return values, n

    def _split_level(self, level: int, frontier: Frontier,
                     routing: dict[str, np.ndarray] | None, trees: list[TreeBuilder],
                     weight: float
                     ) -> Generator[Task, Received, tuple[Frontier, dict[str, np.ndarray],
                                                          float]]:
        """One level that may split: sketch round, candidates, histogram round(s), best
        splits (H-splits included), and the children. Returns the next frontier, its routing
        and the bound on its total weight."""
        cfg = self.config
        n_nodes = frontier.size
        feats = sample_features(self._rng, n_nodes, cfg.n_features, cfg.max_features)
        if self._fused(level, frontier):
            return (yield from self._fused_level(level, frontier, routing, trees, feats))
        # a level's nodes are evaluated in groups (a sketch and a histogram round each)
        # only when asked; the forest is the same either way
        grouped = self._grouped(n_nodes, weight, feats.shape[1])
        task = self._sketch_task(level, n_nodes, routing, feats, grouped)
        blocks, disc = yield task
        if isinstance(self._method, RandomSplits):  # drawn: no round evaluates them
            if level == 0:
                self._marginal_cdf = yield from self._marginals(n_nodes)
            nxt, nxt_routing = self._grow_random(level, frontier, trees, feats)
            return nxt, nxt_routing, weight
        disc = {k: dict(v) for k, v in disc.items()}  # own copy: items are dropped below
        if "minmax" in task.disclose:
            mm = np.stack([disc[k]["minmax"] for k in sorted(disc)])
            self._grid_lohi = np.stack([mm[:, :, 0].min(axis=0), mm[:, :, 1].max(axis=0)],
                                       axis=1)
        self._level_n = None  # the level's pooled node counts, where exact
        if self.policy.totals_in_sketch(last=False):
            totals = blocks["totals"]
            values, n = self._record_totals(frontier, totals, trees, level)
            self._level_n = n
            can = _leaves.splittable(cfg, totals)
            ev = np.flatnonzero(can)
        else:  # DP: every node is evaluated; its totals come from the noisy histogram
            totals = np.ones((n_nodes, cfg.n_stats))
            n = _impurity.counts_of(totals, cfg.task)
            ev = np.arange(n_nodes)
        ctx = LevelContext(level=level, feats=feats, totals=totals, n=n,
                           is_cat=np.array(cfg.kinds) == "categorical",
                           box_lo=frontier.box_lo, box_hi=frontier.box_hi, lohi=self._grid_lohi)
        found = yield from self._evaluate_level(ctx, ev, disc, grouped)
        if not self.policy.totals_in_sketch(last=False):
            totals = _leaves.noisy_level_totals(found.blocks["hist"], found.feats)
            n = _impurity.counts_of(totals, cfg.task)
            if level == 0:
                self._root_n = np.maximum(n, 1.0)
            values = self.policy.node_values(totals, frontier.parent_value)
            frontier.record(trees, values, n, self._impurity(totals))
            can = _leaves.splittable_noisy(cfg, n)
        h_left = self._client_splits(ev, n_nodes, disc, found)
        ok = (np.isfinite(found.gain) & can[ev]
              & (found.gain / self._root_n[frontier.tree[ev]] + 1e-15
                 >= cfg.min_impurity_decrease))
        child_stats = self._noisy_child_stats(ev, ok, found, h_left)
        child = {e: self.policy.node_values(st, np.stack([values[ev[e]], values[ev[e]]]))
                 for e, st in child_stats.items()}
        growth = grow(trees, frontier, ev, ok, found.kind, found.feature, found.threshold,
                      found.sets, child, values, gains=found.gain,
                      child_counts=self._child_counts(ok, found),
                      missing_left=found.missing_left, route_missing=cfg.has_missing)
        for e, st in child_stats.items():  # under DP the leaves keep these (no later release)
            tb = trees[frontier.tree[ev[e]]]
            nd = int(frontier.node[ev[e]])
            for c, side in ((tb.left[nd], 0), (tb.right[nd], 1)):
                tb.n[c] = float(_impurity.counts_of(st[side], cfg.task))
                tb.impurity[c] = float(self._impurity(st[side]))
        self.decisions.append({"level": level, "splits": growth.splits})
        return growth.frontier, growth.routing, float(np.maximum(n[ev][ok], 0.0).sum())

    # ------------------------------------------------------------------ node statistics
    def _client_splits(self, ev: np.ndarray, n_nodes: int, disc: Disclosures,
                       found: EvaluatedNodes) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """H-splits from the per-client node summaries of the sketch round (no extra round):
        updates ``found``; returns the left and right statistics of each new H-split."""
        if not (self.policy.h_splits and ev.size):
            return {}
        clients = np.array(sorted(k for k in disc if "node_stats" in disc[k]))
        per_client = np.stack([disc[k]["node_stats"] for k in clients]) \
            if clients.size else np.zeros((0, n_nodes, self.config.n_stats))
        per_client = self.policy.client_summaries(per_client)
        return client_splits(self.config, per_client, clients, ev, found)

    def _impurity(self, stats: np.ndarray) -> np.ndarray:
        """Node impurities from (possibly noisy) statistics (post-processing)."""
        cfg = self.config
        if self.policy.dp:
            stats = _splits.clean_noisy_groups(
                stats, cfg.task, cfg.target_bound if cfg.task == "regression" else None)
        return _impurity.impurity(stats, cfg.task, cfg.criterion)

    def _noisy_child_stats(self, ev: np.ndarray, ok: np.ndarray, found: EvaluatedNodes,
                           h_left: dict[int, tuple[np.ndarray, np.ndarray]]
                           ) -> dict[int, np.ndarray]:
        """Under DP, the children's statistics (2, S) of each split (rows ``e``), from the
        same noisy histogram (or, for an H-split, the noisy client summaries); without DP,
        none (the children's own totals give their values at the next level)."""
        if not self.policy.dp:
            return {}
        out: dict[int, np.ndarray] = {}
        for e in range(ev.size):
            if not ok[e]:
                continue
            if int(found.kind[e]) != NodeKind.CLIENT:
                left = found.left[e]
                right = found.blocks["hist"][e, found.slot[e]].sum(axis=0) - left
                out[e] = np.stack([left, right])
            elif e in h_left:
                out[e] = np.stack(h_left[e])
        return out
