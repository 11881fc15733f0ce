"""Tests for fedforest_secure._splits: which candidate splits exist, the best ones."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from fedforest_secure import FedForestRegressor, _splits
from fedforest_secure._splits import best_grouping, best_numeric, candidate_valid


def test_present_vs_missing_exists_where_the_present_values_are_all_equal() -> None:
    """A slot without a finite threshold (one distinct present value: no midpoint) still
    splits its present rows from its missing rows, as scikit-learn's trees from 1.8."""
    # regression statistics (n, sum y, sum y^2); bins: x <= t_0, x > t_0, missing
    thresholds = np.array([[np.inf]])
    hist = np.array([[[4.0, 4.0, 4.0], [0.0, 0.0, 0.0], [6.0, 0.0, 0.0]]])
    assert candidate_valid(hist, thresholds, True, "regression").tolist() == [
        [False, False, True]]
    # no present rows: no split; no missing rows: none either
    hist_none = hist.copy()
    hist_none[..., 0, :] = 0.0
    assert not candidate_valid(hist_none, thresholds, True, "regression").any()
    hist_full = hist.copy()
    hist_full[..., -1, :] = 0.0
    assert not candidate_valid(hist_full, thresholds, True, "regression").any()


@pytest.mark.parametrize("method", ["exact", "quantiles"])
def test_a_flag_recorded_or_missing_is_split_present_vs_missing(method: str) -> None:
    rng = np.random.default_rng(0)
    n = 1000
    flag = rng.random(n) < 0.4
    X = np.column_stack([np.where(flag, 1.0, np.nan), rng.normal(size=n)])
    y = 5.0 * flag + 0.1 * X[:, 1] + rng.normal(scale=0.3, size=n)
    tree = FedForestRegressor(n_estimators=1, bootstrap=False, method=method, max_features=None,
                              max_depth=1).fit(X, y).model_.trees[0]
    assert tree.feature[0] == 0 and not tree.missing_left[0]
    assert tree.gain[0] == pytest.approx(5875.8, abs=0.1)


def test_a_grouping_may_leave_exactly_min_samples_leaf_rows_on_each_side() -> None:
    """Categorical levels or clients (H): two groups of 5 rows under min_samples_leaf = 5
    split (regression statistics: count, sum y, sum y^2 per group)."""
    two = np.array([[5, 5.0, 5.0], [5, 50.0, 500.0]])
    gain, left, _ = best_grouping(two, "regression", "mse", 5)
    assert gain == pytest.approx(202.5) and left == [0]
    gain6, _, _ = best_grouping(two, "regression", "mse", 6)
    assert not np.isfinite(gain6)


def test_multiclass_groups_are_ordered_by_the_majority_class_share() -> None:
    """Six groups of three classes, class 2 the majority: ordered by each group's share of
    class 2, the best two-way partition is {0, 1, 5} | {2, 3, 4} (ordered by class 0's share
    instead, it is not found)."""
    cls = np.array([[1, 0, 18], [0, 1, 18], [5, 5, 0], [0, 9, 2], [9, 0, 2], [1, 1, 16]],
                   dtype=float)
    _, left, _ = best_grouping(cls, "classification", "gini", 1)
    assert left in ([0, 1, 5], [2, 3, 4])


