"""Tests of the comparison baselines (local learning, local ensembling, centralized RF)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.ensemble import RandomForestRegressor

from fedforest_secure.experiments.baselines import (
    CentralizedRF,
    LocalEnsemble,
    LocalEnsembleClassifier,
    LocalEnsembleRegressor,
    LocalLearning,
    LocalLearningClassifier,
    LocalLearningRegressor,
)

SMALL = {"n_estimators": 8, "max_depth": 4, "min_samples_leaf": 2}


def _offset_data(seed: int = 0, n_k: int = 60, K: int = 3) -> tuple[np.ndarray, ...]:
    """Client k has y = x0 + 10 k: an offset only the client id explains."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_k * K, 3))
    h = np.repeat(np.arange(K), n_k)
    y = X[:, 0] + 10.0 * h + 0.01 * rng.normal(size=h.size)
    return X, y, h


def _class_data(seed: int = 0) -> tuple[np.ndarray, ...]:
    """Three classes; client 0 only has classes 0/1, client 1 only 1/2 (missing classes)."""
    rng = np.random.default_rng(seed)
    X0 = rng.normal(size=(80, 2))
    y0 = (X0[:, 0] > 0).astype(int)  # 0 / 1
    X1 = rng.normal(size=(80, 2)) + 3.0
    y1 = 1 + (X1[:, 0] > 3).astype(int)  # 1 / 2
    X = np.vstack([X0, X1])
    y = np.array(["a", "b", "c"])[np.concatenate([y0, y1])]
    h = np.repeat(np.array(["north", "south"]), 80)
    return X, y, h


# ------------------------------------------------------------------------- local learning
def test_local_learning_uses_each_rows_client_model() -> None:
    X, y, h = _offset_data()
    m = LocalLearning(**SMALL, random_state=0).fit(X, y, client=h)
    assert m.n_clients_ == 3 and len(m.estimators_) == 3
    pred = m.predict(X, client=h)
    for k in range(3):
        rows = h == k
        np.testing.assert_allclose(pred[rows], m.estimators_[k].predict(X[rows]))
        # the offset of client k is learnt by its own model only
        assert abs(pred[rows].mean() - 10.0 * k) < 1.0
    assert m.score(X, y, client=h) > 0.95


def test_local_learning_without_client_averages_and_rejects_unknown_clients() -> None:
    X, y, h = _offset_data()
    ll = LocalLearning(**SMALL, random_state=0).fit(X, y, client=h)
    le = LocalEnsemble(**SMALL, random_state=0).fit(X, y, client=h)
    np.testing.assert_allclose(ll.predict(X), le.predict(X))
    np.testing.assert_allclose(ll.predict(X), np.mean([e.predict(X) for e in ll.estimators_], 0))
    with pytest.raises(ValueError, match="unknown client"):
        ll.predict(X[:2], client=np.array([0, 7]))
    with pytest.raises(ValueError, match="features"):
        ll.predict(X[:, :2], client=h)


def test_local_forests_use_the_shared_hyper_parameters() -> None:
    X, y, h = _offset_data()
    m = LocalLearning(n_estimators=5, max_depth=3, min_samples_leaf=4, random_state=1).fit(
        X, y, client=h)
    for est in m.estimators_:
        assert est.n_estimators == 5 and est.max_depth == 3 and est.min_samples_leaf == 4
        assert est.max_features == pytest.approx(1 / 3)  # paper default for regression
        assert max(t.get_depth() for t in est.estimators_) <= 3
    c = LocalLearning(task="classification", n_estimators=2).fit(X, (y > 5).astype(int), client=h)
    assert c.estimators_[0].max_features == "sqrt"


def test_local_ensemble_regression_is_the_average_of_local_forests() -> None:
    X, y, h = _offset_data()
    le = LocalEnsemble(**SMALL, random_state=0).fit(X, y, client=h)
    expected = np.mean([e.predict(X) for e in le.estimators_], axis=0)
    np.testing.assert_allclose(le.predict(X), expected)
    np.testing.assert_allclose(le.predict(X, client=h), expected)  # client ignored
    # the clients' offsets are averaged away: constant ~ mean offset 10
    assert abs(le.predict(X).mean() - 10.0) < 1.0
    sized = LocalEnsemble(**SMALL, weights="size", random_state=0)
    Xs, ys, hs = X[:150], y[:150], h[:150]  # sizes 60, 60, 30
    sized.fit(Xs, ys, client=hs)
    w = np.array([60, 60, 30]) / 150
    np.testing.assert_allclose(
        sized.predict(Xs), sum(w[k] * e.predict(Xs) for k, e in enumerate(sized.estimators_)))
    with pytest.raises(ValueError, match="weights"):
        LocalEnsemble(weights="median").fit(X, y, client=h)


def test_classifiers_handle_clients_missing_classes() -> None:
    X, y, h = _class_data()
    for cls in (LocalLearningClassifier, LocalEnsembleClassifier):
        m = cls(**SMALL, random_state=0).fit(X, y, client=h)
        np.testing.assert_array_equal(m.classes_, ["a", "b", "c"])
        p = m.predict_proba(X, client=h)
        assert p.shape == (160, 3)
        np.testing.assert_allclose(p.sum(axis=1), 1.0)
        assert set(m.predict(X, client=h)) <= {"a", "b", "c"}
    ll = LocalLearningClassifier(**SMALL, random_state=0).fit(X, y, client=h)
    p = ll.predict_proba(X, client=h)
    assert np.all(p[:80, 2] == 0) and np.all(p[80:, 0] == 0)  # a client never predicts
    assert ll.score(X, y, client=h) > 0.9                      # a class it never saw
    le = LocalEnsembleClassifier(**SMALL, random_state=0).fit(X, y, client=h)
    np.testing.assert_allclose(le.predict_proba(X), 0.5 * (
        ll._client_values(0, X) + ll._client_values(1, X)))


