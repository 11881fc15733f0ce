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
from .config import JobConfig
from .errors import ProtocolError, RefusedRequest, SchemaError
from .protocol import TASK_ARRAYS, TASK_PARAMS, Block, Reply, StatKind, Task, TaskKind, layout_size

__all__ = ["LEAF", "NUM", "CAT", "CLIENT", "Worker"]

LEAF, NUM, CAT, CLIENT = 0, 1, 2, 3


class Worker:
    """Client side of one training job.

    Parameters
    ----------
    config : the job's configuration (identical on every side)
    X : array of shape (n_k, d), the site's features (categorical features as level codes)
    y : array of shape (n_k,), targets (class codes 0..C-1 for classification)
    client_index : this client's index in 0..K-1 (its value of the client indicator H)
    seed : seed of this client's own randomness (bootstrap)
    """

    def __init__(self, config: JobConfig, X: Any, y: Any, *, client_index: int,
                 seed: int | np.random.SeedSequence | None = None,
                 keep_last_reply: bool = True) -> None:
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
        for j, (kind, nl) in enumerate(zip(config.kinds, config.levels, strict=True)):
            if kind == "categorical":
                col = X[:, j]
                if (col != np.round(col)).any() or col.min() < 0 or col.max() >= nl:
                    raise SchemaError(f"categorical column {j} must hold level codes 0..{nl - 1}")
        self._X = X
        # exact integer codes: rank among the client's distinct values of each feature
        self._uniq = [np.unique(X[:, j]) for j in range(d)]
        self._uniq_off = np.concatenate([[0], np.cumsum([u.size for u in self._uniq])])
        self._uniq_all = np.concatenate(self._uniq)
        # codes of a block live in [block << cbits, (block + 1) << cbits): shifts, not divisions
        self._cbits = int(max(u.size for u in self._uniq) + 1).bit_length()
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
        self._p_row = rr.astype(np.int64)
        self._p_node = tt.astype(np.int64)  # level 0: node index == tree index
        self._p_w = w[tt, rr].astype(np.float64)
        self._level = 0
        self._n_nodes = T
        self._sorted: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._level_feats: np.ndarray | None = None
        self._last_round: int | None = None
        self._last_reply: Reply | None = None
        self._last_digest = b""
        self._keep_last_reply = keep_last_reply
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
        k = kind[node]
        go_left = np.zeros(node.size, dtype=bool)
        num = k == NUM
        if num.any():
            go_left[num] = self._X[self._p_row[num], feat[node[num]]] <= thr[node[num]]
        cat = k == CAT
        if cat.any():
            cat_nodes = np.flatnonzero(kind == CAT)
            max_l = max(self.config.levels) if self.config.levels else 1
            table = np.zeros((cat_nodes.size, max(max_l, 1)), dtype=bool)
            pos = np.full(kind.size, -1, dtype=np.int64)
            pos[cat_nodes] = np.arange(cat_nodes.size)
            for i, nd in enumerate(cat_nodes):
                table[i, vals[ptr[nd]:ptr[nd + 1]]] = True
            lv = self._X[self._p_row[cat], feat[node[cat]]].astype(np.int64)
            go_left[cat] = table[pos[node[cat]], lv]
        cli = k == CLIENT
        if cli.any():
            mine = np.zeros(kind.size, dtype=bool)
            for nd in np.flatnonzero(kind == CLIENT):
                mine[nd] = self.client_index in set(vals[ptr[nd]:ptr[nd + 1]].tolist())
            go_left[cli] = mine[node[cli]]
        new = np.where(go_left, left[node], right[node])
        new = np.where(k == LEAF, -1, new)
        keep = new >= 0
        self._p_row = self._p_row[keep]
        self._p_w = self._p_w[keep]
        self._p_node = new[keep]

    def _node_totals(self, n_nodes: int) -> np.ndarray:
        S = self.config.n_stats
        out = np.zeros((n_nodes, S))
        for c in range(S):
            out[:, c] = np.bincount(self._p_node, weights=self._p_w * self._stats[self._p_row, c],
                                    minlength=n_nodes)
        return out

    def _abstain(self, n_nodes: int) -> None:
        m = int(self._profile.get("abstain_below", 0) or 0)
        if m <= 0:
            return
        cnt = np.bincount(self._p_node, weights=self._p_w, minlength=n_nodes)
        small = (cnt > 0) & (cnt < m)
        self.abstained[self._level] = int(small.sum())
        if small.any():
            keep = ~small[self._p_node]
            self._p_row, self._p_w, self._p_node = (
                self._p_row[keep], self._p_w[keep], self._p_node[keep])

    # ------------------------------------------------------------------ entry point
    def handle(self, task: Task) -> Reply:
        """Answer one task. Answering the same round twice returns the same reply."""
        if task.job_id != self.config.job_id:
            raise ProtocolError("task belongs to another job")
        digest = task.digest()
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
        question = task.question_digest()
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
        if task.kind == TaskKind.HISTOGRAM and task.params.get("stats", "full") != "count":
            self._sorted = None  # the level's last round: free its sorted arrays
        self._questions.add(question)
        if self.config.dp is not None and task.layout:
            self._dp_releases += 1
        return reply

    def allowed_disclosures(self) -> set[str]:
        """What this client's own profile lets it disclose beyond sums.

        Without secure aggregation the profile is open about per-client statistics. With it,
        only what the profile names: quantile sketches (``sketch = "quantiles"``) and, with
        ``h_splits = "clear"``, per-client node summaries. Anything else is refused, whatever
        the task asks (a malicious server cannot widen the disclosure).
        """
        prof = self._profile
        if not prof.get("secure_aggregation"):
            return {"sketch_points", "top_l", "unique", "minmax", "node_stats"}
        allowed: set[str] = set()
        if prof.get("sketch") == "quantiles" and not prof.get("dp"):
            allowed.add("sketch_points")
        if prof.get("h_splits") == "clear" and not prof.get("dp"):
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
        if self._p_node.size and self._p_node.max() >= n_nodes:
            raise ProtocolError("node count does not match routing")
        self._abstain(n_nodes)
        totals = self._node_totals(n_nodes)
        disclosed: dict[str, np.ndarray] = {}
        want = set(task.disclose)
        if "node_stats" in want:
            disclosed["node_stats"] = totals.copy()
        if "minmax" in want:
            disclosed["minmax"] = np.stack([self._X.min(axis=0), self._X.max(axis=0)], axis=1)
        if feats is not None:
            feats = feats.astype(np.int64)
            if feats.shape[0] != n_nodes or (feats >= self.config.n_features).any():
                raise ProtocolError("features must have one row per node and valid indices")
            self._sort_level(feats)
            m = feats.shape[1]
            counts = np.bincount(self._p_node, weights=self._p_w, minlength=n_nodes)
            if "sketch_points" in want or "top_l" in want:
                pts = self._quantile_points(feats, int(task.params["n_points"]))
                if "sketch_points" in want:
                    disclosed["sketch_points"] = pts
                    disclosed["sketch_counts"] = counts
                if "top_l" in want:
                    disclosed["top_l"] = self._local_top_l(feats, pts, int(task.params["top_l"]))
            if "unique" in want:
                ptr, vals = self._unique_values(feats, n_nodes * m)
                disclosed["unique_ptr"] = ptr
                disclosed["unique_vals"] = vals
        summable = totals.ravel() if task.params.get("totals", True) else np.zeros(0)
        return Reply(round_id=task.round_id, summable=summable, disclosed=disclosed)

    def _sort_level(self, feats: np.ndarray) -> None:
        """Sort every (pair, slot) of the level by (block, code) once; later rounds reuse it.

        A block is one (node, feature slot). The sorted order serves the quantile sketch, the
        distinct values, and every histogram of the level: a bin is a contiguous run of it.
        Row and bootstrap weight ride in the low bits of the sort key, so no gather through a
        permutation is needed afterwards.
        """
        m = feats.shape[1]
        n = self.n_rows
        f = feats.astype(np.int32)[self._p_node]  # (P, m)
        valid = bool((f >= 0).all())
        flat_idx = f * np.int32(n) + self._p_row.astype(np.int32)[:, None]
        if not valid:
            flat_idx[f < 0] = 0
        code = np.take(self._codes, flat_idx)
        wmax = int(self._p_w.max()) if self._p_w.size else 0
        nblk_bits = int(max(feats.size, 1)).bit_length()
        fits = (wmax < 256 and nblk_bits + self._cbits + self._rbits <= 62
                and n < (1 << 31))
        if fits:
            key = self._p_node[:, None] * m + np.arange(m)[None, :]
            key <<= self._cbits
            key |= code
            key <<= self._rbits
            key |= ((self._p_row << 8) | self._p_w.astype(np.int64))[:, None]
            key = key.ravel() if valid else key[f >= 0]
            key.sort()
            bc_s = key >> self._rbits
            row_s = ((key >> 8) & ((1 << (self._rbits - 8)) - 1)).astype(np.int32)
            w_s = (key & 255).astype(np.uint8)  # compact: all workers of a process hold one
        else:  # pragma: no cover - huge levels or multiplicities >= 256
            ok = (f >= 0).ravel()
            blk = (self._p_node[:, None] * m + np.arange(m)[None, :]).ravel()[ok]
            bc = blk * self._ustride + code.ravel()[ok]
            rows = np.broadcast_to(self._p_row[:, None], f.shape).ravel()[ok]
            ww = np.broadcast_to(self._p_w[:, None], f.shape).ravel()[ok]
            order = np.lexsort((rows, bc))
            bc_s, row_s, w_s = bc[order], rows[order], ww[order]
        self._sorted = (feats.copy(), bc_s, row_s, w_s)
        self._level_feats = feats.copy()

    def _sorted_for(self, feats: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """The level's sorted block*stride+code keys, checking the features match."""
        if self._sorted is None:
            if self._level_feats is None:
                raise ProtocolError("no sketch round for this level yet")
            self._sort_level(self._level_feats)  # freed after the level's last round; redo
        level_feats, bc_s, _, _ = self._sorted  # type: ignore[misc]
        ref = level_feats[nodes]
        if ref.shape != feats.shape or ((feats >= 0) & (feats != ref)).any():
            raise ProtocolError("histogram features differ from the level's sketch features")
        return bc_s

    def _quantile_points(self, feats: np.ndarray, n_points: int) -> np.ndarray:
        """Weighted quantile points Q(b/B_k), b = 0..B_k, per (node, slot); NaN-padded.

        Categorical slots get no points.
        """
        n_nodes, m = feats.shape
        nblk = n_nodes * m
        out = np.full((nblk, n_points + 1), np.nan)
        _, bc_s, _, w8 = self._sorted  # type: ignore[misc]
        if bc_s.size == 0:
            return out.reshape(n_nodes, m, n_points + 1)
        cw = np.cumsum(w8, dtype=np.float64)
        # block boundaries by search (nblk queries), not by a pass over every entry
        edges = np.searchsorted(bc_s, np.arange(nblk + 1, dtype=np.int64) << self._cbits)
        start, end = edges[:-1], edges[1:]
        bcnt = end - start
        cw0 = np.concatenate([[0.0], cw])
        before = cw0[start]
        bw = cw0[end] - before
        cont = np.array([k == "continuous" for k in self.config.kinds])
        present = np.flatnonzero((bcnt > 0) & cont[feats.reshape(-1).clip(0)]
                                 & (feats.reshape(-1) >= 0))
        # adaptive B: a sketch point summarises at least r rows (B_k <= n_k / r)
        r = int(self._profile.get("rows_per_sketch_point", 0) or 0)
        bk = np.full(present.size, n_points, dtype=np.int64)
        if r >= 1:
            bk = np.minimum((bw[present] // r).astype(np.int64), n_points)
            # fewer than r rows: no point at all (a lone min or max would be a record's value)
            keep = bk >= 1
            present, bk = present[keep], bk[keep]
        b = np.arange(n_points + 1)
        levels = b[None, :] / bk[:, None]
        valid = b[None, :] <= bk[:, None]
        target = before[present, None] + np.maximum(levels * bw[present, None], 0.5)
        idx = np.searchsorted(cw, target.ravel(), side="left").reshape(target.shape)
        idx = np.minimum(idx, (end[present] - 1)[:, None])
        fslot = feats.reshape(-1)[present]
        code = bc_s[idx] & (self._ustride - 1)
        vals = self._uniq_all[self._uniq_off[fslot][:, None] + code]
        out[present] = np.where(valid, vals, np.nan)
        return out.reshape(n_nodes, m, n_points + 1)

    def _unique_values(self, feats: np.ndarray, nblk: int) -> tuple[np.ndarray, np.ndarray]:
        """Distinct values per (node, slot) in CSR form (the exact method's disclosure)."""
        _, bc_s, _, _ = self._sorted  # type: ignore[misc]
        if bc_s.size == 0:
            return np.zeros(nblk + 1, dtype=np.int64), np.zeros(0)
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
        hist = self._hist(np.arange(n_nodes), feats, self._cat_thresholds(feats, thr, cat))
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
    def _hist(self, nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray,
              counts_only: bool = False) -> np.ndarray:
        """Per (evaluated node, slot, bin) statistics; bin b holds rows with t_{b-1} < x <= t_b.

        Each bin is a contiguous run of the level's sorted order, so its statistics are one
        segment sum (``np.add.reduceat``): no per-row search, no cancellation across bins.
        """
        n_eval, m = feats.shape
        bt = thr.shape[2]
        S = self.config.n_stats
        nb = bt + 1
        bc_s = self._sorted_for(feats, nodes)
        stride = self._ustride
        # thresholds -> integer cuts in this client's code space: x <= t  <=>  code < cut
        cuts = np.full(thr.size, stride - 1, dtype=np.int64)
        fb = np.broadcast_to(feats[:, :, None], thr.shape).ravel()
        tflat = thr.ravel()
        idx = np.flatnonzero(np.isfinite(tflat) & (fb >= 0))
        idx = idx[np.argsort(fb[idx], kind="stable")]  # group the thresholds by feature
        fs = fb[idx]
        for j in np.unique(fs):
            a, b = np.searchsorted(fs, j, side="left"), np.searchsorted(fs, j, side="right")
            sel = idx[a:b]
            cuts[sel] = np.searchsorted(self._uniq[j], tflat[sel], side="right")
        cuts = cuts.reshape(thr.shape)
        blk = nodes[:, None] * m + np.arange(m)[None, :]  # (E, m) level block ids
        base = blk * stride
        bounds = np.empty((n_eval, m, nb + 1), dtype=np.int64)
        bounds[:, :, 0] = base
        bounds[:, :, 1:nb] = base[:, :, None] + cuts
        bounds[:, :, nb] = base + stride
        pos = np.searchsorted(bc_s, bounds.ravel(), side="left")
        vals = self._sorted_stats()
        if counts_only:  # weighted row counts: column 0 (regression) or the class sum
            vals = (vals[:, :1] if self.config.task == "regression"
                    else vals.sum(axis=1, keepdims=True))
            S = 1
        # bins are consecutive runs of the sorted order and nodes ascend, so pos is monotone:
        # one reduceat gives every bin's sum ([pos_i, pos_i+1)); empty runs are zeroed below
        sums = np.add.reduceat(vals, pos, axis=0).reshape(n_eval, m, nb + 1, S)[:, :, :nb]
        p3 = pos.reshape(n_eval, m, nb + 1)
        empty = (p3[:, :, 1:] <= p3[:, :, :-1]) | (feats < 0)[:, :, None]
        sums[empty] = 0.0
        return sums

    def _sorted_stats(self) -> np.ndarray:
        """Weighted row statistics in the level's sorted order, plus a zero sentinel row."""
        S = self.config.n_stats
        _, _, rows, w8 = self._sorted  # type: ignore[misc]
        w = w8.astype(np.float64)
        n = w.size
        if self.config.task == "regression":
            vals = np.empty((n + 1, S))  # the sentinel row: pos may equal len(rows)
            yv = np.take(self._y, rows)
            np.copyto(vals[:-1, 0], w)
            np.multiply(w, yv, out=vals[:-1, 1])
            np.multiply(vals[:-1, 1], yv, out=vals[:-1, 2])
            vals[-1] = 0.0
        else:
            vals = np.zeros((n + 1, S))
            vals[np.arange(n), np.take(self._y, rows)] = w
        return vals

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
        hist = self._hist(nodes, feats, thr, counts_only=mode == "count")
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


def stats_kinds(config: JobConfig) -> tuple[StatKind, ...]:
    """Kinds of the statistics axis for this job."""
    if config.task == "regression":
        return (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)
    return (StatKind.COUNT,) * config.n_classes


def totals_block(config: JobConfig, n_nodes: int) -> Block:
    return Block("totals", (n_nodes, config.n_stats), stats_kinds(config))
