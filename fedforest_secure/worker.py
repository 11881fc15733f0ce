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

from . import _impurity
from ._order import LevelOrder, first_reaching
from ._tree import NodeKind
from .config import JobConfig
from .errors import ProtocolError, RefusedRequest, SchemaError
from .protocol import TASK_ARRAYS, TASK_PARAMS, Reply, Task, TaskKind, layout_size

__all__ = ["Worker"]

#: with ``keep_level_order=None``, a worker keeps its level order between rounds as is while it
#: takes at most KEEP_FULL_BYTES, compact while that takes at most KEEP_ORDER_BYTES, and
#: re-sorts otherwise (in-process federations hold K of them)
KEEP_FULL_BYTES = 24 << 20
KEEP_ORDER_BYTES = 32 << 20


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
                 keep_level_order: bool | str | None = True) -> None:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y)
        if X.ndim != 2 or X.shape[1] != config.n_features:
            raise SchemaError(f"X must have shape (n, {config.n_features}), got {X.shape}")
        if X.shape[0] < 1:
            raise SchemaError("a client needs at least one row")
        if y.shape != (X.shape[0],):
            raise SchemaError(f"y must have shape ({X.shape[0]},), got {y.shape}")
        if not np.isfinite(X).all():
            bad = np.argwhere(~np.isfinite(X))[0]
            raise SchemaError(f"non-finite value in row {bad[0] + 1}, column {bad[1]}")
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
                col = X[:, j]
                if (col != np.round(col)).any() or col.min() < 0 or col.max() >= nl:
                    raise SchemaError(f"categorical column {j} must hold level codes 0..{nl - 1}")
        # the table itself is not kept: codes and distinct values answer every question
        # exact integer codes: rank among the client's distinct values of each feature
        uniq = [np.unique(X[:, j]) for j in range(d)]
        self._uniq_off = np.concatenate([[0], np.cumsum([u.size for u in uniq])])
        self._uniq_all = np.concatenate(uniq)
        del uniq  # one copy: each feature's distinct values are a view into _uniq_all
        self._uniq = [self._uniq_all[self._uniq_off[j]:self._uniq_off[j + 1]] for j in range(d)]
        # codes of a block live in [block << cbits, (block + 1) << cbits): shifts, not divisions
        # at least 16 bits: then a code is exactly the low 16 bits of its field (cheap to pull
        # out of a packed key, see _order.LevelOrder.compact)
        self._cbits = max(int(max(u.size for u in self._uniq) + 1).bit_length(), 16)
        self._ustride = 1 << self._cbits
        self._rbits = int(n).bit_length() + 8  # row index and bootstrap weight (8 bits)
        codes = np.empty((d, n), dtype=np.int32)
        for j in range(d):
            codes[j] = np.searchsorted(self._uniq[j], X[:, j])
        self._codes = codes.ravel()  # feature-major: code of (j, row) at j * n + row
        # client-stratified bootstrap: n_k draws with replacement from the client's own rows
        rng = np.random.default_rng(seed)
        T = config.n_estimators
        if config.sampling == "bootstrap":
            w = np.empty((T, n), dtype=np.int64)
            for t in range(T):
                w[t] = np.bincount(rng.integers(0, n, n), minlength=n)
            dp = config.dp
            if dp is not None:  # DP sensitivities assume a capped multiplicity
                np.minimum(w, int(dp.get("max_multiplicity", 4)), out=w)
        elif config.sampling == "disjoint":  # every row in exactly one tree
            w = np.zeros((T, n), dtype=np.int64)
            w[rng.integers(0, T, n), np.arange(n)] = 1
        else:
            w = np.ones((T, n), dtype=np.int64)
        tt, rr = np.nonzero(w)
        # compact pair arrays: every worker of an in-process federation holds its own
        self._p_row = rr.astype(np.int32 if n < 2**31 else np.int64)
        self._p_node = tt.astype(np.int32)  # level 0: node index == tree index
        pw = w[tt, rr]
        self._p_w = pw.astype(np.uint8) if pw.size and pw.max() < 256 else pw
        del w, tt, rr, pw
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
        a = task.arrays
        kind = a["route_kind"]
        if kind.shape != (self._n_nodes,):
            raise ProtocolError(
                f"routing describes {kind.shape[0]} nodes, this client has {self._n_nodes}")
        feat = a["route_feature"].astype(np.int64)
        thr = a["route_threshold"]
        left = a["route_left"].astype(np.int64)
        right = a["route_right"].astype(np.int64)
        ptr = a["route_set_ptr"].astype(np.int64)
        vals = a["route_set_vals"].astype(np.int64)
        node = self._p_node
        is_num = kind == NodeKind.NUMERIC
        num_nodes = np.flatnonzero(is_num)
        if (feat[num_nodes] < 0).any() or (feat[num_nodes] >= self.config.n_features).any():
            raise ProtocolError("routing names a feature this job does not have")
        # numeric splits, for every pair at once: x <= t  <=>  code < (distinct values <= t)
        cut = np.zeros(kind.size, dtype=np.int64)
        for j in np.unique(feat[num_nodes]):
            sel = num_nodes[feat[num_nodes] == j]
            cut[sel] = np.searchsorted(self._uniq[j], thr[sel], side="right")
        # per-node values for every pair: repeated over each node's run when the pairs are in
        # node order (after a grouped level), else gathered pair by pair
        nptr = self._node_ptr
        runs = np.diff(nptr) if nptr is not None and nptr.size == kind.size + 1 else None

        def per_pair(v: np.ndarray) -> np.ndarray:
            return np.repeat(v, runs) if runs is not None else v[node]

        fbase = np.where(is_num, feat, 0) * self.n_rows  # per node: start of its codes
        idx = per_pair(fbase)
        idx += self._p_row
        go_left = self._codes[idx] < per_pair(cut)
        del idx
        k = None
        if (kind == NodeKind.CATEGORICAL).any():
            k = kind[node]
            cat = k == NodeKind.CATEGORICAL
            cat_nodes = np.flatnonzero(kind == NodeKind.CATEGORICAL)
            max_l = max(self.config.levels) if self.config.levels else 1
            table = np.zeros((cat_nodes.size, max(max_l, 1)), dtype=bool)
            pos = np.full(kind.size, -1, dtype=np.int64)
            pos[cat_nodes] = np.arange(cat_nodes.size)
            for i, nd in enumerate(cat_nodes):
                table[i, vals[ptr[nd]:ptr[nd + 1]]] = True
            fc = feat[node[cat]]
            code = self._codes[fc * self.n_rows + self._p_row[cat]]
            lv = self._uniq_all[self._uniq_off[fc] + code].astype(np.int64)
            go_left[cat] = table[pos[node[cat]], lv]
        if (kind == NodeKind.CLIENT).any():
            k = kind[node] if k is None else k
            cli = k == NodeKind.CLIENT
            mine = np.zeros(kind.size, dtype=bool)
            for nd in np.flatnonzero(kind == NodeKind.CLIENT):
                mine[nd] = self.client_index in set(vals[ptr[nd]:ptr[nd + 1]].tolist())
            go_left[cli] = mine[node[cli]]
        # a leaf's pairs leave the level whatever the task says of its children
        left_eff = np.where(kind == NodeKind.LEAF, -1, left)
        right_eff = np.where(kind == NodeKind.LEAF, -1, right)
        new = np.where(go_left, per_pair(left_eff), per_pair(right_eff))
        keep = new >= 0
        if not keep.all():
            self._p_row = self._p_row[keep]
            self._p_w = self._p_w[keep]
            new = new[keep]
        self._p_node = new.astype(np.int32) if new.size and new.max() < 2**31 else new

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
            limit = self.config.max_depth
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
            disclosed["minmax"] = np.array([[u[0], u[-1]] for u in self._uniq])
        if feats is not None:
            feats = feats.astype(np.int64)
            if feats.shape[0] != n_nodes or (feats >= self.config.n_features).any():
                raise ProtocolError("features must have one row per node and valid indices")
            self._sort_level(feats)
            counts = np.bincount(self._p_node, weights=self._p_w, minlength=n_nodes)
            disclosed.update(self._sketch_items(task, feats, counts))
        self._sketched_level = level
        summable = totals.ravel() if task.params.get("totals", True) else np.zeros(0)
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
        self._sort_level(feats, nodes, (loc, row, w))
        del loc, row, w
        disclosed = self._sketch_items(task, feats, counts)
        if task.params.get("totals", True):
            summable = self._node_totals(self._n_nodes)[nodes].ravel()
        else:
            summable = np.zeros(0)
        return Reply(round_id=task.round_id, summable=summable, disclosed=disclosed)

    def _sketch_items(self, task: Task, feats: np.ndarray, counts: np.ndarray
                      ) -> dict[str, np.ndarray]:
        """The sketch disclosures the task asks, for the nodes of the current level order."""
        want = set(task.disclose)
        n_nodes, m = feats.shape
        out: dict[str, np.ndarray] = {}
        if "sketch_points" in want or "top_l" in want:
            pts = self._quantile_points(feats, int(task.params["n_points"]))
            if "sketch_points" in want:
                out["sketch_points"] = pts
                out["sketch_counts"] = counts
            if "top_l" in want:
                out["top_l"] = self._local_top_l(feats, pts, int(task.params["top_l"]))
        if "unique" in want:
            ptr, vals = self._unique_values(feats, n_nodes * m)
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
                    pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
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
        self._sorted = LevelOrder(feats, node, row, w, self._codes, self.n_rows, self._cbits)
        self._level_feats = self._sorted.feats
        self._group = group

    def _sorted_for(self, feats: np.ndarray, nodes: np.ndarray) -> tuple[LevelOrder, np.ndarray]:
        """The level's sorted order and the positions of ``nodes`` in it, checking the
        features match the sketch round's."""
        if self._sorted is None:
            if self._level_feats is None:
                raise ProtocolError("no sketch round for this level yet")
            # freed after the level's (or group's) last round; redo
            self._sort_level(self._level_feats, self._group)
        order = self._sorted
        assert order is not None
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

    def _quantile_points(self, feats: np.ndarray, n_points: int) -> np.ndarray:
        """Weighted quantile points Q(b/B_k), b = 0..B_k, per (node, slot); NaN-padded.

        Categorical slots get no points. Blocks are processed in runs of a bounded number of
        entries, so the scratch memory does not grow with the level.
        """
        n_nodes, m = feats.shape
        nblk = n_nodes * m
        out = np.full((nblk, n_points + 1), np.nan)
        order = self._sorted
        assert order is not None
        if order.size == 0:
            return out.reshape(n_nodes, m, n_points + 1)
        # block boundaries by search (nblk queries), not by a pass over every entry
        edges = order.all_edges()
        cont = np.array([k == "continuous" for k in self.config.kinds])
        fl = feats.reshape(-1)
        wanted = cont[fl.clip(0)] & (fl >= 0)
        r = int(self._profile.get("rows_per_sketch_point", 0) or 0)
        b = np.arange(n_points + 1)
        for b0, b1 in order.chunks(edges):
            e0, e1 = int(edges[b0]), int(edges[b1])
            if e1 == e0:
                continue
            w = order.weights(e0, e1)
            cw0 = np.empty(w.size + 1, dtype=np.int64)  # cumulative weights, 0 first
            cw0[0] = 0
            np.cumsum(w, out=cw0[1:])
            cw = cw0[1:]
            start, end = edges[b0:b1] - e0, edges[b0 + 1:b1 + 1] - e0
            before = cw0[start]
            bw = cw0[end] - before
            present = np.flatnonzero((end > start) & wanted[b0:b1])
            # adaptive B: a sketch point summarises at least r rows (B_k <= n_k / r)
            bk = np.full(present.size, n_points, dtype=np.int64)
            if r >= 1:
                bk = np.minimum(bw[present] // r, n_points)
                # fewer than r rows: no point at all (a lone min or max would be a record)
                keep = bk >= 1
                present, bk = present[keep], bk[keep]
            valid = b[None, :] <= bk[:, None]
            # Q(b / B_k) is the first entry whose cumulative weight within the block reaches
            # b n / B_k (at least 1: Q(0) is the minimum), i.e. the integer ceil(b n / B_k):
            # exact integer arithmetic (as _sketch.client_quantiles), offset by the weight
            # before the block, so a block's points never depend on its neighbours
            bwi = bw[present].astype(np.int64)
            target = b[None, :] * bwi[:, None]
            target += (bk - 1)[:, None]
            target //= bk[:, None]
            np.maximum(target, 1, out=target)
            target += before[present, None].astype(np.int64)
            idx = first_reaching(cw, target.ravel()).reshape(target.shape)
            del w, cw, target
            np.minimum(idx, (end[present] - 1)[:, None], out=idx)
            idx += e0
            fslot = fl[b0:b1][present]
            code = order.codes_at(idx)
            code += self._uniq_off[fslot][:, None]
            vals = self._uniq_all[code]
            vals[~valid] = np.nan
            out[b0 + present] = vals
        return out.reshape(n_nodes, m, n_points + 1)

    def _unique_values(self, feats: np.ndarray, nblk: int) -> tuple[np.ndarray, np.ndarray]:
        """Distinct values per (node, slot) in CSR form (the exact method's disclosure)."""
        order = self._sorted
        assert order is not None
        if order.size == 0:
            return np.zeros(nblk + 1, dtype=np.int64), np.zeros(0)
        bc_s = order.block_codes()
        new = np.ones(bc_s.size, dtype=bool)
        new[1:] = bc_s[1:] != bc_s[:-1]
        ub, uc = bc_s[new] >> self._cbits, bc_s[new] & (self._ustride - 1)
        fslot = feats.reshape(-1)[ub]
        vals = self._uniq_all[self._uniq_off[fslot] + uc]
        ptr = np.concatenate([[0], np.cumsum(np.bincount(ub, minlength=nblk))])
        return ptr.astype(np.int64), vals

    def _local_top_l(self, feats: np.ndarray, pts: np.ndarray, top_l: int) -> np.ndarray:
        """Slots of the L features with the best local gain at the local quantile candidates."""
        n_nodes, m = feats.shape
        thr = pts[:, :, 1:-1].copy()  # interior local quantiles as local candidates
        thr[np.isnan(thr)] = np.inf
        thr.sort(axis=2)
        dup = np.zeros(thr.shape, dtype=bool)
        dup[:, :, 1:] = thr[:, :, 1:] == thr[:, :, :-1]
        thr[dup] = np.inf
        thr.sort(axis=2)
        cat = np.array([k == "categorical" for k in self.config.kinds])
        level_order = self._sorted
        assert level_order is not None
        hist = self._hist(level_order, np.arange(n_nodes), feats,
                          self._cat_thresholds(feats, thr, cat))
        gain = self._gains_from_hist(hist)
        best = np.where(np.isfinite(gain), gain, -np.inf).max(axis=2)  # (n_nodes, m)
        best[feats < 0] = -np.inf
        order = np.argsort(-best, axis=1, kind="stable")[:, :top_l]
        return order.astype(np.int64)

    def _cat_thresholds(self, feats: np.ndarray, thr: np.ndarray, cat: np.ndarray) -> np.ndarray:
        """Replace the thresholds of categorical slots by level cuts k + 0.5."""
        if not cat.any():
            return thr
        width = max(thr.shape[2], max(self.config.levels) - 1)
        out = np.full(thr.shape[:2] + (width,), np.inf)
        out[:, :, : thr.shape[2]] = thr
        is_cat = (feats >= 0) & cat[np.maximum(feats, 0)]
        for nd, sl in zip(*np.nonzero(is_cat), strict=True):
            nl = self.config.levels[feats[nd, sl]]
            out[nd, sl, :] = np.inf
            out[nd, sl, : nl - 1] = np.arange(nl - 1) + 0.5
        return out

    # ------------------------------------------------------------------ histogram round
    def _hist(self, order: LevelOrder, nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray,
              counts_only: bool = False) -> np.ndarray:
        """Per (evaluated node, slot, bin) statistics; bin b holds rows with t_{b-1} < x <= t_b.

        Each bin is a contiguous run of the level's sorted order, so its statistics are one
        segment sum (``np.add.reduceat``): no per-row search, no cancellation across bins.
        ``nodes`` are the positions of the evaluated nodes in ``order`` (ascending).
        """
        n_eval, m = feats.shape
        nb = thr.shape[2] + 1
        S = 1 if counts_only else self.config.n_stats
        stride = self._ustride
        blk = (nodes[:, None] * m + np.arange(m)[None, :]).ravel()  # evaluated block ids
        # block starts/ends of the evaluated blocks (nodes ascend, so blocks do too)
        starts, ends = order.block_edges(blk)
        # thresholds -> integer cuts in this client's code space: x <= t  <=>  code < cut;
        # cutkey[i, b] = (block << cbits) | cut, one feature at a time
        cutkey = np.empty((blk.size, nb - 1), dtype=np.int64)
        cutkey[:] = stride - 1  # no cut (padding): the bin runs to the end of the block
        fl = feats.ravel()
        thr2 = thr.reshape(blk.size, nb - 1)
        for j in np.unique(fl[fl >= 0]):
            sel = np.flatnonzero(fl == j)
            t = thr2[sel].ravel()
            # +inf (padding) maps past the last code, so its bin runs to the end of the block
            u = self._uniq[j]
            c = np.full(t.size, u.size, dtype=np.int64)
            fin = np.flatnonzero(np.isfinite(t))
            if fin.size:
                # searched in ascending order: numpy's binary search starts from the previous
                # answer, several times faster than the blocks' interleaved runs
                tf = t[fin]
                o = np.argsort(tf)
                c[fin[o]] = np.searchsorted(u, tf[o], side="right")
            if t.size and t.min() == -np.inf:  # -inf: no cut either (they ascend)
                c[t == -np.inf] = stride - 1
            cutkey[sel] = c.reshape(sel.size, nb - 1)
        cutkey += (blk << self._cbits)[:, None]
        sums = np.zeros((blk.size, nb, S))
        edges = np.append(starts, ends[-1] if blk.size else 0)
        # bins are consecutive runs of the sorted order, so each bin's statistics are one
        # segment sum (reduceat over [pos_i, pos_i+1)) of the bin's own rows: no cancellation
        # across bins. Runs of blocks keep the scratch memory bounded.
        for i0, i1 in order.chunks(edges):
            e0 = int(starts[i0])
            e1 = int(ends[i1 - 1])
            if e1 <= e0:
                continue
            pos = np.empty((i1 - i0, nb + 1), dtype=np.int64)
            pos[:, 1:nb] = order.search(cutkey[i0:i1].ravel(), e0, e1).reshape(-1, nb - 1)
            pos[:, 0] = starts[i0:i1] - e0
            pos[:, nb] = ends[i0:i1] - e0
            cols = self._sorted_stats(order, counts_only, e0, e1)
            flat = pos.ravel()
            part = sums[i0:i1]
            for c, col in enumerate(cols):
                seg = np.add.reduceat(col, flat).reshape(-1, nb + 1)[:, :nb]
                part[:, :, c] = seg
            del cols
            empty = pos[:, 1:] <= pos[:, :-1]  # empty runs (reduceat gives an element)
            np.copyto(part, 0.0, where=empty[:, :, None])
        sums = sums.reshape(n_eval, m, nb, S)
        sums[feats < 0] = 0.0
        return sums

    def _sorted_stats(self, order: LevelOrder, counts_only: bool, lo: int, hi: int
                      ) -> list[np.ndarray]:
        """Weighted row statistics of entries ``[lo, hi)`` in the level's sorted order, one
        contiguous column per statistic, each with a zero sentinel at the end (a bin may start
        at the last entry)."""
        n = hi - lo
        wf = np.empty(n + 1)
        order.weights_into(wf[:n], lo, hi)
        wf[n] = 0.0
        if counts_only:  # weighted row counts: column 0 (regression) or the class sum
            return [wf]
        rows = order.rows(lo, hi)
        if self.config.task == "regression":
            yv = self._y[rows]
            del rows
            wy = np.empty(n + 1)
            np.multiply(wf[:n], yv, out=wy[:n])
            wy[n] = 0.0
            wyy = np.empty(n + 1)
            np.multiply(wy[:n], yv, out=wyy[:n])
            wyy[n] = 0.0
            return [wf, wy, wyy]
        yc = self._y[rows]
        del rows
        cols = []
        for c in range(self.config.n_classes):
            col = np.zeros(n + 1)
            hit = yc == c
            col[:n][hit] = wf[:n][hit]
            cols.append(col)
        return cols

    def _gains_from_hist(self, hist: np.ndarray) -> np.ndarray:
        """n-weighted local gains per threshold (the client's own CART gains), shape (E, m, Bt)."""
        cfg = self.config
        left = np.cumsum(hist, axis=2)[:, :, :-1, :]
        total = hist.sum(axis=2, keepdims=True)
        right = total - left
        parent = _impurity.weighted_impurity(total, cfg.task, cfg.criterion)
        g = (parent - _impurity.weighted_impurity(left, cfg.task, cfg.criterion)
             - _impurity.weighted_impurity(right, cfg.task, cfg.criterion))
        nl = _impurity.counts_of(left, cfg.task)
        nr = _impurity.counts_of(right, cfg.task)
        return np.where((nl > 0) & (nr > 0), g, 0.0)

    def _histogram(self, task: Task) -> Reply:
        if task.level != self._level:
            raise ProtocolError(f"histogram for level {task.level}, client is at {self._level}")
        try:
            nodes = task.arrays["nodes"].astype(np.int64)
            feats = task.arrays["features"].astype(np.int64)
            thr = task.arrays["thresholds"].astype(np.float64)
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
        order, local = self._sorted_for(feats, nodes)
        hist = self._hist(order, local, feats, thr, counts_only=mode == "count")
        if mode == "full":
            vec = hist
        elif mode == "count":
            vec = hist
        elif mode == "gain":
            g = self._gains_from_hist(hist)
            left_n = np.cumsum(_impurity.counts_of(hist, self.config.task), axis=2)[:, :, :-1]
            vec = np.stack([g, left_n], axis=-1)
        else:
            raise ProtocolError(f"unknown statistics mode {mode!r}")
        return Reply(round_id=task.round_id, summable=np.ascontiguousarray(vec).ravel())