def _wide_histogram(E: int, m: int, bt: int, task: str, missing: bool, seed: int = 0
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin statistics (E, m, bt + 1 (+1), S) with integer counts, thresholds (some +inf)
    and slots that hold a numeric feature."""
    rng = np.random.default_rng(seed)
    nb = bt + 1 + int(missing)
    if task == "regression":
        hist = np.stack([rng.integers(0, 12, size=(E, m, nb)).astype(float),
                         rng.normal(size=(E, m, nb))], axis=-1)
    else:
        hist = rng.integers(0, 6, size=(E, m, nb, 3)).astype(float)
    thr = np.sort(rng.normal(size=(E, m, bt)), axis=2)
    thr[rng.random((E, m, bt)) < 0.1] = np.inf
    thr.sort(axis=2)
    return hist, thr, rng.random((E, m)) < 0.9


@pytest.mark.parametrize("task,criterion", [("regression", "mse"),
                                            ("classification", "gini"),
                                            ("classification", "entropy")])
@pytest.mark.parametrize("missing", [False, True])
def test_best_numeric_scores_runs_of_nodes_as_one_level(monkeypatch: pytest.MonkeyPatch,
                                                        task: str, criterion: str,
                                                        missing: bool) -> None:
    """A level scored a few nodes at a time gives every node the same split, gain and left
    statistics, to the bit, as the level scored at once."""
    hist, thr, valid = _wide_histogram(37, 5, 7, task, missing)
    whole = best_numeric(hist, thr, valid, task, criterion, 3, missing)
    monkeypatch.setattr(_splits, "SCORE_ENTRIES", 2 * hist[0].size + 1)  # runs of 2 nodes
    runs = best_numeric(hist, thr, valid, task, criterion, 3, missing)
    assert len(runs) == len(whole) == 5
    for a, b in zip(whole, runs, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert np.isfinite(whole[0]).sum() > 30  # splits were found


def test_a_wide_level_is_scored_within_its_histograms_size() -> None:
    """Scoring a level of 1,000 nodes x 60 slots x 32 bins (a 30 MB histogram) holds less
    than the histogram's size besides it (about half: runs of nodes); every candidate's left
    and right statistics and gains of the whole level at once would take about 3.6 x."""
    hist, thr, valid = _wide_histogram(1000, 60, 31, "regression", False)
    tracemalloc.start()
    try:
        best_numeric(hist, thr, valid, "regression", "mse", 5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < hist.nbytes, peak / hist.nbytes


def _moments_level(rng: np.random.Generator, E: int, m: int, bt: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A level's (n, sum y) histograms (E, m, bt + 1, 2) with empty bins, equal bins (tied
    gains), +inf thresholds and slots without a numeric feature."""
    n = rng.integers(0, 6, size=(E, m, bt + 1)).astype(float)
    n[rng.random(n.shape) < 0.3] = 0.0
    s = np.where(n > 0, rng.normal(size=n.shape) * n, 0.0)
    s[:, :, ::3] = n[:, :, ::3]  # whole runs of equal bins: tied gains
    thr = np.sort(rng.normal(size=(E, m, bt)), axis=2)
    width = rng.integers(0, bt + 1, size=(E, m))
    thr[np.arange(bt)[None, None, :] >= width[:, :, None]] = np.inf
    valid = rng.random((E, m)) < 0.8
    return np.stack([n, s], axis=-1), thr, valid


@pytest.mark.parametrize("min_leaf", [0.5, 1, 3, 5])
def test_compiled_regression_split_scores_equal_numpy_bit_for_bit(
        monkeypatch: pytest.MonkeyPatch, min_leaf: float) -> None:
    """A regression level's (n, sum y) histograms are scored by one compiled pass
    (``_splits._best_moments``) that gives every node numpy's split: the same gain, slot,
    threshold index, left statistics and side of the larger child, to the bit (ties: the
    first candidate; nodes without a valid split: -inf and numpy's first candidate)."""
    from fedforest_secure import _kernels

    kernels = _kernels.KERNELS
    if kernels is None:
        pytest.skip("the compiled loops are not built")
    rng = np.random.default_rng(7)
    hist, thr, valid = _moments_level(rng, 400, 6, 9)
    hist[3, 2, 4] = [6.0, 1e300]  # a gain that overflows: inf - inf is NaN, numpy's argmax
    thr[3, 2, 4] = 0.0
    valid[3, 2] = True
    compiled = _splits._best_moments(hist, thr, valid, min_leaf)
    monkeypatch.setattr(_kernels, "KERNELS", None)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = best_numeric(hist, thr, valid, "regression", "mse", min_leaf)
    assert len(compiled) == len(ref) == 5
    for a, b in zip(compiled, ref, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    gains = ref[0]
    assert np.isnan(gains).sum() >= 1 and np.isneginf(gains).any() and np.isfinite(gains).any()
    monkeypatch.setattr(_kernels, "KERNELS", kernels)  # best_numeric takes the compiled pass
    assert all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(
        best_numeric(hist, thr, valid, "regression", "mse", min_leaf), ref, strict=True))
