"""The prior of the secure sketch's grids: the pooled marginal CDF of each feature.

:class:`Marginal` holds, per feature, a piecewise-linear CDF learned from a level's pooled
cell counts on nodes whose boxes are still the public bounds, and evaluates it (``cdf_at``)
and its inverse (``quantile_at``) for many rows at once, by the compiled loop where it is
built and by :func:`_count_below`, a branch-free binary search over padded rows, elsewhere.
"""

from __future__ import annotations

import numpy as np

from . import _kernels

__all__ = ["Marginal"]


def _count_below(table: np.ndarray, which: np.ndarray, values: np.ndarray,
                 strict: bool) -> np.ndarray:
    """For each value, how many entries of its row ``table[which]`` (sorted ascending) are
    below it (``<`` if ``strict`` else ``<=``). ``which`` has one entry per row of ``values``.

    A branch-free binary search over every value at once (rows padded to 2^k - 1 entries)."""
    L = table.shape[1]
    k = max(int(L).bit_length(), 1)
    Lp = (1 << k) - 1
    if Lp != L:
        padded = np.full((table.shape[0], Lp), np.inf)
        padded[:, :L] = table
    else:
        padded = table
    flat = np.ascontiguousarray(padded).ravel()
    base = (which.astype(np.int64) * Lp - 1).reshape((-1,) + (1,) * (values.ndim - 1))
    pos = np.zeros(values.shape, dtype=np.int64)
    step = 1 << (k - 1)
    cmp = np.less if strict else np.less_equal
    while step:
        hit = cmp(flat[base + pos + step], values)
        pos += hit * step
        step >>= 1
    return pos


class Marginal:
    """The pooled marginal CDF of each feature: the prior of the grids' placement.

    Per feature ``j`` a piecewise-linear CDF through the points ``(xs[j, i], cdf[j, i])``
    (sorted, padded with +inf and 1.0); ``known[j]`` is False until some level evaluated ``j``
    on a node whose box was still the public bounds.
    """

    def __init__(self, n_features: int) -> None:
        self.known = np.zeros(n_features, dtype=bool)
        self.xs = np.full((n_features, 2), np.inf)
        self.cdf = np.ones((n_features, 2))

    def learn(self, feats: np.ndarray, lo: np.ndarray, hi: np.ndarray, edges: np.ndarray,
              counts: np.ndarray, full_box: np.ndarray) -> None:
        """Learn the features not known yet from a level's partitions.

        ``feats`` (R,) the feature of each (node, slot) row (-1: none), ``lo``/``hi`` its box,
        ``edges`` (R, W) and ``counts`` (R, W + 1) its cells, ``full_box`` (R,) whether the box
        is still the feature's public range. The marginal of ``j`` is the mean of the CDFs of
        its rows (each a node's pooled CDF, mass spread evenly inside each cell)."""
        total = counts.sum(axis=1)
        use = (feats >= 0) & full_box & (total > 0)
        new = np.unique(feats[use])
        new = new[~self.known[new]]
        if new.size == 0:
            return
        curves: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for j in new:
            rows = np.flatnonzero(use & (feats == j))
            fin = np.isfinite(edges[rows])
            xs = np.unique(np.concatenate([lo[rows], hi[rows], edges[rows][fin]]))
            acc = np.zeros(xs.size)
            for r in rows:
                e = edges[r][np.isfinite(edges[r])]
                px = np.concatenate([[lo[r]], e, [hi[r]]])
                pc = np.concatenate([[0.0], np.cumsum(counts[r, : e.size + 1])]) / total[r]
                acc += np.interp(xs, px, pc)
            curves[int(j)] = (xs, np.minimum(acc / rows.size, 1.0))
        width = max(self.xs.shape[1], max(c[0].size for c in curves.values()))
        xs_all = np.full((self.xs.shape[0], width), np.inf)
        cdf_all = np.ones((self.xs.shape[0], width))
        xs_all[:, : self.xs.shape[1]] = self.xs
        cdf_all[:, : self.cdf.shape[1]] = self.cdf
        for j, (xs, cdf) in curves.items():
            xs_all[j] = np.inf
            cdf_all[j] = 1.0
            xs_all[j, : xs.size] = xs
            cdf_all[j, : cdf.size] = np.maximum.accumulate(cdf)
            self.known[j] = True
        self.xs, self.cdf = xs_all, cdf_all

    def _compiled(self, feats: np.ndarray, values: np.ndarray, mode: int) -> np.ndarray | None:
        """:meth:`cdf_at` (mode 0) or :meth:`quantile_at` (mode 1) by the compiled loop (the
        same bits), or None where it is not built."""
        if _kernels.KERNELS is None:
            return None
        vals = _kernels.f64(values)
        out = np.empty(vals.shape)
        _kernels.KERNELS.marginal_at(_kernels.f64(self.xs),
                                     _kernels.f64(self.cdf),
                                     _kernels.i64(feats), vals, out,
                                     self.xs.shape[1], mode)
        return out

    def cdf_at(self, feats: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The marginal CDF of feature ``feats[i]`` at ``x[i]`` (x: (N,) or (N, J))."""
        compiled = self._compiled(feats, x, 0)
        if compiled is not None:
            return compiled
        k = _count_below(self.xs, feats, x, strict=False)  # points at or below x
        L = self.xs.shape[1]
        fr = feats.reshape((-1,) + (1,) * (x.ndim - 1)).astype(np.int64)
        i1 = np.minimum(k, L - 1)
        i0 = np.maximum(k - 1, 0)
        x0, x1 = self.xs[fr, i0], self.xs[fr, i1]
        c0, c1 = self.cdf[fr, i0], self.cdf[fr, i1]
        span = np.where(np.isfinite(x1) & (x1 > x0), x1 - x0, 1.0)
        t = np.clip((x - x0) / span, 0.0, 1.0)
        out = np.where(k == 0, 0.0, np.where(np.isfinite(x1) & (k < L), c0 + t * (c1 - c0),
                                             c0))
        return np.asarray(out, dtype=np.float64)

    def quantile_at(self, feats: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The first ``x`` where the marginal CDF of ``feats[i]`` reaches ``u[i, :]``."""
        compiled = self._compiled(feats, u, 1)
        if compiled is not None:
            return compiled
        k = _count_below(self.cdf, feats, u, strict=True)  # first point with cdf >= u
        L = self.xs.shape[1]
        fr = feats.reshape((-1,) + (1,) * (u.ndim - 1)).astype(np.int64)
        i1 = np.minimum(k, L - 1)
        i0 = np.maximum(k - 1, 0)
        x0, x1 = self.xs[fr, i0], self.xs[fr, i1]
        c0, c1 = self.cdf[fr, i0], self.cdf[fr, i1]
        step = np.where(c1 > c0, c1 - c0, 1.0)
        t = np.clip((u - c0) / step, 0.0, 1.0)
        out = np.where(k == 0, x1, x0 + t * np.where(np.isfinite(x1), x1 - x0, 0.0))
        return np.asarray(out, dtype=np.float64)
