"""Which of a client's rows each tree sees, and how often (the worker's side).

Client-stratified bootstrap: every client resamples its own rows per tree, with replacement,
from its own seed, so no row ever leaves its site to be resampled. The draws are assigned to
the rows in an order fixed by the rows' contents (:func:`canonical_order`), so the forest does
not depend on how a site's table is sorted, and a row of integer weight ``w`` is drawn exactly
as ``w`` copies of it would be (the client draws as many times as its rows' total weight; past
``MAX_COPY_DRAWS`` copies, population counts as weights, the same multinomial law is drawn per
row instead, in memory of the rows' number).
Under DP a row's multiplicity is capped (``dp.max_multiplicity``), as the sensitivities
assume. The job's ``sampling`` may instead give every tree every row once, ``w`` times with
weights ("all"), or every row to exactly one tree ("disjoint": parallel composition under DP;
each of a weighted row's copies to a tree of its own draw).
"""

from __future__ import annotations

import numpy as np

from .config import JobConfig

__all__ = ["canonical_order", "tree_pairs"]

_MIX = np.uint64(0x9E3779B97F4A7C15)

#: above this total weight a client's draws are made per row, not per copy
MAX_COPY_DRAWS = 1 << 24


def canonical_order(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A permutation of the rows that depends on their contents only: rows sorted by a 64-bit
    hash of their values (-0.0 as 0.0, every NaN alike). Equal rows hash alike and are
    interchangeable, so any order among them gives the same draws per distinct row."""
    n = X.shape[0]
    cols = np.column_stack([X, np.asarray(y, dtype=np.float64)]) + 0.0  # -0.0 -> 0.0
    cols[np.isnan(cols)] = np.nan
    bits = np.ascontiguousarray(cols).view(np.uint64)
    h = np.zeros(n, dtype=np.uint64)
    for j in range(bits.shape[1]):
        h ^= bits[:, j]
        h *= _MIX
        h ^= h >> np.uint64(31)
    return np.argsort(h, kind="stable")


def tree_pairs(config: JobConfig, n_rows: int, rng: np.random.Generator, *,
               order: np.ndarray | None = None, weights: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (tree, row) pairs with a non-zero multiplicity: rows, trees and multiplicities.

    ``order``: the rows' canonical order (:func:`canonical_order`; None: as given);
    ``weights``: positive integer weights per row (None: ones).

    Pairs are in (tree, row) order; rows are int32 (int64 beyond 2**31 rows), trees int32 and
    multiplicities uint8 when they fit (every worker of an in-process federation holds its own).
    """
    n = n_rows
    T = config.n_estimators
    perm = np.arange(n) if order is None else order
    if config.sampling == "bootstrap":
        w = np.empty((T, n), dtype=np.int64)
        if weights is None:
            for t in range(T):
                w[t, perm] = np.bincount(rng.integers(0, n, n), minlength=n)
        else:  # draws over the rows' copies, in canonical order
            cum = np.cumsum(weights[perm])
            total = int(cum[-1])
            for t in range(T):
                if total > MAX_COPY_DRAWS:  # the same law, drawn per row
                    w[t, perm] = rng.multinomial(total, weights[perm] / total)
                    continue
                copy = rng.integers(0, total, total)
                w[t, perm] = np.bincount(np.searchsorted(cum, copy, side="right"),
                                         minlength=n)
        dp = config.dp
        if dp is not None:  # DP sensitivities assume a capped multiplicity
            np.minimum(w, int(dp.get("max_multiplicity", 4)), out=w)
    elif config.sampling == "disjoint":  # every row (every copy) in exactly one tree
        w = np.zeros((T, n), dtype=np.int64)
        if weights is None:
            w[rng.integers(0, T, n), np.arange(n)] = 1
        elif int(np.sum(weights)) > MAX_COPY_DRAWS:  # each row's copies split over the trees
            w[:] = rng.multinomial(np.asarray(weights, dtype=np.int64), np.full(T, 1.0 / T)).T
        else:
            rows = np.repeat(np.arange(n), weights)
            np.add.at(w, (rng.integers(0, T, rows.size), rows), 1)
    else:
        w = np.ones((T, n), dtype=np.int64) if weights is None else \
            np.tile(np.asarray(weights, dtype=np.int64), (T, 1))
    tt, rr = np.nonzero(w)
    rows = rr.astype(np.int32 if n < 2**31 else np.int64)
    trees = tt.astype(np.int32)
    pw = w[tt, rr]
    weights_out = pw.astype(np.uint8) if pw.size and pw.max() < 256 else pw
    return rows, trees, weights_out
