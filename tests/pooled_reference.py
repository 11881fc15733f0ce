"""The pooled sketch candidates by whole-array numpy passes (one sort per row, searches over
all rows at once): the reference the compiled row loop of
:func:`fedforest_secure._sketch.pooled_candidates` is tested against, number for number."""

from __future__ import annotations

import numpy as np

from fedforest_secure import _sketch

__all__ = ["pooled_candidates_reference"]


def _first_at_least(F: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per row of the non-decreasing ``F`` (R, E), the first column with ``F >= t`` for each
    target ``t`` (E if none): ``np.searchsorted(F[r], targets)`` for every row.

    One global search over the rows shifted apart by 2 (F lies in [0, 1]) finds the answer up
    to the rounding of the shift; a few vectorised steps then make it exact, so a row's answer
    never depends on which other rows share the call (the coordinator may evaluate a level's
    nodes in groups and must get the same candidates).
    """
    R, E = F.shape
    Q = targets.size
    offs = 2.0 * np.arange(R)[:, None]
    flat = (F + offs).ravel()
    found = np.searchsorted(flat, (targets[None, :] + offs).ravel(), side="left")
    i: np.ndarray = found.reshape(R, Q) - np.arange(R)[:, None] * E
    np.clip(i, 0, E, out=i)
    flatF = F.ravel()
    base = (np.arange(R) * E)[:, None]
    t = np.broadcast_to(targets, (R, Q))
    while True:  # exact: F[r, i - 1] < t <= F[r, i]
        at = np.minimum(i, E - 1)
        at += base
        right = flatF[at] < t
        right &= i < E
        at = np.maximum(i - 1, 0)
        at += base
        left = flatF[at] >= t
        left &= i > 0
        both = right & left  # only where F is not monotone: keep the global answer
        right &= ~both
        left &= ~both
        if not (right.any() or left.any()):
            return i
        i += right
        i -= left


def _mid_gap(xs: np.ndarray, s: np.ndarray, i: np.ndarray, x_i: np.ndarray) -> np.ndarray:
    """For cuts at event positions ``x_i``: the midpoint to the next distinct event where the
    pooled CDF is flat in between (slope 0 after the last event at ``x_i``), else ``x_i``."""
    R, E = xs.shape
    # the last event of each run of equal positions (a row's last event ends a run), in
    # flat positions: ascending over the whole array, so one search finds every run's end
    last = np.ones((R, E), dtype=bool)
    np.not_equal(xs[:, 1:], xs[:, :-1], out=last[:, :-1])
    ends = np.flatnonzero(last)
    base = (np.arange(R) * E)[:, None]
    e = ends[np.searchsorted(ends, i + base)]  # flat index of the run's last event
    e -= base
    has_next = e + 1 < E
    nxt = xs.ravel()[np.minimum(e + 1, E - 1) + base]
    flat = s.ravel()[np.minimum(e, E - 1) + base] == 0
    gap = has_next & flat & (nxt > x_i)
    return np.where(gap, (x_i + nxt) / 2.0, x_i)


def pooled_candidates_reference(points: np.ndarray, counts: np.ndarray, n_bins: int) -> np.ndarray:
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
        row to the left when ``x <= t``.
    """
    R, K, P = points.shape
    chunk = max(1, _sketch.CHUNK_ENTRIES // max(K * P, 1))
    if R > chunk:  # bounded memory: the event arrays are R x K x P wide
        return np.concatenate([pooled_candidates_reference(points[i:i + chunk], counts[i:i + chunk],
                                                 n_bins) for i in range(0, R, chunk)])
    return _pooled(points, counts, (~np.isnan(points)).sum(axis=2), n_bins)


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
    longest = npts.max(axis=1)
    width = points.shape[2]
    if keep.all() and width > 4 and (longest <= width // 2).any():
        # rows whose clients sent short sketches (small nodes, adaptive B) are done with
        # narrower arrays: bucket rows by the longest sketch they hold
        edges = [w for w in BUCKET_WIDTHS if w < width] + [width]
        lo = 0
        for hi_w in edges:
            sel = (longest > lo) & (longest <= hi_w)
            if sel.any():
                out[sel] = _pooled(points[sel, :, :hi_w], counts[sel], npts[sel], n_bins)
            lo = hi_w
        return out
    if not keep.all():
        if keep.any():
            out[keep] = _pooled(points[keep], counts[keep], npts[keep], n_bins)
        return out
    xs, s, dj, F = _sketch._events(points, weights, npts)
    E = xs.shape[1]
    levels = np.arange(1, n_bins) / n_bins
    i = _first_at_least(F, levels - 1e-12)
    i = np.clip(i, 0, E - 1)
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
    t = np.where(inside_ramp, t, _mid_gap(xs, s, i, x_i))
    t = np.where(tot > 0, t, np.inf)
    t.sort(axis=1)
    dup = np.zeros_like(t, dtype=bool)
    dup[:, 1:] = t[:, 1:] == t[:, :-1]
    t[dup] = np.inf
    t.sort(axis=1)
    out[:] = t
    return out
