"""Quantile sketches and the pooled-CDF candidate thresholds of the paper (Section 3.1).

Client ``k`` reports, for a node and a feature, ``B_k + 1`` weighted quantile points
``q_{k,b} = Q_k(b / B_k)`` for ``b = 0..B_k`` (``Q(p) = inf{x : F(x) >= p}``; ``Q(0)`` is the
minimum). The server turns them into a piecewise-linear CDF ``F~_k`` (mass ``1/B_k`` spread
uniformly on each segment ``[q_{k,b}, q_{k,b+1}]``, a point mass where the segment is empty),
mixes the clients with weights ``n_{nu,k} / n_nu`` and inverts the pooled CDF at ``b / B``.
Theorem 1: ``sup_x |F~ - F| <= max_k 1/B_k`` for the pooled empirical CDF ``F``. Quantiles are
never averaged.

Everything is vectorised over many (node, feature) rows at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import _kernels

__all__ = ["client_quantiles", "list_lengths", "mixture_cdf", "pooled_candidates"]

#: rows are processed in chunks of about this many sketch points (bounds peak memory)
CHUNK_ENTRIES = 1 << 18


def client_quantiles(values: np.ndarray, weights: np.ndarray | None, n_points: int) -> np.ndarray:
    """Reference (unvectorised) weighted quantile points ``Q(b / n_points)``, ``b = 0..n_points``.

    Parameters
    ----------
    values : array of shape (n,)
    weights : positive integer weights of shape (n,), or None for ones
    n_points : the sketch size B (>= 1)

    Returns
    -------
    array of shape (n_points + 1,)
    """
    values = np.asarray(values, dtype=np.float64)
    w = np.ones_like(values) if weights is None else np.asarray(weights, dtype=np.float64)
    if values.size == 0:
        return np.full(n_points + 1, np.nan)
    order = np.argsort(values, kind="stable")
    v = values[order]
    cw = np.cumsum(w[order])
    total = cw[-1]
    b = np.arange(n_points + 1)
    if (w == np.floor(w)).all() and total < 2**52:
        # integer weights: the cumulative weight reaches b / B of the total at the integer
        # ceil(b total / B) (at least 1: Q(0) is the minimum), computed exactly
        target = np.maximum(-(-b * int(total) // n_points), 1)
    else:
        target = np.maximum(b / n_points * total, 0.5)
    idx = np.searchsorted(cw, target, side="left")
    return v[np.minimum(idx, v.size - 1)]


def _row_order(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``flat`` (R, W): the permutation a stable argsort gives (NaN last), as
    flat positions (row r's at ``r * W + ...``), and the row's values in that order.

    Each value becomes an order-preserving integer key whose low bits are replaced by the
    value's position, read as a positive double: a plain (unstable, vectorised) sort of those
    doubles orders every row by value and then by position. Values whose keys agree in all
    kept bits but differ (closer than about 2^-40 relative) can come out of order: such rows
    are found by checking the result and sorted again with a stable argsort.
    """
    R, W = flat.shape
    ib = max(int(W - 1).bit_length(), 1)  # bits for a position
    if ib > 20:  # too few value bits left: the stable argsort
        order = np.argsort(flat, axis=1, kind="stable")
        xs = np.take_along_axis(flat, order, axis=1)
        order += (np.arange(R, dtype=np.int64) * W)[:, None]
        return order, xs
    # the order-preserving unsigned key of a double: negative values get every bit flipped,
    # others the sign bit (+ 0.0: -0.0 becomes 0.0, the two compare equal); NaN (positive)
    # comes after +inf
    key = (flat + 0.0).view(np.int64)
    flip = key >> 63  # -1 (all bits) for a negative value, else 0
    flip |= np.int64(-(1 << 63))
    key ^= flip
    del flip
    uk = key.view(np.uint64)
    uk >>= np.uint64(2)  # the top two bits 0: read as a double the key is finite, >= 0
    uk &= np.uint64(~((1 << ib) - 1) & 0xFFFFFFFFFFFFFFFF)  # 62 - ib value bits
    pos = np.arange(W, dtype=np.uint64)
    uk |= pos
    srt = np.sort(uk.view(np.float64), axis=1).view(np.int64)
    del key, uk
    srt &= (np.int64(1) << ib) - 1
    srt += (np.arange(R, dtype=np.int64) * W)[:, None]  # flat positions
    xs = flat.ravel()[srt]
    # equal values have equal keys, so they are in position order; distinct values can only
    # be out of order where their keys agree (NaN comparisons are false); a NaN with the sign
    # bit set sorts first
    bad = (xs[:, 1:] < xs[:, :-1]).any(axis=1)
    bad |= np.isnan(xs[:, 0]) & np.signbit(xs[:, 0])
    redo = np.flatnonzero(bad)
    if redo.size:
        o = np.argsort(flat[redo], axis=1, kind="stable")
        xs[redo] = np.take_along_axis(flat[redo], o, axis=1)
        o += (redo * W)[:, None]
        srt[redo] = o
    return srt, xs


