"""Tests for fedforest_secure._splits: which candidate splits exist."""

from __future__ import annotations

import numpy as np
import pytest

from fedforest_secure import FedForestRegressor
from fedforest_secure._splits import best_grouping, candidate_valid


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
