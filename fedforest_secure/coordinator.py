"""The server side of one job: level-wise planning over all trees (Algorithm 1 of the paper).

The coordinator never sees a row. Per depth level it issues, for all active nodes of all trees
at once, one SKETCH round (routing through the previous level's splits, node totals, and the
sketch the method needs), optionally the refinement rounds of the secure pooled-CDF sketch, and
one HISTOGRAM round (per-bin statistics at the candidate thresholds). Training T trees of depth
M therefore takes O(M) rounds, whatever T (unless a level is evaluated in groups of nodes to
bound memory, which the in-process driver asks for on large jobs; see :class:`Coordinator`).
Gains are exact functions of summed statistics (Theorem 4); candidate thresholds come from the
pooled sketch CDF (Theorem 1).

It is deterministic given the :class:`~fedforest_secure.config.JobConfig` and the aggregates it
receives, so a restarted server rebuilds it by replaying stored rounds.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _impurity, _random_splits, _sketch, _splits
from ._layouts import counts_block, gain_block, hist_block, totals_block
from ._tree import NodeKind, TreeBuilder
from .config import JobConfig
from .errors import BudgetError, InvalidMessage, ProfileError, ProtocolError
from .model import ForestModel
from .protocol import Block, Task, TaskKind, layout_size, split_blocks
from .protocol.uploads import allowed_disclosures

__all__ = ["Coordinator"]

_Received = tuple[dict[str, np.ndarray], dict[int, dict[str, np.ndarray]]]


@dataclass
class _LevelContext:
    """What the evaluation of a level's nodes needs to know about the level."""

    level: int
    feats: np.ndarray  # (n_nodes, m) sampled features
    totals: np.ndarray  # (n_nodes, S) node totals
    n: np.ndarray  # (n_nodes,) weighted counts
    is_cat: np.ndarray
    box_lo: np.ndarray | None
    box_hi: np.ndarray | None
    lohi: np.ndarray | None  # histogram method: the grid's range per feature


@dataclass
class _Evaluated:
    """Best split per evaluated node (rows in the order of the evaluated nodes)."""

    blocks: dict[str, np.ndarray]  # the histogram round's blocks (ungrouped levels only)
    feats: np.ndarray  # (E, m) features, -1 where not evaluated (Top-L)
    threshold: np.ndarray  # (E,) the chosen numeric threshold
    gain: np.ndarray
    slot: np.ndarray
    idx: np.ndarray
    left: np.ndarray  # (E, S) left child's statistics
    kind: np.ndarray
    sets: list[list[int]]

    @staticmethod
    def concat(parts: Sequence[_Evaluated], E: int, m: int, S: int) -> _Evaluated:
        if not parts:
            z = np.zeros(0, dtype=np.int64)
            return _Evaluated({}, np.zeros((E, m), dtype=np.int64), np.zeros(0),
                              np.zeros(0), z, z, np.zeros((0, S)), z, [])
        cat = np.concatenate
        return _Evaluated({}, cat([p.feats for p in parts]), cat([p.threshold for p in parts]),
                          cat([p.gain for p in parts]), cat([p.slot for p in parts]),
                          cat([p.idx for p in parts]), cat([p.left for p in parts]),
                          cat([p.kind for p in parts]), [s for p in parts for s in p.sets])


