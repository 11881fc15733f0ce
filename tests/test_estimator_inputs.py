"""The regression target's centre (``_estimator_inputs.target_centre``) and the warning where
the trees cannot resolve its bulk (``warn_unresolved_target``)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from sklearn.tree import DecisionTreeRegressor

from fedforest_secure import FedForestRegressor

EXACT = dict(n_estimators=1, bootstrap=False, max_features=None, method="exact",
             min_samples_leaf=5, random_state=0)


def _bulk_and_one_far_value(far: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 4))
    y = 100 + 10 * X[:, 0] + rng.normal(size=1000)
    y[0] = far
    return X, y


@pytest.mark.parametrize("far", [1e8, 1e9])
def test_one_far_target_value_leaves_the_exact_tree_as_scikit_learn_grows_it(far: float
                                                                            ) -> None:
    """y ~ 100 +- 10 and one row at 1e8: centred on the middle of the range, the bulk sat
    5e7 from 0 and every node of spread below ~50 read as pure (3 leaves against 162). The
    open profile centres on the median: the same tree as DecisionTreeRegressor."""
    X, y = _bulk_and_one_far_value(far)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = FedForestRegressor(**EXACT).fit(X, y)
    sk = DecisionTreeRegressor(min_samples_leaf=5, random_state=0).fit(X, y)
    assert ours.estimators_[0].get_n_leaves() == sk.get_n_leaves() == 162
    assert ours.y_offset_ == np.median(y)
    np.testing.assert_allclose(ours.predict(X), sk.predict(X), rtol=1e-12)


@pytest.mark.parametrize("sigma", [5.0, 7.0])
def test_a_heavy_tailed_target_grows_the_exact_tree_scikit_learn_grows(sigma: float) -> None:
    """y = exp(sigma * x0): the rows of the lower half lost their splits to the far upper
    tail (17 and 6 leaves against 61 and 64)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(600, 3))
    y = np.exp(sigma * X[:, 0]) + 0.01 * rng.normal(size=600)
    ours = FedForestRegressor(**EXACT).fit(X, y)
    sk = DecisionTreeRegressor(min_samples_leaf=5, random_state=0).fit(X, y)
    assert ours.estimators_[0].get_n_leaves() == sk.get_n_leaves()
    low = y < np.median(y)
    np.testing.assert_allclose(ours.predict(X)[low], sk.predict(X)[low], rtol=0, atol=1e-9)


@pytest.mark.parametrize("profile", ["secure", "secure-dp"])
def test_a_fixed_point_or_dp_profile_centres_on_the_middle_and_warns_of_a_far_value(
        profile: str) -> None:
    """The fixed-point scale and the DP noise's bound are the half-width about the centre,
    smallest about the middle of the range: these profiles keep it, and fit says that the
    bulk's spread is below what the sums resolve there, with the remedy."""
    X, y = _bulk_and_one_far_value(1e8)
    est = FedForestRegressor(n_estimators=2, random_state=0, profile=profile)
    with pytest.warns(UserWarning, match=re.escape(
            "y: the middle half of its values spreads about 10.6 (as a standard deviation) "
            "around 100.078, but the trees' sums of y and y^2 are taken about 5e+07, the "
            "middle of its range [69.4323, 1e+08], and resolve only a spread of about "
            "2.44e+04 there: nodes of the bulk stop splitting and the forest comes out "
            "shallow. Correct or drop the far values of y, or rescale it (e.g. a log)")):
        est.fit(X, y, client=np.arange(1000) % 3)
    assert est.y_offset_ == y.min() / 2 + y.max() / 2


def test_a_target_without_far_values_fits_without_a_warning_in_every_profile() -> None:
    X, y = _bulk_and_one_far_value(130.0)
    for profile in ("open", "secure", "secure-dp"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            FedForestRegressor(n_estimators=2, random_state=0, profile=profile).fit(
                X, y, client=np.arange(1000) % 3)
