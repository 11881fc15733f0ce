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

The rows (node x feature slot) still refined are handled at once with padded arrays: ``edges``
(R', W) sorted and ``+inf``-padded, ``counts`` (R', W + 1) per cell. A row whose grid is final
gets its candidates and its bins' statistics in the round that made it final (a run of rows at
a time) and keeps none of its cells, so a level's memory follows its first grid and the rows
refined, not (rows x the widest refined grid): a wide level (many nodes and features) with a
few heavy cells stays within a few times its first round's sums.
"""

from __future__ import annotations

import numpy as np

from ._cdf_grids import cell_ends, cell_ends_at, distinct_sorted, grid_picks, sub_cell_edges
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
#: the planner's row-by-row steps (first grids, heavy cells, final rows' candidates and bins)
#: run over this many cell entries at a time: their temporaries stay a few hundred KB on any
#: level, beside the round's sums and the level's results
CHUNK_ENTRIES = 1 << 15


class SecureCdfPlanner:
    """Plans the grid rounds of one level's evaluated nodes and turns their pooled statistics
    into candidates (module docstring).

    Only the rows still refined keep a grid (:attr:`edges`, :attr:`counts`, :attr:`unsplit`,
    rows of :attr:`work`, padded to the widest of them): a row whose grid is final gets its
    candidates and its bins' statistics at once and drops its cells, so a few rows refined
    deep pad no other row of the level.

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
    keep_cells : (E, m) the (node, slot) rows whose final cells :meth:`final_cells` returns
        (None: every row with a grid)
    """

    def __init__(self, lo: np.ndarray, hi: np.ndarray, feats: np.ndarray, is_cat: np.ndarray,
                 n_nodes_rows: np.ndarray, n_bins: int, rows_per_point: int = 0, *,
                 marginal: Marginal | None = None, atom_width: np.ndarray | None = None,
                 max_rounds: int = 4, keep_cells: np.ndarray | None = None) -> None:
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
        #: the rows (of the E x m) whose grid is still refined, ascending; the next round asks
        #: every one of them
        self.work = np.flatnonzero(self.active)
        #: their grids: edges (sorted, +inf padded), pooled counts per cell, and per cell how
        #: many refinements in a row left its mass whole
        self.edges = self._first_edges(n[self.work], marginal)
        self.counts: np.ndarray = np.zeros((0, 0))  # set from each round's sums
        self.unsplit: np.ndarray = np.zeros((0, 0), dtype=np.int8)
        # refinement bookkeeping: per new cell, its cell in the previous grid (-1: none)
        self._parent: np.ndarray | None = None
        self._prev: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # what the rows whose grid is final leave: candidates, bins' statistics (once a round
        # carries statistics), cells found to be atoms, and the cells ``keep_cells`` asks for
        self._thr: np.ndarray | None = None  # (R, B' - 1), from the first round's sums
        self._hist: np.ndarray | None = None
        self._atoms: list[tuple[np.ndarray, np.ndarray]] = []
        self._keep = self.active if keep_cells is None else self.active & keep_cells.reshape(R)
        self._kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    # ------------------------------------------------------------------ the first grid
    def _first_edges(self, n: np.ndarray, marginal: Marginal | None) -> np.ndarray:
        """The first grid of the rows of :attr:`work` (``n``: their nodes' pooled rows), a
        run of rows at a time."""
        w = self.work
        bnu = self.bnu[w]
        known = marginal.known[self.fr[w]] if marginal is not None \
            else np.zeros(w.size, dtype=bool)
        r = max(self.r, 1)
        uniform_cells = np.minimum(FIRST_CELLS * bnu, np.maximum(bnu, (n // r).astype(np.int64)))
        cells = np.where(known, bnu, uniform_cells)
        step = max(1, CHUNK_ENTRIES // max(int(cells.max(initial=1)), 1))
        parts = [self._first_edges_of(w[a:a + step], cells[a:a + step], known[a:a + step],
                                      marginal) for a in range(0, w.size, step)]
        width = max((p.shape[1] for p in parts), default=1)
        edges = np.full((w.size, width), np.inf)
        a = 0
        for p in parts:
            edges[a:a + p.shape[0], :p.shape[1]] = p
            a += p.shape[0]
        return edges

    def _first_edges_of(self, w: np.ndarray, cells: np.ndarray, known: np.ndarray,
                        marginal: Marginal | None) -> np.ndarray:
        """The first grid of the rows ``w``, ``cells`` cells each: at the prior's quantiles
        where ``known`` (the prior knows the row's feature), else of equal widths."""
        lo, hi, fr = self.lo[w], self.hi[w], self.fr[w]
        top = int(cells.max()) if w.size else 1
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
            u_lo = marginal.cdf_at(fr[rows], lo[rows])
            u_hi = marginal.cdf_at(fr[rows], hi[rows])
            mass = u_hi - u_lo > 1e-12  # the marginal has mass in the box: follow it
            rows, u_lo, u_hi = rows[mass], u_lo[mass], u_hi[mass]
            if rows.size:
                u = u_lo[:, None] + (u_hi - u_lo)[:, None] * np.minimum(frac[rows], 1.0)
                edges[rows] = marginal.quantile_at(fr[rows], u)
        inside = valid & (edges > lo[:, None]) & (edges < hi[:, None])
        return distinct_sorted(np.where(inside, edges, np.inf))

    # ------------------------------------------------------------------ rounds
    def next_round(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The next round's question, or None when the sketch is done: the nodes (ascending
        indices of the E) with a row to count, their features (E', m), -1 where a slot is
        finished, and thresholds (E', m, W)."""
        if self.work.size == 0 or self.rounds >= self.max_rounds:
            return None
        m = self.shape[1]
        node, slot = np.divmod(self.work, m)
        nodes = np.unique(node)
        at = np.searchsorted(nodes, node)
        asked = np.zeros((nodes.size, m), dtype=bool)
        asked[at, slot] = True
        width = max(int(np.isfinite(self.edges).sum(axis=1).max()), 1)
        grid = np.full((nodes.size, m, width), np.inf)
        grid[at, slot] = self.edges[:, :width]
        return nodes, np.where(asked, self.feats[nodes], -1), grid

    def active_features(self) -> np.ndarray:
        """Features to count in the next round (E, m) (-1 where a slot is finished)."""
        pending = np.zeros(self.R, dtype=bool)
        pending[self.work] = True
        return np.where(pending.reshape(self.shape), self.feats, -1)

    def next_grid(self) -> np.ndarray | None:
        """Thresholds (E, m, W) of the next round (:meth:`next_round` for every node), or None
        when the sketch is done."""
        if self.R and self.work.size == self.R and self.rounds < self.max_rounds:
            # every row asked: the grids themselves (as wide as the widest, as below), no copy
            return self.edges.reshape(self.shape + self.edges.shape[1:])
        question = self.next_round()
        if question is None:
            return None
        nodes, _, grid = question
        out = np.full(self.shape + grid.shape[2:], np.inf)
        out[nodes] = grid
        return out

    def receive(self, counts: np.ndarray, stats: np.ndarray | None = None,
                nodes: np.ndarray | None = None) -> None:
        """Pooled counts (E', m, W' + 1) per cell of the grid just sent, and optionally every
        cell's statistics (E', m, W' + 1, S), of the nodes ``nodes`` (the E' that
        :meth:`next_round` named; None: all E); plan the next round. The rows whose grid is
        final get their candidates and, with ``stats``, their bins' statistics."""
        self.rounds += 1
        E, m = self.shape
        nb = counts.shape[-1]
        counts = counts.reshape(-1, m, nb)
        if (counts > 2.0**53).any():  # beyond exact counting: a crafted sum, not rows
            raise InvalidMessage("a grid cell's pooled count exceeds 2^53 rows")
        place = np.arange(E) if nodes is None else np.full(E, -1, dtype=np.int64)
        if nodes is not None:
            place[nodes] = np.arange(nodes.size)
        node, slot = np.divmod(self.work, m)
        node = place[node]  # each row's place in the sums
        if (node < 0).any():
            raise ValueError("internal: a grid round left out a row being refined")
        at = node * m + slot
        W = self.edges.shape[1]
        w = min(nb, W + 1)
        got = np.zeros((self.work.size, W + 1))
        step = max(1, CHUNK_ENTRIES // (W + 1))
        for a in range(0, got.shape[0], step):  # no copy of the whole round's counts
            got[a:a + step, :w] = np.maximum(counts[node[a:a + step], slot[a:a + step], :w], 0.0)
        if self._thr is None:
            self._thr = np.full((self.R, max(self.width - 1, 0)), np.inf)
        st = None if stats is None else stats.reshape(counts.shape[0] * m, nb, -1)
        if st is not None and self._hist is None:  # the first round carrying statistics
            self._hist = np.zeros((self.R, self.width, st.shape[2]))
            idle = np.flatnonzero(~self.active)  # no grid: every row in the first bin
            where = place[idle // m] * m + idle % m
            asked = where >= 0
            self._hist[idle[asked], 0] = st[where[asked], :w].sum(axis=1)
        if self._parent is not None and self._prev is not None:
            self.unsplit = self._unsplit(got, self._parent, self._prev)
        else:  # the first round
            self.unsplit = np.zeros(got.shape, dtype=np.int8)
        self.counts = got
        self._parent = self._prev = None
        plan = self._plan_refinement() if self.rounds < self.max_rounds else None
        refine = plan[0] if plan is not None else np.zeros(self.work.size, dtype=bool)
        self._finish(np.flatnonzero(~refine), st, at, w)
        if plan is None:
            self.work = self.work[:0]
            self.edges = np.full((0, 1), np.inf)
        else:
            self.work = self.work[refine]
            self.edges, self._parent, self._prev = plan[1], plan[2], plan[3]
        self.counts = np.zeros((0, 0))
        self.unsplit = np.zeros((0, 0), dtype=np.int8)

    @staticmethod
    def _unsplit(got: np.ndarray, parent: np.ndarray,
                 prev: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """Per new cell: how many refinements in a row left its mass in one cell
        (``parent``: its cell in the previous grid; ``prev``: that grid's counts, unsplit
        counts and heavy cells)."""
        prev_counts, prev_unsplit, prev_heavy = prev
        rows = np.arange(got.shape[0])[:, None]
        p = np.maximum(parent, 0)
        whole = (parent >= 0) & prev_heavy[rows, p] & (got > 0) & (got == prev_counts[rows, p])
        out: np.ndarray = np.where(whole, prev_unsplit[rows, p] + 1, 0).astype(np.int8)
        return out

    def _plan_refinement(self) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                        tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        """The next grid of the rows of :attr:`work` with a heavy cell: which rows, their
        edges, per new cell its cell in the current grid, and the current grid's counts,
        unsplit counts and heavy cells of those rows; None where no row is refined."""
        R = self.work.size
        if R == 0:
            return None
        lo, hi, bnu = self.lo[self.work], self.hi[self.work], self.bnu[self.work]
        total = self.counts.sum(axis=1)
        heavy = self._heavy(total, lo, hi, bnu)
        n_heavy = heavy.sum(axis=1)
        refine = n_heavy > 0
        if not refine.any():
            return None
        hr, hc = np.nonzero(heavy)
        count = self.counts[hr, hc]
        unsplit = self.unsplit[hr, hc]
        # sub-cells: about half an equal-mass cell each, many for a suspected atom, never
        # more than the rows allow (r per cell) nor a budget of 4 B new edges per row (a cell that
        # kept its whole mass adds geometric ones besides, see below)
        r = max(self.r, 1)
        want = np.ceil(2.0 * count * bnu[hr] / np.maximum(total, 1.0)[hr])
        sub = np.clip(want, 2, MAX_SUB).astype(np.int64)
        sub = np.where(unsplit >= 1, MAX_SUB, sub)
        if self.rounds + 1 >= self.max_rounds:  # the last round: no later one mends a cell
            sub[:] = MAX_SUB                    # whose rows sit at one end
        sub = np.minimum(sub, np.maximum(2, (count // r).astype(np.int64)))
        budget = np.maximum(2, (4 * self.B) // np.maximum(n_heavy, 1))
        n_sub = np.minimum(sub, budget[hr])
        # a cell whose mass stayed whole in one sub-cell holds a cluster narrower than the
        # sub-cells (or an atom): besides its equal steps, up to MAX_SUB / 2 edges at
        # geometric steps from both ends (down to 2^-40 of its width; from what the budget
        # leaves, or 2 B more per row), which cut a cluster beside one end at any scale in
        # one round (data beside a far value, the box's end at the data's minimum or maximum)
        room = np.maximum(budget[hr] - n_sub, (2 * self.B) // np.maximum(n_heavy[hr], 1))
        geo = np.where(unsplit >= 1, np.clip(room // 2, 0, MAX_SUB // 4), 0)
        lw, rw = cell_ends_at(self.edges, lo, hi, hr, hc)
        rr, new_vals = sub_cell_edges(hr, lw, rw, n_sub, geo)
        old_r, old_c = np.nonzero(np.isfinite(self.edges) & refine[:, None])
        rows = np.concatenate([old_r, rr])
        vals = np.concatenate([self.edges[old_r, old_c], new_vals])
        is_old = np.concatenate([np.ones(old_r.size, dtype=bool), np.zeros(rr.size, dtype=bool)])
        inside = (vals > lo[rows]) & (vals < hi[rows])
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
                return None
            mine = refine[rows]
            rows, vals, is_old = rows[mine], vals[mine], is_old[mine]
        ref = np.flatnonzero(refine)
        rows = (np.cumsum(refine) - 1)[rows]  # rows of ``ref``
        cnt = np.bincount(rows, minlength=ref.size)
        start = np.cumsum(cnt) - cnt
        col = np.arange(rows.size) - start[rows]
        width = max(int(cnt.max()), 1)
        edges = np.full((ref.size, width), np.inf)
        edges[rows, col] = vals
        # the previous cell of every new cell: old edges at or before its left end
        olds = np.zeros((ref.size, width), dtype=np.int64)
        olds[rows, col] = is_old
        parent = np.full((ref.size, width + 1), -1, dtype=np.int64)
        parent[:, 0] = 0
        parent[:, 1:] = np.cumsum(olds, axis=1)
        parent[np.arange(width + 1)[None, :] > cnt[:, None]] = -1
        return refine, edges, parent, (self.counts[ref], self.unsplit[ref], heavy[ref])

    def _heavy(self, total: np.ndarray, lo: np.ndarray, hi: np.ndarray, bnu: np.ndarray
               ) -> np.ndarray:
        """The heavy cells (R', W + 1) of the rows of :attr:`work` (``total`` their pooled rows,
        ``lo``, ``hi``, ``bnu`` theirs), a run of rows at a time."""
        heavy = np.empty(self.counts.shape, dtype=bool)
        step = max(1, CHUNK_ENTRIES // self.counts.shape[1])
        for a in range(0, self.work.size, step):
            at = slice(a, a + step)
            counts, edges = self.counts[at], self.edges[at]
            left, right = cell_ends(edges, lo[at], hi[at])
            share = np.full(counts.shape, HEAVY_MASS)
            share[:, 0] = HEAVY_MASS - 1.0  # the box's end cells
            share[np.arange(counts.shape[0]), np.isfinite(edges).sum(axis=1)] = HEAVY_MASS - 1.0
            limit = np.maximum(share * (total[at] / bnu[at])[:, None], MIN_HEAVY_ROWS)
            heavy[at] = ((counts > limit)
                         & (right - left > self.atom_floor[self.work[at]][:, None])
                         & (self.unsplit[at] < ATOM_RUNS))
        return heavy

    # ------------------------------------------------------------------ final rows
    def _finish(self, done: np.ndarray, st: np.ndarray | None, at: np.ndarray, w: int) -> None:
        """Candidates, bins' statistics, atoms and kept cells of the rows ``done`` (of
        :attr:`work`), whose grids are final: a run of rows at a time. ``st`` the round's
        statistics per asked (node, slot) row, ``at`` the place of each row of ``work`` in
        it, ``w`` the cells it has of each grid."""
        W = self.edges.shape[1]
        S = st.shape[2] if st is not None else 1
        step = max(1, CHUNK_ENTRIES // ((W + 1) * S))
        for a in range(0, done.size, step):
            q = done[a:a + step]
            rows = self.work[q]
            edges, counts = self.edges[q], self.counts[q]
            ar, ac = np.nonzero(self.unsplit[q] >= ATOM_RUNS)
            if ar.size:  # cells found to hold a single value
                left, right = cell_ends(edges[ar], self.lo[rows[ar]], self.hi[rows[ar]])
                i = np.arange(ar.size)
                self._atoms.append((self.fr[rows[ar]], right[i, ac] - left[i, ac]))
            keep = self._keep[rows]
            if keep.any():
                self._kept.append((rows[keep], edges[keep], counts[keep]))
            total = counts.sum(axis=1)
            ok = np.flatnonzero((total > 0) & (self.bnu[rows] >= 2)
                                & np.isfinite(edges).any(axis=1))
            pick = grid_picks(ok, counts, total, edges, self.bnu[rows], self.width)
            if ok.size and self._thr is not None:
                padded = np.concatenate([edges[ok], np.full((ok.size, 1), np.inf)], axis=1)
                self._thr[rows[ok]] = np.take_along_axis(padded, np.minimum(pick, W), axis=1)
            if st is None or self._hist is None:
                continue
            if st.shape[1] == W + 1:
                cells = st[at[q]]
            else:
                cells = np.zeros((q.size, W + 1, S))
                cells[:, :w] = st[at[q], :w]
            self._hist[rows, 0] = cells.sum(axis=1)  # no candidate: every row in the first bin
            if ok.size:
                B = self.width
                cum = np.cumsum(cells[ok], axis=1)  # through cell i (the cells' own are kept)
                left_of = cum[np.arange(ok.size)[:, None], pick]  # (R', B - 1, S)
                part = np.empty((ok.size, B, S))
                part[:, 0] = left_of[:, 0]
                part[:, 1:B - 1] = np.diff(left_of, axis=1)
                part[:, B - 1] = cum[:, -1] - left_of[:, -1]
                self._hist[rows[ok]] = part

    # ------------------------------------------------------------------ results
    def atoms(self) -> tuple[np.ndarray, np.ndarray]:
        """Features and widths of the cells found to hold a single value (whole through
        :data:`ATOM_RUNS` refinements)."""
        if not self._atoms:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return (np.concatenate([f for f, _ in self._atoms]),
                np.concatenate([wd for _, wd in self._atoms]))

    def final_cells(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows (of the E x m, ascending) of ``keep_cells`` whose grid is final, their
        edges (+inf padded) and pooled counts per cell (zero padded)."""
        if not self._kept:
            return np.zeros(0, dtype=np.int64), np.full((0, 1), np.inf), np.zeros((0, 2))
        rows = np.concatenate([r for r, _, _ in self._kept])
        width = max(e.shape[1] for _, e, _ in self._kept)
        edges = np.full((rows.size, width), np.inf)
        counts = np.zeros((rows.size, width + 1))
        a = 0
        for _, e, c in self._kept:
            edges[a:a + e.shape[0], :e.shape[1]] = e
            counts[a:a + c.shape[0], :c.shape[1]] = c
            a += e.shape[0]
        order = np.argsort(rows, kind="stable")
        return rows[order], edges[order], counts[order]

    @property
    def carries_stats(self) -> bool:
        """Whether the rounds carried the cells' statistics (:meth:`histogram` holds them)."""
        return self._hist is not None

    def candidates(self) -> np.ndarray:
        """Thresholds (E, m, B' - 1) (:attr:`width`): the chosen cell edges, sorted and +inf
        padded (none for a row whose grid is not final)."""
        shape = self.shape + (max(self.width - 1, 0),)
        return np.full(shape, np.inf) if self._thr is None else self._thr.reshape(shape)

    def histogram(self) -> np.ndarray:
        """Statistics (E, m, B', S) (:attr:`width`) of the bins between the candidates (bin b
        holds t_{b-1} < x <= t_b), summed from the final cells' statistics."""
        if self._hist is None:
            raise ValueError("the grid rounds carried counts only")
        return self._hist.reshape(self.shape + self._hist.shape[1:])
