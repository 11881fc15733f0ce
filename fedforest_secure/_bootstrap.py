"""Which of a client's rows each tree sees, and how often (the worker's side).

Client-stratified bootstrap: every client resamples ``n_k`` of its own rows per tree, with
replacement, from its own seed, so no row ever leaves its site to be resampled. Under DP a row's
multiplicity is capped (``dp.max_multiplicity``), as the sensitivities assume. The job's
``sampling`` may instead give every tree every row once ("all") or every row to exactly one
tree ("disjoint": parallel composition under DP).
"""

from __future__ import annotations

import numpy as np

from .config import JobConfig

__all__ = ["tree_pairs"]


def tree_pairs(config: JobConfig, n_rows: int, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (tree, row) pairs with a non-zero multiplicity: rows, trees and multiplicities.

    Pairs are in (tree, row) order; rows are int32 (int64 beyond 2**31 rows), trees int32 and
    multiplicities uint8 when they fit (every worker of an in-process federation holds its own).
    """
    n = n_rows
    T = config.n_estimators
    if config.sampling == "bootstrap":
        w = np.empty((T, n), dtype=np.int64)
        for t in range(T):
            w[t] = np.bincount(rng.integers(0, n, n), minlength=n)
        dp = config.dp
        if dp is not None:  # DP sensitivities assume a capped multiplicity
            np.minimum(w, int(dp.get("max_multiplicity", 4)), out=w)
    elif config.sampling == "disjoint":  # every row in exactly one tree
        w = np.zeros((T, n), dtype=np.int64)
        w[rng.integers(0, T, n), np.arange(n)] = 1
    else:
        w = np.ones((T, n), dtype=np.int64)
    tt, rr = np.nonzero(w)
    rows = rr.astype(np.int32 if n < 2**31 else np.int64)
    trees = tt.astype(np.int32)
    pw = w[tt, rr]
    weights = pw.astype(np.uint8) if pw.size and pw.max() < 256 else pw
    return rows, trees, weights
