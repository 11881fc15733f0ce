"""Impurities from additive sufficient statistics (Theorem 4 of the paper).

A statistics vector is ``(n, sum y, sum y^2)`` for regression or the class counts
``(n_1..n_C)`` for classification, so the statistics of a union are sums. All functions work on
arrays whose last axis is the statistics axis and return ``n * impurity`` ("weighted impurity"),
so that a split's gain is ``wimp(parent) - wimp(left) - wimp(right)`` = ``n * Delta I``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["counts_of", "impurity", "node_values", "weighted_impurity"]


def counts_of(stats: np.ndarray, task: str) -> np.ndarray:
    """Number of (weighted) rows behind each statistics vector."""
    return stats[..., 0] if task == "regression" else stats.sum(axis=-1)


def weighted_impurity(stats: np.ndarray, task: str, criterion: str) -> np.ndarray:
    """``n * impurity`` for each statistics vector (0 where n <= 0).

    Regression statistics may also be ``(n, sum y)`` alone: then the result is ``n * impurity``
    minus the sum of y^2, which leaves every split gain unchanged."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if task == "regression":
            n, s = stats[..., 0], stats[..., 1]
            mean_part = np.where(n > 0, s * s / np.where(n > 0, n, 1.0), 0.0)
            if stats.shape[-1] == 2:
                # (n, sum y) only: n * impurity up to the node's sum of y^2, a constant that
                # cancels in every gain (parent - left - right)
                return -mean_part
            out = stats[..., 2] - mean_part
            return np.where(n > 0, np.maximum(out, 0.0), 0.0)
        c = np.maximum(stats, 0.0)
        n = c.sum(axis=-1)
        safe_n = np.where(n > 0, n, 1.0)
        if criterion == "gini":
            out = n - (c * c).sum(axis=-1) / safe_n
        elif criterion == "entropy":
            p = c / safe_n[..., None]
            logp = np.log2(np.where(p > 0, p, 1.0))
            out = -n * (p * logp).sum(axis=-1)
        else:
            raise ValueError(f"unknown criterion {criterion!r}")
        return np.where(n > 0, np.maximum(out, 0.0), 0.0)


def node_values(stats: np.ndarray, task: str) -> np.ndarray:
    """Leaf values: the mean of y (shape (..., 1)) or class proportions (shape (..., C))."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if task == "regression":
            n = stats[..., 0]
            return (stats[..., 1] / np.where(n > 0, n, 1.0))[..., None]
        c = np.maximum(stats, 0.0)
        n = c.sum(axis=-1, keepdims=True)
        shares: np.ndarray = c / np.where(n > 0, n, 1.0)
        return shares


def impurity(stats: np.ndarray, task: str, criterion: str) -> np.ndarray:
    """The impurity of each statistics vector (variance, Gini, or entropy in bits, as
    scikit-learn's ``tree_.impurity``); 0 where n <= 0."""
    n = counts_of(np.maximum(stats, 0.0) if task != "regression" else stats, task)
    w = weighted_impurity(stats, task, criterion)
    out: np.ndarray = np.where(n > 0, w / np.where(n > 0, n, 1.0), 0.0)
    return out
