"""Tests for fedforest_secure._splits: which candidate splits exist."""

from __future__ import annotations

import numpy as np
import pytest

from fedforest_secure import FedForestRegressor
from fedforest_secure._splits import candidate_valid


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
