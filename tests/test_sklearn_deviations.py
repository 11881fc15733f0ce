"""Where the forests knowingly differ from scikit-learn's, as the estimators' docstring and
docs/configuration.md state: ``min_samples_leaf`` counts bootstrap repeats, and a node whose
drawn ``max_features`` features are all constant on it becomes a leaf."""

from __future__ import annotations

import warnings

import numpy as np

from fedforest_secure import FedForestRegressor
from fedforest_secure.federation import client_seed
from fedforest_secure.worker import Worker


def test_min_samples_leaf_counts_bootstrap_repeats_not_distinct_rows() -> None:
    rng = np.random.default_rng(0)
    n = 400
    X = rng.normal(size=(n, 3))
    y = X[:, 0] + rng.normal(scale=0.5, size=n)
    ff = FedForestRegressor(n_estimators=4, min_samples_leaf=5, max_features=None,
                            random_state=0).fit(X, y)
    cfg = ff.config_
    # the bootstrap multiplicities the one in-process client drew for each tree
    wk = Worker(cfg, X, y - ff.y_offset_, client_index=0, seed=client_seed(cfg, 0))
    draws = np.zeros((cfg.n_estimators, n))
    np.add.at(draws, (wk._p_node.astype(int), wk._p_row), wk._p_w)
    leaves = ff.apply(X)
    fewest_distinct = n
    for t, tree in enumerate(ff.model_.trees):
        for leaf in np.flatnonzero(tree.left < 0):
            rows = (leaves[:, t] == leaf) & (draws[t] > 0)
            assert draws[t][rows].sum() == tree.n[leaf] >= 5  # the count min_samples_leaf bounds
            fewest_distinct = min(fewest_distinct, int(rows.sum()))
    assert fewest_distinct < 5


def test_node_whose_drawn_features_are_all_constant_becomes_a_leaf() -> None:
    rng = np.random.default_rng(0)
    n = 400
    X = np.column_stack([rng.normal(size=n), np.zeros((n, 3))])
    y = 3 * X[:, 0] + rng.normal(scale=0.1, size=n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the constant columns' bounds
        one = FedForestRegressor(n_estimators=20, max_features=1, random_state=0).fit(X, y)
        every = FedForestRegressor(n_estimators=20, max_features=None, random_state=0).fit(X, y)
    assert sum(t.n.size == 1 for t in one.model_.trees) >= 10
    assert all(t.n.size > 1 for t in every.model_.trees)