def _events(points: np.ndarray, weights: np.ndarray, npts: np.ndarray | None = None
            ) -> tuple[np.ndarray, ...]:
    """The pooled sketch CDF of each row, tabulated at every reported point.

    ``points`` has shape (R, K, P) (NaN-padded at the end of each client's list), ``weights``
    (R, K) the mixing weights (summing to 1 over K, or 0 for absent clients), ``npts`` (R, K)
    the number of points of each client's list, if the caller counted them.

    Returns ``xs`` (R, W) all points of the row in ascending order, ``s`` the slope of the
    pooled CDF just right of each, ``dj`` the point mass at each, and ``F`` the CDF value at
    each (jumps included). One sort per row (:func:`_row_order`); every point's slope change
    and jump is computed where the point is and gathered into sorted order.
    """
    R, K, P = points.shape
    W = K * P
    if npts is None:
        npts = (~np.isnan(points)).sum(axis=2)  # points per (row, client)
    flat = np.ascontiguousarray(points).reshape(R, W)
    nv = npts.sum(axis=1)  # valid points per row: the padding is xs[r, nv[r]:]
    order, xs = _row_order(flat)
    if nv.min() < W:  # the padding repeats the row's last point (0 for an empty row)
        tail = np.arange(W)[None, :] >= nv[:, None]
        last = xs.ravel()[np.maximum(nv - 1, 0) + np.arange(R) * W]
        last[nv == 0] = 0.0
        np.copyto(xs, np.broadcast_to(last[:, None], xs.shape), where=tail)
        del tail
    nseg = np.maximum(npts - 1, 0)
    mass = np.where(nseg > 0, weights / np.maximum(nseg, 1), 0.0)
    # per point, over the flat rows: the segment it starts (none at a client's last slot)
    length = np.empty((R, W))
    lf = length.ravel()
    ff = flat.ravel()
    with np.errstate(invalid="ignore"):
        np.subtract(ff[1:], ff[:-1], out=lf[:-1])  # NaN where a point is padding
    length[:, P - 1::P] = np.nan
    mass_p = np.repeat(mass.ravel(), P).reshape(R, W)
    # slope of the segment a point starts, 0 where it is not a ramp
    slope = np.zeros((R, W))
    np.divide(mass_p, length, out=slope, where=length > 0)
    # a point starts at most one segment and ends at most one, so its slope change is
    # (slope of the segment it starts) - (slope of the segment it ends), and its point mass
    # the mass of an empty segment it starts or a lone point's weight: computed per point,
    # then put in sorted order (what scattering by rank with bincount gave, bit for bit)
    dsp = np.empty((R, W))
    sf = slope.ravel()
    np.subtract(sf[1:], sf[:-1], out=dsp.ravel()[1:])
    dsp[:, 0] = slope[:, 0]  # the slot before a client's first point has slope 0
    djp = mass_p
    djp *= length == 0
    del length
    single = npts == 1
    if single.any():
        djp[:, ::P] += np.where(single, weights, 0.0)
    ds = dsp.ravel()[order]
    dj = djp.ravel()[order]
    del dsp, djp, order
    s = np.cumsum(ds, axis=1)
    del ds
    tiny = 1e-12 * np.maximum(slope.max(axis=1, initial=0.0), 1e-300)  # slopes are >= 0
    s[np.abs(s) <= tiny[:, None]] = 0.0
    dx = np.diff(xs, axis=1)
    F = np.cumsum(dj, axis=1)
    np.multiply(s[:, :-1], dx, out=dx)
    np.cumsum(dx, axis=1, out=dx)
    F[:, 1:] += dx
    return xs, s, dj, F


