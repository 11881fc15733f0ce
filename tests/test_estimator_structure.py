"""The fitted forest as scikit-learn shows it (``_estimator_structure``): ``estimators_`` and
``feature_importances_`` built once per fitted forest."""

from __future__ import annotations

import copy
import pickle

import numpy as np
from sklearn.tree import DecisionTreeRegressor

from fedforest_secure import FedForestRegressor


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 4))
    return X, X[:, 0] + X[:, 1] ** 2 + 0.1 * rng.normal(size=300), np.arange(300) % 3


def test_estimators_is_built_once_per_fitted_forest_and_again_after_a_refit(
        tmp_path: object) -> None:
    """Each read of estimators_ built every tree anew (200 trees: 2 s a read, and
    ``m.estimators_[i]`` in a loop 232 s): the same list now, until a fit, a failed fit or a
    load gives the estimator another forest."""
    X, y, h = _data()
    est = FedForestRegressor(n_estimators=4, random_state=0).fit(X, y, client=h)
    trees = est.estimators_
    assert est.estimators_ is trees and all(a is b for a, b in zip(est.estimators_, trees,
                                                                  strict=True))
    assert [t.tree_.node_count for t in trees] == [t.n_nodes for t in est.model_.trees]
    imp = est.feature_importances_
    imp[:] = -1.0  # the caller's copy: the next read is unchanged
    np.testing.assert_array_equal(est.feature_importances_,
                                  FedForestRegressor(n_estimators=4, random_state=0)
                                  .fit(X, y, client=h).feature_importances_)
    est.set_params(n_estimators=2)
    assert est.estimators_ is trees  # the fitted forest is still the one it was
    est.fit(X, 2 * y, client=h)
    assert len(est.estimators_) == 2 and est.estimators_ is not trees
    np.testing.assert_array_equal(est.estimators_[0].tree_.value[:, 0, 0],  # the new forest's
                                  est.model_.trees[0].value[:, 0] + est.y_offset_)
    first = est.estimators_
    try:
        est.fit(X, np.full(300, np.nan), client=h)
    except ValueError:
        pass
    assert not hasattr(est, "_structure_cache") and not hasattr(est, "model_")
    est.fit(X, y, client=h)
    assert est.estimators_ is not first


def test_a_pickled_or_copied_estimator_builds_its_trees_again() -> None:
    """The built trees hold the estimator's input checks (a closure): pickle and deepcopy
    leave them out and the copy builds its own."""
    X, y, h = _data()
    est = FedForestRegressor(n_estimators=3, random_state=0).fit(X, y, client=h)
    trees = est.estimators_
    for other in (pickle.loads(pickle.dumps(est)), copy.deepcopy(est)):
        assert other.estimators_ is not trees
        np.testing.assert_array_equal(other.estimators_[1].apply(X), trees[1].apply(X))
        np.testing.assert_array_equal(other.feature_importances_, est.feature_importances_)


def test_a_trees_depth_is_scikit_learns() -> None:
    """Tree.depth (one pass per level) against DecisionTreeRegressor.get_depth on one exact,
    unlimited tree."""
    X, y, _ = _data()
    est = FedForestRegressor(n_estimators=1, bootstrap=False, max_features=None,
                             method="exact", max_depth=None, min_samples_leaf=1).fit(X, y)
    sk = DecisionTreeRegressor(random_state=0).fit(X, y)
    assert est.model_.trees[0].depth == est.estimators_[0].get_depth() == sk.get_depth() > 8
