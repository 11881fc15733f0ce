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

import numpy as np

from ._jit import kernel

__all__ = ["client_quantiles", "mixture_cdf", "pooled_candidates"]

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


def _events(points: np.ndarray, weights: np.ndarray, npts: np.ndarray | None = None
            ) -> tuple[np.ndarray, ...]:
    """The pooled sketch CDF of each row, tabulated at every reported point.

    ``points`` has shape (R, K, P) (NaN-padded at the end of each client's list), ``weights``
    (R, K) the mixing weights (summing to 1 over K, or 0 for absent clients), ``npts`` (R, K)
    the number of points of each client's list, if the caller counted them.

    Returns ``xs`` (R, W) all points of the row in ascending order, ``s`` the slope of the
    pooled CDF just right of each, ``dj`` the point mass at each, and ``F`` the CDF value at
    each (jumps included). One sort per row; every point's slope change and jump is
    computed where the point is and gathered into sorted order.
    """
    R, K, P = points.shape
    W = K * P
    if npts is None:
        npts = (~np.isnan(points)).sum(axis=2)  # points per (row, client)
    # NaN sorts after every number, so the padding ends every row; stable: ties keep the
    # clients' order
    flat = points.reshape(R, W)
    order = np.argsort(flat, axis=1, kind="stable")
    # gathers along rows through flat indices (cheaper than take_along_axis)
    order += (np.arange(R) * W)[:, None]
    xs = flat.ravel()[order]
    nv = npts.sum(axis=1)  # valid points per row: the padding is xs[r, nv[r]:]
    if nv.min() < W:  # the padding repeats the row's last point (0 for an empty row)
        tail = np.arange(W)[None, :] >= nv[:, None]
        last = xs.ravel()[np.maximum(nv - 1, 0) + np.arange(R) * W]
        last[nv == 0] = 0.0
        np.copyto(xs, np.broadcast_to(last[:, None], xs.shape), where=tail)
        del tail
    nseg = np.maximum(npts - 1, 0)
    mass = np.where(nseg > 0, weights / np.maximum(nseg, 1), 0.0)[:, :, None]
    with np.errstate(invalid="ignore"):
        length = points[:, :, 1:] - points[:, :, :-1]  # NaN where a point is padding
    ramp = length > 0
    jump = length == 0
    slope = np.zeros((R, K, P - 1))
    np.divide(mass, length, out=slope, where=ramp)
    del length
    # a point starts at most one segment and ends at most one, so its slope change is
    # (slope of the segment it starts) - (slope of the segment it ends), and its point mass
    # the mass of an empty segment it starts or a lone point's weight: computed per point,
    # then put in sorted order (what scattering by rank with bincount gave, bit for bit)
    dsp = np.zeros((R, K, P))
    dsp[:, :, :-1] = slope  # 0 where the segment is not a ramp
    dsp[:, :, 1:] -= slope
    djp = np.zeros((R, K, P))
    np.copyto(djp[:, :, :-1], np.broadcast_to(mass, jump.shape), where=jump)
    single = npts == 1
    if single.any():
        djp[:, :, 0] += np.where(single, weights, 0.0)
    ds = dsp.ravel()[order]
    dj = djp.ravel()[order]
    del dsp, djp, order
    s = np.cumsum(ds, axis=1)
    del ds
    tiny = 1e-12 * np.maximum(np.abs(slope).reshape(R, -1).max(axis=1, initial=0.0), 1e-300)
    s[np.abs(s) <= tiny[:, None]] = 0.0
    dx = np.diff(xs, axis=1)
    F = np.cumsum(dj, axis=1)
    np.multiply(s[:, :-1], dx, out=dx)
    np.cumsum(dx, axis=1, out=dx)
    F[:, 1:] += dx
    return xs, s, dj, F


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