def _row_count(flat: np.ndarray, start: np.ndarray, width: int, v: np.ndarray,
               strict: bool) -> np.ndarray:
    """Per query ``q``: how many of the ``width`` entries ``flat[start[q]:start[q] + width]``
    (non-decreasing) are below ``v[q]`` (``strict``) or at most ``v[q]``: a branch-free
    binary search of every query at once, within its own row."""
    pos = np.zeros(v.shape, dtype=np.int64)
    step = 1 << (max(width, 1).bit_length() - 1)  # the largest power of two <= width
    last = start - 1
    cand = np.empty_like(pos)
    hit = np.empty(v.shape, dtype=bool)
    inside = np.empty(v.shape, dtype=bool)
    while step:
        np.add(pos, step, out=cand)
        np.less_equal(cand, width, out=inside)
        np.minimum(cand, width, out=cand)
        cand += last
        if strict:
            np.less(flat[cand], v, out=hit)
        else:
            np.less_equal(flat[cand], v, out=hit)
        hit &= inside
        pos += hit * step
        step >>= 1
    return pos


def _first_at_least(F: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per row of the non-decreasing ``F`` (R, E), the first column with ``F >= t`` for each
    target ``t`` (E if none): ``np.searchsorted(F[r], targets)`` for every row.

    A binary search within each row (:func:`_row_count`), so a row's answer never depends on
    which other rows share the call (the coordinator may evaluate a level's nodes in groups
    and must get the same candidates).
    """
    R, E = F.shape
    start = np.broadcast_to((np.arange(R, dtype=np.int64) * E)[:, None], (R, targets.size))
    t = np.broadcast_to(targets, (R, targets.size))
    return _row_count(F.ravel(), start, E, t, strict=True)


def _mid_gap(xs: np.ndarray, s: np.ndarray, i: np.ndarray, x_i: np.ndarray) -> np.ndarray:
    """For cuts at event positions ``i`` (values ``x_i``, both 1-d, rows ``i // E``
    flattened): the midpoint to the next distinct event where the pooled CDF is flat in
    between (slope 0 after the last event at ``x_i``), else ``x_i``."""
    R, E = xs.shape
    start = i - i % E
    # the last event of the run of events equal to x_i: the row's events up to x_i, minus 1
    e = _row_count(xs.ravel(), start, E, x_i, strict=False)
    e += start - 1
    has_next = e + 1 < start + E
    nxt = xs.ravel()[np.where(has_next, e + 1, e)]
    flat = s.ravel()[e] == 0
    gap = has_next & flat & (nxt > x_i)
    out: np.ndarray = np.where(gap, (x_i + nxt) / 2.0, x_i)
    return out


def mixture_cdf(points: np.ndarray, weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Evaluate the pooled sketch CDF ``F~`` of each row at the points ``x`` of shape (R, Q)."""
    xs, s, dj, F = _events(points, weights)
    R = xs.shape[0]
    out = np.empty(x.shape, dtype=np.float64)
    for r in range(R):
        i = np.searchsorted(xs[r], x[r], side="right") - 1  # last event <= x
        inside = i >= 0
        ii = np.maximum(i, 0)
        val = F[r, ii] + s[r, ii] * (x[r] - xs[r, ii])
        out[r] = np.where(inside, val, 0.0)
    return np.clip(out, 0.0, 1.0)


def list_lengths(points: np.ndarray) -> np.ndarray:
    """The number of points of each NaN-padded list (the last axis of ``points``).

    Raises
    ------
    ValueError
        A list has a point after its padding.
    """
    shape = points.shape
    P = shape[-1] if len(shape) else 0
    if P == 0 or points.size == 0:
        return np.zeros(shape[:-1], dtype=np.int64)
    flat = _kernels.f64(points).reshape(-1, P)
    if _kernels.KERNELS is not None:
        out = np.empty(flat.shape[0], dtype=np.int64)
        bad = _kernels.KERNELS.list_lengths(flat, out, P)
    else:
        gap = np.isnan(flat)
        after = gap[:, :-1] & ~gap[:, 1:]
        bad = int(np.flatnonzero(after.any(axis=1))[0]) if after.any() else -1
        out = P - gap.sum(axis=1)
    if bad >= 0:
        raise ValueError("a client's list has a point after its NaN padding")
    return out.reshape(shape[:-1])


def pooled_candidates(points: np.ndarray, counts: np.ndarray, n_bins: int,
                      npts: np.ndarray | None = None) -> np.ndarray:
    """Candidate thresholds ``(F~)^{-1}(b / B)``, ``b = 1..B-1``, per row.

    Parameters
    ----------
    points : array of shape (R, K, P)
        Each client's quantile points per row (node x feature), NaN-padded.
    counts : array of shape (R, K)
        Each client's (weighted) number of rows at the node that have the row's feature
        (the rows its quantile points summarise): the mixing weights.
    n_bins : the sketch size B of the pooled grid
    npts : array of shape (R, K), optional
        Each list's number of points (:func:`list_lengths`), if the caller counted them

    Returns
    -------
    array of shape (R, B - 1)
        Sorted distinct thresholds per row, padded with ``+inf``. A threshold ``t`` splits a
        row to the left when ``x <= t``.
    """
    R, K, P = points.shape
    if npts is None:
        npts = list_lengths(points)
    chunk = max(1, CHUNK_ENTRIES // max(K * P, 1))
    out = []
    for i in range(0, R, chunk):  # bounded memory: the event arrays are R x K x P wide
        out.append(_pooled(points[i:i + chunk], counts[i:i + chunk], npts[i:i + chunk],
                           n_bins))
    return out[0] if len(out) == 1 else np.concatenate(out) if out else \
        np.full((0, n_bins - 1), np.inf)


def pooled_candidates_lists(lists: Sequence[np.ndarray], counts: np.ndarray, n_bins: int,
                            npts: np.ndarray) -> np.ndarray:
    """:func:`pooled_candidates` of rows whose clients' lists are separate arrays, ``lists[k]``
    of shape (R, P) for client k (``counts`` and ``npts`` (R, K) as there): the compiled loops
    read each client's array in place, without an (R, K, P) copy of them all. Needs the
    compiled loops (:data:`~fedforest_secure._kernels.KERNELS`)."""
    kernels = _kernels.KERNELS
    if kernels is None:
        raise RuntimeError("internal: pooled_candidates_lists needs the compiled loops")
    R, K = counts.shape
    P = lists[0].shape[1] if lists else 0
    # the weights and rows of _pooled, each row then by the same compiled loop
    counts = np.where(npts == 0, 0.0, np.maximum(counts, 0.0))
    tot = counts.sum(axis=1, keepdims=True)
    weights = np.divide(counts, tot, out=np.zeros_like(counts), where=tot > 0)
    out = np.full((R, n_bins - 1), np.inf)
    keep = tot[:, 0] > 0
    if R and P and keep.any():
        kernels.pooled_lists([_kernels.f64(a) for a in lists], _kernels.f64(weights),
                             keep.astype(np.int64), out, R, K, P, n_bins)
    return out


#: sketch widths of the row buckets of :func:`_pooled` (the last bucket: the full width)
BUCKET_WIDTHS = (3, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129)


def _pooled(points: np.ndarray, counts: np.ndarray, npts: np.ndarray, n_bins: int
            ) -> np.ndarray:
    """:func:`pooled_candidates` of rows whose clients' lists hold ``npts`` (R, K) points."""
    R = points.shape[0]
    counts = np.where(npts == 0, 0.0, np.maximum(counts, 0.0))
    tot = counts.sum(axis=1, keepdims=True)
    weights = np.divide(counts, tot, out=np.zeros_like(counts), where=tot > 0)
    out = np.full((R, n_bins - 1), np.inf)
    if R == 0:
        return out
    keep = tot[:, 0] > 0
    if _kernels.KERNELS is not None:  # rows of every width at once: the compiled loops skip padding
        if not keep.any():  # no row has a point
            return out
        every = bool(keep.all())
        pts = points if every else points[keep]
        res = out if every else np.full((pts.shape[0], n_bins - 1), np.inf)
        _kernels.KERNELS.pooled_rows(_kernels.f64(pts),
                                     _kernels.f64(weights if every else weights[keep]),
                                     res, *pts.shape, n_bins)
        if not every:
            out[keep] = res
        return out
    longest = npts.max(axis=1)
    width = points.shape[2]
    if keep.all() and width > 4 and (longest <= width // 2).any():
        # rows whose clients sent short sketches (small nodes, adaptive B) are done with
        # narrower arrays: bucket rows by the longest sketch they hold; the last bucket (the
        # full width) is done here, not by another call that would bucket it again forever
        edges = [w for w in BUCKET_WIDTHS if w < width] + [width]
        lo = 0
        for hi_w in edges:
            sel = (longest > lo) & (longest <= hi_w)
            if sel.any():
                if hi_w < width:
                    out[sel] = _pooled(points[sel, :, :hi_w], counts[sel], npts[sel], n_bins)
                else:
                    out[sel] = _pooled_numpy(points[sel], weights[sel], npts[sel], n_bins,
                                             np.full((int(sel.sum()), n_bins - 1), np.inf))
            lo = hi_w
        return out
    if not keep.all():
        if keep.any():
            out[keep] = _pooled(points[keep], counts[keep], npts[keep], n_bins)
        return out
    return _pooled_numpy(points, weights, npts, n_bins, out)


def _pooled_numpy(points: np.ndarray, weights: np.ndarray, npts: np.ndarray, n_bins: int,
                  out: np.ndarray) -> np.ndarray:
    """The core of :func:`_pooled` in numpy (rows with weights summing to 1), into ``out``."""
    R = points.shape[0]
    xs, s, dj, F = _events(points, weights, npts)
    E = xs.shape[1]
    levels = np.arange(1, n_bins) / n_bins
    i = _first_at_least(F, levels - 1e-12)
    # no event reaching a level (the slopes below 1e-12 of the largest were dropped): the
    # row's last reported point, wherever the padding of the array ends
    np.minimum(i, npts.sum(axis=1, keepdims=True) - 1, out=i)
    prev = np.maximum(i - 1, 0)
    base = (np.arange(R) * E)[:, None]
    prev += base
    F_prev = F.ravel()[prev]
    s_prev = s.ravel()[prev]
    x_prev = xs.ravel()[prev]
    x_i = xs.ravel()[i + base]
    left_limit = F_prev + s_prev * (x_i - x_prev)
    u = levels[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        interp = x_prev + (u - F_prev) / s_prev
    ramp = (i > 0) & (s_prev > 0) & (u <= left_limit + 1e-12)
    t = np.where(ramp, interp, x_i)
    t = np.clip(t, x_prev, x_i)
    # A cut at a point after which the pooled CDF stays flat (a gap between clients' data)
    # goes to the middle of the gap, like CART's midpoints: the same training rows fall on
    # each side, and rows just beyond the last observed value are not cut off.
    inside_ramp = ramp & (u < left_limit - 1e-12) & (t < x_i)  # else the cut sits at x_i
    away = np.flatnonzero(~inside_ramp)  # cuts at an event: maybe to the middle of a gap
    if away.size:
        t.ravel()[away] = _mid_gap(xs, s, (i + base).ravel()[away], x_i.ravel()[away])
    t += 0.0  # -0.0 becomes 0.0 (the same cut): the sort below need not order signed zeros
    t.sort(axis=1)
    dup = np.zeros_like(t, dtype=bool)
    dup[:, 1:] = t[:, 1:] == t[:, :-1]
    t[dup] = np.inf
    t.sort(axis=1)
    out[:] = t
    return out
