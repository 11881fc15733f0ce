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

from ._answered import AnsweredRounds
from ._bootstrap import canonical_order, row_keys, tree_pairs
from ._disclosures import MAX_SKETCH_POINTS as MAX_SKETCH_POINTS
from ._disclosures import check_sketch_size, profile_disclosures, sketch_items
from ._grid_stats import bin_statistics, bin_statistics_shape, classes_of, columns_of, zeros_after
from ._layouts import CLASS_TOTALS_BLOCK
from ._level_pairs import by_node, group_pairs, node_totals, order_positions
from ._level_stats import CodeBook, LevelStatistics, local_gains, local_left_counts
from ._order import LevelOrder
from ._routing import route
from ._site_table import check_level_codes, checked_rows, encode_features, row_statistics
from ._site_table import frequency_weights as _frequency_weights  # noqa: F401  (re-exported)
from ._task_checks import (
    bounded_question,
    check_class_totals,
    check_feature_slots,
    check_level_nodes,
    check_random_root,
    check_reply_kinds,
    check_sketch_grid,
    group_arrays,
    histogram_arrays,
    level_features,
    level_node_cap,
    sketch_n_nodes,
)
from .config import JobConfig
from .errors import ProtocolError, RefusedRequest
from .privacy.profile import with_profile_defaults
from .protocol import Reply, Task, TaskKind, check_task_form, layout_size

__all__ = ["Worker", "client_seed"]

#: with ``keep_level_order=None``, a worker keeps its level order between rounds as is while it
#: takes at most KEEP_FULL_BYTES, compact while that takes at most KEEP_ORDER_BYTES, and
#: re-sorts otherwise (in-process federations hold K of them)
KEEP_FULL_BYTES = 24 << 20
KEEP_ORDER_BYTES = 32 << 20
#: a histogram round of an unsorted level sorts its entries when it asks fewer than 1 /
#: SORT_RATIO thresholds per (pair, slot) entry (measured: the sort costs about as much per
#: entry as the search, and each threshold about as much again)
SORT_RATIO = 1.25


