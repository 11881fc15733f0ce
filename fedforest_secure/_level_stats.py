"""A client's statistics over a level's sorted order (the worker's side of every round).

The worker sorts the level's (pair, feature slot) entries once per level
(:class:`~fedforest_secure._order.LevelOrder`); every answer of the level is read off that
order: the per-bin histograms of the histogram round (each block's entries walk once through
its thresholds), the weighted quantile sketch, the distinct values of the exact method, and
the local Top-L ranking of AvgImp. The walks over the order are compiled loops
(:func:`~fedforest_secure._jit.kernel`). Feature values are compared through the client's exact
integer codes (:class:`CodeBook`), so ``x <= t`` is decided exactly for any threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _impurity
from ._jit import kernel
from ._layouts import categorical_cuts
from ._order import LevelOrder
from ._splits import candidate_lefts
from .config import JobConfig

__all__ = ["CodeBook", "LevelStatistics", "local_gains", "local_left_counts"]


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

    def quantile_points(self, feats: np.ndarray, n_points: int, rows_per_point: int
                        ) -> np.ndarray:
        """Weighted quantile points Q(b/B_k), b = 0..B_k, per (node, slot); NaN-padded.

        Categorical slots get no points. With ``rows_per_point`` r >= 1 (adaptive B), a block
        of w rows gets at most w // r points, none below r rows. Blocks are processed in runs
        of a bounded number of entries, so the scratch memory does not grow with the level.
        """
        n_nodes, m = feats.shape
        nblk = n_nodes * m
        out = np.full((nblk, n_points + 1), np.nan)
        order = self.order
        if order.size == 0:
            return out.reshape(n_nodes, m, n_points + 1)
        # block boundaries by search (nblk queries), not by a pass over every entry
        edges = order.all_edges()
        cont = np.array([k == "continuous" for k in self.config.kinds])
        fl = feats.reshape(-1)
        wanted = cont[fl.clip(0)] & (fl >= 0)
        book = self.book
        for b0, b1 in order.chunks(edges):
            e0, e1 = int(edges[b0]), int(edges[b1])
            if e1 == e0:
                continue
            key, code, _, w = order.fields(e0, e1)
            _quantile_rows(edges[b0:b1] - e0, edges[b0 + 1:b1 + 1] - e0, fl[b0:b1],
                           wanted[b0:b1], key, order.shift, order.cbits, code, w,
                           book.uniq_all, book.uniq_off, book.missing_code,
                           self.config.has_missing, int(n_points), int(rows_per_point),
                           out[b0:b1])
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
                  counts_only: bool = False, missing_bin: bool = False) -> np.ndarray:
        """Per (evaluated node, slot, bin) statistics; bin b holds rows with t_{b-1} < x <= t_b.

        Every entry of the level order gets its bin, the number of its block's thresholds
        below its value (a block's entries ascend, so one walk through its thresholds finds
        them all), and adds its weighted statistics there: a bin's sum adds its rows one by
        one in the order's sequence. ``nodes`` are the positions of the evaluated nodes in
        ``order`` (ascending).
        With ``missing_bin`` the rows missing the slot's feature (their code sorts after every
        value) fill one more bin at the end and no other; without it they are left out.
        """
        if missing_bin or self.config.has_missing:
            # a last cut at +inf maps to the missing code: the bins after it hold the missing
            # rows only, whatever the thresholds
            thr = np.concatenate([thr, np.full(thr.shape[:2] + (1,), np.inf)], axis=2)
            out = self._histogram(nodes, feats, thr, counts_only)
            return out if missing_bin else out[:, :, :-1]
        return self._histogram(nodes, feats, thr, counts_only)

    def _histogram(self, nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray,
                   counts_only: bool) -> np.ndarray:
        order = self.order
        n_eval, m = feats.shape
        nb = thr.shape[2] + 1
        S = 1 if counts_only else self.config.n_stats
        blk = (nodes[:, None] * m + np.arange(m)[None, :]).ravel()  # evaluated block ids
        out = np.zeros((blk.size, nb, S))
        if blk.size == 0 or order.size == 0:
            return out.reshape(n_eval, m, nb, S)
        # block starts/ends of the evaluated blocks (nodes ascend, so blocks do too)
        starts, ends = order.block_edges(blk)
        thr2 = np.ascontiguousarray(thr.reshape(blk.size, nb - 1), dtype=np.float64)
        # the feature whose values the block holds; -1: a slot left out (Top-L), no sums
        fl = np.where(feats.reshape(-1) < 0, -1, order.feats.reshape(-1)[blk])
        mode = 0 if counts_only else 1 if self.config.task == "regression" else 2
        y = self.y.astype(np.float64)
        book = self.book
        edges = np.append(starts, ends[-1])
        for i0, i1 in order.chunks(edges):
            e0 = int(starts[i0])
            e1 = int(ends[i1 - 1])
            if e1 <= e0:
                continue
            key, code, rows, w = order.fields(e0, e1)
            _bin_sums(starts[i0:i1] - e0, ends[i0:i1] - e0, fl[i0:i1], thr2[i0:i1], key,
                      order.shift, order.cbits, order.row_mask, code, rows, w, book.uniq_all,
                      book.uniq_off, book.missing_code, y, mode, out[i0:i1])
        return out.reshape(n_eval, m, nb, S)

def _bin_sums_py(starts: np.ndarray, ends: np.ndarray, feat: np.ndarray, thr: np.ndarray,
                 key: np.ndarray, shift: int, cbits: int, rmask: int, code: np.ndarray,
                 rows: np.ndarray, w: np.ndarray, uniq_all: np.ndarray, uniq_off: np.ndarray,
                 n_codes: np.ndarray, y: np.ndarray, mode: int, out: np.ndarray) -> None:
    """Per-bin sums of blocks ``[starts[i], ends[i])`` of a run of the level order.

    Block i holds the values of feature ``feat[i]`` (-1: skipped) in ascending order, so its
    entries walk through its sorted thresholds ``thr[i]`` once: an entry's bin is the number
    of thresholds below its value, a missing value (code ``>= n_codes``) goes past all of
    them. ``mode`` 0 sums the weights into ``out[i, bin, 0]``; 1 (regression) the weight,
    weight x y and weight x y x y; 2 (classes) the weight into the entry's class column.
    A bin adds its rows one by one in the order's sequence. Entries come as packed ``key``
    (when not empty) or as ``code``, ``rows`` and ``w`` (:meth:`LevelOrder.fields`).
    """
    nblk, width = thr.shape
    packed = key.size > 0
    cmask = (1 << cbits) - 1
    for i in range(nblk):
        f = feat[i]
        if f < 0:
            continue
        off = uniq_off[f]
        mc = n_codes[f]
        b = 0
        cur = -1  # the bin being summed: a block's bins come one after the other
        a0 = 0.0
        a1 = 0.0
        a2 = 0.0
        for e in range(starts[i], ends[i]):
            if packed:
                k = key[e]
                c = (k >> shift) & cmask
                row = (k >> 8) & rmask
                wt = float(k & 255)
            else:
                c = np.int64(code[e])
                row = np.int64(rows[e])
                wt = float(w[e])
            if c >= mc:
                b = width
            else:
                x = uniq_all[off + c]
                while b < width and thr[i, b] < x:
                    b += 1
            if mode == 2:
                out[i, b, int(y[row])] += wt
                continue
            if b != cur:
                if cur >= 0:
                    out[i, cur, 0] = a0
                    if mode == 1:
                        out[i, cur, 1] = a1
                        out[i, cur, 2] = a2
                cur = b
                a0 = 0.0
                a1 = 0.0
                a2 = 0.0
            a0 += wt
            if mode == 1:
                yv = y[row]
                wy = wt * yv
                a1 += wy
                a2 += wy * yv
        if cur >= 0:
            out[i, cur, 0] = a0
            if mode == 1:
                out[i, cur, 1] = a1
                out[i, cur, 2] = a2


_bin_sums = kernel(_bin_sums_py)


def _quantile_rows_py(starts: np.ndarray, ends: np.ndarray, feat: np.ndarray,
                      wanted: np.ndarray, key: np.ndarray, shift: int, cbits: int,
                      code: np.ndarray, w: np.ndarray, uniq_all: np.ndarray,
                      uniq_off: np.ndarray, n_codes: np.ndarray, has_missing: bool,
                      n_points: int, r: int, out: np.ndarray) -> None:
    """Weighted quantile points of blocks ``[starts[i], ends[i])`` (where ``wanted``) into
    ``out[i]`` (NaN-filled): ``Q(b / B_k)`` for ``b = 0..B_k`` is the first entry whose
    cumulative weight within the block reaches the integer ``ceil(b n / B_k)`` (at least 1),
    with ``B_k = min(n // r, n_points)`` for ``r >= 1`` (no point below ``r`` rows), else
    ``n_points``. Missing values (code ``>= n_codes``, at the end of a block) are left out.
    Entries come as packed ``key`` (when not empty) or as ``code`` and ``w``.
    """
    nblk = starts.size
    packed = key.size > 0
    cmask = (1 << cbits) - 1
    for i in range(nblk):
        if not wanted[i]:
            continue
        s0 = starts[i]
        e1 = ends[i]
        f = feat[i]
        if has_missing:
            mc = n_codes[f]
            while e1 > s0 and (int((key[e1 - 1] >> shift) & cmask) if packed
                               else int(code[e1 - 1])) >= mc:
                e1 -= 1
        if e1 <= s0:
            continue
        bw = 0
        for e in range(s0, e1):
            bw += int(key[e] & 255) if packed else int(w[e])
        bk = n_points
        if r >= 1:
            bk = min(bw // r, n_points)
            if bk < 1:
                continue
        off = uniq_off[f]
        e = s0
        cw = int(key[e] & 255) if packed else int(w[e])
        for b in range(bk + 1):
            target = max((b * bw + bk - 1) // bk, 1)
            while cw < target and e < e1 - 1:
                e += 1
                cw += int(key[e] & 255) if packed else int(w[e])
            c = int((key[e] >> shift) & cmask) if packed else int(code[e])
            out[i, b] = uniq_all[off + c]


_quantile_rows = kernel(_quantile_rows_py)


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
