"""The client side of one job: everything that touches the site's rows.

A :class:`Worker` holds one client's table and answers the coordinator's tasks (see
:mod:`fedforest_secure.protocol`). All work is vectorised over every active (tree, row) pair of
the level at once; there is no Python loop over samples.

State kept between rounds:

* the bootstrap multiplicities of every tree (client-stratified bootstrap: the client resamples
  ``n_k`` of its own rows per tree, drawn from its own seed), and
* the *active pairs* of the current level: for every (tree, row) with a non-zero multiplicity
  that sits in a node still growing, the index of that node in the level's node list.

Feature values are compared through exact integer codes (the rank of a value among the client's
distinct values of that feature), so ``x <= t`` is decided exactly for any threshold ``t``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._bootstrap import canonical_order, row_keys, tree_pairs
from ._grid_stats import bin_statistics
from ._layouts import CLASS_TOTALS_BLOCK
from ._level_stats import CodeBook, LevelStatistics, local_gains, local_left_counts
from ._order import LevelOrder
from ._routing import route
from .config import JobConfig
from .errors import ProtocolError, RefusedRequest, SchemaError
from .privacy.pinning import clip_targets
from .protocol import TASK_ARRAYS, TASK_PARAMS, Reply, Task, TaskKind, layout_size

__all__ = ["Worker"]

#: with ``keep_level_order=None``, a worker keeps its level order between rounds as is while it
#: takes at most KEEP_FULL_BYTES, compact while that takes at most KEEP_ORDER_BYTES, and
#: re-sorts otherwise (in-process federations hold K of them)
KEEP_FULL_BYTES = 24 << 20
KEEP_ORDER_BYTES = 32 << 20
#: a histogram round of an unsorted level sorts its entries when it asks fewer than 1 /
#: SORT_RATIO thresholds per (pair, slot) entry (measured: the sort costs about as much per
#: entry as the search, and each threshold about as much again)
SORT_RATIO = 1.25
#: the most quantile points a sketch round may ask per (node, slot) (the compiled loops' limit)
MAX_SKETCH_POINTS = 1 << 24


class Worker:
    """Client side of one training job.

    Parameters
    ----------
    config : the job's configuration (identical on every side)
    X : array of shape (n_k, d), the site's features (categorical features as level codes)
    y : array of shape (n_k,), targets (class codes 0..C-1 for classification)
    client_index : this client's index in 0..K-1 (its value of the client indicator H)
    seed : seed of this client's own randomness (bootstrap)
    keep_last_reply : keep the last reply, so a retried round gets the same answer (a client
        behind a network needs it; an in-process federation never retries)
    sample_weight : array of shape (n_k,) or None, non-negative integer frequency weights: a
        row of weight ``w`` counts as ``w`` copies of it (a row of weight 0 is left out). Under
        differential privacy only 0 and 1 (a heavier row would exceed the sensitivities).
    keep_level_order : keep the level's sorted order between its rounds (one sort per level):
        True keeps it as is (8 bytes per entry), "compact" in 5 bytes per entry (keys rebuilt
        a run at a time), False frees it after every round and sorts again when the next round
        of the level needs it (more time, least memory). None (auto, for many workers in one
        process): as is up to :data:`KEEP_FULL_BYTES`, compact up to :data:`KEEP_ORDER_BYTES`,
        else freed.
    """

    def __init__(self, config: JobConfig, X: Any, y: Any, *, client_index: int,
                 seed: int | np.random.SeedSequence | None = None,
                 keep_last_reply: bool = True,
                 keep_level_order: bool | str | None = True,
                 sample_weight: Any = None) -> None:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y)
        if X.ndim != 2 or X.shape[1] != config.n_features:
            raise SchemaError(f"X must have shape (n, {config.n_features}), got {X.shape}")
        if y.shape != (X.shape[0],):
            raise SchemaError(f"y must have shape ({X.shape[0]},), got {y.shape}")
        weights = _frequency_weights(sample_weight, X.shape[0], config.dp is not None)
        if weights is not None and X.shape[0] and not (weights > 0).any():
            raise SchemaError(f"all {X.shape[0]} rows of this client have sample_weight 0: a "
                              "client needs at least one row to train on; give some of them "
                              "a positive weight, or leave this site out of the job")
        if weights is not None:
            X, y, weights = X[weights > 0], y[weights > 0], weights[weights > 0]
            if (weights == 1).all():
                weights = None
        if X.shape[0] < 1:
            raise SchemaError("a client needs at least one row (of positive weight)")
        # a missing value (NaN) only where the job allows it; infinities never
        bad_cells = ~np.isfinite(X) & ~(np.isnan(X) & np.array(config.may_miss)[None, :])
        if bad_cells.any():
            bad = np.argwhere(bad_cells)[0]
            what = "missing" if np.isnan(X[bad[0], bad[1]]) else "non-finite"
            raise SchemaError(f"{what} value in row {bad[0] + 1}, column {bad[1]}"
                              + (" (the job allows no missing values there)"
                                 if what == "missing" else ""))
        if not 0 <= client_index < config.n_clients:
            raise ValueError(f"client_index must be in [0, {config.n_clients})")
        self.config = config
        self.client_index = int(client_index)
        self._profile = dict(config.profile)
        n, d = X.shape
        self.n_rows = n
        # row statistics (one row of S per sample)
        if config.task == "regression":
            yf = y.astype(np.float64)
            if not np.isfinite(yf).all():
                raise SchemaError("non-finite target value")
            if config.target_offset:
                yf = yf - config.target_offset  # centred: the sums carry the spread
            yf = clip_targets(config, yf)  # within the bound the DP noise is calibrated for
            self._stats = np.stack([np.ones(n), yf, yf * yf], axis=1)
            self._y = yf
        else:
            yi = y.astype(np.int64)
            if (yi != y).any() or yi.min() < 0 or yi.max() >= config.n_classes:
                raise SchemaError(f"class codes must be integers in [0, {config.n_classes})")
            self._y = yi
            self._stats = np.zeros((n, config.n_classes))
            self._stats[np.arange(n), yi] = 1.0
        self._stats_cm = np.ascontiguousarray(self._stats.T)  # one contiguous row per statistic
        del self._stats
        for j, (kind, nl) in enumerate(zip(config.kinds, config.levels, strict=True)):
            if kind == "categorical":
                col = X[:, j][~np.isnan(X[:, j])]
                if col.size and ((col != np.round(col)).any() or col.min() < 0
                                 or col.max() >= nl):
                    raise SchemaError(f"categorical column {j} must hold level codes 0..{nl - 1}")
        # the table itself is not kept: codes and distinct values answer every question
        # exact integer codes: rank among the client's distinct values of each feature; a
        # missing value's code is one past the last (it sorts after every present value)
        uniq = [np.unique(X[:, j][~np.isnan(X[:, j])]) for j in range(d)]
        self._uniq_off = np.concatenate([[0], np.cumsum([u.size for u in uniq])])
        self._uniq_all = np.concatenate(uniq)
        del uniq  # one copy: each feature's distinct values are a view into _uniq_all
        self._uniq = [self._uniq_all[self._uniq_off[j]:self._uniq_off[j + 1]] for j in range(d)]
        # codes of a block live in [block << cbits, (block + 1) << cbits): shifts, not divisions
        # at least 16 bits: then a code is exactly the low 16 bits of its field (cheap to pull
        # out of a packed key, see _order.LevelOrder.compact)
        self._cbits = max(int(max(u.size for u in self._uniq) + 1).bit_length(), 16)
        self._rbits = int(n).bit_length() + 8  # row index and bootstrap weight (8 bits)
        codes = np.empty((d, n), dtype=np.int32)
        for j in range(d):
            codes[j] = np.searchsorted(self._uniq[j], X[:, j])
            codes[j][np.isnan(X[:, j])] = self._uniq[j].size
        self._codes = codes.ravel()  # feature-major: code of (j, row) at j * n + row
        # client-stratified bootstrap: n_k draws with replacement from the client's own rows;
        # level 0: a pair's node index is its tree index
        # (under DP each row's draws from its own key: module docstring of _bootstrap)
        per_row = config.dp is not None and config.sampling in ("bootstrap", "disjoint")
        keys = row_keys(X, self._y) if per_row else None
        order = canonical_order(X, self._y) if config.sampling == "bootstrap" and not per_row \
            else None
        self._p_row, self._p_node, self._p_w = tree_pairs(
            config, n, np.random.default_rng(seed), order=order, weights=weights, keys=keys)
        del order, keys
        T = config.n_estimators
        self._level = 0
        self._n_nodes = T
        self._sorted: LevelOrder | None = None
        self._level_feats: np.ndarray | None = None
        self._group: np.ndarray | None = None  # nodes of the current order (None: the level)
        self._sketched_level: int | None = None  # level whose sketch round was answered
        self._node_ptr: np.ndarray | None = None  # start of each node's pairs (node order)
        self._last_round: int | None = None
        self._last_reply: Reply | None = None
        self._last_digest = b""
        self._keep_last_reply = keep_last_reply
        self._keep_order = keep_level_order
        self._questions: set[bytes] = set()
        self._dp_releases = 0
        #: number of nodes this client abstained from, per level (for audits and tests)
        self.abstained: dict[int, int] = {}

    # ------------------------------------------------------------------ routing
    def _route(self, task: Task) -> None:
        """Move every pair to its child in the task's level (:func:`~._routing.route`);
        pairs whose node became a leaf leave."""
        new = route(task.arrays, n_nodes=self._n_nodes, node=self._p_node, row=self._p_row,
                    node_ptr=self._node_ptr, codes=self._codes, n_rows=self.n_rows,
                    book=self._book(), config=self.config, client_index=self.client_index)
        keep = new >= 0
        if not keep.all():
            self._p_row = self._p_row[keep]
            self._p_w = self._p_w[keep]
            new = new[keep]
        self._p_node = new.astype(np.int32) if new.size and new.max() < 2**31 else new

    def _book(self) -> CodeBook:
        """The client's integer codes (views of the worker's arrays)."""
        return CodeBook(self._uniq, self._uniq_all, self._uniq_off, self._cbits)

    def _level_stats(self, order: LevelOrder) -> LevelStatistics:
        """The client's statistics over ``order``."""
        return LevelStatistics(order, self.config, self._y, self._book())

    def _node_totals(self, n_nodes: int) -> np.ndarray:
        S = self.config.n_stats
        out = np.zeros((n_nodes, S))
        # indices converted once (numpy converts int32 indices on every gather and bincount)
        rows = self._p_row.astype(np.intp)
        node = self._p_node.astype(np.intp)
        for c in range(S):
            if c == 0 and self.config.task == "regression":
                # statistic 1 per row: the weights themselves (integer sums, exact either way)
                out[:, 0] = np.bincount(node, weights=self._p_w, minlength=n_nodes)
                continue
            wc = self._stats_cm[c][rows]
            wc *= self._p_w
            out[:, c] = np.bincount(node, weights=wc, minlength=n_nodes)
        return out

    def _abstain(self, n_nodes: int) -> None:
        m = int(self._profile.get("abstain_below", 0) or 0)
        if m <= 0:
            return
        # distinct rows: a record the bootstrap drew several times still counts once, so a
        # lone record never passes the threshold by being repeated
        cnt = np.bincount(self._p_node, minlength=n_nodes)
        small = (cnt > 0) & (cnt < m)
        self.abstained[self._level] = int(small.sum())
        if small.any():
            keep = ~small[self._p_node]
            self._p_row, self._p_w, self._p_node = (
                self._p_row[keep], self._p_w[keep], self._p_node[keep])

    # ------------------------------------------------------------------ entry point
    def handle(self, task: Task, *, digests: tuple[bytes, bytes] | None = None) -> Reply:
        """Answer one task. Answering the same round twice returns the same reply.

        ``digests``: the task's ``(digest(), question_digest())`` when the caller already
        computed them for this very task object (an in-process federation hands one task to
        every client); otherwise they are computed here.
        """
        if task.job_id != self.config.job_id:
            raise ProtocolError("task belongs to another job")
        digest = task.digest() if digests is None else digests[0]
        if self._last_round is not None and task.round_id == self._last_round:
            if digest != self._last_digest:
                raise ProtocolError(f"round {task.round_id} was already answered for another "
                                    "question; refusing to answer it twice")
            if self._last_reply is None:
                raise ProtocolError(f"round {task.round_id} was already answered")
            return self._last_reply
        if self._last_round is not None and task.round_id < self._last_round:
            raise ProtocolError(f"round {task.round_id} is older than round {self._last_round}")
        self._check_disclosures(task)
        extra = (set(task.params) - TASK_PARAMS[task.kind]) | (
            set(task.arrays) - TASK_ARRAYS[task.kind])
        if extra:
            raise ProtocolError(f"task carries fields this client does not use: {sorted(extra)}")
        question = task.question_digest() if digests is None else digests[1]
        if question in self._questions:
            raise RefusedRequest("this question was already answered in an earlier round; "
                                 "answering it again could isolate a client by differencing")
        if self.config.dp is not None and task.layout:
            # one noisy aggregate per planned release: a histogram round per splitting level,
            # or with random splits the marginal counts (with the class totals, if planned)
            # and the leaves' totals
            limit = 2 if self.config.method == "random" else self.config.max_depth
            if self._dp_releases >= limit:
                raise RefusedRequest(f"privacy budget spent: this client releases at most "
                                     f"{limit} noisy aggregates per job")
        if task.kind == TaskKind.SKETCH:
            reply = self._sketch(task)
        elif task.kind == TaskKind.HISTOGRAM:
            reply = self._histogram(task)
        else:  # pragma: no cover - enum is closed
            raise ProtocolError(f"unknown task kind {task.kind}")
        if reply.summable.shape != (layout_size(task.layout),):
            raise ProtocolError("reply does not match the task layout")
        self._last_round, self._last_digest = task.round_id, digest
        # the last reply is kept so a retried round gets the same answer; an in-process
        # federation, which never retries, can skip keeping it (memory)
        self._last_reply = reply if self._keep_last_reply else None
        keep = self._keep_order
        if keep is None and self._sorted is not None:  # auto, by size
            size = self._sorted.size
            keep = True if 8 * size <= KEEP_FULL_BYTES else \
                "compact" if 5 * size <= KEEP_ORDER_BYTES else False
        if (task.kind == TaskKind.HISTOGRAM and task.params.get("stats", "full") != "count") \
                or not keep:
            self._sorted = None  # free the sorted order (the next round of the level re-sorts)
        elif keep == "compact" and self._sorted is not None:
            self._sorted.compact()  # until the level's next round
        self._questions.add(question)
        if self.config.dp is not None and task.layout:
            self._dp_releases += 1
        return reply

    def allowed_disclosures(self) -> set[str]:
        """What this client's own profile lets it disclose beyond sums.

        Without secure aggregation the profile is open about per-client statistics. With it,
        only what the profile names: quantile sketches (``sketch = "quantiles"``) and, with
        ``h_splits = "clear"`` (``"noisy"`` under DP: noised), per-client node summaries.
        Anything else is refused, whatever the task asks (a malicious server cannot widen the
        disclosure). ``h_splits = "off"`` refuses node summaries in every profile.
        """
        prof = self._profile
        # --- node summaries for H-splits (h_splits: "off" never, "clear" as they are,
        # "noisy" only with the client's own DP noise, privacy/hsplits.py) ---
        h = prof.get("h_splits")
        node_stats = h == "clear" and not prof.get("dp") or h == "noisy" and bool(prof.get("dp"))
        if not prof.get("secure_aggregation"):
            return {"sketch_points", "top_l", "unique", "minmax"} | (
                set() if h == "off" else {"node_stats"})
        allowed: set[str] = set()
        if prof.get("sketch") == "quantiles" and not prof.get("dp"):
            allowed.add("sketch_points")
        if node_stats:
            allowed.add("node_stats")
        return allowed

    def _check_disclosures(self, task: Task) -> None:
        extra = set(task.disclose) - self.allowed_disclosures()
        if extra:
            raise RefusedRequest(f"the privacy profile {self._profile.get('name', '?')!r} "
                                 f"forbids disclosing {sorted(extra)}")

    # ------------------------------------------------------------------ sketch round
    def _sketch(self, task: Task) -> Reply:
        level = task.level
        try:
            n_nodes = int(task.params["n_nodes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError("sketch task lacks a valid n_nodes") from exc
        grid = [k for k in ("grid_nodes", "grid_features", "grid_thresholds")
                if k in task.arrays]
        if grid and (len(grid) < 3 or "stats" not in task.params or "nodes" in task.arrays) \
                or "stats" in task.params and not grid:
            # a histogram in a sketch task comes whole (nodes, features, thresholds and the
            # statistics), in a whole-level sketch; a parameter it does not use is refused
            raise ProtocolError("a sketch task asks a histogram with grid_nodes, "
                                "grid_features, grid_thresholds and stats, or none of them")
        if "nodes" in task.arrays:
            return self._sketch_group(task, n_nodes)
        feats = task.arrays.get("features")
        if feats is not None and (feats.ndim != 2 or feats.shape[0] != n_nodes
                                  or (feats >= self.config.n_features).any()):
            raise ProtocolError("features must have one row per node and valid indices")
        if level == self._level + 1:
            self._route(task)
            self._level = level
        elif level != self._level or (level == 0 and "route_kind" in task.arrays):
            raise ProtocolError(f"sketch for level {level} but this client is at level "
                                f"{self._level}; replay the earlier sketch tasks first")
        self._n_nodes = n_nodes
        self._sorted = None
        self._level_feats = None
        self._group = None
        self._sketched_level = None
        if self._p_node.size and self._p_node.max() >= n_nodes:
            raise ProtocolError("node count does not match routing")
        self._abstain(n_nodes)
        self._node_ptr = None  # the pairs changed (see _group_pairs)
        totals = self._node_totals(n_nodes)
        disclosed: dict[str, np.ndarray] = {}
        want = set(task.disclose)
        if "node_stats" in want:
            # --- h_splits = "noisy": one DP-noised release per level (privacy/hsplits.py) ---
            if self._profile.get("h_splits") == "noisy":
                from .privacy.hsplits import NodeStatsRelease

                if getattr(self, "_h_release", None) is None:
                    self._h_release = NodeStatsRelease(self.config)
                disclosed["node_stats"] = self._h_release.release(level, totals)
            else:
                disclosed["node_stats"] = totals.copy()
        if "minmax" in want:
            disclosed["minmax"] = np.array([[u[0], u[-1]] if u.size else [np.inf, -np.inf]
                                            for u in self._uniq])
        if feats is not None:
            feats = feats.astype(np.int64)
            if feats.shape[0] != n_nodes or (feats >= self.config.n_features).any():
                raise ProtocolError("features must have one row per node and valid indices")
            order = self._sort_level(feats)
            counts = np.bincount(self._p_node, weights=self._p_w, minlength=n_nodes)
            disclosed.update(self._sketch_items(task, order, feats, counts))
        self._sketched_level = level
        summable = totals.ravel() if task.params.get("totals", True) else np.zeros(0)
        if "grid_thresholds" in task.arrays:
            # the level's first histogram in the same round (after routing and abstention)
            if feats is not None:
                raise ProtocolError("a sketch task sorts the level or asks a histogram, "
                                    "not both")
            nodes, gfeats, thr, mode = self._histogram_arrays(task, "grid_")
            if mode == "gain":
                raise ProtocolError("a sketch task asks histograms of statistics only")
            hist = self._unsorted_histogram(nodes, gfeats, thr, mode)
            summable = np.concatenate([summable, hist.ravel()])
        return Reply(round_id=task.round_id, summable=summable, disclosed=disclosed)

    def _sketch_group(self, task: Task, n_nodes: int) -> Reply:
        """The sketch of some of the level's nodes, after the level's routing round.

        The coordinator may evaluate a level's nodes in groups (each group a sketch round and
        a histogram round): the task lists the group's nodes (``nodes``, ascending) and their
        features, one row per listed node. Nothing is routed and no abstention is decided
        again; the level order is built for the group's pairs only.
        """
        a = task.arrays
        if self._sketched_level != task.level or task.level != self._level:
            raise ProtocolError(f"sketch of a node group for level {task.level}, but this "
                                f"client has not answered that level's sketch round")
        if any(name.startswith("route_") for name in a) or n_nodes != self._n_nodes:
            raise ProtocolError("a node group's sketch neither routes nor changes the level")
        want = set(task.disclose)
        if want & {"node_stats", "minmax"}:
            raise ProtocolError("a node group's sketch discloses sketches only")
        nodes = a["nodes"]
        feats = a.get("features")
        if (nodes.ndim != 1 or nodes.dtype.kind not in "iu" or nodes.size == 0
                or nodes.min() < 0 or nodes.max() >= n_nodes
                or (nodes.size > 1 and (np.diff(nodes) <= 0).any())):
            raise ProtocolError("nodes must be distinct ascending node indices of the level")
        if feats is None or feats.ndim != 2 or feats.shape[0] != nodes.size \
                or (feats >= self.config.n_features).any():
            raise ProtocolError("features must have one row per listed node and valid indices")
        nodes = nodes.astype(np.int64)
        feats = feats.astype(np.int64)
        loc, row, w = self._group_pairs(nodes)
        counts = np.bincount(loc, weights=w, minlength=nodes.size)
        order = self._sort_level(feats, nodes, (loc, row, w))
        del loc, row, w
        disclosed = self._sketch_items(task, order, feats, counts)
        if task.params.get("totals", True):
            summable = self._node_totals(self._n_nodes)[nodes].ravel()
        else:
            summable = np.zeros(0)
        return Reply(round_id=task.round_id, summable=summable, disclosed=disclosed)

    def _sketch_items(self, task: Task, order: LevelOrder, feats: np.ndarray,
                      counts: np.ndarray) -> dict[str, np.ndarray]:
        """The sketch disclosures the task asks, for the nodes of the level order ``order``."""
        want = set(task.disclose)
        stats = self._level_stats(order)
        out: dict[str, np.ndarray] = {}
        if "sketch_points" in want or "top_l" in want:
            rows_per_point = int(self._profile.get("rows_per_sketch_point", 0) or 0)
            n_points = int(task.params["n_points"])
            if not 1 <= n_points <= MAX_SKETCH_POINTS:
                raise ProtocolError(f"a sketch of {n_points} points was asked; from 1 to "
                                    f"{MAX_SKETCH_POINTS}")
            pts = stats.quantile_points(feats, n_points, rows_per_point)
            if "sketch_points" in want:
                out["sketch_points"] = pts
                out["sketch_counts"] = counts
            if "top_l" in want:
                out["top_l"] = stats.top_l(feats, pts, int(task.params["top_l"]))
        if "unique" in want:
            ptr, vals = stats.unique_values(feats)
            out["unique_ptr"] = ptr
            out["unique_vals"] = vals
        return out

    def _group_pairs(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pairs of the listed nodes (ascending): their position in ``nodes``, rows and
        weights, in the pairs' order.

        On the level's first call the pairs are put in node order (a stable sort: the pairs
        of one node keep their order, so every per-node sum is unchanged); a group is then
        one slice of them.
        """
        if self._node_ptr is None:
            node = self._p_node
            if node.size > 1 and (node[1:] < node[:-1]).any():
                perm = np.argsort(node, kind="stable")
                self._p_node, self._p_row, self._p_w = node[perm], self._p_row[perm], \
                    self._p_w[perm]
                del perm
            self._node_ptr = np.searchsorted(self._p_node, np.arange(self._n_nodes + 1))
        ptr = self._node_ptr
        first, last = int(nodes[0]), int(nodes[-1])
        lo, hi = int(ptr[first]), int(ptr[last + 1])
        loc = self._p_node[lo:hi] - np.int32(first)
        row, w = self._p_row[lo:hi], self._p_w[lo:hi]
        if nodes.size != last + 1 - first:  # nodes not listed lie in between: drop theirs
            table = np.full(last + 1 - first, -1, dtype=np.int32)
            table[nodes - first] = np.arange(nodes.size, dtype=np.int32)
            loc = table[loc]
            keep = np.flatnonzero(loc >= 0)
            loc, row, w = loc[keep], row[keep], w[keep]
        return loc, row, w

    def _sort_level(self, feats: np.ndarray, group: np.ndarray | None = None,
                    pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                    ) -> LevelOrder:
        """Sort every (pair, slot) of the level by (block, code) once; later rounds reuse it.

        A block is one (node, feature slot). The sorted order serves the quantile sketch, the
        distinct values, and every histogram of the level: a bin is a contiguous run of it
        (see :class:`~fedforest_secure._order.LevelOrder`). With ``group`` (ascending node
        indices) only the pairs of those nodes are sorted, and block i * m + s belongs to
        ``group[i]``; the pairs keep their relative order, so every block is the same as in
        the whole level's order.
        """
        self._sorted = None  # the old order's memory is free before the new one is built
        if group is None:
            node, row, w = self._p_node, self._p_row, self._p_w
        else:
            node, row, w = pairs if pairs is not None else self._group_pairs(group)
        order = LevelOrder(feats, node, row, w, self._codes, self.n_rows, self._cbits)
        self._sorted = order
        self._level_feats = order.feats
        self._group = group
        return order

    def _sorted_for(self, feats: np.ndarray, nodes: np.ndarray) -> tuple[LevelOrder, np.ndarray]:
        """The level's sorted order and the positions of ``nodes`` in it, checking the
        features match the sketch round's."""
        order = self._sorted
        if order is None:
            if self._level_feats is None:
                raise ProtocolError("no sketch round for this level yet")
            # freed after the level's (or group's) last round; redo
            order = self._sort_level(self._level_feats, self._group)
        group = self._group
        local = nodes
        if group is not None:
            local = np.searchsorted(group, nodes)
            if nodes.size and (local.max() >= group.size or (group[local] != nodes).any()):
                raise ProtocolError("histogram asks for nodes outside the last sketched group")
        ref = order.feats[local]
        if ref.shape != feats.shape or ((feats >= 0) & (feats != ref)).any():
            raise ProtocolError("histogram features differ from the level's sketch features")
        return order, local

    # ------------------------------------------------------------------ histogram round
    def _histogram_arrays(self, task: Task, prefix: str = ""
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        """The evaluated nodes, features, thresholds and statistics mode a task asks a
        histogram of (``prefix``: ``"grid_"`` in a sketch task), checked."""
        try:
            nodes = task.arrays[prefix + "nodes"].astype(np.int64)
            feats = task.arrays[prefix + "features"].astype(np.int64)
            thr = task.arrays[prefix + "thresholds"].astype(np.float64)
        except KeyError as exc:
            raise ProtocolError(f"histogram task lacks {exc}") from exc
        if (nodes.ndim != 1 or feats.ndim != 2 or thr.ndim != 3
                or feats.shape[0] != nodes.size or thr.shape[:2] != feats.shape
                or (nodes.size and (nodes.min() < 0 or nodes.max() >= self._n_nodes))
                or (nodes.size > 1 and (np.diff(nodes) <= 0).any())
                or (feats >= self.config.n_features).any() or np.isnan(thr).any()):
            raise ProtocolError("histogram task arrays are inconsistent")
        if thr.shape[2] and (thr[:, :, 1:] < thr[:, :, :-1]).any():
            raise ProtocolError("thresholds must be sorted per node and slot")
        mode = task.params.get("stats", "full")
        if mode not in ("full", "count", "gain", "moments"):
            raise ProtocolError(f"unknown statistics mode {mode!r}")
        return nodes, feats, thr, mode

    def _histogram(self, task: Task) -> Reply:
        if task.level != self._level:
            raise ProtocolError(f"histogram for level {task.level}, client is at {self._level}")
        nodes, feats, thr, mode = self._histogram_arrays(task)
        cfg = self.config
        if (cfg.dp is not None and cfg.method == "random" and task.level == 0
                and cfg.sampling != "disjoint" and nodes.size > 1):
            # the marginal counts (and class totals) of a DP random-split job: every tree holds
            # every row, so the plan's sensitivity holds for one root's counts only
            raise ProtocolError("the level-0 counts of a DP random-split job are asked of one "
                                "root (every tree holds every row)")
        # statistics carry the missing rows' bin when the job has missing values; counts (the
        # secure sketch's grids) leave missing rows out
        missing_bin = mode != "count" and self.config.has_missing
        if self._sorted is None and self._level_feats is None:
            # the level's sketch round did not sort the level
            if self._sketched_level != self._level:
                raise ProtocolError("no sketch round for this level yet")
            hist = self._unsorted_histogram(nodes, feats, thr, mode, missing_bin)
        else:
            order, local = self._sorted_for(feats, nodes)
            hist = self._level_stats(order).histogram(local, feats, thr,
                                                     counts_only=mode == "count",
                                                     missing_bin=missing_bin,
                                                     moments=mode == "moments")
        vec = hist
        if mode == "gain":
            g = local_gains(hist, self.config)
            vec = np.stack([g, local_left_counts(hist, self.config)], axis=-1)
        summable = np.ascontiguousarray(vec).ravel()
        if any(b.name == CLASS_TOTALS_BLOCK for b in task.layout):
            summable = np.concatenate([summable, self._class_totals(task, nodes, mode)])
        return Reply(round_id=task.round_id, summable=summable)

    def _class_totals(self, task: Task, nodes: np.ndarray, mode: str) -> np.ndarray:
        """The classes' row totals over ``nodes``, ``a`` times over
        (:func:`~fedforest_secure.privacy.allocation.class_totals_scale`), for the level-0
        marginal counts of a DP random-split classification job whose plan releases them: the
        client's own profile decides ``a``, never the task.

        Raises
        ------
        ProtocolError
            The task asks for class totals where this client's plan releases none (another
            job, round, level or statistics mode, or a plan without them), or in a layout
            other than one block of ``(1, n_classes)`` after the counts.
        """
        from .privacy.allocation import class_totals_scale

        cfg = self.config
        a = class_totals_scale(cfg)
        names = [b.name for b in task.layout]
        if (a < 1 or task.level != 0 or mode != "count" or names[-1:] != [CLASS_TOTALS_BLOCK]
                or names.count(CLASS_TOTALS_BLOCK) != 1
                or task.layout[-1].shape != (1, cfg.n_classes)):
            raise ProtocolError("class totals are released only with the level-0 marginal "
                                "counts of a DP random-split classification job that plans "
                                "them, as one (1, n_classes) block after the counts")
        totals = self._node_totals(self._n_nodes)[nodes].sum(axis=0)
        out: np.ndarray = float(a) * totals
        return out

    def _unsorted_histogram(self, nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray,
                            mode: str, missing_bin: bool = False) -> np.ndarray:
        """Per-bin statistics of a level the sketch round did not sort, by whichever costs less
        (the same sums): with fewer thresholds than about SORT_RATIO x the (pair, slot)
        entries, sort the evaluated nodes' entries for this round only (every bin is then a
        segment of the order, see :meth:`LevelStatistics.histogram`); else one pass over the
        pairs, a binary search among its own block's thresholds per entry
        (:func:`~fedforest_secure._grid_stats.bin_statistics`)."""
        m = feats.shape[1]
        entries = self._p_node.size * m
        if np.isfinite(thr).sum() * SORT_RATIO < entries:
            level_feats = np.full((self._n_nodes, m), -1, dtype=np.int64)
            level_feats[nodes] = feats
            order = LevelOrder(level_feats, self._p_node, self._p_row, self._p_w, self._codes,
                               self.n_rows, self._cbits)
            hist = self._level_stats(order).histogram(nodes, feats, thr,
                                                     counts_only=mode == "count",
                                                     missing_bin=missing_bin,
                                                     moments=mode == "moments")
            del order
            return hist
        return self._bin_statistics(nodes, feats, thr, mode, missing_bin)

    def _bin_statistics(self, nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray,
                        mode: str, missing_bin: bool = False) -> np.ndarray:
        """Per-bin statistics by one pass over the level's pairs
        (:func:`~fedforest_secure._grid_stats.bin_statistics`)."""
        columns = {"count": "count", "moments": "moments"}.get(mode, "full")
        classes = self.config.n_classes if self.config.task == "classification" else 0
        return bin_statistics(self._p_node, self._p_row, self._p_w, self._n_nodes, nodes,
                              feats, thr, self._codes, self.n_rows, self._uniq_all,
                              self._uniq_off, self._y, columns, classes,
                              has_missing=self.config.has_missing, missing_bin=missing_bin)



def _frequency_weights(sample_weight: Any, n: int, dp: bool) -> np.ndarray | None:
    """Validated frequency weights (int64), or None.

    Raises
    ------
    SchemaError
        Not one finite, non-negative integer per row, (``dp``) a weight above 1, or weights
        adding up to more than 2^40 rows.
    """
    if sample_weight is None:
        return None
    w = np.asarray(sample_weight, dtype=np.float64)
    if w.shape != (n,):
        raise SchemaError(f"sample_weight must have shape ({n},), got {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any() or (w != np.round(w)).any():
        raise SchemaError("sample_weight must hold non-negative integers (frequency weights: "
                          "a row of weight 3 counts as three rows)")
    if dp and (w > 1).any():
        raise SchemaError("under differential privacy a row counts at most once: "
                          "sample_weight may only be 0 or 1")
    if w.sum() > 2.0**40:  # counts stay exact in float64 and in the ring, with room to sum
        raise SchemaError(f"sample_weight adds up to {w.sum():.3g} rows; at most 2^40 "
                          "(about 1.1e12) rows per client")
    return w.astype(np.int64)
