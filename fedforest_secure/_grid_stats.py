"""A client's per-bin statistics in one pass over its pairs (histogram rounds without a sort).

A histogram round gives, per evaluated (node, feature slot), sorted thresholds; a row of the
node falls in bin ``b`` when ``t_{b-1} < x <= t_b``. Here every (pair, slot) finds its bin by a
branch-free binary search among the thresholds of its own (node, slot), for all pairs at once
(``log2 W`` vectorised steps), and the statistics are weighted ``bincount`` s over the bin
indices: cost proportional to the pairs, not to the thresholds, and no sorted level order.
The worker answers this way whenever the level's sketch round did not ask it to sort the level
(the secure pooled-CDF sketch, whose grids are as fine as the nodes are large).

Values are compared as float64 (a row's value is its distinct value, looked up through its exact
integer code), so ``x <= t`` is decided exactly, as everywhere else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import _kernels
from .errors import ProtocolError

if TYPE_CHECKING:
    from .config import JobConfig

__all__ = ["bin_statistics", "bin_statistics_shape", "classes_of", "columns_of", "zeros_after"]


def columns_of(mode: str) -> str:
    """The statistics a histogram round of ``mode`` sums, as :func:`bin_statistics` names them
    ("count", "moments", else "full")."""
    return {"count": "count", "moments": "moments"}.get(mode, "full")


def classes_of(config: JobConfig) -> int:
    """The classes a job's histograms sum per bin (0: regression)."""
    return config.n_classes if config.task == "classification" else 0


def zeros_after(head: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """One new vector, ``head`` followed by zeros for an array of ``shape``, and that array (a
    view of the vector's tail)."""
    out = np.zeros(head.size + int(np.prod(shape)))
    out[:head.size] = head
    return out, out[head.size:].reshape(shape)


def bin_statistics_shape(feats: np.ndarray, thr: np.ndarray, columns: str, n_classes: int = 0,
                         missing_bin: bool = False) -> tuple[int, int, int, int]:
    """The shape of :func:`bin_statistics`' result: (E, m, bins, statistics)."""
    E, m = feats.shape
    classes = n_classes if columns != "count" and n_classes > 0 else 0
    S = {"count": 1, "moments": 2, "full": 3}[columns] if not classes else classes
    return E, m, thr.shape[2] + 1 + int(missing_bin), S


def bin_statistics(node: np.ndarray, row: np.ndarray, weight: np.ndarray, n_nodes: int,
                   nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray, codes: np.ndarray,
                   n_rows: int, uniq_all: np.ndarray, uniq_off: np.ndarray, y: np.ndarray,
                   columns: str, n_classes: int = 0, *, has_missing: bool = False,
                   missing_bin: bool = False, out: np.ndarray | None = None) -> np.ndarray:
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
    out : zeros of the result's shape (:func:`bin_statistics_shape`) to write it into, e.g.
        a view of the reply it goes into (None: a new array)

    Returns
    -------
    array of shape (E, m, W + 1, S), or (E, m, W + 2, S) with ``missing_bin`` (``out`` when
    given)
    """
    E, m = feats.shape
    shape = bin_statistics_shape(feats, thr, columns, n_classes, missing_bin)
    W, nb, S = thr.shape[2], shape[2], shape[3]
    if has_missing:
        miss_code = np.diff(uniq_off).astype(np.int64)
    if np.isneginf(thr).any():
        raise ProtocolError("thresholds must be finite or +inf padding")
    classes = n_classes if columns != "count" and n_classes > 0 else 0
    if out is None:
        out = np.zeros(shape)
    elif out.shape != shape or out.dtype != np.float64:
        raise ValueError(f"out must be float64 of shape {shape}, not {out.dtype} {out.shape}")
    if E == 0 or node.size == 0:
        return out
    pos = np.full(n_nodes, -1, dtype=np.int64)
    pos[nodes] = np.arange(E)
    if _kernels.KERNELS is not None:  # the same bins and sums, pair by pair
        i64, f64 = _kernels.i64, _kernels.f64
        _kernels.KERNELS.grid_sums(i64(node), i64(row), i64(weight), pos, i64(feats), f64(thr),
                                   i64(uniq_off), f64(uniq_all), i64(codes), f64(y), out,
                                   n_rows, m, S, 1 if classes else 0, int(has_missing),
                                   int(missing_bin))
        return out
    e = pos[node]
    sel = np.flatnonzero(e >= 0)
    e, r = e[sel], row[sel].astype(np.int64)
    w = weight[sel].astype(np.float64)
    cols: list[np.ndarray] = [w]
    ycls: np.ndarray | None = None
    if classes:
        ycls = y[r].astype(np.int64)
    elif columns != "count":
        yv = y[r]
        wy = w * yv
        cols.append(wy)
        if columns == "full":
            cols.append(wy * yv)
    # thresholds padded to 2^k - 1 per (node, slot): the search needs no bounds checks
    k = int(W).bit_length()
    Wp = (1 << k) - 1
    tp = np.full((E, m, max(Wp, 1)), np.inf)
    tp[:, :, :W] = thr
    tflat = tp.ravel()
    e_nb = e * nb
    for s in range(m):
        fe = feats[:, s]
        if (fe < 0).all():
            continue
        f = fe[e]
        ok = f >= 0
        idx = None if ok.all() else np.flatnonzero(ok)
        fs = f if idx is None else f[idx]
        rs = r if idx is None else r[idx]
        es = e if idx is None else e[idx]
        at = fs * n_rows
        at += rs
        code = codes[at].astype(np.int64)
        del at
        missing = code >= miss_code[fs] if has_missing else None
        if missing is not None:
            code[missing] = 0  # looked up below and then overridden
        x = uniq_all[np.minimum(uniq_off[fs] + code, max(uniq_all.size - 1, 0))] \
            if uniq_all.size else np.zeros(code.size)
        del code
        # bin = number of thresholds below x (t_{b-1} < x <= t_b)
        base = es * m
        base += s
        base *= Wp
        base -= 1
        b = base.copy()  # the last threshold below x found so far (its flat position)
        hit = np.empty(es.size, dtype=bool)
        inc = np.empty_like(b)
        step = 1 << (k - 1) if k else 0
        while step:
            np.less(tflat[b + step], x, out=hit)
            np.multiply(hit, step, out=inc)
            b += inc
            step >>= 1
        b -= base
        keep = None
        if missing is not None and missing.any():
            if missing_bin:
                b[missing] = W + 1
            else:  # the missing rows are left out
                keep = ~missing
        key = e_nb if idx is None else e_nb[idx]
        key = key + b
        del b, base, x
        if keep is not None:
            key = key[keep]
        if classes:
            if ycls is None:  # pragma: no cover - set with classes
                raise ProtocolError("internal: class codes missing")
            yc = ycls if idx is None else ycls[idx]
            if keep is not None:
                yc = yc[keep]
            ck = key * classes
            ck += yc
            ws = w if idx is None else w[idx]
            if keep is not None:
                ws = ws[keep]
            out[:, s] = np.bincount(ck, weights=ws, minlength=E * nb * classes
                                    ).reshape(E, nb, classes)
            continue
        for c, col in enumerate(cols):
            ws = col if idx is None else col[idx]
            if keep is not None:
                ws = ws[keep]
            out[:, s, :, c] = np.bincount(key, weights=ws, minlength=E * nb).reshape(E, nb)
    return out
