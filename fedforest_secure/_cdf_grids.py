"""Row-wise steps of the secure pooled-CDF sketch's grids (:mod:`~fedforest_secure._secure_cdf`).

Each row is one (node, feature slot): its grid's edges (sorted, ``+inf`` padded), the cells
between them and the pooled counts per cell. Every function here computes a row from that
row alone, so the planner may run them over any subset of rows, a run at a time, with the
same bits: where each cell ends (:func:`cell_ends`), the new edges of refined cells
(:func:`sub_cell_edges`) and the candidates' picks (:func:`grid_picks`, by the compiled loop
where it is built).
"""

from __future__ import annotations

import numpy as np

from . import _kernels

__all__ = ["cell_ends", "cell_ends_at", "distinct_sorted", "grid_picks", "steps", "sub_cell_edges"]


def steps(rows: np.ndarray, reps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every entry ``i`` of ``rows``, ``reps[i]`` entries: its row and the step ``k = 1 ..
    reps[i]``."""
    reps = np.maximum(reps, 0)
    k = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps) + 1
    return np.repeat(rows, reps), k


def distinct_sorted(edges: np.ndarray) -> np.ndarray:
    """Each row sorted, repeated values replaced by +inf (and moved to the end); as wide as
    the row with the most distinct values (at least one column)."""
    out = np.sort(edges, axis=1)
    dup = np.zeros(out.shape, dtype=bool)
    dup[:, 1:] = out[:, 1:] == out[:, :-1]
    if dup.any():
        out[dup] = np.inf
        out.sort(axis=1)
    width = int(np.isfinite(out).sum(axis=1).max()) if out.size else 0
    return out[:, :max(width, 1)]


def cell_ends(edges: np.ndarray, lo: np.ndarray, hi: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Left and right end of every cell (rows of ``edges`` in boxes ``lo``, ``hi``: W + 1
    cells each); padding cells are empty at ``hi``."""
    e = np.where(np.isfinite(edges), edges, hi[:, None])
    left = np.concatenate([lo[:, None], e], axis=1)
    right = np.concatenate([e, hi[:, None]], axis=1)
    return left, right


def cell_ends_at(edges: np.ndarray, lo: np.ndarray, hi: np.ndarray, r: np.ndarray,
                 c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`cell_ends` of the cells ``(r, c)`` only."""
    W = edges.shape[1]
    e = np.stack([edges[r, np.maximum(c - 1, 0)], edges[r, np.minimum(c, W - 1)]])
    e = np.where(np.isfinite(e), e, hi[r])
    return np.where(c == 0, lo[r], e[0]), np.where(c == W, hi[r], e[1])


def sub_cell_edges(rows: np.ndarray, left: np.ndarray, right: np.ndarray, n_eq: np.ndarray,
                   n_geo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The new edges inside refined cells (cell ``i`` of row ``rows[i]``, from ``left[i]`` to
    ``right[i]``): ``n_eq[i]`` equal sub-cells, and ``n_geo[i]`` edges at geometric steps
    from each end, the first half of ratio 1/4 (fine cells near the end), the rest steeper,
    down to 2^-40 of the width. Returns each new edge's row and value."""
    rr_eq, k_eq = steps(rows, n_eq - 1)
    rr_geo, k_geo = steps(rows, n_geo)
    cell_eq = np.repeat(np.arange(rows.size), n_eq - 1)
    cell_geo = np.repeat(np.arange(rows.size), n_geo)
    w = right - left
    g = n_geo[cell_geo].astype(np.float64)
    half = np.ceil(g / 2.0)
    steep = np.maximum(2.0, (40.0 - 2.0 * half) / np.maximum(g - half, 1.0))
    frac = np.exp2(-2.0 * np.minimum(k_geo, half) - steep * np.maximum(k_geo - half, 0))
    return np.concatenate([rr_eq, rr_geo, rr_geo]), np.concatenate([
        left[cell_eq] + w[cell_eq] * k_eq / n_eq[cell_eq],
        left[cell_geo] + w[cell_geo] * frac, right[cell_geo] - w[cell_geo] * frac])


def grid_picks(rows: np.ndarray, counts: np.ndarray, total: np.ndarray, edges: np.ndarray,
               bnu: np.ndarray, B: int) -> np.ndarray:
    """Per row of ``rows`` (of the grids ``edges`` with pooled ``counts`` per cell, ``total``
    rows and ``bnu`` bins each), the chosen edges' indices (sorted, ``W`` where none): for
    b = 1 .. B_nu - 1 (b < ``B``) the edge whose pooled CDF is nearest to b / B_nu."""
    W = edges.shape[1]
    if rows.size == 0:
        return np.zeros((0, max(B - 1, 0)), dtype=np.int64)
    if _kernels.KERNELS is not None and B >= 2:  # the same picks, row by row
        picks = np.empty((rows.size, B - 1), dtype=np.int64)
        _kernels.KERNELS.grid_picks(rows.astype(np.int64), _kernels.f64(counts),
                                    _kernels.f64(total), _kernels.f64(edges),
                                    _kernels.i64(bnu), picks, B, W)
        return picks
    cum = np.cumsum(counts[rows], axis=1)[:, :W] / total[rows, None]
    fin = np.isfinite(edges[rows])
    cum = np.where(fin, cum, 3.0)  # padding edges are never the nearest
    b = np.arange(1, B)
    u = b[None, :] / bnu[rows, None]
    valid = b[None, :] < bnu[rows, None]
    offs = 4.0 * np.arange(rows.size)[:, None]
    i = np.searchsorted((cum + offs).ravel(), (u + offs).ravel(), side="left")
    i = i.reshape(u.shape) - np.arange(rows.size)[:, None] * W
    hi_i = np.clip(i, 0, W - 1)
    lo_i = np.clip(i - 1, 0, W - 1)
    d_hi = np.abs(np.take_along_axis(cum, hi_i, axis=1) - u)
    d_lo = np.abs(np.take_along_axis(cum, lo_i, axis=1) - u)
    pick: np.ndarray = np.where(d_lo <= d_hi, lo_i, hi_i)
    pick = np.where(valid, pick, W)
    pick.sort(axis=1)
    dup = np.zeros(pick.shape, dtype=bool)
    dup[:, 1:] = pick[:, 1:] == pick[:, :-1]
    pick[dup] = W
    pick.sort(axis=1)
    return pick
