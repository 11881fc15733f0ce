"""Tests for fedforest_secure.experiments.synthetic: the paper's synthetic settings."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from fedforest_secure.experiments import synthetic as S


def test_aux_target_formula() -> None:
    # d = 5, 1-based j: j=1 sin(4 pi x1), j=2 x2*x3, j=3 step(x3), j=4 sin(4 pi x4),
    # j=5 x5*x1 (the partner index (j mod d) + 1 wraps around)
    x = np.array([[0.125, 0.2, 0.7, 0.375, 0.3]])
    expected = 1.0 + 0.2 * 0.7 + 1.0 - 1.0 + 0.3 * 0.125
    assert S._aux_target(x)[0] == pytest.approx(expected)


def test_tree_distilled_f() -> None:
    f = S.tree_distilled_f(20, 0)
    assert f is S.tree_distilled_f(20, 0)  # cached
    assert f.tree.get_depth() == 8
    X = np.random.default_rng(0).uniform(-10, 10, size=(500, 20))
    out = f(X)
    assert out.shape == (500,) and out.dtype == np.float64
    g = pickle.loads(pickle.dumps(f))
    assert np.array_equal(g(X), out)
    assert not np.array_equal(S.tree_distilled_f(20, 1)(X), out)
    # f distils y_aux: it explains much of its variance on a fresh uniform sample
    y_aux = S._aux_target((X + 10) / 20)
    assert 1 - np.mean((out - y_aux) ** 2) / y_aux.var() > 0.3
    with pytest.raises(ValueError, match="shape"):
        f(np.zeros((3, 5)))


def test_federated_regression_shapes_and_determinism() -> None:
    train, test = S.make_federated_regression("homogeneous", seed=7)
    assert train.X.shape == (1400, 20) and test.X.shape == (600, 20)
    assert train.task == "regression" and train.client is not None
    assert np.bincount(train.client).tolist() == [140] * 10
    assert np.bincount(test.client).tolist() == [60] * 10
    again = S.make_federated_regression("homogeneous", seed=7)
    assert np.array_equal(again.train.X, train.X) and np.array_equal(again.test.y, test.y)
    other = S.make_federated_regression("homogeneous", seed=8)
    assert not np.array_equal(other.train.X, train.X)
    with pytest.raises(ValueError, match="covariate_shift"):
        S.make_federated_regression("label_shift")
    with pytest.raises(ValueError, match="test_size"):
        S.make_federated_regression(test_size=1.0)


@pytest.mark.parametrize("setting", ["homogeneous", "covariate_shift", "outcome_shift", "full"])
def test_federated_regression_statistics(setting: str) -> None:
    p = S.SYNTHETIC_SETTINGS[setting]
    train, test = S.make_federated_regression(setting, n_clients=4, n_per_client=3000, seed=0)
    f = S.tree_distilled_f(20, 0)
    X = np.vstack([train.X, test.X])
    y = np.concatenate([train.y, test.y])
    client = np.concatenate([train.client, test.client])
    resid_all = y - f(X)
    for k in range(4):
        sign = -1.0 if k % 2 == 0 else 1.0  # (-1)^k for the paper's k = client + 1
        Xk, rk = X[client == k], resid_all[client == k]
        assert Xk.mean() == pytest.approx(sign * p["gamma"], abs=0.03)
        assert Xk.var(axis=0).mean() == pytest.approx(p["alpha"], rel=0.05)
        assert rk.mean() == pytest.approx(sign * p["delta"], abs=0.05)
        assert rk.var() == pytest.approx(0.5, rel=0.1)  # noise variance 0.5


def test_federated_regression_overrides() -> None:
    f = S.tree_distilled_f(3, 0)
    train, _ = S.make_federated_regression(
        "homogeneous", n_clients=2, n_per_client=2000, d=3, gamma=1.0, delta=2.0,
        noise_var=0.0, f=f, seed=0,
    )
    assert train.client is not None
    assert train.X[train.client == 1].mean() == pytest.approx(1.0, abs=0.05)
    resid = train.y - f(train.X)
    assert np.allclose(resid[train.client == 0], -2.0)


def test_disjoint_supports() -> None:
    train, test = S.make_disjoint_supports(2.5, n_per_client=2000, seed=0)
    assert train.X.shape == (2800, 5) and test.X.shape == (1200, 5)
    assert train.client is not None
    for k, sign in ((0, -1.0), (1, 1.0)):
        Xk = train.X[train.client == k]
        assert Xk[:, 0].mean() == pytest.approx(sign * 2.5, abs=0.08)
        assert np.abs(Xk[:, 1:].mean(0)).max() < 0.08
        assert Xk.std(0).mean() == pytest.approx(1.0, rel=0.05)
    resid = train.y - 10.0 * (train.X[:, 0] > 0)
    assert resid.std() == pytest.approx(1.0, rel=0.05)
    a = S.make_disjoint_supports(1.0, seed=3)
    b = S.make_disjoint_supports(1.0, seed=3)
    assert a.train.X.shape == (210, 5)
    assert np.array_equal(a.train.y, b.train.y)


def test_overlapping_supports() -> None:
    train, _ = S.make_overlapping_supports(1.0, n_per_client=3000, seed=0)
    assert train.client is not None
    for k, sign in ((0, -1.0), (1, 1.0)):
        Xk = train.X[train.client == k]
        assert np.allclose(Xk.mean(0), sign * 1.0, atol=0.08)
        assert Xk.std(0).mean() == pytest.approx(1.5, rel=0.05)
    assert (train.y - train.X[:, 0]).std() == pytest.approx(1.0, rel=0.05)
    with pytest.raises(ValueError, match="gamma"):
        S.make_overlapping_supports(-1.0)


@pytest.mark.parametrize("fraction", [0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 1.0])
def test_contaminate_outliers_exact_fraction(fraction: float) -> None:
    train, _ = S.make_federated_regression("homogeneous", seed=0)
    X = train.X
    X_before = X.copy()
    out, rows = S.contaminate_outliers(X, fraction, 0)
    assert np.array_equal(X, X_before)  # input untouched
    assert rows.size == round(fraction * X.shape[0])
    assert len(np.unique(rows)) == rows.size
    changed = np.flatnonzero(np.any(out != X, axis=1))
    assert np.array_equal(changed, rows)
    assert np.allclose(out[rows], 1000.0 * X[rows])
    out2, rows2 = S.contaminate_outliers(X, fraction, 0)
    assert np.array_equal(out2, out) and np.array_equal(rows2, rows)


def test_contaminate_outliers_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="fraction"):
        S.contaminate_outliers(np.ones((4, 2)), 1.5, 0)
    with pytest.raises(ValueError, match="2-D"):
        S.contaminate_outliers(np.ones(4), 0.5, 0)
