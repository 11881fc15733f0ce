"""The secure pooled-CDF sketch: candidate thresholds from securely summed counts.

The paper's sketch has every client disclose its own quantiles. Quantiles are not sums, so the
``secure_cdf`` sketch builds the pooled CDF from counts instead, which secure aggregation can
sum: per node and feature, counts of rows in the cells of a grid inside the node's box (the
schema's public bounds intersected with the ancestors' splits). Cells that hold more than
``1/(2 B_nu)`` of the node's pooled mass are cut into finer cells in a further round, at most
``max_rounds`` rounds in all, so heavy regions (e.g. clean data next to x1000 outliers) are
resolved where fixed-width histograms are not. Candidates are read off the piecewise-linear
pooled CDF (mass spread uniformly inside each cell) at ``b / B_nu``; the pooled rank error of a
candidate is at most the mass of the cell it falls in. Adaptive B: ``B_nu = min(B, n_nu / r)``.
The server sees only pooled counts per cell, never a client's quantile.

All rows (node x feature slot) are handled at once with padded arrays: ``edges`` (R, W) sorted
and ``+inf``-padded, ``counts`` (R, W + 1) per cell.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SecureCdfPlanner"]


def _pack(rows: np.ndarray, vals: np.ndarray, R: int) -> np.ndarray:
    """Sorted distinct values per row as a (R, W) array padded with +inf."""
    if vals.size == 0:
        return np.full((R, 1), np.inf)
    order = np.lexsort((vals, rows))
    rows, vals = rows[order], vals[order]
    keep = np.ones(vals.size, dtype=bool)
    keep[1:] = (rows[1:] != rows[:-1]) | (vals[1:] != vals[:-1])
    rows, vals = rows[keep], vals[keep]
    cnt = np.bincount(rows, minlength=R)
    width = max(int(cnt.max()), 1)
    start = np.cumsum(cnt) - cnt
    col = np.arange(rows.size) - start[rows]
    out = np.full((R, width), np.inf)
    out[rows, col] = vals
    return out


class SecureCdfPlanner:
    """Plans the grid rounds for one level's evaluated nodes and turns counts into candidates.

    Parameters
    ----------
    lo, hi : (E, m) the box of each (node, slot)
    feats : (E, m) feature per slot (-1 for none)
    is_cat : (d,) categorical flags (categorical slots need no sketch)
    n_nodes_rows : (E,) pooled (weighted) rows per node
    n_bins : B
    rows_per_point : r for adaptive B (0 = off)
    """

    def __init__(self, lo: np.ndarray, hi: np.ndarray, feats: np.ndarray, is_cat: np.ndarray,
                 n_nodes_rows: np.ndarray, n_bins: int, rows_per_point: int = 0,
                 initial_cells: int | None = None, max_rounds: int = 4,
                 budget: int | None = None) -> None:
        E, m = feats.shape
        self.shape = (E, m)
        self.B = n_bins
        self.feats = feats
        R = E * m
        self.R = R
        self.lo = lo.reshape(R).astype(np.float64)
        self.hi = hi.reshape(R).astype(np.float64)
        f = feats.reshape(R)
        self.active = (f >= 0) & ~is_cat[np.maximum(f, 0)] & (self.hi > self.lo)
        nb = np.repeat(np.asarray(n_nodes_rows, dtype=np.float64), m)
        bnu = np.full(R, n_bins, dtype=np.int64)
        if rows_per_point >= 1:
            bnu = np.clip((nb // rows_per_point).astype(np.int64), 1, n_bins)
        self.bnu = bnu
        g0 = initial_cells or 2 * n_bins
        frac = np.arange(1, g0) / g0
        edges = self.lo[:, None] + (self.hi - self.lo)[:, None] * frac[None, :]
        self.edges = np.where(self.active[:, None], edges, np.inf)
        self.counts = np.zeros((R, self.edges.shape[1] + 1))
        self.pending = self.active.copy()  # rows whose next grid must be counted
        self.rounds = 0
        self.max_rounds = max_rounds
        self.budget = budget or 4 * n_bins
        self.tol = 1e-9 * np.maximum(np.abs(self.hi - self.lo), 1e-300)

    def active_features(self) -> np.ndarray:
        """Features to count in the next round (-1 where a slot is finished)."""
        return np.where(self.pending.reshape(self.shape), self.feats, -1)

    def next_grid(self) -> np.ndarray | None:
        """Thresholds (E, m, W) of the next counting round, or None when the sketch is done."""
        if not self.pending.any() or self.rounds >= self.max_rounds:
            return None
        grid = np.where(self.pending[:, None], self.edges, np.inf)
        width = max(int(np.isfinite(grid).sum(axis=1).max()), 1)
        return grid[:, :width].reshape(self.shape + (width,))

    def _cells(self) -> tuple[np.ndarray, np.ndarray]:
        """Left and right end of every cell (R, W + 1); padding cells are empty at ``hi``."""
        hi = self.hi[:, None]
        e = np.where(np.isfinite(self.edges), self.edges, hi)
        left = np.concatenate([self.lo[:, None], e], axis=1)
        right = np.concatenate([e, hi], axis=1)
        return left, right

    def receive(self, counts: np.ndarray) -> None:
        """Pooled counts per cell (E, m, W' + 1) for the grid just sent; plan the next one."""
        self.rounds += 1
        R = self.R
        W = self.edges.shape[1]
        c = np.maximum(counts.reshape(R, -1), 0.0)
        got = np.zeros((R, W + 1))
        w = min(c.shape[1], W + 1)
        got[:, :w] = c[:, :w]
        # padding cells beyond a row's edges are empty; their mass sits in the row's last cell
        n_edges = np.isfinite(self.edges).sum(axis=1)
        tail = got[:, w - 1:].sum(axis=1) if c.shape[1] > W + 1 else None
        if tail is not None:  # pragma: no cover - the grid is never wider than the edges
            got[np.arange(R), n_edges] = tail
        self.counts = np.where(self.pending[:, None], got, self.counts)
        total = self.counts.sum(axis=1)
        if self.rounds >= self.max_rounds:
            self.pending[:] = False
            return
        left, right = self._cells()
        heavy = ((self.counts > (total / (2.0 * self.bnu))[:, None])
                 & (right - left > self.tol[:, None]) & self.pending[:, None]
                 & (total > 0)[:, None])
        n_heavy = heavy.sum(axis=1)
        refine = n_heavy > 0
        if not refine.any():
            self.pending[:] = False
            return
        sub = np.maximum(2, np.minimum(64, self.budget // np.maximum(n_heavy, 1)))
        hr, hc = np.nonzero(heavy)
        reps = sub[hr] - 1
        rr = np.repeat(hr, reps)
        frac = (np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps) + 1) \
            / np.repeat(sub[hr], reps)
        new_vals = np.repeat(left[hr, hc], reps) + np.repeat((right - left)[hr, hc], reps) * frac
        # keep old edges of refined rows unless both neighbouring cells are empty
        occupied = self.counts > 0
        keep = (occupied[:, :-1] | occupied[:, 1:]) & np.isfinite(self.edges) & refine[:, None]
        kr, kc = np.nonzero(keep)
        rows = np.concatenate([kr, rr])
        vals = np.concatenate([self.edges[kr, kc], new_vals])
        inside = (vals > self.lo[rows]) & (vals < self.hi[rows])
        packed = _pack(rows[inside], vals[inside], R)
        width = max(packed.shape[1], W)
        edges = np.full((R, width), np.inf)
        edges[:, :W] = self.edges
        counts = np.zeros((R, width + 1))
        counts[:, : W + 1] = self.counts
        edges[refine] = np.inf
        edges[refine, : packed.shape[1]] = packed[refine]
        counts[refine] = 0.0
        self.edges, self.counts = edges, counts
        self.pending = refine

    def candidates(self) -> np.ndarray:
        """Thresholds (E, m, B - 1): the pooled sketch CDF inverted at b / B_nu (+inf padded)."""
        R, B = self.R, self.B
        out = np.full((R, B - 1), np.inf)
        total = self.counts.sum(axis=1)
        ok = self.active & (total > 0) & (self.bnu >= 2)
        if not ok.any():
            return out.reshape(self.shape + (B - 1,))
        rows = np.flatnonzero(ok)
        cnt = self.counts[rows]
        left, right = self._cells()
        left, right = left[rows], right[rows]
        tot = total[rows]
        cum = np.cumsum(cnt, axis=1) / tot[:, None]
        C = cum.shape[1]
        b = np.arange(1, B)
        u = b[None, :] / self.bnu[rows, None]
        valid = b[None, :] < self.bnu[rows, None]
        offs = 2.0 * np.arange(rows.size)[:, None]
        i = np.searchsorted((cum + offs).ravel(), (np.minimum(u, 1.0) - 1e-12 + offs).ravel(),
                            side="left").reshape(u.shape) - np.arange(rows.size)[:, None] * C
        i = np.clip(i, 0, C - 1)
        before = np.where(i > 0, np.take_along_axis(cum, np.maximum(i - 1, 0), axis=1), 0.0)
        ci = np.take_along_axis(cnt, i, axis=1)
        share = np.where(ci > 0, (u - before) * tot[:, None] / np.where(ci > 0, ci, 1.0), 1.0)
        t = (np.take_along_axis(left, i, axis=1)
             + np.clip(share, 0.0, 1.0) * np.take_along_axis(right - left, i, axis=1))
        t = np.where(valid, t, np.inf)
        t.sort(axis=1)
        dup = np.zeros(t.shape, dtype=bool)
        dup[:, 1:] = t[:, 1:] == t[:, :-1]
        t[dup] = np.inf
        t.sort(axis=1)
        out[rows] = t
        return out.reshape(self.shape + (B - 1,))
