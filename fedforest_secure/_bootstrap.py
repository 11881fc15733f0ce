"""Which of a client's rows each tree sees, and how often (the worker's side).

Client-stratified bootstrap: every client resamples its own rows per tree, with replacement,
from its own seed, so no row ever leaves its site to be resampled. The draws are assigned to
the rows in an order fixed by the rows' contents (:func:`canonical_order`), so the forest's
splits do not depend on how a site's table is sorted (without secure aggregation a regression's
leaf values may differ in the last bits: the clients' float sums follow their tables' order;
fixed-point sums are exact), and a row of integer weight ``w`` is drawn exactly
as ``w`` copies of it would be (the client draws as many times as its rows' total weight; past
``MAX_COPY_DRAWS`` copies, population counts as weights, the same multinomial law is drawn per
row instead, in memory of the rows' number).
The job's ``sampling`` may instead give every tree every row once, ``w`` times with weights
("all"), or every row to exactly one tree ("disjoint": parallel composition under DP; each of a
weighted row's copies to a tree of its own draw).

Under DP every row's draws depend on that row alone (its content hash, :func:`row_keys`, mixed
with the client's seed and the tree), never on the other rows: the sensitivities assume that
adding or removing one record changes only that record's copies. A multinomial draw over the
table (or a draw per row in table order) would move every other row's multiplicity too. So
under DP "bootstrap" draws each row's multiplicity per tree from Poisson(1) (the usual
independent-row bootstrap), capped at ``dp.max_multiplicity``, and "disjoint" sends each row
to the tree its key picks.
"""

from __future__ import annotations

import numpy as np

from .config import JobConfig

__all__ = ["canonical_order", "record_uniforms", "row_keys", "tree_pairs"]

_MIX = np.uint64(0x9E3779B97F4A7C15)

#: P(Poisson(1) <= k), k = 0..19: a uniform below entry k draws multiplicity k
_POISSON1_CDF = np.cumsum([np.exp(-1.0) / float(np.prod(np.arange(1, k + 1)))
                           for k in range(20)])

#: above this total weight a client's draws are made per row, not per copy
MAX_COPY_DRAWS = 1 << 24


def row_keys(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row's values (-0.0 as 0.0, every NaN alike): equal rows hash
    alike."""
    n = X.shape[0]
    cols = np.column_stack([X, np.asarray(y, dtype=np.float64)]) + 0.0  # -0.0 -> 0.0
    cols[np.isnan(cols)] = np.nan
    bits = np.ascontiguousarray(cols).view(np.uint64)
    h = np.zeros(n, dtype=np.uint64)
    for j in range(bits.shape[1]):
        h ^= bits[:, j]
        h *= _MIX
        h ^= h >> np.uint64(31)
    return h


def canonical_order(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A permutation of the rows that depends on their contents only: rows sorted by
    :func:`row_keys`. Equal rows hash alike and are interchangeable, so any order among them
    gives the same draws per distinct row."""
    return np.argsort(row_keys(X, y), kind="stable")


def _uniforms(keys: np.ndarray, seed: int, tree: int) -> np.ndarray:
    """A uniform in [0, 1) per row from its key, the seed and the tree alone (splitmix64's
    finaliser over the three mixed)."""
    with np.errstate(over="ignore"):
        x = keys ^ np.uint64(seed) ^ (np.uint64(tree + 1) * _MIX)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    out: np.ndarray = (x >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return out


def _record_keys(keys: np.ndarray) -> np.ndarray:
    """Each row's key mixed with its occurrence among the rows of equal key (0, 1, 2, ...):
    equal rows are records of their own and draw independently. Equal rows are
    interchangeable, so the multiset of their draws does not depend on the table's order, and
    a copy added or removed adds or removes one draw of that multiset, leaving the others."""
    n = keys.size
    order = np.argsort(keys, kind="stable")
    ranked = keys[order]
    first = np.r_[True, ranked[1:] != ranked[:-1]]
    occurrence = np.empty(n, dtype=np.uint64)
    occurrence[order] = (np.arange(n) - np.maximum.accumulate(
        np.where(first, np.arange(n), 0))).astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed: np.ndarray = keys ^ ((occurrence + np.uint64(1)) * np.uint64(0xD6E8FEB86659FD93))
    return mixed


def record_uniforms(X: np.ndarray, y: np.ndarray, seed: int, stream: int) -> np.ndarray:
    """A uniform in [0, 1) per row from that row's values alone (copies of a row draw
    independently), the seed and a stream number: adding or removing one record leaves every
    other record's draw as it was."""
    return _uniforms(_record_keys(row_keys(X, y)), seed, stream)


def _per_row_draws(config: JobConfig, keys: np.ndarray, rng: np.random.Generator
                   ) -> np.ndarray:
    """Multiplicities (T, n) under DP, each row's from its own key (module docstring)."""
    T, n = config.n_estimators, keys.size
    keys = _record_keys(keys)
    seed = int(rng.integers(0, 2**63))
    w = np.zeros((T, n), dtype=np.int64)
    if config.sampling == "disjoint":
        tree = np.minimum((_uniforms(keys, seed, -1) * T).astype(np.int64), T - 1)
        w[tree, np.arange(n)] = 1
        return w
    cap = int((config.dp or {}).get("max_multiplicity", 4))
    for t in range(T):
        w[t] = np.searchsorted(_POISSON1_CDF, _uniforms(keys, seed, t), side="right")
    np.minimum(w, cap, out=w)
    return w


def tree_pairs(config: JobConfig, n_rows: int, rng: np.random.Generator, *,
               order: np.ndarray | None = None, weights: np.ndarray | None = None,
               keys: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (tree, row) pairs with a non-zero multiplicity: rows, trees and multiplicities.

    ``order``: the rows' canonical order (:func:`canonical_order`; None: as given);
    ``weights``: positive integer weights per row (None: ones); ``keys``: the rows'
    :func:`row_keys`, which a DP job's "bootstrap" and "disjoint" draws need (and take
    instead of ``order``).

    Pairs are in (tree, row) order; rows are int32 (int64 beyond 2**31 rows), trees int32 and
    multiplicities uint8 when they fit (every worker of an in-process federation holds its own).
    """
    n = n_rows
    T = config.n_estimators
    perm = np.arange(n) if order is None else order
    if config.dp is not None and config.sampling in ("bootstrap", "disjoint"):
        if keys is None or weights is not None:
            raise ValueError("a DP job's row sampling draws from the rows' keys, one copy each")
        w = _per_row_draws(config, keys, rng)
    elif config.sampling == "bootstrap":
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
