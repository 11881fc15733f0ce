"""A client's statistics over a level's sorted order (the worker's side of every round).

The worker sorts the level's (pair, feature slot) entries once per level
(:class:`~fedforest_secure._order.LevelOrder`); every answer of the level is read off that
order: the per-bin histograms of the histogram round (each bin a contiguous run, summed by
``np.add.reduceat``), the weighted quantile sketch, the distinct values of the exact method,
and the local Top-L ranking of AvgImp. Feature values are compared through the client's exact
integer codes (:class:`CodeBook`), so ``x <= t`` is decided exactly for any threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _impurity, _kernels
from ._layouts import categorical_cuts
from ._order import LevelOrder, first_reaching
from ._splits import candidate_lefts
from .config import JobConfig

__all__ = ["CodeBook", "LevelStatistics", "local_gains", "local_left_counts"]

#: a run of blocks places its entries among the thresholds (a binary search per entry)
#: rather than the thresholds among the entries (a search per threshold) when its finite
#: thresholds outnumber its entries times this; both give the same bins
ENTRY_SEARCH_RATIO = 0.5


@dataclass(frozen=True)
class CodeBook:
    """A client's exact integer codes: the code of a value is its rank among the client's
    distinct values of that feature.

    ``uniq_all`` holds every feature's distinct values, feature ``j``'s at
    ``uniq_off[j]:uniq_off[j + 1]`` (``uniq[j]`` is a view). Codes of block ``b`` of a level
    order live in ``[b << cbits, (b + 1) << cbits)``.
    """

    uniq: list[np.ndarray]
    uniq_all: np.ndarray
    uniq_off: np.ndarray
    cbits: int

    @property
    def stride(self) -> int:
        return 1 << self.cbits

    @property
    def missing_code(self) -> np.ndarray:
        """(d,) the code of a missing value per feature: one past the feature's last distinct
        value, so missing entries sort at the end of every block."""
        sizes: np.ndarray = np.diff(self.uniq_off).astype(np.int64)
        return sizes


class LevelStatistics:
    """The client's answers over one level order (module docstring).

    Parameters
    ----------
    order : the level's (or a node group's) sorted order
    config : the job's configuration
    y : array of shape (n_k,), the client's targets (class codes for classification)
    book : the client's integer codes
    """

    def __init__(self, order: LevelOrder, config: JobConfig, y: np.ndarray,
                 book: CodeBook) -> None:
        self.order = order
        self.config = config
        self.y = y
        self.book = book
        self._y64: np.ndarray | None = None  # y as doubles, for the compiled histogram

    def quantile_points(self, feats: np.ndarray, n_points: int, rows_per_point: int
                        ) -> np.ndarray:
        """Weighted quantile points Q(b/B_k), b = 0..B_k, per (node, slot); NaN-padded.

        Categorical slots get no points. With ``rows_per_point`` r >= 1 (adaptive B), a block
        gets B_k = min(n_points, c // r) intervals, none where that is 0: c is its distinct
        rows (its entries, whatever their weights) with r >= 2, its weighted rows with r = 1.
        Blocks are processed in runs of a bounded number of entries, so the scratch memory
        does not grow with the level.
        """
        n_nodes, m = feats.shape
        nblk = n_nodes * m
        order = self.order
        compiled = _kernels.KERNELS is not None and order.size > 0
        # the compiled loop writes every slot (NaN where a block has no such point)
        out = np.empty((nblk, n_points + 1)) if compiled else np.full((nblk, n_points + 1),
                                                                          np.nan)
        if order.size == 0:
            return out.reshape(n_nodes, m, n_points + 1)
        # block boundaries by search (nblk queries), not by a pass over every entry
        edges = order.all_edges()
        cont = np.array([k == "continuous" for k in self.config.kinds])
        fl = feats.reshape(-1)
        wanted = cont[fl.clip(0)] & (fl >= 0)
        r = rows_per_point
        if compiled and _kernels.KERNELS is not None:  # every block in one pass, in place
            (code, cs, cm), _, (w, ws, wm) = order.fields()
            book = self.book
            missing = book.missing_code if self.config.has_missing else np.empty(0, np.int64)
            _kernels.KERNELS.sketch_values(
                w, ws, wm, code, cs, cm, _kernels.i64(edges),
                wanted.astype(np.int64), _kernels.i64(fl),
                _kernels.i64(book.uniq_off),
                _kernels.f64(book.uniq_all),
                _kernels.i64(missing), out, n_points, r)
            return out.reshape(n_nodes, m, n_points + 1)
        for b0, b1 in order.chunks(edges):
            e0, e1 = int(edges[b0]), int(edges[b1])
            if e1 == e0:
                continue
            start, end = edges[b0:b1] - e0, edges[b0 + 1:b1 + 1] - e0
            if self.config.has_missing:  # the sketch ignores missing values
                blk = np.arange(b0, b1, dtype=np.int64)
                mcode = self.book.missing_code[fl[b0:b1].clip(0)]
                end = np.minimum(end, order.search((blk << self.book.cbits) | mcode, e0, e1))
                end = np.maximum(end, start)
            fslots = fl[b0:b1]
            w = order.weights(e0, e1)
            cw0 = np.empty(w.size + 1, dtype=np.int64)  # cumulative weights, 0 first
            cw0[0] = 0
            np.cumsum(w, out=cw0[1:])
            cw = cw0[1:]
            before = cw0[start]
            bw = cw0[end] - before
            present = np.flatnonzero((end > start) & wanted[b0:b1])
            # adaptive B: a sketch point summarises at least r rows (B_k <= c_k / r); with
            # r >= 2 c_k is the block's distinct rows (its entries: a row drawn several times,
            # or of frequency weight w, counts once), with r = 1 its weighted rows (the paper's
            # rule; a row of weight w as w copies; its points show at most its d_k values)
            bk = np.full(present.size, n_points, dtype=np.int64)
            if r >= 1:
                rows = (end - start)[present] if r >= 2 else bw[present]
                bk = np.minimum(rows // r, n_points)
                # fewer than r rows: no point at all (a lone min or max would be a record,
                # however often it was drawn)
                keep = bk >= 1
                present, bk = present[keep], bk[keep]
            # the points b = 0..B_k of every present block, one after the other (blocks with
            # few rows, the deep levels, have far fewer than n_points + 1)
            npt = bk + 1
            first = np.cumsum(npt)
            first -= npt
            bb = np.arange(int(first[-1] + npt[-1]) if npt.size else 0, dtype=np.int64)
            bb -= np.repeat(first, npt)
            # Q(b / B_k) is the first entry whose cumulative weight within the block reaches
            # b n / B_k (at least 1: Q(0) is the minimum), i.e. the integer ceil(b n / B_k):
            # exact integer arithmetic (as _sketch.client_quantiles), offset by the weight
            # before the block, so a block's points never depend on its neighbours
            # (where B_k equals the block's weight, the deep levels, that is b itself)
            bwp = bw[present].astype(np.int64)
            target = bb.copy()
            part = np.flatnonzero(np.repeat(bk != bwp, npt))
            if part.size:
                bkp = np.repeat(bk, npt)[part]
                t = bb[part] * np.repeat(bwp, npt)[part]
                t += bkp
                t -= 1
                t //= bkp
                target[part] = t
                del bkp, t
            np.maximum(target, 1, out=target)
            target += np.repeat(before[present].astype(np.int64), npt)
            idx = first_reaching(cw, target)
            del w, cw, target
            np.minimum(idx, np.repeat(end[present] - 1, npt), out=idx)
            idx += e0
            fslot = fslots[present]
            code = order.codes_at(idx)
            code += np.repeat(self.book.uniq_off[fslot], npt)
            bb += np.repeat((b0 + present) * (n_points + 1), npt)  # flat slot in out
            out.ravel()[bb] = self.book.uniq_all[code]
        return out.reshape(n_nodes, m, n_points + 1)

    def unique_values(self, feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distinct values per (node, slot) in CSR form (the exact method's disclosure)."""
        order = self.order
        nblk = feats.size
        if order.size == 0:
            return np.zeros(nblk + 1, dtype=np.int64), np.zeros(0)
        bc_s = order.block_codes()
        new = np.ones(bc_s.size, dtype=bool)
        new[1:] = bc_s[1:] != bc_s[:-1]
        ub, uc = bc_s[new] >> self.book.cbits, bc_s[new] & (self.book.stride - 1)
        fslot = feats.reshape(-1)[ub]
        present = uc < self.book.missing_code[fslot]  # a missing value is no value
        ub, uc, fslot = ub[present], uc[present], fslot[present]
        vals = self.book.uniq_all[self.book.uniq_off[fslot] + uc]
        ptr = np.concatenate([[0], np.cumsum(np.bincount(ub, minlength=nblk))])
        return ptr.astype(np.int64), vals

    def top_l(self, feats: np.ndarray, pts: np.ndarray, top_l: int) -> np.ndarray:
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
        hist = self.histogram(np.arange(n_nodes), feats,
                              categorical_cuts(thr, feats, cat, self.config.levels),
                              missing_bin=self.config.has_missing)
        gain = local_gains(hist, self.config)
        best = np.where(np.isfinite(gain), gain, -np.inf).max(axis=2)  # (n_nodes, m)
        best[feats < 0] = -np.inf
        ranked = np.argsort(-best, axis=1, kind="stable")[:, :top_l]
        return ranked.astype(np.int64)

    def histogram(self, nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray,
                  counts_only: bool = False, missing_bin: bool = False,
                  moments: bool = False) -> np.ndarray:
        """Per (evaluated node, slot, bin) statistics; bin b holds rows with t_{b-1} < x <= t_b.

        Every entry of the level order gets its bin, the number of its block's thresholds
        below its value, and each statistic is one ``np.bincount`` over (block, bin): a bin's
        sum adds its rows one by one in the order's sequence, whatever finds the bins.
        Where a block has more thresholds than rows (the deep levels) the entries are placed
        among the thresholds (:meth:`_bins_by_entries`); otherwise the thresholds are placed
        among the entries (:meth:`_bins_by_cuts`). ``nodes`` are the positions of the
        evaluated nodes in ``order`` (ascending).
        With ``missing_bin`` the rows missing the slot's feature (their code sorts after every
        value) fill one more bin at the end and no other; without it they are left out.
        With ``moments`` a regression histogram holds (n, sum y) only (the statistics a split's
        gain needs, :func:`~fedforest_secure._layouts.moments_block`).
        """
        S = 1 if counts_only else 2 if moments and self.config.task == "regression" \
            else self.config.n_stats
        if missing_bin or self.config.has_missing:
            # a last cut at +inf maps to the missing code: the bins after it hold the missing
            # rows only, whatever the thresholds
            thr = np.concatenate([thr, np.full(thr.shape[:2] + (1,), np.inf)], axis=2)
            out = self._histogram(nodes, feats, thr, S)
            return out if missing_bin else out[:, :, :-1]
        return self._histogram(nodes, feats, thr, S)

    def add_histogram(self, nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray,
                      total: np.ndarray, counts_only: bool = False, moments: bool = False
                      ) -> bool:
        """Add :meth:`histogram` to ``total`` (other clients' running sum, flat float64)
        by the compiled loop, each block summed apart and then added: the floats of ``total
        += histogram(...).ravel()``. False (``total`` untouched) where it does not apply:
        no compiled loops, missing values, an empty level, another size, a slot left out."""
        kernels = _kernels.KERNELS
        order = self.order
        n_eval, m = feats.shape
        S = 1 if counts_only else 2 if moments and self.config.task == "regression" \
            else self.config.n_stats
        size = n_eval * m * (thr.shape[2] + 1) * S
        if (kernels is None or self.config.has_missing or order.size == 0 or n_eval == 0
                or total.dtype != np.float64 or not total.flags.c_contiguous
                or not total.flags.writeable or total.shape != (size,)
                or ((feats < 0) & (order.feats[nodes] >= 0)).any()):
            return False
        blk = (nodes[:, None] * m + np.arange(m)[None, :]).ravel()
        self._histogram_compiled(blk, thr.reshape(blk.size, -1), S, into=total)
        return True

    def _histogram(self, nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray, S: int
                   ) -> np.ndarray:
        order = self.order
        n_eval, m = feats.shape
        nb = thr.shape[2] + 1
        counts_only = S == 1
        blk = (nodes[:, None] * m + np.arange(m)[None, :]).ravel()  # evaluated block ids
        # block starts/ends of the evaluated blocks (nodes ascend, so blocks do too)
        starts, ends = order.block_edges(blk)
        thr2 = thr.reshape(blk.size, nb - 1)
        if blk.size == 0 or order.size == 0:
            return np.zeros((n_eval, m, nb, S))
        if _kernels.KERNELS is not None:
            out = self._histogram_compiled(blk, thr2, S).reshape(n_eval, m, nb, S)
            if (feats < 0).any():
                out[feats < 0] = 0.0
            return out
        # row of each of the order's blocks among the evaluated ones (-1: not evaluated)
        row_of = np.full(order.feats.size + 1, -1, dtype=np.int64)
        row_of[blk] = np.arange(blk.size)
        edges = np.append(starts, ends[-1])
        table: _ThresholdTable | None = None
        runs = order.chunks(edges)
        sums: np.ndarray | None = None
        for i0, i1 in runs:
            e0 = int(starts[i0])
            e1 = int(ends[i1 - 1])
            if e1 <= e0:
                continue
            if (i1 - i0) * (nb - 1) > ENTRY_SEARCH_RATIO * (e1 - e0):
                table = table or _ThresholdTable(thr2)
                gbin, keep = self._bins_by_entries(row_of, table, e0, e1)
            else:
                gbin, keep = self._bins_by_cuts(blk[i0:i1], thr2[i0:i1], starts[i0:i1],
                                                ends[i0:i1], i0, e0, e1)
            gbin -= i0 * nb
            size = (i1 - i0) * nb * S
            if self.config.task == "regression" or counts_only:
                stats = self._sorted_stats(S, e0, e1, keep)
                if S == 1 or gbin.size >= size // S:
                    # one bincount per statistic, interleaved as the reply lays them out
                    part = np.empty(size)
                    for c in range(S):
                        part[c::S] = np.bincount(gbin, weights=stats[c], minlength=size // S)
                else:  # more bins than entries (deep levels): one bincount over (bin, stat)
                    gbin *= S
                    ids = np.empty(stats.shape, dtype=np.int64)
                    for c in range(S):
                        np.add(gbin, c, out=ids[c])
                    part = np.bincount(ids.ravel(), weights=stats.ravel(), minlength=size)
                    del ids
            else:  # class counts: each row adds its weight to its own class's column only
                gbin *= S
                rows = order.rows(e0, e1)
                w = order.weights(e0, e1).astype(np.float64)
                if keep is not None:
                    rows, w = rows[keep], w[keep]
                gbin += self.y[rows]
                part = np.bincount(gbin, weights=w, minlength=size)
            del gbin
            if len(runs) == 1:
                sums = part
            else:
                if sums is None:
                    sums = np.zeros(blk.size * nb * S)
                sums[i0 * nb * S:i1 * nb * S] = part
        out = (sums if sums is not None else np.zeros(blk.size * nb * S)).reshape(
            n_eval, m, nb, S)
        if (feats < 0).any():
            out[feats < 0] = 0.0
        return out

    def _histogram_compiled(self, blk: np.ndarray, thr2: np.ndarray, S: int,
                            into: np.ndarray | None = None) -> np.ndarray:
        """:meth:`_histogram`'s sums (flat) by the compiled loop over the evaluated blocks
        ``blk``: the same bins, and each bin's statistics added in the same sequence. With
        ``into`` (a running total, :meth:`add_histogram`) they are added to it, which is
        returned."""
        order, book = self.order, self.book
        nb = thr2.shape[1] + 1
        sums = np.zeros(blk.size * nb * S) if into is None else into
        kernels = _kernels.KERNELS
        if kernels is None:  # pragma: no cover - the caller checks
            return sums
        classes = self.config.task != "regression" and S > 1
        if self._y64 is None:
            self._y64 = _kernels.f64(self.y)
        missing = book.missing_code if self.config.has_missing else np.empty(0, np.int64)
        (code, cs, cm), (rows, rs, rm), (w, ws, wm) = order.fields()
        kernels.histogram_blocks(code, cs, cm, rows, rs, rm, w, ws, wm,
                                 _kernels.i64(order.all_edges()),
                                 _kernels.i64(blk),
                                 _kernels.i64(order.feats.reshape(-1)),
                                 _kernels.i64(book.uniq_off),
                                 _kernels.f64(book.uniq_all),
                                 _kernels.i64(missing),
                                 _kernels.f64(thr2), self._y64, sums,
                                 S, (1 if classes else 0) + (2 if into is not None else 0))
        return sums

    def _bins_by_entries(self, row_of: np.ndarray, table: _ThresholdTable, e0: int, e1: int
                         ) -> tuple[np.ndarray, np.ndarray | None]:
        """Global bin (evaluated row x bins + bin) of every evaluated entry of ``[e0, e1)``
        by a binary search of its value among its block's thresholds (all blocks at once),
        and which entries are evaluated (None: all)."""
        book = self.book
        bc = self.order.block_codes(e0, e1)
        b = bc >> book.cbits
        rows = row_of[b]
        keep: np.ndarray | None = None
        if (rows < 0).any():  # blocks of nodes not evaluated lie in between
            keep = rows >= 0
            rows, bc, b = rows[keep], bc[keep], b[keep]
        code = bc & (book.stride - 1)
        fb = self.order.feats.reshape(-1)[b]
        missing = code >= book.missing_code[fb] if self.config.has_missing else None
        code += book.uniq_off[fb]
        if missing is None:
            x = book.uniq_all[code]
        else:  # a missing value has no value: its bin is set below
            x = np.zeros(code.size)
            x[~missing] = book.uniq_all[code[~missing]]
        del bc, b, code, fb
        below = table.count_below(rows, x)
        if missing is not None:
            # past every threshold, the last one (+inf, added by :meth:`histogram`) included:
            # the missing rows' own bin
            below[missing] = table.width
        rows *= table.width + 1
        rows += below
        return rows, keep

    def _bins_by_cuts(self, blk: np.ndarray, thr2: np.ndarray, starts: np.ndarray,
                      ends: np.ndarray, i0: int, e0: int, e1: int
                      ) -> tuple[np.ndarray, np.ndarray | None]:
        """As :meth:`_bins_by_entries` for the evaluated blocks ``blk`` (rows ``i0``...),
        from the position of every threshold in the sorted order (thresholds mapped to the
        client's integer codes: ``x <= t`` iff ``code < cut``)."""
        book = self.book
        n, W = thr2.shape
        nb = W + 1
        fl = self.order.feats.reshape(-1)[blk]
        cut = np.empty((n, W), dtype=np.int64)
        for j in np.unique(fl):
            sel = np.flatnonzero(fl == j)
            t = thr2[sel].ravel()
            u = book.uniq[j]
            # searched in ascending order: numpy's binary search starts from the previous
            # answer, several times faster than the blocks' interleaved runs
            o = np.argsort(t)
            c = np.empty(t.size, dtype=np.int64)
            c[o] = np.searchsorted(u, t[o], side="right")  # +inf: past the last code
            cut[sel] = c.reshape(sel.size, W)
        np.minimum(cut, book.stride - 1, out=cut)
        cut += (blk << book.cbits)[:, None]
        # bin edges in the chunk: [start, cut_1, ..., cut_W, end] per block; entries between
        # the evaluated blocks (nodes not evaluated) fall in one extra bin that is dropped
        pos = np.empty((n, nb + 1), dtype=np.int64)
        pos[:, 1:nb] = self.order.search(cut.ravel(), e0, e1).reshape(n, W)
        pos[:, 0] = starts - e0
        pos[:, nb] = ends - e0
        runs = np.empty(n * (nb + 1), dtype=np.int64)  # bins, then the gap to the next block
        runs.reshape(n, nb + 1)[:, :nb] = np.diff(pos, axis=1)
        gap = runs.reshape(n, nb + 1)[:, nb]
        gap[:-1] = starts[1:] - ends[:-1]
        gap[-1] = 0
        ids = np.arange(n * (nb + 1), dtype=np.int64)
        ids -= ids // (nb + 1)  # bin j of row i is i * nb + j; a gap gets the next row's 0
        gbin = np.repeat(ids, runs)
        keep = None
        if gap.any():
            keep = np.repeat(np.arange(n * (nb + 1)) % (nb + 1) != nb, runs)
            gbin = gbin[keep]
        gbin += i0 * nb
        return gbin, keep

    def _sorted_stats(self, S: int, lo: int, hi: int,
                      keep: np.ndarray | None = None) -> np.ndarray:
        """The first ``S`` weighted row statistics (S, n) of entries ``[lo, hi)`` in the
        level's sorted order (those where ``keep``, if given): the weight, then, for
        regression, weight x y and weight x y^2. One contiguous row per statistic."""
        order = self.order
        w = order.weights(lo, hi)
        rows = None if S == 1 else order.rows(lo, hi)
        if keep is not None:
            w = w[keep]
            rows = None if rows is None else rows[keep]
        n = w.size
        out = np.empty((S, n))
        out[0] = w
        if rows is not None:
            yv = self.y[rows]
            np.multiply(out[0], yv, out=out[1])
            if S > 2:
                np.multiply(out[1], yv, out=out[2])
        return out


class _ThresholdTable:
    """Each row's sorted thresholds, padded with +inf to 2^k - 1 so that a branch-free binary
    search takes k halving steps and never leaves its row."""

    def __init__(self, thr2: np.ndarray) -> None:
        self.width = int(thr2.shape[1])
        self.steps = max(self.width.bit_length(), 1)
        self.stride = (1 << self.steps) - 1
        if self.stride == self.width:
            self.flat = np.ascontiguousarray(thr2).ravel()
        else:
            padded = np.full((thr2.shape[0], self.stride), np.inf)
            padded[:, : self.width] = thr2
            self.flat = padded.ravel()

    def count_below(self, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
        """For each value ``x[i]``, the number of thresholds of row ``rows[i]`` below it."""
        at = rows * self.stride
        at -= 1  # the last threshold below x found so far (its flat position)
        base = at.copy()
        hit = np.empty(x.size, dtype=bool)
        inc = np.empty_like(at)
        step = 1 << (self.steps - 1)
        while step:
            np.less(self.flat[at + step], x, out=hit)
            np.multiply(hit, step, out=inc)
            at += inc
            step >>= 1
        at -= base
        return at


def local_gains(hist: np.ndarray, config: JobConfig) -> np.ndarray:
    """n-weighted local gains per candidate split (the client's own CART gains), shape
    (E, m, C): the thresholds, and with missing values (``config.has_missing``, ``hist``
    with the missing-value bin) the candidates of :func:`~._splits.candidate_lefts`."""
    cfg = config
    left, total = candidate_lefts(hist, cfg.has_missing)
    right = total - left
    parent = _impurity.weighted_impurity(total, cfg.task, cfg.criterion)
    g = (parent - _impurity.weighted_impurity(left, cfg.task, cfg.criterion)
         - _impurity.weighted_impurity(right, cfg.task, cfg.criterion))
    nl = _impurity.counts_of(left, cfg.task)
    nr = _impurity.counts_of(right, cfg.task)
    return np.where((nl > 0) & (nr > 0), g, 0.0)


def local_left_counts(hist: np.ndarray, config: JobConfig) -> np.ndarray:
    """Weighted rows sent left by every candidate of :func:`local_gains`, shape (E, m, C)."""
    left, _ = candidate_lefts(hist, config.has_missing)
    out: np.ndarray = _impurity.counts_of(left, config.task)
    return out
