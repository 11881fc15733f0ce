"""Tests for fedforest_secure.model: prediction, JSON round trips (bit for bit), formats."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedforest_secure import FedForestClassifier, FedForestRegressor, ForestModel
from fedforest_secure.errors import SchemaError
from fedforest_secure.model import Tree


def _data(seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(150, 4)) * np.array([1.0, 1e-7, 1e5, 1.0])  # awkward scales
    y = X[:, 0] / 3 + np.sin(X[:, 1] * 1e7) + 1e-5 * X[:, 2] + 0.1 * rng.normal(size=150)
    h = np.arange(150) % 3
    return X, y, h


@pytest.mark.parametrize("method", ["quantiles", "exact"])
def test_regressor_save_load_is_bit_for_bit(tmp_path: Path, method: str) -> None:
    X, y, h = _data()
    est = FedForestRegressor(n_estimators=4, max_depth=5, n_bins=16, method=method,
                             random_state=3).fit(X, y, client=h)
    path = tmp_path / "reg.json"
    est.save(path)
    back = FedForestRegressor.load(path)
    rng = np.random.default_rng(1)
    Xt = np.vstack([X, rng.normal(size=(200, 4)) * np.array([1.0, 1e-7, 1e5, 1.0])])
    assert back.predict(Xt).tobytes() == est.predict(Xt).tobytes()
    assert back.model_.digest() == est.model_.digest()
    assert back.get_params()["n_estimators"] == 4 and back.get_params()["method"] == method
    assert back.n_features_in_ == 4 and list(back.clients_) == [0, 1, 2]
    # thresholds survive exactly (repr precision)
    for a, b in zip(est.model_.trees, back.model_.trees, strict=True):
        assert a.threshold.tobytes() == b.threshold.tobytes()
        assert a.value.tobytes() == b.value.tobytes()
    # a second save of the loaded estimator is byte-identical
    path2 = tmp_path / "reg2.json"
    back.save(path2)
    assert json.loads(path2.read_text())["model"] == json.loads(path.read_text())["model"]


def test_classifier_save_load_is_bit_for_bit(tmp_path: Path) -> None:
    X, y, h = _data(2)
    labels = np.array(["low", "mid", "high"])[np.digitize(y, [-0.3, 0.4])]
    est = FedForestClassifier(n_estimators=5, max_depth=4, n_bins=8, criterion="entropy",
                              random_state=1).fit(X, labels, client=h)
    path = tmp_path / "clf.json"
    est.save(path)
    back = FedForestClassifier.load(path)
    assert back.predict_proba(X).tobytes() == est.predict_proba(X).tobytes()
    np.testing.assert_array_equal(back.predict(X), est.predict(X))
    np.testing.assert_array_equal(back.classes_, est.classes_)
    assert back.criterion == "entropy"
    with pytest.raises(ValueError):
        FedForestRegressor.load(path)  # a classifier file is not a regressor


def test_h_split_model_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    X = rng.normal(size=(180, 2))
    h = np.repeat(np.array(["a", "b", "c"]), 60)
    y = X[:, 0] + 8.0 * (h == "b")
    est = FedForestRegressor(n_estimators=2, max_depth=2, max_features=1.0, split_on_client=True,
                             random_state=0).fit(X, y, client=h)
    assert est.model_.uses_client
    est.save(tmp_path / "h.json")
    back = FedForestRegressor.load(tmp_path / "h.json")
    assert back.predict(X, client=h).tobytes() == est.predict(X, client=h).tobytes()
    assert back.model_.trees[0].sets == est.model_.trees[0].sets


def test_forest_model_json_round_trip_and_format() -> None:
    X, y, h = _data()
    est = FedForestRegressor(n_estimators=2, max_depth=3, random_state=0).fit(X, y, client=h)
    model = est.model_
    text = model.to_json()
    back = ForestModel.from_json(text)
    assert back.to_json() == text
    assert back.predict(X).tobytes() == model.predict(X).tobytes()
    doc = json.loads(text)
    assert doc["format"] == "fedforest-secure/model/v1"
    for bad in [json.dumps({**doc, "format": "fedforest-secure/model/v0"}),
                json.dumps({k: v for k, v in doc.items() if k != "format"}),
                json.dumps([doc]), "null", json.dumps("fedforest-secure/model/v1")]:
        with pytest.raises(ValueError):
            ForestModel.from_json(bad)
    with pytest.raises(ValueError):
        ForestModel.from_json("{not json")


def test_estimator_load_rejects_other_files(tmp_path: Path) -> None:
    X, y, h = _data()
    model = FedForestRegressor(n_estimators=1, max_depth=2).fit(X, y, client=h).model_
    p = tmp_path / "bare_model.json"
    model.save(p)
    with pytest.raises(ValueError):
        FedForestRegressor.load(p)  # a bare model file is not a saved estimator
    assert ForestModel.load(p).to_json() == model.to_json()


def _stump(kind: int, feature: int = 0, threshold: float = 0.0,
           sets: dict[int, list[int]] | None = None) -> Tree:
    return Tree(kind=np.array([kind, 0, 0]), feature=np.array([feature, -1, -1]),
                threshold=np.array([threshold, 0.0, 0.0]), left=np.array([1, -1, -1]),
                right=np.array([2, -1, -1]), value=np.array([[0.0], [1.0], [2.0]]),
                n=np.array([10.0, 4.0, 6.0]), sets=sets or {})


def test_tree_apply_kinds() -> None:
    X = np.array([[-1.0, 0], [0.0, 1], [0.5, 2], [3.0, 5]])
    num = _stump(1, 0, 0.0)
    np.testing.assert_array_equal(num.apply(X, None), [1, 1, 2, 2])  # x <= t goes left
    cat = _stump(2, 1, sets={0: [0, 2]})
    np.testing.assert_array_equal(cat.apply(X, None), [1, 2, 1, 2])  # unseen level 5: right
    cli = _stump(3, -1, sets={0: [1]})
    np.testing.assert_array_equal(cli.apply(X, np.array([0, 1, 2, 1])), [2, 1, 2, 1])
    with pytest.raises(ValueError, match="client"):
        cli.apply(X, None)
    assert num.depth == 1 and num.n_nodes == 3
    m = ForestModel(task="regression", n_features=2, n_classes=0, trees=[num, cat], n_clients=3)
    np.testing.assert_allclose(m.predict(X), [1.0, 1.5, 1.5, 2.0])
    m_cli = ForestModel(task="regression", n_features=2, n_classes=0, trees=[cli], n_clients=3)
    with pytest.raises(SchemaError):
        m_cli.predict(X, client=np.array([0, 1, 3, 1]))  # unknown client index
    with pytest.raises(SchemaError):
        m.predict(X[:, :1])
    with pytest.raises(SchemaError):
        m.predict(X, client=np.array([0, 1]))


def test_classification_model_predicts_argmax() -> None:
    t = Tree(kind=np.array([1, 0, 0]), feature=np.array([0, -1, -1]),
             threshold=np.array([0.0, 0, 0]), left=np.array([1, -1, -1]),
             right=np.array([2, -1, -1]),
             value=np.array([[0.5, 0.5, 0.0], [0.9, 0.1, 0.0], [0.1, 0.2, 0.7]]),
             n=np.array([10.0, 5, 5]))
    m = ForestModel(task="classification", n_features=1, n_classes=3, trees=[t])
    np.testing.assert_array_equal(m.predict(np.array([[-1.0], [1.0]])), [0, 2])
    back = ForestModel.from_json(m.to_json())
    assert back.predict_values(np.array([[1.0]])).tobytes() == \
        m.predict_values(np.array([[1.0]])).tobytes()


