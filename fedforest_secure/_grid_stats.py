"""A client's per-bin statistics in one pass over its pairs (histogram rounds without a sort).

A histogram round gives, per evaluated (node, feature slot), sorted thresholds; a row of the
node falls in bin ``b`` when ``t_{b-1} < x <= t_b``. Here every (pair, slot) finds its bin by a
binary search among the thresholds of its own (node, slot) and adds its weighted statistics
there, in one compiled pass over the pairs per slot: cost proportional to the pairs, not to
the thresholds, and no sorted level order. The worker answers this way whenever the level's
sketch round did not ask it to sort the level (the secure pooled-CDF sketch, whose grids are
as fine as the nodes are large).

Values are compared as float64 (a row's value is its distinct value, looked up through its exact
integer code), so ``x <= t`` is decided exactly, as everywhere else.
"""

from __future__ import annotations

import numpy as np

from ._jit import kernel
from .errors import ProtocolError

__all__ = ["bin_statistics", "warm_kernels"]


def bin_statistics(node: np.ndarray, row: np.ndarray, weight: np.ndarray, n_nodes: int,
                   nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray, codes: np.ndarray,
                   n_rows: int, uniq_all: np.ndarray, uniq_off: np.ndarray, y: np.ndarray,
                   columns: str, n_classes: int = 0, *, has_missing: bool = False,
                   missing_bin: bool = False) -> np.ndarray:
    """Per (evaluated node, slot, bin) statistics of the level's pairs.

    Parameters
    ----------
    node, row, weight : (P,) the level's pairs: node index, row index, bootstrap multiplicity
    n_nodes : number of nodes of the level
    nodes : (E,) the evaluated nodes, ascending
    feats : (E, m) feature per slot, -1 for a slot left out (its bins stay zero)
    thr : (E, m, W) thresholds per slot, sorted, +inf padded
    codes : feature-major exact codes (``codes[j * n_rows + r]``)
    uniq_all, uniq_off : every feature's distinct values (feature ``j``'s at
        ``uniq_off[j]:uniq_off[j + 1]``)
    y : (n_rows,) targets (float, or class codes for classification)
    columns : "count" (weighted rows), "moments" (regression: weighted rows and sum of y),
        "full" (regression: rows, sum of y and sum of y^2; classification: class counts)
    n_classes : number of classes for classification, else 0
    has_missing : rows may miss a feature (their code is one past the feature's last
        distinct value, ``uniq_off[j + 1] - uniq_off[j]``)
    missing_bin : such rows fill one more bin at the end (W + 2 bins); without it they are
        left out

    Returns
    -------
    array of shape (E, m, W + 1, S), or (E, m, W + 2, S) with ``missing_bin``
    """
    E, m = feats.shape
    W = thr.shape[2]
    nb = W + 1 + int(missing_bin)  # with missing_bin, bin W + 1 holds the missing rows
    if np.isneginf(thr).any():
        raise ProtocolError("thresholds must be finite or +inf padding")
    classes = n_classes if columns != "count" and n_classes > 0 else 0
    S = {"count": 1, "moments": 2, "full": 3}[columns] if not classes else classes
    out = np.zeros((E, m, nb, S))
    if E == 0 or node.size == 0:
        return out
    pos = np.full(n_nodes, -1, dtype=np.int64)
    pos[nodes] = np.arange(E)
    e = pos[node]
    sel = np.flatnonzero(e >= 0)
    mode = 3 if classes else {"count": 0, "moments": 1, "full": 2}[columns]
    miss = np.diff(uniq_off).astype(np.int64)  # a missing value's code, per feature
    _bin_statistics(e[sel], row[sel].astype(np.int64), weight[sel].astype(np.float64),
                    np.ascontiguousarray(feats, dtype=np.int64),
                    np.ascontiguousarray(thr, dtype=np.float64), codes, int(n_rows),
                    uniq_all, uniq_off.astype(np.int64), miss, bool(has_missing),
                    bool(missing_bin), y.astype(np.float64), mode, out)
    return out


def _bin_statistics_py(e: np.ndarray, r: np.ndarray, w: np.ndarray, feats: np.ndarray,
                       thr: np.ndarray, codes: np.ndarray, n_rows: int, uniq_all: np.ndarray,
                       uniq_off: np.ndarray, miss_code: np.ndarray, has_missing: bool,
                       missing_bin: bool, y: np.ndarray, mode: int, out: np.ndarray) -> None:
    """:func:`bin_statistics` over the evaluated pairs (evaluated row ``e``, row ``r``,
    weight ``w``), slot by slot: a pair's bin is the number of its (node, slot)'s thresholds
    below its value (a binary search), a missing value's the bin after them all
    (``missing_bin``) or none. ``mode`` 0: weights; 1: weights and weight x y; 2: also
    weight x y x y; 3: each weight into its class's column. Each bin adds its pairs one by
    one in the pairs' order."""
    E, m = feats.shape
    W = thr.shape[2]
    for s in range(m):
        for p in range(e.size):
            i = e[p]
            f = feats[i, s]
            if f < 0:
                continue
            c = np.int64(codes[f * n_rows + r[p]])
            if has_missing and c >= miss_code[f]:
                if not missing_bin:
                    continue
                b = W + 1
            else:
                x = uniq_all[uniq_off[f] + c]
                lo = 0
                hi = W
                while lo < hi:  # first threshold >= x: the number of thresholds below x
                    mid = (lo + hi) >> 1
                    if thr[i, s, mid] < x:
                        lo = mid + 1
                    else:
                        hi = mid
                b = lo
            wt = w[p]
            if mode == 3:
                out[i, s, b, int(y[r[p]])] += wt
                continue
            out[i, s, b, 0] += wt
            if mode >= 1:
                yv = y[r[p]]
                wy = wt * yv
                out[i, s, b, 1] += wy
                if mode == 2:
                    out[i, s, b, 2] += wy * yv


_bin_statistics = kernel(_bin_statistics_py)


def warm_kernels() -> None:
    """Load (the first time on a machine: compile) the compiled loop of
    :func:`bin_statistics` now rather than in the first round that needs it."""
    i64 = np.zeros(0, dtype=np.int64)
    f64 = np.zeros(0)
    _bin_statistics(i64, i64, f64, np.zeros((0, 1), dtype=np.int64), np.zeros((0, 1, 1)),
                    np.zeros(0, dtype=np.int32), 0, f64, i64, i64, False, False, f64, 0,
                    np.zeros((0, 1, 1, 1)))
