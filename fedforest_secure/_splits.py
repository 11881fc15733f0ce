"""Split search on aggregated statistics (server side): numeric, categorical and H splits."""

from __future__ import annotations

import itertools

import numpy as np

from . import _impurity, _kernels

__all__ = ["best_grouping", "best_numeric", "candidate_lefts", "candidate_valid",
           "clean_noisy_groups", "decode_candidate"]


def candidate_lefts(hist: np.ndarray, missing: bool) -> tuple[np.ndarray, np.ndarray]:
    """Left-child statistics of every candidate split of per-bin histograms, and the totals.

    ``hist`` has shape (..., Bt + 1, S) (bin b: t_{b-1} < x <= t_b), and with ``missing`` one
    more bin at the end holding the rows whose feature is missing. Without ``missing`` the
    candidates are the Bt thresholds; with it they are ``2 Bt + 1`` (:func:`decode_candidate`):
    each threshold with the missing rows sent right, then each with them sent left (as
    scikit-learn's splitter and XGBoost's default direction try both), then every present
    value left and the missing rows right (threshold +inf).

    Returns
    -------
    lefts (..., C, S), totals (..., 1, S)
    """
    total = hist.sum(axis=-2, keepdims=True)
    if not missing:
        return np.cumsum(hist, axis=-2)[..., :-1, :], total
    cum = np.cumsum(hist[..., :-1, :], axis=-2)
    miss = hist[..., -1:, :]
    return np.concatenate([cum[..., :-1, :], cum[..., :-1, :] + miss, cum[..., -1:, :]],
                          axis=-2), total


