"""Split search on aggregated statistics (server side): numeric, categorical and H splits."""

from __future__ import annotations

import itertools

import numpy as np

from . import _impurity

__all__ = ["best_numeric", "best_grouping", "clean_noisy_groups"]


def best_numeric(hist: np.ndarray, thresholds: np.ndarray, valid_slot: np.ndarray,
                 task: str, criterion: str, min_leaf: float) -> tuple[np.ndarray, ...]:
    """Best (slot, threshold index) per node from per-bin histograms.

    Parameters
    ----------
    hist : (E, m, Bt + 1, S) summed per-bin statistics (bin b: t_{b-1} < x <= t_b)
    thresholds : (E, m, Bt), +inf padded
    valid_slot : (E, m) bool, slots that hold a numeric feature

    Returns
    -------
    gain (E,) (-inf where no valid split), slot (E,), index (E,), left stats (E, S)
    """
    E, m, nb, S = hist.shape
    bt = nb - 1
    if E == 0 or bt == 0:
        z = np.zeros(E, dtype=np.int64)
        return np.full(E, -np.inf), z, z, np.zeros((E, S))
    left = np.cumsum(hist, axis=2)[:, :, :bt, :]
    total = hist.sum(axis=2, keepdims=True)
    right = total - left
    g = (_impurity.weighted_impurity(total, task, criterion)
         - _impurity.weighted_impurity(left, task, criterion)
         - _impurity.weighted_impurity(right, task, criterion))
    nl = _impurity.counts_of(left, task)
    nr = _impurity.counts_of(right, task)
    ok = (nl >= min_leaf) & (nr >= min_leaf) & np.isfinite(thresholds) & valid_slot[:, :, None]
    ok &= (nl > 0) & (nr > 0)
    g = np.where(ok, g, -np.inf)
    flat = g.reshape(E, -1)
    best = np.argmax(flat, axis=1)
    gain = flat[np.arange(E), best]
    slot, idx = np.divmod(best, bt)
    lstats = left[np.arange(E), slot, idx]
    return gain, slot, idx, lstats


def _order_key(stats: np.ndarray, task: str) -> np.ndarray:
    """Fisher ordering key per group: mean of y, or proportion of the node's majority class."""
    n = _impurity.counts_of(stats, task)
    safe = np.where(n > 0, n, 1.0)
    if task == "regression":
        return stats[:, 1] / safe
    tot = stats.sum(axis=0)
    major = int(np.argmax(tot)) if stats.shape[1] > 2 else 1
    return stats[:, major] / safe


def best_grouping(groups: np.ndarray, task: str, criterion: str, min_leaf: float,
                  exhaustive_max: int = 4) -> tuple[float, list[int], np.ndarray]:
    """Best two-way partition of groups (categorical levels or clients) by their statistics.

    With at most ``exhaustive_max`` non-empty groups every partition is scored; otherwise groups
    are ordered by their mean (regression), class-1 proportion (binary) or majority-class
    proportion (multi-class) and contiguous splits are scanned (Fisher 1958), which is exact for
    regression and binary classification.

    Returns the gain (``-inf`` if none is valid), the groups that go left, and their statistics.
    """
    n = _impurity.counts_of(groups, task)
    present = np.flatnonzero(n > 0)
    S = groups.shape[1]
    none: tuple[float, list[int], np.ndarray] = (-np.inf, [], np.zeros(S))
    if present.size < 2:
        return none
    total = groups[present].sum(axis=0)
    parent = float(_impurity.weighted_impurity(total, task, criterion))
    if present.size <= exhaustive_max:
        first, rest = present[0], present[1:]
        subsets = []
        for r in range(0, rest.size):
            for comb in itertools.combinations(rest.tolist(), r):
                subsets.append([int(first), *comb])
    else:
        order = present[np.argsort(_order_key(groups[present], task), kind="stable")]
        subsets = [order[:i].tolist() for i in range(1, order.size)]
    lefts = np.array([groups[s].sum(axis=0) for s in subsets])
    rights = total[None, :] - lefts
    g = (parent - _impurity.weighted_impurity(lefts, task, criterion)
         - _impurity.weighted_impurity(rights, task, criterion))
    nl = _impurity.counts_of(lefts, task)
    nr = _impurity.counts_of(rights, task)
    g = np.where((nl >= min_leaf) & (nr >= min_leaf) & (nl > 0) & (nr > 0), g, -np.inf)
    i = int(np.argmax(g))
    if not np.isfinite(g[i]):
        return none
    return float(g[i]), sorted(int(v) for v in subsets[i]), lefts[i]


def clean_noisy_groups(groups: np.ndarray, task: str, bound: float | None = None) -> np.ndarray:
    """Make DP-noised per-group statistics consistent (post-processing, no privacy cost).

    Class counts are clipped at 0. For regression, a group whose noisy count is not positive
    is dropped (all zeros); otherwise the sum is kept within ``[-bound n, bound n]`` (when the
    public target bound is given) and the sum of squares within ``[sum**2 / n, bound**2 n]``,
    so that means and impurities stay in range.
    """
    g = np.array(groups, dtype=np.float64, copy=True)
    if task != "regression":
        return np.maximum(g, 0.0)
    n = g[..., 0]
    absent = n <= 0
    safe = np.where(absent, 1.0, n)
    if bound is not None:
        g[..., 1] = np.clip(g[..., 1], -bound * safe, bound * safe)
    lo = g[..., 1] ** 2 / safe
    hi = np.inf if bound is None else bound * bound * safe
    g[..., 2] = np.clip(g[..., 2], lo, hi)
    g[absent] = 0.0
    return g
