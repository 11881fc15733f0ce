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
"""

from __future__ import annotations

import numpy as np

__all__ = ["SecureCdfPlanner"]


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
        self.lo = lo.reshape(R).astype(np.float64)
        self.hi = hi.reshape(R).astype(np.float64)
        f = feats.reshape(R)
        self.active = (f >= 0) & ~is_cat[np.maximum(f, 0)] & (self.hi > self.lo)
        nb = np.repeat(np.asarray(n_nodes_rows, dtype=np.float64), m)
        bnu = np.full(R, n_bins, dtype=np.int64)
        if rows_per_point >= 1:
            bnu = np.clip((nb // rows_per_point).astype(np.int64), 1, n_bins)
        self.bnu = bnu
        g0 = initial_cells or 4 * n_bins
        frac = np.arange(1, g0) / g0
        self.edges: list[np.ndarray] = [
            self.lo[r] + (self.hi[r] - self.lo[r]) * frac if self.active[r] else np.zeros(0)
            for r in range(R)]
        self.counts: list[np.ndarray] = [np.zeros(e.size + 1) for e in self.edges]
        self.pending = self.active.copy()  # rows whose next grid must be counted
        self.rounds = 0
        self.max_rounds = max_rounds
        self.budget = budget or 8 * n_bins
        self.tol = 1e-9 * np.maximum(np.abs(self.hi - self.lo), 1e-300)

    def active_features(self) -> np.ndarray:
        """Features to count in the next round (-1 where a slot is finished)."""
        return np.where(self.pending.reshape(self.shape), self.feats, -1)

    def next_grid(self) -> np.ndarray | None:
        """Thresholds (E, m, W) of the next counting round, or None when the sketch is done."""
        if not self.pending.any() or self.rounds >= self.max_rounds:
            return None
        width = max((self.edges[r].size for r in np.flatnonzero(self.pending)), default=0)
        grid = np.full((len(self.edges), max(width, 1)), np.inf)
        for r in np.flatnonzero(self.pending):
            grid[r, : self.edges[r].size] = self.edges[r]
        return grid.reshape(self.shape + (grid.shape[1],))

    def receive(self, counts: np.ndarray) -> None:
        """Pooled counts per cell (E, m, W + 1) for the grid just sent; plan the next one."""
        self.rounds += 1
        R = len(self.edges)
        c = np.maximum(counts.reshape(R, -1), 0.0)
        refine_next = np.zeros(R, dtype=bool)
        for r in np.flatnonzero(self.pending):
            e = self.edges[r]
            cnt = c[r, : e.size + 1]
            self.counts[r] = cnt
            total = cnt.sum()
            if total <= 0 or self.rounds >= self.max_rounds:
                continue
            left = np.concatenate([[self.lo[r]], e])
            right = np.concatenate([e, [self.hi[r]]])
            heavy = (cnt > total / (2.0 * self.bnu[r])) & (right - left > self.tol[r])
            if not heavy.any():
                continue
            sub = int(max(2, min(64, self.budget // int(heavy.sum()))))
            frac = np.arange(1, sub) / sub
            new = [left[heavy][:, None] + (right[heavy] - left[heavy])[:, None] * frac[None, :]]
            # drop edges between two empty cells: they carry no information
            keep = (cnt[:-1] > 0) | (cnt[1:] > 0)
            merged = np.unique(np.concatenate([e[keep], *[x.ravel() for x in new]]))
            self.edges[r] = merged[(merged > self.lo[r]) & (merged < self.hi[r])]
            refine_next[r] = True
        self.pending = refine_next

    def candidates(self) -> np.ndarray:
        """Thresholds (E, m, B - 1): the pooled sketch CDF inverted at b / B_nu (+inf padded)."""
        R = len(self.edges)
        B = self.B
        out = np.full((R, B - 1), np.inf)
        for r in np.flatnonzero(self.active):
            e = self.edges[r]
            cnt = self.counts[r]
            if cnt.size != e.size + 1:
                continue
            total = cnt.sum()
            if total <= 0:
                continue
            bn = int(self.bnu[r])
            if bn < 2:
                continue
            left = np.concatenate([[self.lo[r]], e])
            right = np.concatenate([e, [self.hi[r]]])
            cum = np.cumsum(cnt) / total
            u = np.arange(1, bn) / bn
            i = np.searchsorted(cum, u - 1e-12, side="left")
            i = np.minimum(i, cnt.size - 1)
            before = np.where(i > 0, cum[np.maximum(i - 1, 0)], 0.0)
            share = np.where(cnt[i] > 0, (u - before) * total / np.where(cnt[i] > 0, cnt[i], 1), 1.0)
            t = left[i] + np.clip(share, 0.0, 1.0) * (right[i] - left[i])
            t = np.unique(t)
            out[r, : t.size] = t
        return out.reshape(self.shape + (B - 1,))