class Coordinator:
    """Server side of one job. Drive it with :meth:`next_task` / :meth:`submit`.

    Parameters
    ----------
    config : the job's configuration
    max_nodes_per_round, max_round_bytes : a level with more nodes than this, or whose
        estimated state (see :meth:`_node_groups`) exceeds this many bytes, is evaluated in
        groups of nodes (each within both limits): after the level's routing round (node
        totals), every group gets its own sketch round and histogram round, so neither the
        clients' sorted orders nor the coordinator's copy of their sketches scale with the
        whole level. The forest is identical; such a level takes more rounds. Both None (the
        default, and what a deployment uses): one sketch and one histogram round per level.
        Ignored under DP and with the secure pooled-CDF sketch.
    total_rows : the number of rows over all clients, if known (the in-process driver knows
        it): bounds the first level's state; without it a byte budget groups the first level.
    """

    def __init__(self, config: JobConfig, *, max_nodes_per_round: int | None = None,
                 max_round_bytes: int | None = None, total_rows: int | None = None) -> None:
        self.config = config
        if max_nodes_per_round is not None and max_nodes_per_round < 1:
            raise ValueError("max_nodes_per_round must be at least 1")
        if max_round_bytes is not None and max_round_bytes < 1:
            raise ValueError("max_round_bytes must be positive")
        self._max_nodes = max_nodes_per_round
        self._max_bytes = max_round_bytes
        self._total_rows = total_rows
        prof = dict(config.profile)
        self._sketch_kind = str(prof.get("sketch", "quantiles"))
        self._h_policy = str(prof.get("h_splits", "clear"))
        self._rows_per_point = int(prof.get("rows_per_sketch_point", 0) or 0)
        if config.split_on_client and self._h_policy == "off":
            raise ProfileError("split_on_client=True but the privacy profile has h_splits='off'")
        # h_splits = "noisy": per-client node summaries carry each client's own DP noise
        # (privacy/hsplits.py); they need a budget, so without [dp] the job fails closed
        self._noisy_h = bool(config.split_on_client and self._h_policy == "noisy")
        if self._noisy_h and config.dp is None:
            raise BudgetError("h_splits='noisy' adds DP noise to per-client node summaries and "
                              "needs a [dp] budget (dp.epsilon and dp.h_epsilon); refusing to "
                              "train without one")
        if config.method == "exact" and prof.get("secure_aggregation"):
            raise ProfileError("method='exact' discloses every node value; use the open profile")
        if self._sketch_kind == "secure_cdf" and config.method in ("quantiles", "avgimp"):
            if config.feature_bounds is None:
                raise ProfileError("the secure_cdf sketch needs public feature bounds "
                                   "(set them in the schema)")
        if config.method == "random" and config.feature_bounds is None:
            raise ProfileError("method='random' draws thresholds inside the public feature "
                               "bounds; set them in the schema")
        if config.method == "random" and config.split_on_client:
            raise ProfileError("method='random' does not split on the client")
        self._dp = config.dp
        if self._dp is not None:
            if config.feature_bounds is None or (config.task == "regression"
                                                 and not config.target_bound > 0):
                raise BudgetError("differential privacy needs public feature and target bounds; "
                                  "refusing to infer them from data")
            from .privacy.hsplits import job_budget

            # releases: one histogram round per level; node and leaf values come from the same
            # noisy histograms, so no other round releases anything, except (noisy H-splits)
            # one set of noisy per-client node summaries per splitting level
            self._budget = job_budget(self._dp, config.max_depth, noisy_h=self._noisy_h)
            self.accountant = self._budget.accountant()
        self._rng = np.random.default_rng(np.random.SeedSequence([config.random_state, 0xF0]))
        self._round = 0
        self._model: ForestModel | None = None
        self.rounds_by_kind: dict[str, int] = {}
        #: every DP release: round, budget share, running totals, noise scales
        self.dp_spends: list[dict[str, Any]] = []
        #: split decisions per level: tree, node, kind, feature, threshold, left set
        self.decisions: list[dict[str, Any]] = []
        self._events_seen = (0, 0)
        self._k_min = 0
        self._gen = self._run()
        self._pending: Task | None = next(self._gen)

    # ------------------------------------------------------------------ public driving API
    def next_task(self) -> Task | None:
        """The task of the current round, or None once the forest is trained."""
        return self._pending

    def submit(self, round_id: int, total: np.ndarray,
               disclosed: Mapping[int, Mapping[str, np.ndarray]] | None = None,
               participants: Sequence[int] | None = None) -> None:
        """Hand in the aggregate of the current round (and any per-client disclosures)."""
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
        for k, items in (disclosed or {}).items():
            extra = set(items) - allowed_disclosures(task)
            if extra:
                raise ProtocolError(f"client {k} disclosed {sorted(extra)} that were not asked")
            disc[int(k)] = {name: np.asarray(v) for name, v in items.items()}
        if (self._dp is not None and participants is not None and task.layout
                and len(participants) < self._k_min):
            raise ProtocolError(f"{len(participants)} clients contributed; the DP noise is "
                                f"calibrated for at least {self._k_min}: sum not released")
        blocks = split_blocks(total, task.layout)
        try:
            self._pending = self._gen.send((blocks, disc))
        except StopIteration as stop:
            self._model = stop.value
            self._pending = None

    def result(self) -> ForestModel:
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

    # ------------------------------------------------------------------ helpers
    def _task(self, kind: TaskKind, level: int, params: dict[str, Any],
              arrays: dict[str, np.ndarray], layout: tuple[Block, ...],
              disclose: tuple[str, ...] = ()) -> Task:
        self._round += 1
        self.rounds_by_kind[kind.value] = self.rounds_by_kind.get(kind.value, 0) + 1
        if self._dp is not None and layout_size(layout) > 0:
            params = dict(params, dp=self._noise_params(kind, level, layout))
        return Task(job_id=self.config.job_id, round_id=self._round, kind=kind, level=level,
                    params=params, arrays=arrays, layout=layout, disclose=disclose)

    def _noise_params(self, kind: TaskKind, level: int, layout: tuple[Block, ...]
                      ) -> dict[str, Any]:
        """Spend one round's budget share; the noise scales (which every client recomputes
        from its own profile, see :func:`~fedforest_secure.secure_sum.noise_sigmas`) are
        published in the task and the audit log for transparency only."""
        from .privacy.allocation import job_noise
        from .secure_sum import noise_sigmas, noise_units

        sigmas, k_min = noise_sigmas(self.config, layout, level)
        dims: dict[str, int] = {}
        for b in layout:
            per = b.size // max(len(b.kinds), 1)
            for k in b.kinds:
                dims[k.value] = dims.get(k.value, 0) + per
        cost = job_noise(self.config, noise_units(self.config)).cost(level, dims)
        spend = self.accountant.spend(f"round {self._round} ({kind.value}, level {level})",
                                      cost, mechanism="gaussian_discrete (distributed)")
        self._k_min = k_min
        self.dp_spends.append({"round": self._round, "kind": kind.value, "level": level,
                               "epsilon": spend.epsilon, "delta": spend.delta,
                               "rho": spend.rho, "xi": spend.xi,
                               "mechanism": "gaussian_discrete (distributed)",
                               "total_epsilon": spend.total_epsilon,
                               "total_delta": spend.total_delta, "sigma_client": sigmas})
        return {"sigma": sigmas, "epsilon": spend.epsilon, "delta": spend.delta,
                "rho": spend.rho, "xi": spend.xi, "total_epsilon": spend.total_epsilon}

    def _spend_node_stats(self, level: int, n_nodes: int) -> None:
        """Noisy H-splits: charge this round's per-client node summaries (each client adds
        local noise for its own release, see :mod:`~fedforest_secure.privacy.hsplits`)."""
        from .privacy.hsplits import node_stats_noise

        noise = node_stats_noise(self.config, n_nodes)
        spend = self.accountant.spend(
            f"round {self._round} (node_stats, level {level})", noise.cost,
            mechanism="gaussian_discrete (local, per client)")
        self.dp_spends.append({"round": self._round, "kind": "node_stats", "level": level,
                               "epsilon": spend.epsilon, "delta": spend.delta,
                               "rho": spend.rho, "xi": spend.xi,
                               "mechanism": "gaussian_discrete (local, per-client node summaries)",
                               "total_epsilon": spend.total_epsilon,
                               "total_delta": spend.total_delta,
                               "sigma_client": {"node_stats": noise.sigma_values.tolist()}})

    def _dp_values(self, stats: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        """Node values from noisy statistics: the parent's value where the noisy count is too
        small to trust (below ``min_samples_leaf``), regression means clipped to the public
        target bounds and class proportions kept non-negative (post-processing)."""
        cfg = self.config
        n = _impurity.counts_of(stats, cfg.task)
        values = _impurity.node_values(stats, cfg.task)
        weak = n < max(cfg.min_samples_leaf, 1)
        values[weak] = fallback[weak]
        if cfg.task == "regression":
            np.clip(values, -cfg.target_bound, cfg.target_bound, out=values)
        return values

    def _sample_features(self, n_nodes: int) -> np.ndarray:
        d, m = self.config.n_features, self.config.max_features
        if m == d:
            return np.tile(np.arange(d, dtype=np.int64), (n_nodes, 1))
        keys = self._rng.random((n_nodes, d))
        return np.argsort(keys, axis=1)[:, :m].astype(np.int64)

    def _leaf_min_count(self) -> float:
        """Random splits: the count below which a node takes its ancestor's value. Under DP
        a regression leaf's mean also needs a count above the noise on it (one standard
        deviation of the summed count noise)."""
        cfg = self.config
        floor = float(max(cfg.min_samples_leaf, 1))
        if self._dp is None or cfg.task != "regression":
            return floor
        from .privacy.allocation import job_noise
        from .secure_sum import noise_units

        plan = job_noise(cfg, noise_units(cfg))
        return max(floor, plan.sum_count_std(cfg.max_depth, cfg.n_clients))

    def _grow_random(self, trees: list[TreeBuilder], level: int, lvl_tree: np.ndarray,
                     lvl_node: np.ndarray, box_lo: np.ndarray, box_hi: np.ndarray,
                     feature: np.ndarray, threshold: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                dict[str, np.ndarray]]:
        """Split every node of the level at its random (feature, threshold): the next level's
        nodes, boxes and routing."""
        n_nodes = lvl_tree.size
        nt = np.repeat(lvl_tree, 2)
        nn = np.empty(2 * n_nodes, dtype=np.int64)
        for i in range(n_nodes):
            tb = trees[int(lvl_tree[i])]
            nd = int(lvl_node[i])
            tb.kind[nd], tb.feature[nd] = NodeKind.NUMERIC, int(feature[i])
            tb.threshold[nd] = float(threshold[i])
            lc, rc = tb.add(), tb.add()
            tb.left[nd], tb.right[nd] = lc, rc
            nn[2 * i], nn[2 * i + 1] = lc, rc
        rows = np.arange(n_nodes)
        lo = np.repeat(box_lo, 2, axis=0)
        hi = np.repeat(box_hi, 2, axis=0)
        hi[2 * rows, feature] = np.minimum(hi[2 * rows, feature], threshold)
        lo[2 * rows + 1, feature] = np.maximum(lo[2 * rows + 1, feature], threshold)
        self.decisions.append({"level": level, "splits": [
            {"tree": int(lvl_tree[i]), "node": int(lvl_node[i]), "kind": "numeric",
             "feature": int(feature[i]), "threshold": float(threshold[i]), "left_set": []}
            for i in range(n_nodes)]})
        routing: dict[str, np.ndarray] = {
                   "route_kind": np.full(n_nodes, NodeKind.NUMERIC, dtype=np.int32),
                   "route_feature": feature.astype(np.int32),
                   "route_threshold": threshold.astype(np.float64),
                   "route_left": (2 * rows).astype(np.int32),
                   "route_right": (2 * rows + 1).astype(np.int32),
                   "route_set_ptr": np.zeros(n_nodes + 1, dtype=np.int64),
                   "route_set_vals": np.zeros(0, dtype=np.int32)}
        return nt, nn, lo, hi, routing

    # ------------------------------------------------------------------ the level loop
    def _run(self) -> Generator[Task, _Received, ForestModel]:
        cfg = self.config
        T, S = cfg.n_estimators, cfg.n_stats
        n_out = 1 if cfg.task == "regression" else cfg.n_classes
        kinds = np.array(cfg.kinds)
        is_cat = kinds == "categorical"
        trees = [TreeBuilder(n_out) for _ in range(T)]
        lvl_tree = np.arange(T, dtype=np.int64)
        lvl_node = np.array([t.add() for t in trees], dtype=np.int64)
        parent_value = np.zeros((T, n_out))
        root_n = np.zeros(T)
        bounds = (np.array(cfg.feature_bounds, dtype=np.float64)
                  if cfg.feature_bounds is not None else None)
        box_lo = np.tile(bounds[:, 0], (T, 1)) if bounds is not None else None
        box_hi = np.tile(bounds[:, 1], (T, 1)) if bounds is not None else None
        routing: dict[str, np.ndarray] | None = None
        grid_lohi: np.ndarray | None = None
        use_h = cfg.split_on_client and self._h_policy in ("clear", "noisy")
        random_mode = cfg.method == "random"
        # bound on the level's total weight (sum of its nodes' weighted counts): a tree's
        # bootstrap draws as many rows as there are (at most the rows' multiplicities)
        level_weight = (float(T) * self._total_rows if self._total_rows is not None
                        else np.inf)
        for level in range(cfg.max_depth + 1):
            n_nodes = lvl_tree.size
            if n_nodes == 0:
                break
            last = level == cfg.max_depth
            arrays: dict[str, np.ndarray] = dict(routing) if routing is not None else {}
            params: dict[str, Any] = {"n_nodes": int(n_nodes)}
            disclose: list[str] = []
            # what the sketch of a node asks (rounds, parameters, disclosures)
            sk_params: dict[str, Any] = {}
            sk_disclose: list[str] = []
            feats = self._sample_features(n_nodes) if not last else None
            dp_mode = self._dp is not None
            # a level's nodes are evaluated in groups (a sketch and a histogram round each)
            # only when asked; the forest is the same either way
            grouped = feats is not None and self._group_level(n_nodes, level_weight,
                                                              feats.shape[1])
            if feats is not None:
                if not grouped:
                    arrays["features"] = feats
                if cfg.method in ("quantiles", "avgimp") and self._sketch_kind == "quantiles":
                    sk_disclose.append("sketch_points")
                    sk_params["n_points"] = cfg.n_bins
                if cfg.method == "avgimp" and cfg.top_l is not None:
                    sk_disclose.append("top_l")
                    sk_params["top_l"] = cfg.top_l
                    sk_params.setdefault("n_points", cfg.n_bins)
                if cfg.method == "exact":
                    sk_disclose.append("unique")
                if not grouped:
                    params.update(sk_params)
                    disclose += sk_disclose
                if cfg.method == "histogram" and grid_lohi is None and bounds is None:
                    disclose.append("minmax")
            if use_h and not last:
                disclose.append("node_stats")
            # under DP the sketch round releases nothing: node totals come from the (noisy)
            # histogram of the same level and leaf values from the parent's, which saves budget.
            # Random splits release the leaves' totals only (the structure is data-independent)
            release = (last if random_mode else not dp_mode)
            params["totals"] = release
            task = self._task(TaskKind.SKETCH, level, params, arrays,
                              (totals_block(cfg, n_nodes),) if release else (),
                              tuple(disclose))
            if self._noisy_h and "node_stats" in disclose:
                self._spend_node_stats(level, n_nodes)
            blocks, disc = yield task
            disc = {k: dict(v) for k, v in disc.items()}  # own copy: items are dropped below
            totals = blocks["totals"] if release else np.ones((n_nodes, S))
            n = _impurity.counts_of(totals, cfg.task)
            if level == 0 and release:
                root_n = np.maximum(n, 1e-300)
            values = _impurity.node_values(totals, cfg.task)
            empty = n <= 0
            values[empty] = parent_value[empty]
            for i in range(n_nodes if release else 0):
                tb = trees[lvl_tree[i]]
                tb.value[lvl_node[i]] = values[i]
                tb.n[lvl_node[i]] = float(n[i])
            if last:
                if random_mode:  # every node's value from the (noisy) leaf totals
                    _random_splits.values_from_leaves(
                        trees, lvl_tree, lvl_node, totals, cfg.task, self._leaf_min_count(),
                        cfg.target_bound if cfg.task == "regression" else None)
                elif dp_mode:  # leaves at max depth: values from the parent's noisy histogram
                    for i in range(n_nodes):
                        trees[lvl_tree[i]].value[lvl_node[i]] = parent_value[i]
                break
            if random_mode:  # data-independent splits: no round evaluates them
                if feats is None or box_lo is None or box_hi is None:  # pragma: no cover
                    raise ProtocolError("internal: random splits need features and boxes")
                feature, threshold = _random_splits.random_splits(self._rng, feats, box_lo,
                                                                  box_hi)
                lvl_tree, lvl_node, box_lo, box_hi, routing = self._grow_random(
                    trees, level, lvl_tree, lvl_node, box_lo, box_hi, feature, threshold)
                parent_value = np.zeros((lvl_tree.size, n_out))
                continue
            if "minmax" in disclose:
                mm = np.stack([disc[k]["minmax"] for k in sorted(disc)])
                grid_lohi = np.stack([mm[:, :, 0].min(axis=0), mm[:, :, 1].max(axis=0)], axis=1)
            if release:
                imp = _impurity.weighted_impurity(totals, cfg.task, cfg.criterion)
                scale = np.maximum(totals[:, 2] / np.maximum(n, 1e-300), 1e-300) \
                    if cfg.task == "regression" else np.ones(n_nodes)
                pure = imp <= 1e-12 * np.maximum(n, 1.0) * scale
                can = ((n >= cfg.min_samples_split) & (n >= 2 * cfg.min_samples_leaf)
                       & ~pure & ~empty)
            else:
                can = np.ones(n_nodes, dtype=bool)
            ev = np.flatnonzero(can) if release else np.arange(n_nodes)
            if feats is None:  # pragma: no cover - only the last level has no features
                raise ProtocolError("internal: no features sampled")
            m = feats.shape[1]
            ctx = _LevelContext(level=level, feats=feats, totals=totals, n=n, is_cat=is_cat,
                                box_lo=box_lo, box_hi=box_hi,
                                lohi=grid_lohi if bounds is None else bounds)
            if not grouped:
                ev_out = yield from self._evaluate(ctx, ev, ev, disc)
            else:
                parts = []
                for a, b in self._node_groups(ev, n, m):
                    nodes = ev[a:b]
                    task = self._task(TaskKind.SKETCH, level,
                                      {"n_nodes": int(n_nodes), **sk_params, "totals": False},
                                      {"nodes": nodes, "features": feats[nodes]}, (),
                                      tuple(sk_disclose))
                    _, gdisc = yield task
                    gdisc = {k: dict(v) for k, v in gdisc.items()}
                    parts.append((yield from self._evaluate(
                        ctx, nodes, np.arange(nodes.size), gdisc)))
                    del gdisc
                ev_out = _Evaluated.concat(parts, ev.size, m, S)
            blocks = ev_out.blocks
            ev_feats, thr_chosen = ev_out.feats, ev_out.threshold
            gain, slot, left_stats = ev_out.gain, ev_out.slot, ev_out.left
            split_kind, split_set = ev_out.kind, ev_out.sets
            if not release:  # DP: node totals from the noisy histogram, averaged over slots
                valid_slot = (ev_feats >= 0)[..., None]
                slot_tot = blocks["hist"].sum(axis=2)
                totals = (slot_tot * valid_slot).sum(axis=1) / np.maximum(valid_slot.sum(axis=1), 1)
                n = _impurity.counts_of(totals, cfg.task)
                if level == 0:
                    root_n = np.maximum(n, 1.0)
                values = self._dp_values(totals, parent_value)
                empty = n <= 0
                for i in range(n_nodes):
                    tb = trees[lvl_tree[i]]
                    tb.value[lvl_node[i]] = values[i]
                    tb.n[lvl_node[i]] = float(n[i])
                can = (n >= cfg.min_samples_split) & (n >= 2 * cfg.min_samples_leaf) & ~empty
            # ---- H splits from per-client node summaries (no extra round)
            h_left: dict[int, tuple[np.ndarray, np.ndarray]] = {}
            if use_h and ev.size:
                clients = np.array(sorted(k for k in disc if "node_stats" in disc[k]))
                per_client = np.stack([disc[k]["node_stats"] for k in clients]) \
                    if clients.size else np.zeros((0, n_nodes, S))
                if self._noisy_h:  # post-processing of the noisy summaries
                    per_client = _splits.clean_noisy_groups(
                        per_client, cfg.task,
                        cfg.target_bound if cfg.task == "regression" else None)
                for e, i in enumerate(ev):
                    g, left_cl, ls = _splits.best_grouping(
                        per_client[:, i, :], cfg.task, cfg.criterion, cfg.min_samples_leaf)
                    if g > gain[e]:
                        gain[e] = g
                        split_kind[e] = NodeKind.CLIENT
                        split_set[e] = [int(clients[c]) for c in left_cl]
                        h_left[e] = (ls, per_client[:, i, :].sum(axis=0) - ls)
            # ---- apply decisions, build the next level
            ok = (np.isfinite(gain) & can[ev]
                  & (gain / root_n[lvl_tree[ev]] + 1e-15 >= cfg.min_impurity_decrease))
            r_kind = np.full(n_nodes, NodeKind.LEAF, dtype=np.int32)
            r_feat = np.full(n_nodes, -1, dtype=np.int32)
            r_thr = np.zeros(n_nodes)
            r_left = np.full(n_nodes, -1, dtype=np.int32)
            r_right = np.full(n_nodes, -1, dtype=np.int32)
            set_lists: list[list[int]] = [[] for _ in range(n_nodes)]
            nt: list[int] = []
            nn: list[int] = []
            nxt_lo: list[np.ndarray] = []
            nxt_hi: list[np.ndarray] = []
            pv: list[np.ndarray] = []
            for e, i in enumerate(ev):
                if not ok[e]:
                    continue
                t, nd = int(lvl_tree[i]), int(lvl_node[i])
                tb = trees[t]
                kind = int(split_kind[e])
                feat = int(ev_feats[e, slot[e]]) if kind != NodeKind.CLIENT else -1
                tb.kind[nd] = kind
                tb.feature[nd] = feat
                r_kind[i], r_feat[i] = kind, feat
                if kind == NodeKind.NUMERIC:
                    tb.threshold[nd] = r_thr[i] = float(thr_chosen[e])
                else:
                    tb.sets[nd] = split_set[e]
                    set_lists[i] = split_set[e]
                lc, rc = tb.add(), tb.add()
                tb.left[nd], tb.right[nd] = lc, rc
                r_left[i], r_right[i] = len(nt), len(nt) + 1
                nt += [t, t]
                nn += [lc, rc]
                if dp_mode and kind != NodeKind.CLIENT:  # children's values: this noisy hist
                    right_stats = blocks["hist"][e, slot[e]].sum(axis=0) - left_stats[e]
                    child = self._dp_values(np.stack([left_stats[e], right_stats]),
                                            np.stack([values[i], values[i]]))
                    pv += [child[0], child[1]]
                elif dp_mode and e in h_left:  # noisy H-split: from the noisy client sums
                    child = self._dp_values(np.stack(h_left[e]), np.stack([values[i], values[i]]))
                    pv += [child[0], child[1]]
                else:
                    pv += [values[i], values[i]]
                if box_lo is not None and box_hi is not None:
                    lo_l, hi_l = box_lo[i].copy(), box_hi[i].copy()
                    lo_r, hi_r = box_lo[i].copy(), box_hi[i].copy()
                    if kind == NodeKind.NUMERIC:
                        hi_l[feat] = min(hi_l[feat], r_thr[i])
                        lo_r[feat] = max(lo_r[feat], r_thr[i])
                    nxt_lo += [lo_l, lo_r]
                    nxt_hi += [hi_l, hi_r]
            self.decisions.append({"level": level, "splits": [
                {"tree": int(lvl_tree[i]), "node": int(lvl_node[i]),
                 "kind": NodeKind(int(r_kind[i])).label,
                 "feature": int(r_feat[i]), "threshold": float(r_thr[i]),
                 "left_set": [int(v) for v in set_lists[i]]}
                for i in range(n_nodes) if r_kind[i] != NodeKind.LEAF]})
            ptr = np.zeros(n_nodes + 1, dtype=np.int64)
            ptr[1:] = np.cumsum([len(s) for s in set_lists])
            vals = np.array([v for s in set_lists for v in s], dtype=np.int32)
            routing = {"route_kind": r_kind, "route_feature": r_feat, "route_threshold": r_thr,
                       "route_left": r_left, "route_right": r_right,
                       "route_set_ptr": ptr, "route_set_vals": vals}
            lvl_tree = np.array(nt, dtype=np.int64)
            lvl_node = np.array(nn, dtype=np.int64)
            level_weight = float(np.maximum(n[ev][ok], 0.0).sum())
            parent_value = np.array(pv).reshape(-1, n_out)
            if box_lo is not None:
                box_lo = np.array(nxt_lo).reshape(-1, cfg.n_features)
                box_hi = np.array(nxt_hi).reshape(-1, cfg.n_features)
        return ForestModel(task=cfg.task, n_features=cfg.n_features, n_classes=cfg.n_classes,
                           n_clients=cfg.n_clients, trees=[t.build() for t in trees],
                           meta={"rounds": self._round,
                                 "rounds_by_kind": dict(self.rounds_by_kind)})

    # ------------------------------------------------------------------ evaluation
    def _node_bytes(self, m: int) -> float:
        """Estimated coordinator memory per evaluated node: every client's quantile sketch."""
        cfg = self.config
        if cfg.method in ("quantiles", "avgimp") and self._sketch_kind == "quantiles":
            return 8.0 * cfg.n_clients * m * (cfg.n_bins + 1)
        return 0.0

    def _group_level(self, n_nodes: int, weight: float, m: int) -> bool:
        """Whether this level's nodes are evaluated in groups: a limit is set and the level
        exceeds it, and neither DP (every histogram round spends budget) nor the secure
        pooled-CDF sketch (its refinement rounds are planned over the whole level) is on.
        ``weight`` bounds the sum of the level's weighted node counts."""
        if self._dp is not None or (self.config.method in ("quantiles", "avgimp")
                                    and self._sketch_kind == "secure_cdf"):
            return False
        if self._max_nodes is not None and n_nodes > self._max_nodes:
            return True
        if self._max_bytes is not None:
            return 8.0 * m * weight + self._node_bytes(m) * n_nodes > self._max_bytes
        return False

    def _node_groups(self, ev: np.ndarray, n: np.ndarray, m: int) -> list[tuple[int, int]]:
        """Consecutive ranges ``[a, b)`` of the evaluated nodes ``ev``, each one group.

        A group holds at most ``max_nodes_per_round`` nodes and, estimated from the node
        totals, at most ``max_round_bytes`` of the state its rounds create: every client's
        sorted level order (at most one 8-byte entry per unit of weight and feature slot, so
        ``8 m n_nu`` over all clients) and, with quantile sketches, the coordinator's copy of
        every client's sketch (``8 K m (B + 1)``). A group has at least one node.
        """
        E = ev.size
        if E == 0:
            return []
        cap = self._max_nodes if self._max_nodes is not None else E
        if self._max_bytes is None:
            return [(a, min(a + cap, E)) for a in range(0, E, cap)]
        per_node = 8.0 * m * np.maximum(n[ev], 0.0) + self._node_bytes(m)
        cum = np.concatenate([[0.0], np.cumsum(per_node)])
        out: list[tuple[int, int]] = []
        a = 0
        while a < E:
            b = int(np.searchsorted(cum, cum[a] + self._max_bytes, side="right")) - 1
            b = min(max(b, a + 1), a + cap, E)
            out.append((a, b))
            a = b
        return out

    def _evaluate(self, ctx: _LevelContext, nodes: np.ndarray, pos: np.ndarray,
                  disc: dict[int, dict[str, np.ndarray]]
                  ) -> Generator[Task, _Received, _Evaluated]:
        """Candidates, the histogram round and the best split of the level's nodes ``nodes``.

        ``disc`` holds the clients' sketch disclosures, the rows of ``nodes`` at ``pos``. The
        result of a node does not depend on which other nodes are evaluated with it.
        """
        cfg = self.config
        is_cat = ctx.is_cat
        ev_feats = ctx.feats[nodes].copy()
        m = ev_feats.shape[1]
        dp_mode = self._dp is not None
        # ---- candidates
        if dp_mode:
            if ctx.box_lo is None or ctx.box_hi is None:  # pragma: no cover - __init__ checks
                raise BudgetError("differential privacy needs public feature bounds")
            thr = self._histogram_candidates(
                np.stack([ctx.box_lo[nodes[:, None], ev_feats],
                          ctx.box_hi[nodes[:, None], ev_feats]], axis=-1), None, is_cat)
        elif cfg.method in ("quantiles", "avgimp"):
            if self._sketch_kind == "quantiles":
                thr = self._quantile_candidates(disc, pos, ev_feats, is_cat)
            else:
                if ctx.box_lo is None or ctx.box_hi is None:  # pragma: no cover - __init__
                    raise ProfileError("the secure_cdf sketch needs public feature bounds")
                lo = ctx.box_lo[nodes[:, None], ev_feats]
                hi = ctx.box_hi[nodes[:, None], ev_feats]
                thr = yield from self._secure_cdf(ctx.level, nodes, ev_feats, lo, hi,
                                                  ctx.n[nodes], is_cat)
        elif cfg.method == "exact":
            thr = self._exact_candidates(disc, pos, ev_feats, 0, m, is_cat)
        else:
            if ctx.lohi is None:  # pragma: no cover - minmax was requested above
                raise ProtocolError("internal: no histogram range")
            thr = self._histogram_candidates(ctx.lohi, ev_feats, is_cat)
        thr = self._add_categorical(thr, ev_feats, is_cat)
        for k in disc:  # the sketches are spent: free them before the evaluation round
            for name in ("sketch_points", "unique_vals", "unique_ptr"):
                disc[k].pop(name, None)
        if cfg.method == "avgimp" and cfg.top_l is not None and nodes.size:
            keep = np.zeros_like(ev_feats, dtype=bool)
            for k in disc:
                top = disc[k]["top_l"][pos]
                sent = disc[k]["sketch_counts"][pos] > 0 if "sketch_counts" in disc[k] \
                    else np.ones(nodes.size, dtype=bool)
                rows = np.repeat(np.arange(nodes.size), top.shape[1])
                keep[rows[np.repeat(sent, top.shape[1])],
                     top[sent].ravel()] = True
            ev_feats = np.where(keep, ev_feats, -1)
        # ---- evaluation round
        bt = thr.shape[2]
        mode = "gain" if cfg.method == "avgimp" and not dp_mode else "full"
        if mode == "full":
            layout = (hist_block(cfg, nodes.size, m, bt + 1),)
        else:
            layout = (gain_block(nodes.size, m, bt),)
        task = self._task(TaskKind.HISTOGRAM, ctx.level, {"stats": mode},
                          {"nodes": nodes, "features": ev_feats, "thresholds": thr}, layout)
        blocks, _ = yield task
        gain, slot, idx, left, kind, sets = self._choose(
            blocks, mode, thr, ev_feats, is_cat, ctx.totals[nodes], ctx.n[nodes])
        chosen = (thr[np.arange(nodes.size), slot, idx] if bt and nodes.size
                  else np.zeros(nodes.size))
        return _Evaluated(blocks, ev_feats, chosen, gain, slot, idx, left, kind, sets)

    # ------------------------------------------------------------------ candidates
    def _quantile_candidates(self, disc: dict[int, dict[str, np.ndarray]], ev: np.ndarray,
                             feats: np.ndarray, is_cat: np.ndarray) -> np.ndarray:
        B = self.config.n_bins
        E, m = feats.shape
        clients = sorted(disc)
        if E == 0 or not clients:
            return np.full((E, m, B - 1), np.inf)
        K = len(clients)
        cnt = np.stack([disc[k]["sketch_counts"][ev] for k in clients], axis=1)  # (E, K)
        P = disc[clients[0]]["sketch_points"].shape[2]
        thr = np.empty((E, m, B - 1))
        # the clients' sketches are gathered a run of nodes at a time: never a K-fold copy
        step = max(1, _sketch.CHUNK_ENTRIES // max(K * P * m, 1))
        for a in range(0, E, step):
            sel = ev[a:a + step]
            pts = np.stack([disc[k]["sketch_points"][sel] for k in clients], axis=2)
            rows = pts.reshape(sel.size * m, K, P)
            counts = np.repeat(cnt[a:a + step], m, axis=0)
            thr[a:a + step] = _sketch.pooled_candidates(rows, counts, B).reshape(sel.size, m,
                                                                                 B - 1)
        return thr

    def _exact_candidates(self, disc: dict[int, dict[str, np.ndarray]], ev: np.ndarray,
                          feats: np.ndarray, n_nodes: int, m: int,
                          is_cat: np.ndarray) -> np.ndarray:
        E = ev.size
        per_block: list[np.ndarray] = []
        for i in ev:
            for s in range(m):
                b = i * m + s
                parts = [disc[k]["unique_vals"][disc[k]["unique_ptr"][b]:
                                                disc[k]["unique_ptr"][b + 1]] for k in disc]
                u = np.unique(np.concatenate(parts)) if parts else np.zeros(0)
                mid = (u[:-1] + u[1:]) / 2.0
                mid = np.where(mid == u[1:], u[:-1], mid)  # scikit-learn's rounding guard
                per_block.append(mid)
        width = max([p.size for p in per_block], default=0)
        out = np.full((E * m, max(width, 1)), np.inf)
        for r, p in enumerate(per_block):
            out[r, : p.size] = p
        return out.reshape(E, m, max(width, 1))

    def _histogram_candidates(self, lohi: np.ndarray, feats: np.ndarray | None,
                              is_cat: np.ndarray) -> np.ndarray:
        """Fixed-width bins on [lo, hi]: the global [min, max] of each feature (Kalloori et al.),
        or, with ``feats=None``, per (node, slot) ranges given directly (the node's box)."""
        B = self.config.n_bins
        frac = np.arange(1, B) / B
        if feats is None:
            lo, hi = lohi[..., 0], lohi[..., 1]
        else:
            lo, hi = lohi[feats, 0], lohi[feats, 1]
        thr = lo[..., None] + (hi - lo)[..., None] * frac
        thr = np.where((hi > lo)[..., None], thr, np.inf)
        return thr

    def _add_categorical(self, thr: np.ndarray, feats: np.ndarray,
                         is_cat: np.ndarray) -> np.ndarray:
        """Categorical slots get cuts k + 0.5 so that the histogram bins are the levels."""
        if not is_cat.any() or feats.size == 0:
            return thr
        levels = self.config.levels
        width = max(thr.shape[2], max(levels) - 1)
        out = np.full(thr.shape[:2] + (width,), np.inf)
        out[:, :, : thr.shape[2]] = thr
        cat_slot = (feats >= 0) & is_cat[np.maximum(feats, 0)]
        for e, s in zip(*np.nonzero(cat_slot), strict=True):
            nl = levels[feats[e, s]]
            out[e, s, :] = np.inf
            out[e, s, : nl - 1] = np.arange(nl - 1) + 0.5
        return out

    def _secure_cdf(self, level: int, ev: np.ndarray, feats: np.ndarray, lo: np.ndarray,
                    hi: np.ndarray, n_ev: np.ndarray, is_cat: np.ndarray
                    ) -> Generator[Task, _Received, np.ndarray]:
        """Pooled-CDF sketch from securely summed counts, refined coarse to fine.

        Counts on a grid inside each node's box (public bounds intersected with the ancestors'
        splits) are aggregated like any other statistic. Cells holding more than ``1/(2B)`` of
        the node's pooled mass are subdivided in further rounds, so that the candidates, read
        off the piecewise-linear pooled CDF, have a pooled rank error near ``1/B``.
        """
        from ._secure_cdf import SecureCdfPlanner

        planner = SecureCdfPlanner(lo, hi, feats, is_cat, n_ev, self.config.n_bins,
                                   self._rows_per_point)
        while (grid := planner.next_grid()) is not None:
            task = self._task(TaskKind.HISTOGRAM, level, {"stats": "count", "purpose": "sketch"},
                              {"nodes": ev, "features": planner.active_features(),
                               "thresholds": grid},
                              (counts_block(ev.size, feats.shape[1], grid.shape[2] + 1),))
            blocks, _ = yield task
            planner.receive(blocks["counts"][..., 0])
        return planner.candidates()

    # ------------------------------------------------------------------ decisions
    def _choose(self, blocks: dict[str, np.ndarray], mode: str, thr: np.ndarray,
                feats: np.ndarray, is_cat: np.ndarray, totals: np.ndarray, n: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                           list[list[int]]]:
        cfg = self.config
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
                g, left, ls = _splits.best_grouping(hist[e, s, :nl], cfg.task, cfg.criterion,
                                                    cfg.min_samples_leaf)
                if g > gain[e]:
                    gain[e], slot[e], lstats[e] = g, s, ls
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
            best = np.argmax(flat, axis=1) if E else np.zeros(0, dtype=np.int64)
            gain = flat[np.arange(E), best] if E else np.zeros(0)
            slot, idx = np.divmod(best, max(bt, 1))
            lstats = np.zeros((E, cfg.n_stats))
            # AvgImp scores are n-weighted averages of local gains; comparable across nodes only
            # through the min_impurity_decrease test, which we apply on the same scale.
        return gain, slot, idx, lstats, split_kind, split_set
