"""The secure pooled-CDF sketch: candidates and their statistics from one secure sum.

The paper's sketch has every client disclose its own quantiles. Quantiles are not sums, so the
``secure_cdf`` sketch asks instead, per node and feature slot, the statistics of the rows in
each cell of a grid inside the node's box (the schema's public bounds intersected with the
ancestors' splits), summed by secure aggregation like any other statistic. The cells' counts
give the pooled CDF and their cumulative statistics the gain of a split at every cell edge
(Theorem 4), so one secure sum gives both the candidates and their gains.

**Grid.** The cells sit at equal steps of a prior CDF restricted to the node's box: the pooled
marginal of the feature (:class:`Marginal`, from the first level whose nodes evaluate it, whose
boxes are still the public bounds). Where a node's rows follow the marginal restricted to its
box (features independent of the ancestors' splits) every cell holds about ``1/B_nu`` of the
node. Without a prior (the roots) the grid is ``4 B_nu`` cells of equal width (never more cells
than ``n_nu / r``).

**Refinement.** A cell that holds more than ``4/B_nu`` of the node's pooled rows (``3/B_nu`` at
the box's ends) and more than :data:`MIN_HEAVY_ROWS` rows is cut into finer cells in a further
round, for the (node, slot) rows that have such a cell only, at most ``max_rounds`` rounds in
all: heavy regions (clean data beside x1000 outliers, features that depend on the ancestors'
splits) are resolved where fixed-width histograms are not. A cell whose whole mass stayed in
one sub-cell is cut at equal steps and, besides, at geometric steps from both its ends (down
to 2^-40 of its width), so data beside one far value (a sentinel such as 9999999, which puts
all the other rows in the first grid's end cell) is reached in one round at any scale; in
the last round every heavy cell gets the most sub-cells the budget allows. A cell whose whole
mass stays in one of its sub-cells three times in a row holds a single value (an atom) and is
not cut again; at later levels a cell of that feature no wider than such an atom is taken as
one (the ``atom_width`` a :class:`SecureCdfPlanner` is given). With B >= 16 every candidate
comes within 2/B of its pooled rank beside one far value at either end (tested to 10^10
times the data's spread) and for data anywhere inside public bounds up to 10^6 times wider
than it (``tests/test_secure_cdf.py``); data deep inside bounds 10^7 times wider or more (far
values of different sizes at both ends) is beyond what the equal cuts reach in four rounds.
No cell narrower than :data:`MIN_CELL` of its box is cut: where the middle half of a feature's
distinct values spans less than that of its bounds (data beside one value some 10^12 times
their spread away), the roots' candidates miss the data's bulk, and the forest splits on the
feature later and less often (banknote beside a value 10^18 away: half as often; 10^20:
never). The estimators warn at fit
(:func:`~fedforest_secure._estimator_inputs.warn_unresolved`).

**Candidates.** For ``b = 1 .. B_nu - 1`` the cell edge whose pooled CDF is nearest to
``b / B_nu``: a target inside a cell is at most half the cell's mass from one of its edges (the
whole mass less ``1/B_nu`` in the box's end cells), so once no cell is heavy every ``b / B_nu``
has a candidate within ``2 / B_nu`` of pooled rank (the paper's sketch guarantees ``1 / B``,
Theorem 1), and where a node's rows follow the prior the cells hold about ``1/B_nu`` each and
the candidates are the pooled quantiles. The statistics of the bins between consecutive
candidates are sums of cells. Adaptive B: ``B_nu = min(B, n_nu / r)``. The
server sees only pooled statistics per cell, never a client's quantile.

All rows (node x feature slot) are handled at once with padded arrays: ``edges`` (R, W) sorted
and ``+inf``-padded, ``counts`` (R, W + 1) and ``stats`` (R, W + 1, S) per cell.
"""

from __future__ import annotations

import numpy as np

from . import _kernels
from ._cdf_prior import Marginal
from ._cdf_prior import _count_below as _count_below  # re-exported
from .errors import InvalidMessage

__all__ = ["FIRST_CELLS", "HEAVY_MASS", "MIN_CELL", "MIN_HEAVY_ROWS", "Marginal",
           "SecureCdfPlanner"]