def client_seed(config: JobConfig, client_index: int) -> np.random.SeedSequence:
    """The seed of a client's own randomness (its bootstrap), derived from the job's seed."""
    return np.random.SeedSequence([config.random_state, 0xC1, client_index])


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
        X, y, weights = checked_rows(config, X, y, sample_weight)
        if not 0 <= client_index < config.n_clients:
            raise ValueError(f"client_index must be in [0, {config.n_clients})")
        self.config = config
        self.client_index = int(client_index)
        # every setting the job's profile leaves out at PrivacyProfile's default (h_splits
        # "off", rows_per_sketch_point 1, ...), as a site's pin check reads it
        self._profile = with_profile_defaults(config.profile)
        n = X.shape[0]
        self.n_rows = n
        # row statistics: one contiguous row per statistic, one column per sample
        self._y, self._stats_cm = row_statistics(config, y)
        check_level_codes(config, X)
        # the table itself is not kept: codes and distinct values answer every question
        # (uniq[j] is a view into uniq_all; codes feature-major: code of (j, row) at j * n + row)
        book, self._codes = encode_features(X)
        self._uniq, self._uniq_all = book.uniq, book.uniq_all
        self._uniq_off, self._cbits = book.uniq_off, book.cbits
        self._rbits = int(n).bit_length() + 8  # row index and bootstrap weight (8 bits)
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
        #: the most nodes the current level can have (:func:`~._task_checks.level_node_cap`)
        self._level_nodes = T
        self._sorted: LevelOrder | None = None
        self._level_feats: np.ndarray | None = None
        self._group: np.ndarray | None = None  # nodes of the current order (None: the level)
        self._sketched_level: int | None = None  # level whose sketch round was answered
        self._node_ptr: np.ndarray | None = None  # start of each node's pairs (node order)
        self._answers = AnsweredRounds(config, keep_last_reply)  # rounds and questions answered
        self._keep_order = keep_level_order
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
        """The row statistics summed per node over the active pairs, shape (n_nodes, n_stats)."""
        return node_totals(self.config, self._stats_cm, self._p_row, self._p_node, self._p_w,
                           n_nodes)

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
    def handle(self, task: Task, *, digests: tuple[bytes, bytes] | None = None,
               into: np.ndarray | None = None) -> Reply:
        """Answer one task. Answering the same round twice returns the same reply.

        ``digests``: the task's ``(digest(), question_digest())`` when the caller already
        computed them for this very task object (an in-process federation hands one task to
        every client); otherwise they are computed here.
        ``into``: the round's running sum of the clients before this one (in process). A
        worker that keeps no reply may add its histogram to it (the floats of adding its
        vector) and return an empty vector; otherwise its vector is to be added.
        """
        if task.job_id != self.config.job_id:
            raise ProtocolError("task belongs to another job")
        digest = task.digest() if digests is None else digests[0]
        replayed = self._answers.replay(task.round_id, digest)
        if replayed is not None:
            return replayed
        self._check_disclosures(task)
        check_task_form(task)  # no unused field, no wrong type: the question key is exact
        check_feature_slots(self.config, task)  # the plan's slots: one noisy copy per feature
        question = task.question_digest() if digests is None else digests[1]
        # thresholds beyond the public bounds cut nothing: the same question without them
        question = bounded_question(self.config, task, question)
        slots = self._answers.check_new(task, question)
        size = layout_size(task.layout)
        added = False  # whether the histogram was added to ``into``
        if task.kind == TaskKind.SKETCH:
            reply = self._sketch(task)
        elif task.kind == TaskKind.HISTOGRAM:
            # a kept reply must hold its vector (a retried round gets it again)
            fuse = into is not None and into.shape == (size,) and not self._answers.keeps_reply
            reply, added = self._histogram(task, into if fuse else None)
        else:  # pragma: no cover - enum is closed
            raise ProtocolError(f"unknown task kind {task.kind}")
        if not added and reply.summable.shape != (size,):
            raise ProtocolError("reply does not match the task layout")
        check_reply_kinds(self.config, task, size)  # kinds decide the noise
        self._answers.answered(task.round_id, digest, reply)
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
        self._answers.counted(task, question, slots)
        return reply

    def allowed_disclosures(self) -> set[str]:
        """What this client's own profile lets it disclose beyond sums.

        Without secure aggregation the profile is open about per-client statistics. With it,
        only what the profile names: quantile sketches (``sketch = "quantiles"``) and, with
        ``h_splits = "clear"`` (``"noisy"`` under DP: noised), per-client node summaries.
        Anything else is refused, whatever the task asks (a malicious server cannot widen the
        disclosure). ``h_splits = "off"`` refuses node summaries in every profile.
        """
        return profile_disclosures(self._profile)

    def _check_disclosures(self, task: Task) -> None:
        extra = set(task.disclose) - self.allowed_disclosures()
        if extra:
            raise RefusedRequest(f"the privacy profile {self._profile.get('name', '?')!r} "
                                 f"forbids disclosing {sorted(extra)}", code="disclosure")

    # ------------------------------------------------------------------ sketch round
    def _sketch(self, task: Task) -> Reply:
        level = task.level
        n_nodes = sketch_n_nodes(task)
        check_sketch_grid(task)
        if "nodes" in task.arrays:
            return self._sketch_group(task, n_nodes)
        feats = level_features(task, n_nodes, self.config.n_features)
        if level == self._sketched_level:
            # the level's node totals again (routing, which the client does not redo, or a
            # sketch setting changed): a question answered already
            raise RefusedRequest(f"the sketch of level {level} was already answered; a second "
                                 "one re-asks its node totals, which could isolate a client by "
                                 "differencing", code="question_reused")
        # before the routing: a refused task leaves the client at its level
        check_sketch_size(task, self.config.n_bins)
        routes = level == self._level + 1
        if not routes and (level != self._level or (level == 0 and "route_kind" in task.arrays)):
            raise ProtocolError(f"sketch for level {level} but this client is at level "
                                f"{self._level}; replay the earlier sketch tasks first")
        # the level's nodes before anything is sized by them
        cap = level_node_cap(task, self._level_nodes, routes=routes)
        check_level_nodes(task, n_nodes, cap)
        if routes:
            self._route(task)
            self._level, self._level_nodes = level, cap
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
            sketched = self._check_sketch(task, np.arange(n_nodes), feats)
            order = self._sort_level(feats)
            counts = np.bincount(self._p_node, weights=self._p_w, minlength=n_nodes)
            disclosed.update(sketch_items(task, self._level_stats(order), feats, counts,
                                          self._profile))
            if sketched is not None:
                self._answers.count_sketch(level, sketched)
        self._sketched_level = level
        summable = totals.ravel() if task.params.get("totals", True) else np.zeros(0)
        if "grid_thresholds" in task.arrays:
            # the level's first histogram in the same round (after routing and abstention)
            if feats is not None:
                raise ProtocolError("a sketch task sorts the level or asks a histogram, "
                                    "not both")
            nodes, gfeats, thr, mode = histogram_arrays(task, self._n_nodes,
                                                        self.config.n_features, "grid_")
            if mode == "gain":
                raise ProtocolError("a sketch task asks histograms of statistics only")
            # written into the reply's vector after the totals: the two are not concatenated
            shape = bin_statistics_shape(gfeats, thr, columns_of(mode), classes_of(self.config))
            summable, grid = zeros_after(summable, shape)
            self._unsorted_histogram(nodes, gfeats, thr, mode, out=grid)
        return Reply(round_id=task.round_id, summable=summable, disclosed=disclosed)

    def _sketch_group(self, task: Task, n_nodes: int) -> Reply:
        """The sketch of some of the level's nodes, after the level's routing round.

        The coordinator may evaluate a level's nodes in groups (each group a sketch round and
        a histogram round): the task lists the group's nodes (``nodes``, ascending) and their
        features, one row per listed node. Nothing is routed, no abstention is decided again
        and no node totals are sent (the level's sketch round sent them); the level order is
        built for the group's pairs only.
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
        if task.params.get("totals", True):
            # the level's sketch round released them (the coordinator sends totals: false)
            raise ProtocolError("a node group's sketch asks no node totals: the level's sketch "
                                "round released them; asking them again could isolate a "
                                "client by differencing")
        nodes, feats = group_arrays(task, n_nodes, self.config.n_features)
        sketched = self._check_sketch(task, nodes, feats)
        check_sketch_size(task, self.config.n_bins)
        loc, row, w = self._group_pairs(nodes)
        counts = np.bincount(loc, weights=w, minlength=nodes.size)
        order = self._sort_level(feats, nodes, (loc, row, w))
        del loc, row, w
        disclosed = sketch_items(task, self._level_stats(order), feats, counts, self._profile)
        if sketched is not None:
            self._answers.count_sketch(task.level, sketched)
        return Reply(round_id=task.round_id, summable=np.zeros(0), disclosed=disclosed)

    def _check_sketch(self, task: Task, nodes: np.ndarray, feats: np.ndarray
                      ) -> np.ndarray | None:
        """Where ``task`` discloses sketches (points or a top-L ranking), refuse those of a
        (node, feature) disclosed before at the level and return the pairs' keys; else None."""
        if not {"sketch_points", "top_l"} & set(task.disclose):
            return None
        return self._answers.check_sketch(task.level, nodes, np.asarray(feats))

    def _group_pairs(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pairs of the listed nodes (ascending): their position in ``nodes``, rows and
        weights, in the pairs' order.

        On the level's first call the pairs are put in node order (a stable sort: the pairs
        of one node keep their order, so every per-node sum is unchanged); a group is then
        one slice of them.
        """
        if self._node_ptr is None:
            self._p_node, self._p_row, self._p_w, self._node_ptr = by_node(
                self._p_node, self._p_row, self._p_w, self._n_nodes)
        return group_pairs(self._p_node, self._p_row, self._p_w, self._node_ptr, nodes)

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
        return order, order_positions(order, self._group, feats, nodes)

    # ------------------------------------------------------------------ histogram round
    def _histogram(self, task: Task, into: np.ndarray | None = None) -> tuple[Reply, bool]:
        """The histogram round's reply, and whether it was added to ``into`` instead
        (:meth:`handle`, :meth:`LevelStatistics.add_histogram`)."""
        if task.level != self._level:
            raise ProtocolError(f"histogram for level {task.level}, client is at {self._level}")
        nodes, feats, thr, mode = histogram_arrays(task, self._n_nodes, self.config.n_features)
        if nodes.size and thr.shape[2] == 0:
            # one bin per slot: the nodes' totals, which the level's sketch round released
            # (the coordinator always sends thresholds, +inf padded where a slot has none)
            raise ProtocolError("a histogram without thresholds asks the level's node totals "
                                "again; refusing (it could isolate a client by differencing)")
        check_random_root(self.config, task, nodes)
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
            stats = self._level_stats(order)
            if (into is not None and mode in ("full", "moments", "count")
                    and not any(b.name == CLASS_TOTALS_BLOCK for b in task.layout)
                    and stats.add_histogram(local, feats, thr, into,
                                            counts_only=mode == "count",
                                            moments=mode == "moments")):
                return Reply(round_id=task.round_id, summable=np.zeros(0)), True
            hist = stats.histogram(local, feats, thr, counts_only=mode == "count",
                                   missing_bin=missing_bin, moments=mode == "moments")
        vec = hist
        if mode == "gain":
            g = local_gains(hist, self.config)
            vec = np.stack([g, local_left_counts(hist, self.config)], axis=-1)
        summable = np.ascontiguousarray(vec).ravel()
        if any(b.name == CLASS_TOTALS_BLOCK for b in task.layout):
            summable = np.concatenate([summable, self._class_totals(task, nodes, mode)])
        return Reply(round_id=task.round_id, summable=summable), False

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

        a = class_totals_scale(self.config)
        check_class_totals(self.config, task, mode, a)
        totals = self._node_totals(self._n_nodes)[nodes].sum(axis=0)
        out: np.ndarray = float(a) * totals
        return out

    def _unsorted_histogram(self, nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray,
                            mode: str, missing_bin: bool = False,
                            out: np.ndarray | None = None) -> np.ndarray:
        """Per-bin statistics of a level the sketch round did not sort, by whichever costs less
        (the same sums): with fewer thresholds than about SORT_RATIO x the (pair, slot)
        entries, sort the evaluated nodes' entries for this round only (every bin is then a
        segment of the order, see :meth:`LevelStatistics.histogram`); else one pass over the
        pairs, a binary search among its own block's thresholds per entry
        (:func:`~fedforest_secure._grid_stats.bin_statistics`). With ``out`` (zeros of the
        result's shape) the statistics are returned in it: the one pass writes them there, the
        sorted order's histogram is copied in."""
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
            if out is None:
                return hist
            out[...] = hist  # this path's one copy
            return out
        return bin_statistics(self._p_node, self._p_row, self._p_w, self._n_nodes, nodes,
                              feats, thr, self._codes, self.n_rows, self._uniq_all,
                              self._uniq_off, self._y, columns_of(mode), classes_of(self.config),
                              has_missing=self.config.has_missing, missing_bin=missing_bin,
                              out=out)