def decode_candidate(index: np.ndarray, bt: int, missing: bool
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Threshold index, missing-goes-left flag and "threshold is +inf" flag of candidate
    indices of :func:`candidate_lefts` (``bt`` thresholds per slot)."""
    index = np.asarray(index)
    if not missing:
        return index, np.zeros(index.shape, dtype=bool), np.zeros(index.shape, dtype=bool)
    inf = index == 2 * bt
    left = (index >= bt) & ~inf
    return np.where(inf, 0, np.where(left, index - bt, index)), left, inf


def candidate_valid(hist: np.ndarray, thresholds: np.ndarray, missing: bool, task: str
                    ) -> np.ndarray:
    """(..., C) which candidates of :func:`candidate_lefts` exist: a finite threshold, and
    with missing rows at the node for the missing-left and +inf candidates; the +inf split
    (present | missing) where the slot has a finite threshold or present rows, so a feature
    whose present values are all equal splits present from missing too (as scikit-learn's
    trees from 1.8)."""
    fin: np.ndarray = np.isfinite(thresholds)
    if not missing:
        return fin
    n_miss = _impurity.counts_of(hist[..., -1, :], task)
    has = (n_miss > 0)[..., None]
    n_present = _impurity.counts_of(hist[..., :-1, :].sum(axis=-2), task)
    present = fin.any(axis=-1, keepdims=True) | (n_present > 0)[..., None]
    return np.concatenate([fin, fin & has, present & has], axis=-1)


#: :func:`best_numeric` scores runs of nodes of at most this many histogram entries at a
#: time: the temporaries of a wide level (many nodes, features and bins) stay a few MB
SCORE_ENTRIES = 1 << 19


def best_numeric(hist: np.ndarray, thresholds: np.ndarray, valid_slot: np.ndarray,
                 task: str, criterion: str, min_leaf: float, missing: bool = False
                 ) -> tuple[np.ndarray, ...]:
    """Best (slot, threshold index) per node from per-bin histograms, a run of nodes at a
    time (a node's result does not depend on the others).

    Parameters
    ----------
    hist : (E, m, Bt + 1 (+ 1 with ``missing``), S) summed per-bin statistics (bin b:
        t_{b-1} < x <= t_b; the last bin, with ``missing``, the rows missing the feature)
    thresholds : (E, m, Bt), +inf padded
    valid_slot : (E, m) bool, slots that hold a numeric feature
    missing : whether ``hist`` has the missing-value bin (:func:`candidate_lefts`)

    Returns
    -------
    gain (E,) (-inf where no valid split), slot (E,), index (E,) into the thresholds (the
    split at +inf: ``Bt``), left stats (E, S), missing_left (E,) bool: where the missing rows
    go (with none at the node, the child with more rows, as scikit-learn)
    """
    step = max(1, SCORE_ENTRIES // max(int(np.prod(hist.shape[1:])), 1))
    if hist.shape[0] <= step:
        return _best_numeric(hist, thresholds, valid_slot, task, criterion, min_leaf, missing)
    parts = [_best_numeric(hist[a:a + step], thresholds[a:a + step], valid_slot[a:a + step],
                           task, criterion, min_leaf, missing)
             for a in range(0, hist.shape[0], step)]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(len(parts[0])))


def _best_numeric(hist: np.ndarray, thresholds: np.ndarray, valid_slot: np.ndarray,
                  task: str, criterion: str, min_leaf: float, missing: bool
                  ) -> tuple[np.ndarray, ...]:
    """:func:`best_numeric` of one run of nodes."""
    E, m = hist.shape[:2]
    S = hist.shape[-1]
    bt = thresholds.shape[2]
    if E == 0 or bt == 0:
        z = np.zeros(E, dtype=np.int64)
        return np.full(E, -np.inf), z, z, np.zeros((E, S)), np.zeros(E, dtype=bool)
    if (not missing and task == "regression" and S == 2 and _kernels.KERNELS is not None
            and hist.dtype == np.float64 and hist.flags.c_contiguous):
        # the same operations in the same order, every node in one compiled pass
        return _best_moments(hist, thresholds, valid_slot, min_leaf)
    left, total = candidate_lefts(hist, missing)
    right = total - left
    g = (_impurity.weighted_impurity(total, task, criterion)
         - _impurity.weighted_impurity(left, task, criterion)
         - _impurity.weighted_impurity(right, task, criterion))
    nl = _impurity.counts_of(left, task)
    nr = _impurity.counts_of(right, task)
    ok = ((nl >= min_leaf) & (nr >= min_leaf) & candidate_valid(hist, thresholds, missing, task)
          & valid_slot[:, :, None])
    ok &= (nl > 0) & (nr > 0)
    g = np.where(ok, g, -np.inf)
    C = g.shape[2]
    flat = g.reshape(E, -1)
    best = np.argmax(flat, axis=1)
    gain = flat[np.arange(E), best]
    slot, cand = np.divmod(best, C)
    rows = np.arange(E)
    lstats = left[rows, slot, cand]
    idx, miss_left, inf = decode_candidate(cand, bt, missing)
    idx = np.where(inf, bt, idx)
    n_left = _impurity.counts_of(lstats, task)
    n_right = _impurity.counts_of(total[rows, slot, 0], task) - n_left
    if missing:
        none_missing = _impurity.counts_of(hist[rows, slot, -1], task) <= 0
    else:
        none_missing = np.ones(E, dtype=bool)
    miss_left = np.where(none_missing, n_left > n_right, miss_left)
    return gain, slot, idx, lstats, miss_left


def _best_moments(hist: np.ndarray, thresholds: np.ndarray, valid_slot: np.ndarray,
                  min_leaf: float) -> tuple[np.ndarray, ...]:
    """:func:`_best_numeric` of a regression's (n, sum y) histograms without a missing-value
    bin, by the compiled loop (C-contiguous ``hist``: numpy sums its bins one after the other,
    as the loop does)."""
    kernels = _kernels.KERNELS
    if kernels is None:  # pragma: no cover - the caller checks
        raise RuntimeError("internal: _best_moments needs the compiled loops")
    E, m, bt = thresholds.shape
    gain = np.empty(E)
    slot = np.empty(E, dtype=np.int64)
    idx = np.empty(E, dtype=np.int64)
    left = np.empty((E, 2))
    more_left = np.empty(E, dtype=np.int64)
    kernels.best_moments(hist, _kernels.f64(thresholds), _kernels.i64(valid_slot), gain, slot,
                         idx, left, more_left, E, m, bt, float(min_leaf))
    return gain, slot, idx, left, more_left.astype(bool)


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