def pooled_candidates(points: np.ndarray, counts: np.ndarray, n_bins: int) -> np.ndarray:
    """Candidate thresholds ``(F~)^{-1}(b / B)``, ``b = 1..B-1``, per row.

    Parameters
    ----------
    points : array of shape (R, K, P)
        Each client's quantile points per row (node x feature), NaN-padded.
    counts : array of shape (R, K)
        Each client's (weighted) number of rows at the node: the mixing weights.
    n_bins : the sketch size B of the pooled grid

    Returns
    -------
    array of shape (R, B - 1)
        Sorted distinct thresholds per row, padded with ``+inf``. A threshold ``t`` splits a
        row to the left when ``x <= t``. A row without data (zero total count) gets only
        ``+inf``.
    """
    pts = np.ascontiguousarray(points, dtype=np.float64)
    cnt = np.ascontiguousarray(counts, dtype=np.float64)
    R, K, P = pts.shape
    out = np.full((R, max(n_bins - 1, 0)), np.inf)
    if R and K and P and n_bins > 1:
        _pooled_rows(pts, cnt, int(n_bins), out)
    return out


def _pooled_rows_py(points: np.ndarray, counts: np.ndarray, n_bins: int, out: np.ndarray
                 ) -> None:
    """:func:`pooled_candidates` row by row, into ``out`` (pre-filled with +inf).

    Per row: the clients' mixing weights; each point's slope change and point mass
    (:func:`_events`: mass ``w_k / (B_k)`` spread uniformly over each segment, a point mass
    where a segment is empty or a client sent a lone point); the points merged in ascending
    order, ties in the clients' order (a stable natural merge sort: the clients' lists are
    runs already); the pooled CDF ``F`` and its slope ``s`` at every point by running sums;
    then for every ``u = b / B`` the first point with ``F >= u - 1e-12``, interpolated on the
    ramp before it, or moved to the middle of a gap where ``F`` stays flat after it. The
    arithmetic is :func:`_events`' in the same order, so the thresholds are the same numbers.
    """
    R, K, P = points.shape
    W = K * P
    nb = n_bins - 1
    vals = np.empty(W)
    idx = np.empty(W, dtype=np.int64)
    vals2 = np.empty(W)
    idx2 = np.empty(W, dtype=np.int64)
    runs = np.empty(W + 1, dtype=np.int64)
    runs2 = np.empty(W + 1, dtype=np.int64)
    dsp = np.empty(W)
    djp = np.empty(W)
    wts = np.empty(K)
    npts = np.empty(K, dtype=np.int64)
    lasts = np.empty(K, dtype=np.int64)
    xs = np.empty(W)
    s = np.empty(W)
    F = np.empty(W)
    t = np.empty(nb)
    for r in range(R):
        tot = 0.0
        for k in range(K):
            last = P - 1  # the client's last point; the NaN padding after it carries nothing
            while last >= 0 and np.isnan(points[r, k, last]):
                last -= 1
            lasts[k] = last
            c = 0
            for j in range(last + 1):
                if not np.isnan(points[r, k, j]):
                    c += 1
            npts[k] = c
            w = counts[r, k]
            if c == 0:
                w = 0.0
            elif w < 0.0:
                w = 0.0
            wts[k] = w
            tot += w
        if not tot > 0.0:
            continue
        # per point: slope change and point mass (client-major, as the points came)
        top = 0.0  # largest |slope|: what counts as a zero slope after the running sums
        nv = 0
        for k in range(K):
            wk = wts[k] / tot
            nseg = npts[k] - 1
            mass = wk / nseg if nseg > 0 else 0.0
            base = k * P
            prev_slope = 0.0
            for j in range(lasts[k] + 1):
                slope = 0.0
                jump = 0.0
                if j < P - 1:
                    length = points[r, k, j + 1] - points[r, k, j]
                    if length > 0.0:
                        slope = mass / length
                    elif length == 0.0:
                        jump = mass
                ds = slope - prev_slope if j > 0 else slope
                if j == 0 and npts[k] == 1:
                    jump += wk
                if abs(slope) > top:
                    top = abs(slope)
                dsp[base + j] = ds
                djp[base + j] = jump
                prev_slope = slope
                x = points[r, k, j]
                if not np.isnan(x):  # NaN padding carries no mass: left out of the merge
                    vals[nv] = x
                    idx[nv] = base + j
                    nv += 1
        # stable natural merge sort of the valid points
        nr = 0
        runs[0] = 0
        for e in range(1, nv):
            if vals[e] < vals[e - 1]:
                nr += 1
                runs[nr] = e
        nr += 1
        runs[nr] = nv
        src_v, src_i, dst_v, dst_i = vals, idx, vals2, idx2
        rs, rs2 = runs, runs2
        while nr > 1:
            q = 0
            nn = 0
            while q < nr:
                a0 = rs[q]
                a1 = rs[q + 1]
                b1 = rs[q + 2] if q + 1 < nr else a1
                ia = a0
                ib = a1
                o = a0
                while ia < a1 and ib < b1:  # branch-free: the comparison picks the source
                    va = src_v[ia]
                    vb = src_v[ib]
                    tb = vb < va
                    dst_v[o] = vb if tb else va
                    dst_i[o] = src_i[ib] if tb else src_i[ia]
                    ib += tb
                    ia += 1 - tb
                    o += 1
                while ia < a1:
                    dst_v[o] = src_v[ia]
                    dst_i[o] = src_i[ia]
                    ia += 1
                    o += 1
                while ib < b1:
                    dst_v[o] = src_v[ib]
                    dst_i[o] = src_i[ib]
                    ib += 1
                    o += 1
                rs2[nn] = a0
                nn += 1
                q += 2
            rs2[nn] = nv
            nr = nn
            src_v, dst_v = dst_v, src_v
            src_i, dst_i = dst_i, src_i
            rs, rs2 = rs2, rs
        # the pooled CDF at every point: running sums in the merged order
        tiny = 1e-12 * (top if top > 1e-300 else 1e-300)
        run_s = 0.0
        run_j = 0.0
        run_x = 0.0
        for e in range(nv):
            p = src_i[e]
            xs[e] = src_v[e]
            run_s += dsp[p]
            s[e] = 0.0 if abs(run_s) <= tiny else run_s
            run_j += djp[p]
            if e > 0:
                run_x += s[e - 1] * (xs[e] - xs[e - 1])
                F[e] = run_j + run_x
            else:
                F[e] = run_j
        # invert at b / B
        i = 0
        for b in range(nb):
            u = (b + 1) / n_bins
            target = u - 1e-12
            while i < nv and not F[i] >= target:
                i += 1
            ii = i if i < nv else nv - 1
            pv = ii - 1 if ii > 0 else 0
            f_prev = F[pv]
            s_prev = s[pv]
            x_prev = xs[pv]
            x_i = xs[ii]
            left_limit = f_prev + s_prev * (x_i - x_prev)
            ramp = ii > 0 and s_prev > 0.0 and u <= left_limit + 1e-12
            tt = x_prev + (u - f_prev) / s_prev if ramp else x_i
            if not np.isnan(tt):  # np.clip(tt, x_prev, x_i)
                tt = tt if tt > x_prev else x_prev
                tt = tt if tt < x_i else x_i
            if not (ramp and u < left_limit - 1e-12 and tt < x_i):
                # a cut after which the pooled CDF stays flat (a gap between clients' data)
                # goes to the middle of the gap, like CART's midpoints
                e = ii
                while e + 1 < nv and xs[e + 1] == xs[e]:
                    e += 1
                if e + 1 < nv and s[e] == 0.0 and xs[e + 1] > x_i:
                    tt = (x_i + xs[e + 1]) / 2.0
                else:
                    tt = x_i
            t[b] = tt
        # sorted, distinct, +inf padded
        for a in range(1, nb):
            v = t[a]
            c2 = a - 1
            while c2 >= 0 and t[c2] > v:
                t[c2 + 1] = t[c2]
                c2 -= 1
            t[c2 + 1] = v
        o = 0
        for a in range(nb):
            if a == 0 or t[a] != t[a - 1]:
                out[r, o] = t[a]
                o += 1


_pooled_rows = kernel(_pooled_rows_py)
