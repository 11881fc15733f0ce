"""A client's table as its worker holds it: the checks of the rows, frequency weights and
targets a site hands in, the row statistics, and the exact integer codes of the feature values.

The table itself is not kept: codes and distinct values answer every question. A feature
value's code is its rank among the client's distinct values of that feature (a missing value's
code is one past the last), so ``x <= t`` is decided exactly for any threshold ``t``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._level_stats import CodeBook
from .config import JobConfig
from .errors import SchemaError
from .privacy.pinning import clip_targets

__all__ = ["check_level_codes", "checked_rows", "encode_features", "frequency_weights",
           "row_statistics"]


def checked_rows(config: JobConfig, X: Any, y: Any, sample_weight: Any
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The client's rows of positive weight, their targets and their frequency weights (None:
    every row counts once), checked against the job.

    Raises
    ------
    SchemaError
        X or y of the wrong shape, invalid weights (:func:`frequency_weights`), no row of
        positive weight, a missing value where the job allows none, an infinity, or a
        continuous feature's value outside the job's public bounds (never clipped).
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    if X.ndim != 2 or X.shape[1] != config.n_features:
        raise SchemaError(f"X must have shape (n, {config.n_features}), got {X.shape}")
    if y.shape != (X.shape[0],):
        raise SchemaError(f"y must have shape ({X.shape[0]},), got {y.shape}")
    weights = frequency_weights(sample_weight, X.shape[0], config.dp is not None)
    if weights is not None and X.shape[0] and not (weights > 0).any():
        raise SchemaError(f"all {X.shape[0]} rows of this client have sample_weight 0: a "
                          "client needs at least one row to train on; give some of them "
                          "a positive weight, or leave this site out of the job")
    # the rows' numbers as given (1-based), for the messages: rows of weight 0 are left out
    number = np.arange(1, X.shape[0] + 1)
    if weights is not None:
        kept = weights > 0
        X, y, weights, number = X[kept], y[kept], weights[kept], number[kept]
        if (weights == 1).all():
            weights = None
    if X.shape[0] < 1:
        raise SchemaError("a client needs at least one row (of positive weight)")
    # a missing value (NaN) only where the job allows it; infinities never
    bad_cells = ~np.isfinite(X) & ~(np.isnan(X) & np.array(config.may_miss)[None, :])
    if bad_cells.any():
        bad = np.argwhere(bad_cells)[0]
        what = "missing" if np.isnan(X[bad[0], bad[1]]) else "non-finite"
        raise SchemaError(f"{what} value in row {number[bad[0]]}, column {bad[1]}"
                          + (" (the job allows no missing values there)"
                             if what == "missing" else ""))
    _refuse_outside_bounds(config, X, number)
    return X, y, weights


def _refuse_outside_bounds(config: JobConfig, X: np.ndarray, number: np.ndarray) -> None:
    """Refuse a continuous feature's value outside the job's public bounds (the fixed-point
    scales, the secure sketch's grid and the DP sensitivities hold only within them), naming
    the first such cell by its row's ``number``; a missing value (NaN) is no value outside
    them. Categorical columns are checked as level codes (:func:`check_level_codes`)."""
    if config.feature_bounds is None:
        return
    lohi = np.array(config.feature_bounds, dtype=np.float64).reshape(-1, 2)
    continuous = np.array([kind == "continuous" for kind in config.kinds])
    outside = ((X < lohi[:, 0]) | (X > lohi[:, 1])) & continuous  # NaN: neither
    if outside.any():
        row, j = (int(v) for v in np.argwhere(outside)[0])
        lo, hi = (float(b) for b in lohi[j])
        raise SchemaError(f"value {float(X[row, j])!r} in row {number[row]}, column {j} is "
                          f"outside the job's public bounds [{lo!r}, {hi!r}] of that feature: "
                          "values are never clipped; correct them, drop the rows, or agree on "
                          "wider bounds (the schema's) with every site")


def row_statistics(config: JobConfig, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The targets as the worker keeps them (regression: centred and clipped floats;
    classification: class codes) and the row statistics, shape (n_stats, n): one contiguous
    row per statistic, one column per sample.

    Raises
    ------
    SchemaError
        A non-finite regression target, or a class code that is no integer in
        ``[0, n_classes)``.
    """
    n = y.shape[0]
    # row statistics (one row of S per sample)
    if config.task == "regression":
        yf = y.astype(np.float64)
        if not np.isfinite(yf).all():
            raise SchemaError("non-finite target value")
        if config.target_offset:
            yf = yf - config.target_offset  # centred: the sums carry the spread
        yf = clip_targets(config, yf)  # within the bound the DP noise is calibrated for
        stats = np.stack([np.ones(n), yf, yf * yf], axis=1)
        kept: np.ndarray = yf
    else:
        yi = y.astype(np.int64)
        if (yi != y).any() or yi.min() < 0 or yi.max() >= config.n_classes:
            raise SchemaError(f"class codes must be integers in [0, {config.n_classes})")
        kept = yi
        stats = np.zeros((n, config.n_classes))
        stats[np.arange(n), yi] = 1.0
    stats_cm = np.ascontiguousarray(stats.T)  # one contiguous row per statistic
    return kept, stats_cm


def check_level_codes(config: JobConfig, X: np.ndarray) -> None:
    """Refuse a categorical column holding anything but the job's level codes (or missing
    values).

    Raises
    ------
    SchemaError
        A categorical column with a value that is no integer in ``[0, levels)``.
    """
    for j, (kind, nl) in enumerate(zip(config.kinds, config.levels, strict=True)):
        if kind == "categorical":
            col = X[:, j][~np.isnan(X[:, j])]
            if col.size and ((col != np.round(col)).any() or col.min() < 0
                             or col.max() >= nl):
                raise SchemaError(f"categorical column {j} must hold level codes 0..{nl - 1}")


def encode_features(X: np.ndarray) -> tuple[CodeBook, np.ndarray]:
    """The client's code book and the code of every cell of X (shape (n, d)), feature-major:
    the code of (j, row) at ``j * n + row``."""
    n, d = X.shape
    # exact integer codes: rank among the client's distinct values of each feature; a
    # missing value's code is one past the last (it sorts after every present value)
    uniq = [np.unique(X[:, j][~np.isnan(X[:, j])]) for j in range(d)]
    uniq_off = np.concatenate([[0], np.cumsum([u.size for u in uniq])])
    uniq_all = np.concatenate(uniq)
    del uniq  # one copy: each feature's distinct values are a view into uniq_all
    views = [uniq_all[uniq_off[j]:uniq_off[j + 1]] for j in range(d)]
    # codes of a block live in [block << cbits, (block + 1) << cbits): shifts, not divisions
    # at least 16 bits: then a code is exactly the low 16 bits of its field (cheap to pull
    # out of a packed key, see _order.LevelOrder.compact)
    cbits = max(int(max(u.size for u in views) + 1).bit_length(), 16)
    codes = np.empty((d, n), dtype=np.int32)
    for j in range(d):
        codes[j] = np.searchsorted(views[j], X[:, j])
        codes[j][np.isnan(X[:, j])] = views[j].size
    return CodeBook(views, uniq_all, uniq_off, cbits), codes.ravel()


def frequency_weights(sample_weight: Any, n: int, dp: bool) -> np.ndarray | None:
    """Validated frequency weights (int64), or None.

    Raises
    ------
    SchemaError
        Not one finite, non-negative integer per row, (``dp``) a weight above 1, or weights
        adding up to more than 2^40 rows.
    """
    if sample_weight is None:
        return None
    w = np.asarray(sample_weight, dtype=np.float64)
    if w.shape != (n,):
        raise SchemaError(f"sample_weight must have shape ({n},), got {w.shape}")
    if not np.isfinite(w).all() or (w < 0).any() or (w != np.round(w)).any():
        raise SchemaError("sample_weight must hold non-negative integers (frequency weights: "
                          "a row of weight 3 counts as three rows)")
    if dp and (w > 1).any():
        raise SchemaError("under differential privacy a row counts at most once: "
                          "sample_weight may only be 0 or 1")
    if w.sum() > 2.0**40:  # counts stay exact in float64 and in the ring, with room to sum
        raise SchemaError(f"sample_weight adds up to {w.sum():.3g} rows; at most 2^40 "
                          "(about 1.1e12) rows per client")
    return w.astype(np.int64)