#: a cell holding more than HEAVY_MASS / B_nu of its node's rows is refined (at the box's
#: ends, where only one edge is a candidate, more than (HEAVY_MASS - 1) / B_nu) ...
HEAVY_MASS = 4.0
#: ... if it also holds more than this many (weighted) rows: an equal-mass cell of a small
#: node exceeds HEAVY_MASS / B_nu by sampling noise (bootstrap multiplicities make the counts
#: clump), not because the prior is wrong, and a finer grid would resolve single rows
MIN_HEAVY_ROWS = 64.0
#: cells per B_nu of a grid without a prior (equal widths)
FIRST_CELLS = 4
#: at most this many sub-cells per refined cell and round
MAX_SUB = 64
#: a cell whose whole mass stayed in one sub-cell this many refinements in a row is taken as
#: a single value (an atom) and not cut again
ATOM_RUNS = 3
#: a cell no wider than this fraction of its node's box is not cut again (about 2^-40, the
#: finest geometric step): values closer together than that at the roots, whose boxes are
#: the public bounds, are not told apart until a split narrows the box
MIN_CELL = 1e-12


def _steps(rows: np.ndarray, reps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every entry ``i`` of ``rows``, ``reps[i]`` entries: its row and the step ``k = 1 ..
    reps[i]``."""
    reps = np.maximum(reps, 0)
    k = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps) + 1
    return np.repeat(rows, reps), k


def _distinct_sorted(edges: np.ndarray) -> np.ndarray:
    """Each row sorted, repeated values replaced by +inf (and moved to the end)."""
    out = np.sort(edges, axis=1)
    dup = np.zeros(out.shape, dtype=bool)
    dup[:, 1:] = out[:, 1:] == out[:, :-1]
    if dup.any():
        out[dup] = np.inf
        out.sort(axis=1)
    width = int(np.isfinite(out).sum(axis=1).max()) if out.size else 0
    return out[:, :max(width, 1)]


class SecureCdfPlanner:
    """Plans the grid rounds of one level's evaluated nodes and turns their pooled statistics
    into candidates (module docstring).

    Parameters
    ----------
    lo, hi : (E, m) the box of each (node, slot)
    feats : (E, m) feature per slot (-1 for none)
    is_cat : (d,) categorical flags (categorical slots need no grid)
    n_nodes_rows : (E,) pooled (weighted) rows per node
    n_bins : B
    rows_per_point : r for adaptive B (0 = off)
    marginal : the prior of the grids (None or a feature it does not know: equal widths)
    atom_width : (d,) per feature, cells no wider than this are single values (not refined)
    max_rounds : at most this many grid rounds (the first and its refinements)
    """

    def __init__(self, lo: np.ndarray, hi: np.ndarray, feats: np.ndarray, is_cat: np.ndarray,
                 n_nodes_rows: np.ndarray, n_bins: int, rows_per_point: int = 0, *,
                 marginal: Marginal | None = None, atom_width: np.ndarray | None = None,
                 max_rounds: int = 4) -> None:
        E, m = feats.shape
        self.shape = (E, m)
        self.B = n_bins
        self.feats = feats
        R = E * m
        self.R = R
        self.lo = lo.reshape(R).astype(np.float64)
        self.hi = hi.reshape(R).astype(np.float64)
        f = feats.reshape(R)
        self.fr = np.maximum(f, 0).astype(np.int64)
        self.active = (f >= 0) & ~is_cat[self.fr] & (self.hi > self.lo)
        n = np.repeat(np.asarray(n_nodes_rows, dtype=np.float64), m)
        self.r = int(rows_per_point)
        bnu = np.full(R, n_bins, dtype=np.int64)
        if self.r >= 1:
            bnu = np.clip((n // self.r).astype(np.int64), 1, n_bins)
        self.bnu = bnu
        #: B', the bins of the candidates' histogram: the largest B_nu of a row with a grid (at
        #: least 2, at most B). No row has more than B_nu - 1 candidates: an n_bins above what
        #: adaptive B allows pads no array, nor the histograms the clients sum
        self.width = min(n_bins, max(2, int(bnu[self.active].max(initial=0))))
        self.max_rounds = max_rounds
        self.rounds = 0
        # MIN_CELL of the box's width without overflowing near the float maximum (halves
        # scale exactly: the same bits as MIN_CELL * |hi - lo| wherever that is finite)
        self.tol = 2.0 * MIN_CELL * np.maximum(np.abs(self.hi * 0.5 - self.lo * 0.5), 0.5e-300)
        aw = np.zeros(int(is_cat.size)) if atom_width is None else atom_width
        self.atom_floor = np.maximum(self.tol, aw[self.fr])
        self.edges = self._first_edges(n, marginal)
        self._picked: tuple[np.ndarray, np.ndarray] | None = None  # _picks, until receive
        self.counts = np.zeros((R, self.edges.shape[1] + 1))
        self.stats: np.ndarray | None = None
        self.unsplit = np.zeros((R, self.edges.shape[1] + 1), dtype=np.int8)
        self.pending = self.active.copy()  # rows whose next grid must be summed
        # refinement bookkeeping: per new cell, its cell in the previous grid (-1: none)
        self._parent: np.ndarray | None = None
        self._prev: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------ the first grid
    def _first_edges(self, n: np.ndarray, marginal: Marginal | None) -> np.ndarray:
        R, lo, hi, bnu = self.R, self.lo, self.hi, self.bnu
        known = (marginal.known[self.fr] if marginal is not None
                 else np.zeros(R, dtype=bool)) & self.active
        r = max(self.r, 1)
        uniform_cells = np.minimum(FIRST_CELLS * bnu, np.maximum(bnu, (n // r).astype(np.int64)))
        cells = np.where(known, bnu, uniform_cells)
        cells = np.where(self.active, cells, 1)
        top = int(cells.max()) if R else 1
        g = np.arange(1, max(top, 2), dtype=np.float64)
        frac = g[None, :] / cells[:, None]
        valid = g[None, :] < cells[:, None]
        with np.errstate(over="ignore", invalid="ignore"):
            span = hi - lo  # past the float maximum for a box of values near it
            edges = lo[:, None] + span[:, None] * frac
            wide = ~np.isfinite(span)
            if wide.any():  # the same points without the overflowing width
                edges[wide] = lo[wide, None] * (1.0 - frac[wide]) + hi[wide, None] * frac[wide]
        rows = np.flatnonzero(known)
        if rows.size and marginal is not None:
            u_lo = marginal.cdf_at(self.fr[rows], lo[rows])
            u_hi = marginal.cdf_at(self.fr[rows], hi[rows])
            mass = u_hi - u_lo > 1e-12  # the marginal has mass in the box: follow it
            rows, u_lo, u_hi = rows[mass], u_lo[mass], u_hi[mass]
            if rows.size:
                u = u_lo[:, None] + (u_hi - u_lo)[:, None] * np.minimum(frac[rows], 1.0)
                edges[rows] = marginal.quantile_at(self.fr[rows], u)
        inside = valid & self.active[:, None] & (edges > lo[:, None]) & (edges < hi[:, None])
        return _distinct_sorted(np.where(inside, edges, np.inf))

    # ------------------------------------------------------------------ rounds
    def active_features(self) -> np.ndarray:
        """Features to count in the next round (-1 where a slot is finished)."""
        return np.where(self.pending.reshape(self.shape), self.feats, -1)

    def next_grid(self) -> np.ndarray | None:
        """Thresholds (E, m, W) of the next round, or None when the sketch is done."""
        if not self.pending.any() or self.rounds >= self.max_rounds:
            return None
        if self.pending.all():
            return self.edges.reshape(self.shape + (self.edges.shape[1],))
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

    def receive(self, counts: np.ndarray, stats: np.ndarray | None = None) -> None:
        """Pooled counts (E, m, W' + 1) per cell of the grid just sent, and optionally every
        cell's statistics (E, m, W' + 1, S); plan the next round."""
        self.rounds += 1
        self._picked = None  # the counts (and maybe the edges) change
        R = self.R
        W = self.edges.shape[1]
        c = np.maximum(counts.reshape(R, -1), 0.0)
        if (c > 2.0**53).any():  # beyond exact counting: a crafted sum, not rows
            raise InvalidMessage("a grid cell's pooled count exceeds 2^53 rows")
        w = min(c.shape[1], W + 1)
        if c.shape[1] == W + 1:
            got = c
        else:
            got = np.zeros((R, W + 1))
            got[:, :w] = c[:, :w]
        pend = self.pending
        if stats is not None:
            st = stats.reshape(R, c.shape[1], -1)
            if self.stats is None:  # the first round: every active row was asked
                if st.shape[1] == W + 1:
                    self.stats = st  # the caller's array, read only, not copied
                else:
                    self.stats = np.zeros((R, W + 1, st.shape[2]))
                    self.stats[:, :w] = st[:, :w]
            else:
                self.stats[pend] = 0.0
                self.stats[pend, :w] = st[pend, :w]
        if self._parent is not None and self._prev is not None:
            self.unsplit[pend] = self._unsplit(got, self._parent, self._prev)[pend]
        self.counts[pend] = got[pend]
        self._parent = self._prev = None
        if self.rounds >= self.max_rounds:
            self.pending = np.zeros(R, dtype=bool)
            return
        self._plan_refinement()

    def _unsplit(self, got: np.ndarray, parent: np.ndarray,
                 prev: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """Per new cell: how many refinements in a row left its mass in one cell
        (``parent``: its cell in the previous grid; ``prev``: that grid's counts, unsplit
        counts and heavy cells)."""
        prev_counts, prev_unsplit, prev_heavy = prev
        rows = np.arange(self.R)[:, None]
        p = np.maximum(parent, 0)
        whole = (parent >= 0) & prev_heavy[rows, p] & (got > 0) & (got == prev_counts[rows, p])
        out: np.ndarray = np.where(whole, prev_unsplit[rows, p] + 1, 0).astype(np.int8)
        return out

    def _plan_refinement(self) -> None:
        R = self.R
        total = self.counts.sum(axis=1)
        left, right = self._cells()
        share = np.full(self.counts.shape, HEAVY_MASS)
        share[:, 0] = HEAVY_MASS - 1.0  # the box's end cells
        share[np.arange(R), np.isfinite(self.edges).sum(axis=1)] = HEAVY_MASS - 1.0
        limit = np.maximum(share * (total / self.bnu)[:, None], MIN_HEAVY_ROWS)
        heavy = ((self.counts > limit) & (right - left > self.atom_floor[:, None])
                 & (self.unsplit < ATOM_RUNS) & self.pending[:, None])
        n_heavy = heavy.sum(axis=1)
        refine = n_heavy > 0
        if not refine.any():
            self.pending = np.zeros(R, dtype=bool)
            return
        # sub-cells: about half an equal-mass cell each, many for a suspected atom, never
        # more than the rows allow (r per cell) nor a budget of 4 B new edges per row (a cell that
        # kept its whole mass adds geometric ones besides, see below)
        r = max(self.r, 1)
        want = np.ceil(2.0 * self.counts * self.bnu[:, None] / np.maximum(total, 1.0)[:, None])
        sub = np.clip(want, 2, MAX_SUB).astype(np.int64)
        sub = np.where(self.unsplit >= 1, MAX_SUB, sub)
        if self.rounds + 1 >= self.max_rounds:  # the last round: no later one mends a cell
            sub[:] = MAX_SUB                    # whose rows sit at one end
        sub = np.minimum(sub, np.maximum(2, (self.counts // r).astype(np.int64)))
        budget = np.maximum(2, (4 * self.B) // np.maximum(n_heavy, 1))
        sub = np.minimum(sub, budget[:, None])
        hr, hc = np.nonzero(heavy)
        # a cell whose mass stayed whole in one sub-cell holds a cluster narrower than the
        # sub-cells (or an atom): besides its equal steps, up to MAX_SUB / 2 edges at
        # geometric steps from both ends (down to 2^-40 of its width; from what the budget
        # leaves, or 2 B more per row), which cut a cluster beside one end at any scale in
        # one round (data beside a far value, the box's end at the data's minimum or maximum)
        n_sub = sub[hr, hc]
        room = np.maximum(budget[hr] - n_sub, (2 * self.B) // np.maximum(n_heavy[hr], 1))
        geo = np.where(self.unsplit[hr, hc] >= 1, np.clip(room // 2, 0, MAX_SUB // 4), 0)
        n_eq = n_sub
        rr_eq, k_eq = _steps(hr, n_eq - 1)
        rr_geo, k_geo = _steps(hr, geo)
        cell_eq, cell_geo = np.repeat(np.arange(hr.size), n_eq - 1), np.repeat(
            np.arange(hr.size), geo)
        lw, rw = left[hr, hc], right[hr, hc]
        w = rw - lw
        # the first half of the steps of ratio 1/4 (fine cells near the end), the rest
        # steeper, down to 2^-40 of the width
        g = geo[cell_geo].astype(np.float64)
        half = np.ceil(g / 2.0)
        steep = np.maximum(2.0, (40.0 - 2.0 * half) / np.maximum(g - half, 1.0))
        frac = np.exp2(-2.0 * np.minimum(k_geo, half) - steep * np.maximum(k_geo - half, 0))
        rr = np.concatenate([rr_eq, rr_geo, rr_geo])
        new_vals = np.concatenate([
            lw[cell_eq] + w[cell_eq] * k_eq / n_eq[cell_eq],
            lw[cell_geo] + w[cell_geo] * frac, rw[cell_geo] - w[cell_geo] * frac])
        old_r, old_c = np.nonzero(np.isfinite(self.edges) & refine[:, None])
        rows = np.concatenate([old_r, rr])
        vals = np.concatenate([self.edges[old_r, old_c], new_vals])
        is_old = np.concatenate([np.ones(old_r.size, dtype=bool), np.zeros(rr.size, dtype=bool)])
        inside = (vals > self.lo[rows]) & (vals < self.hi[rows])
        rows, vals, is_old = rows[inside], vals[inside], is_old[inside]
        order = np.lexsort((~is_old, vals, rows))  # an old edge first among equal values
        rows, vals, is_old = rows[order], vals[order], is_old[order]
        keep = np.ones(rows.size, dtype=bool)
        keep[1:] = (rows[1:] != rows[:-1]) | (vals[1:] != vals[:-1])
        rows, vals, is_old = rows[keep], vals[keep], is_old[keep]
        # a row whose heavy cells admit no new edge (cells as narrow as floats allow) is done:
        # asking its grid again would repeat a question the clients already answered
        gained = np.zeros(R, dtype=bool)
        gained[rows[~is_old]] = True
        if (refine & ~gained).any():
            refine = refine & gained
            if not refine.any():
                self.pending = np.zeros(R, dtype=bool)
                return
            mine = refine[rows]
            rows, vals, is_old = rows[mine], vals[mine], is_old[mine]
        cnt = np.bincount(rows, minlength=R)
        start = np.cumsum(cnt) - cnt
        col = np.arange(rows.size) - start[rows]
        W = self.edges.shape[1]
        width = max(int(cnt.max()), W, 1)
        edges = np.full((R, width), np.inf)
        edges[:, :W] = self.edges
        edges[refine] = np.inf
        edges[rows, col] = vals
        # the previous cell of every new cell: old edges at or before its left end
        olds = np.zeros((R, width), dtype=np.int64)
        olds[rows, col] = is_old
        parent = np.full((R, width + 1), -1, dtype=np.int64)
        parent[:, 0] = 0
        parent[:, 1:] = np.cumsum(olds, axis=1)
        n_new = np.isfinite(edges).sum(axis=1)
        parent[np.arange(width + 1)[None, :] > n_new[:, None]] = -1
        parent[~refine] = -1
        self._prev = (self.counts, self.unsplit, heavy)
        self._parent = parent
        self.edges = edges
        self.counts = np.zeros((R, width + 1))
        self.counts[~refine, : W + 1] = self._prev[0][~refine]
        unsplit = np.zeros((R, width + 1), dtype=np.int8)
        unsplit[~refine, : W + 1] = self._prev[1][~refine]
        self.unsplit = unsplit
        if self.stats is not None:
            stats = np.zeros((R, width + 1, self.stats.shape[2]))
            stats[~refine, : W + 1] = self.stats[~refine]
            self.stats = stats
        self.pending = refine

    # ------------------------------------------------------------------ results
    def atoms(self) -> tuple[np.ndarray, np.ndarray]:
        """Features and widths of the cells found to hold a single value (unsplit twice)."""
        left, right = self._cells()
        r, c = np.nonzero((self.unsplit >= ATOM_RUNS) & self.active[:, None])
        return self.fr[r], (right - left)[r, c]

    def _picks(self) -> tuple[np.ndarray, np.ndarray]:
        """Rows with candidates and, per row, the chosen edges' indices (sorted, ``W`` where
        none): for b = 1 .. B_nu - 1 the edge whose pooled CDF is nearest to b / B_nu.
        Computed once per state of the grid (candidates and histogram both ask)."""
        if self._picked is None:
            self._picked = self._pick()
        return self._picked

    def _pick(self) -> tuple[np.ndarray, np.ndarray]:
        B = self.width  # every b >= B_nu is padding: b < B' covers a row's candidates
        W = self.edges.shape[1]
        total = self.counts.sum(axis=1)
        ok = self.active & (total > 0) & (self.bnu >= 2) & np.isfinite(self.edges).any(axis=1)
        rows = np.flatnonzero(ok)
        if rows.size == 0:
            return rows, np.zeros((0, max(B - 1, 0)), dtype=np.int64)
        if _kernels.KERNELS is not None and B >= 2:  # the same picks, row by row
            pick = np.empty((rows.size, B - 1), dtype=np.int64)
            _kernels.KERNELS.grid_picks(rows.astype(np.int64),
                                        _kernels.f64(self.counts),
                                        _kernels.f64(total),
                                        _kernels.f64(self.edges),
                                        _kernels.i64(self.bnu), pick,
                                        B, W)
            return rows, pick
        cum = np.cumsum(self.counts[rows], axis=1)[:, :W] / total[rows, None]
        fin = np.isfinite(self.edges[rows])
        cum = np.where(fin, cum, 3.0)  # padding edges are never the nearest
        b = np.arange(1, B)
        u = b[None, :] / self.bnu[rows, None]
        valid = b[None, :] < self.bnu[rows, None]
        offs = 4.0 * np.arange(rows.size)[:, None]
        i = np.searchsorted((cum + offs).ravel(), (u + offs).ravel(), side="left")
        i = i.reshape(u.shape) - np.arange(rows.size)[:, None] * W
        hi_i = np.clip(i, 0, W - 1)
        lo_i = np.clip(i - 1, 0, W - 1)
        d_hi = np.abs(np.take_along_axis(cum, hi_i, axis=1) - u)
        d_lo = np.abs(np.take_along_axis(cum, lo_i, axis=1) - u)
        pick = np.where(d_lo <= d_hi, lo_i, hi_i)
        pick = np.where(valid, pick, W)
        pick.sort(axis=1)
        dup = np.zeros(pick.shape, dtype=bool)
        dup[:, 1:] = pick[:, 1:] == pick[:, :-1]
        pick[dup] = W
        pick.sort(axis=1)
        return rows, pick

    def candidates(self) -> np.ndarray:
        """Thresholds (E, m, B' - 1) (:attr:`width`): the chosen cell edges, sorted and +inf
        padded."""
        R, B = self.R, self.width
        out = np.full((R, max(B - 1, 0)), np.inf)
        rows, pick = self._picks()
        if rows.size:
            W = self.edges.shape[1]
            padded = np.concatenate([self.edges[rows], np.full((rows.size, 1), np.inf)], axis=1)
            out[rows] = np.take_along_axis(padded, np.minimum(pick, W), axis=1)
        return out.reshape(self.shape + (max(B - 1, 0),))

    def histogram(self) -> np.ndarray:
        """Statistics (E, m, B', S) (:attr:`width`) of the bins between the candidates (bin b
        holds t_{b-1} < x <= t_b), summed from the cells' statistics (which this spends: call
        it once, after the last round)."""
        if self.stats is None:
            raise ValueError("the grid rounds carried counts only")
        R, B = self.R, self.width
        S = self.stats.shape[2]
        out = np.zeros((R, B, S))
        out[:, 0] = self.stats.sum(axis=1)  # no candidate: every row in the first bin
        rows, pick = self._picks()
        if rows.size:
            cum = np.cumsum(self.stats, axis=1)  # through cell i (the cells' own are kept)
            self.stats = None  # spent
            at = cum[rows[:, None], pick]  # (R', B - 1, S): everything left of each candidate
            part = out[rows]
            part[:, 0] = at[:, 0]
            part[:, 1:B - 1] = np.diff(at, axis=1)
            part[:, B - 1] = cum[rows, -1] - at[:, -1]
            out[rows] = part
        return out.reshape(self.shape + (B, S))
