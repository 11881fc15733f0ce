"""Tests for fedforest_secure.experiments.partitions: Dirichlet and even client partitions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedforest_secure.experiments import partitions as P


def _label_heterogeneity(y: np.ndarray, client: np.ndarray) -> float:
    """Mean total-variation distance between client label distributions and the pooled one."""
    classes = np.unique(y)
    glob = np.array([(y == c).mean() for c in classes])
    dists = []
    for k in np.unique(client):
        yk = y[client == k]
        dists.append(0.5 * np.abs(np.array([(yk == c).mean() for c in classes]) - glob).sum())
    return float(np.mean(dists))


def _feature_heterogeneity(X: np.ndarray, client: np.ndarray) -> float:
    """Mean distance between client feature means and the pooled mean (standardised)."""
    Z = (X - X.mean(0)) / X.std(0)
    return float(np.mean([np.linalg.norm(Z[client == k].mean(0)) for k in np.unique(client)]))


def _check_partition(client: np.ndarray, n: int, K: int, min_size: int = 2) -> None:
    assert client.shape == (n,) and client.dtype == np.int64
    assert client.min() >= 0 and client.max() < K
    assert np.bincount(client, minlength=K).min() >= min_size
    assert np.bincount(client, minlength=K).sum() == n  # each row in exactly one client


def test_dirichlet_partition_labels() -> None:
    y = np.random.default_rng(0).integers(0, 3, size=1000)
    het = {}
    for alpha in (0.1, 100.0):
        vals = []
        for seed in range(3):
            client = P.dirichlet_partition(y, 20, alpha, seed)
            _check_partition(client, y.size, 20)
            vals.append(_label_heterogeneity(y, client))
        het[alpha] = np.mean(vals)
    assert het[0.1] > 0.3 > 0.1 > het[100.0]


def test_dirichlet_partition_features_covariate_shift() -> None:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((1200, 5)) @ rng.standard_normal((5, 5))
    small = P.dirichlet_partition(X, 20, 0.1, 0)
    large = P.dirichlet_partition(X, 20, 100.0, 0)
    _check_partition(small, 1200, 20)
    _check_partition(large, 1200, 20)
    assert _feature_heterogeneity(X, small) > 3 * _feature_heterogeneity(X, large)
    # deterministic given the seed, different across seeds
    assert np.array_equal(small, P.dirichlet_partition(X, 20, 0.1, 0))
    assert np.array_equal(small, P.dirichlet_partition(X, 20, 0.1, np.random.default_rng(0)))
    assert not np.array_equal(small, P.dirichlet_partition(X, 20, 0.1, 1))


def test_dirichlet_partition_continuous_target_and_min_size() -> None:
    y = np.random.default_rng(2).standard_normal(60)
    client = P.dirichlet_partition(y, 20, 0.01, 3, min_size=3)
    _check_partition(client, 60, 20, min_size=3)
    # a 2-D input whose rows are all identical still partitions
    _check_partition(P.dirichlet_partition(np.ones((50, 3)), 5, 1.0, 0), 50, 5)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((np.zeros(100), 10, 0.0, 0), "alpha"),
        ((np.zeros(100), 10, float("nan"), 0), "alpha"),
        ((np.zeros(100), 0, 1.0, 0), "n_clients"),
        ((np.zeros(10), 10, 1.0, 0), "cannot give"),
        ((np.zeros((2, 2, 2)), 2, 1.0, 0), "1-D or 2-D"),
        ((np.array([0.0, np.inf, 1.0, 2.0]), 2, 1.0, 0), "non-finite"),
    ],
)
def test_dirichlet_partition_rejects_bad_input(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        P.dirichlet_partition(*args)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(20, 300),
    K=st.integers(1, 10),
    alpha=st.floats(0.01, 100.0),
    n_labels=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_dirichlet_partition_property(n: int, K: int, alpha: float, n_labels: int,
                                      seed: int) -> None:
    y = np.random.default_rng(seed).integers(0, n_labels, size=n)
    _check_partition(P.dirichlet_partition(y, K, alpha, seed), n, K)


def test_even_partition() -> None:
    for K in (1, 2, 5, 10, 20, 50, 100):
        client = P.even_partition(1372, K, 0)
        sizes = np.bincount(client, minlength=K)
        assert client.shape == (1372,) and sizes.sum() == 1372
        assert sizes.max() - sizes.min() <= 1
    assert np.array_equal(P.even_partition(100, 7, 5), P.even_partition(100, 7, 5))
    with pytest.raises(ValueError, match="exceeds"):
        P.even_partition(5, 6, 0)
    with pytest.raises(ValueError, match="n_clients"):
        P.even_partition(5, 0, 0)