def test_regression_has_no_predict_proba_and_classification_needs_two_classes() -> None:
    X, y, h = _offset_data()
    m = LocalEnsembleRegressor(**SMALL).fit(X, y, client=h)
    with pytest.raises(AttributeError):
        m.predict_proba(X)
    with pytest.raises(ValueError, match="two classes"):
        LocalLearningClassifier().fit(X, np.zeros(X.shape[0]), client=h)
    with pytest.raises(ValueError, match="task"):
        LocalLearning(task="ranking").fit(X, y, client=h)
    with pytest.raises(AttributeError, match="not fitted"):
        LocalLearning().predict(X)


def test_estimators_are_sklearn_clonable_and_deterministic() -> None:
    X, y, h = _offset_data()
    for est in (LocalLearningRegressor(**SMALL, random_state=3),
                LocalEnsemble(**SMALL, random_state=3),
                CentralizedRF(**SMALL, use_client=True, random_state=3)):
        a = clone(est).fit(X, y, client=h).predict(X, client=h)
        b = clone(est).fit(X, y, client=h).predict(X, client=h)
        np.testing.assert_array_equal(a, b)
    assert "task" not in LocalLearningRegressor().get_params()
    with pytest.raises(TypeError):
        LocalLearning(50)  # type: ignore[misc]  # keyword-only


# ------------------------------------------------------------------------- centralized
def test_centralized_x_matches_sklearn_random_forest() -> None:
    X, y, h = _offset_data()
    ours = CentralizedRF(**SMALL, random_state=5).fit(X, y).predict(X)
    ref = RandomForestRegressor(**SMALL, max_features=1 / 3, random_state=5).fit(X, y).predict(X)
    np.testing.assert_allclose(ours, ref)


def test_centralized_xh_fisher_encodes_the_client_by_its_mean_outcome() -> None:
    X, y, h = _offset_data()
    m = CentralizedRF(**SMALL, use_client=True, random_state=0).fit(X, y, client=h)
    np.testing.assert_allclose(m.client_codes_[:, 0], [y[h == k].mean() for k in range(3)])
    Xa = m._fisher_transform(X[:3], np.array([2, 0, 9]))  # 9: unseen -> pooled mean
    np.testing.assert_allclose(Xa[:, -1], [y[h == 2].mean(), y[h == 0].mean(), y.mean()])
    x_only = CentralizedRF(**SMALL, random_state=0).fit(X, y)
    # the offsets are explained by H only
    assert m.score(X, y, client=h) > x_only.score(X, y) + 0.001
    assert np.mean((m.predict(X, client=h) - y) ** 2) < 0.5 * np.mean((x_only.predict(X) - y) ** 2)
    with pytest.raises(ValueError, match="client"):
        m.predict(X)


def test_centralized_classification_and_client_bootstrap() -> None:
    X, y, h = _class_data()
    m = CentralizedRF(task="classification", **SMALL, use_client=True,
                      bootstrap="client", random_state=0).fit(X, y, client=h)
    assert m.client_codes_.shape == (2, 3)  # one share per class (3 classes)
    p = m.predict_proba(X, client=h)
    assert p.shape == (160, 3)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    assert m.score(X, y, client=h) > 0.9
    assert len(m.estimators_) == SMALL["n_estimators"]
    Xr, yr, hr = _offset_data()
    r = CentralizedRF(**SMALL, bootstrap="client", random_state=0).fit(Xr, yr, client=hr)
    pooled = CentralizedRF(**SMALL, random_state=0).fit(Xr, yr, client=hr)
    assert abs(r.score(Xr, yr) - pooled.score(Xr, yr)) < 0.1
    for tree in r.estimators_:  # each client resampled its own 60 rows: 180 draws in all
        assert tree.tree_.weighted_n_node_samples[0] == pytest.approx(180)
    with pytest.raises(ValueError, match="bootstrap"):
        CentralizedRF(bootstrap="maybe").fit(Xr, yr)
    with pytest.raises(ValueError, match="client"):
        CentralizedRF(bootstrap="client").fit(Xr, yr)


def test_an_unknown_client_is_named_as_given_not_as_a_numpy_scalar() -> None:
    X, y, h = _offset_data()
    ll = LocalLearning(**SMALL, random_state=0).fit(X, y, client=h)
    with pytest.raises(ValueError) as exc:
        ll.predict(X[:2], client=np.array([0, 7]))
    assert str(exc.value) == "unknown client 7; known clients are [0, 1, 2]"
    named = LocalLearning(**SMALL, random_state=0).fit(X, y, client=np.array(["a", "b", "c"])[h])
    with pytest.raises(ValueError) as exc:
        named.predict(X[:1], client=np.array(["solo"]))
    assert str(exc.value) == "unknown client 'solo'; known clients are ['a', 'b', 'c']"
    with pytest.raises(ValueError) as exc:  # labels held as objects (a pandas column of text)
        named.predict(X[:1], client=np.array(["solo"], dtype=object))
    assert str(exc.value) == "unknown client 'solo'; known clients are ['a', 'b', 'c']"
