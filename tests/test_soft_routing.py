"""Soft routing at prediction (``fedforest_secure._soft_routing``): a DP random-split
classifier shares a row within ``w`` of the rows (in the released marginal CDF) of a split's
threshold between both children. Post-processing of the released forest: the model file
carries the width and the CDF, a file with them is format v3, and the ONNX export computes the
same probabilities."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import pytest
from engine_driver import stump
from onnx_labels import assert_labels_match

from fedforest_secure import FedForestClassifier, FedForestRegressor, load_profile
from fedforest_secure import model as model_module
from fedforest_secure._soft_routing import SoftRouting
from fedforest_secure._tree import NodeKind
from fedforest_secure.model import FORMAT, FORMAT_ROUTED, ForestModel
from fedforest_secure.privacy import allocation


def _uniform(d: int, nb: int = 4, lo: float = 0.0, hi: float = 1.0) -> SoftRouting:
    """Routing whose CDF is uniform on [lo, hi] for every feature: F(x) = (x - lo) / (hi - lo)."""
    return SoftRouting(0.1, np.tile([lo, hi], (d, 1)), np.tile(np.linspace(0, 1, nb + 1), (d, 1)))


def _stump_model(routing: SoftRouting | None, missing_left: bool = True) -> ForestModel:
    """One tree, x0 <= 0.5: left leaf class 0, right leaf class 1."""
    tb = stump()
    tb.value[1], tb.value[2] = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    tb.value[0] = np.array([0.5, 0.5])
    tb.missing_left[0] = missing_left
    return ForestModel(task="classification", n_features=2, n_classes=2, trees=[tb.build()],
                       routing=routing)


def test_a_row_within_the_width_of_the_threshold_is_shared_in_proportion() -> None:
    """F uniform on [0, 1], w = 0.1, threshold 0.5: p(left) = clip(1/2 + (0.5 - x) / 0.2)."""
    model = _stump_model(_uniform(2))
    X = np.array([[0.0, 0.0], [0.39, 0.0], [0.45, 0.0], [0.5, 0.0], [0.58, 0.0], [0.7, 0.0]])
    p_left = model.values_of(X)[:, 0]
    np.testing.assert_allclose(p_left, [1.0, 1.0, 0.75, 0.5, 0.1, 0.0], atol=1e-12)
    hard = _stump_model(None).values_of(X)[:, 0]
    np.testing.assert_array_equal(hard, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0])


def test_the_width_is_measured_in_the_cdf_not_in_the_feature_units() -> None:
    """Feature 0 on [0, 0.3] in bins of 0.1 with CDF 0, 0.5, 0.55, 1 at their edges, threshold
    0.1 (F = 0.5): x = 0.08 (F = 0.4) goes left with probability 1/2 + 0.1 / 0.2 = 1, and
    x = 0.19 (F = 0.545) with 1/2 - 0.045 / 0.2 = 0.275. Uniform on the range instead, the
    first would be 1/2 + (1/3 - 0.08 / 0.3) / 0.2 = 0.833."""
    tb = stump()
    tb.threshold[0] = 0.1
    tb.value[1], tb.value[2] = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    routing = SoftRouting(0.1, np.array([[0.0, 0.3], [0.0, 1.0]]),
                          np.array([[0.0, 0.5, 0.55, 1.0], [0.0, 1 / 3, 2 / 3, 1.0]]))
    model = ForestModel(task="classification", n_features=2, n_classes=2, trees=[tb.build()],
                        routing=routing)
    p = model.values_of(np.array([[0.08, 0.0], [0.19, 0.0]]))[:, 0]
    np.testing.assert_allclose(p, [1.0, 0.275], atol=1e-12)


def test_rows_shared_at_two_depths_reach_each_leaf_with_the_product_of_their_shares() -> None:
    """Root x0 <= 0.5 with a leaf on its left (node 1) and, on its right, x1 <= 0.3 with two
    leaves (nodes 3 and 4), every node of another class; F uniform on [0, 1], w = 0.1. A row
    reaches leaf 1 with s0, leaf 3 with (1 - s0) s1 and leaf 4 with (1 - s0)(1 - s1), where
    s = clip(1/2 + (t - x) / 0.2); a missing x1 goes right (missing_left False)."""
    tb = stump()
    inner, low, high = tb.right[0], tb.add(), tb.add()
    tb.left[inner], tb.right[inner] = low, high
    tb.kind[inner], tb.feature[inner], tb.threshold[inner] = NodeKind.NUMERIC, 1, 0.3
    tb.missing_left[inner] = False
    tb.value[1], tb.value[low], tb.value[high] = [1.0, 0.0], [0.0, 1.0], [0.5, 0.5]
    model = ForestModel(task="classification", n_features=2, n_classes=2, trees=[tb.build()],
                        routing=_uniform(2))
    X = np.array([[0.45, 0.25], [0.55, 0.35], [0.0, 0.9], [0.9, 0.0], [0.52, np.nan],
                  [0.5, 0.3]])

    def share(t: float, x: float) -> float:
        return float(np.clip(0.5 + (t - x) / 0.2, 0.0, 1.0))

    want = []
    for x0, x1 in X:
        s0, s1 = share(0.5, x0), (0.0 if np.isnan(x1) else share(0.3, x1))
        leaves = [s0, (1 - s0) * s1, (1 - s0) * (1 - s1)]
        want.append(leaves[0] * np.array([1.0, 0.0]) + leaves[1] * np.array([0.0, 1.0])
                    + leaves[2] * np.array([0.5, 0.5]))
    np.testing.assert_allclose(model.values_of(X), want, atol=1e-12)


def test_rows_predicted_in_blocks_get_the_values_they_get_all_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = _dp_classifier(8.0, True).model_
    X = _rows(100, 3)
    X[np.random.default_rng(4).random(X.shape) < 0.1] = np.nan
    whole = model.values_of(X)
    monkeypatch.setattr(model_module, "ROUTED_ROWS", 7)  # 15 blocks, the last of 2 rows
    np.testing.assert_array_equal(model.values_of(X), whole)


def test_a_missing_value_goes_where_the_split_sends_it() -> None:
    X = np.array([[np.nan, 0.0]])
    assert _stump_model(_uniform(2), missing_left=True).values_of(X)[0, 0] == 1.0
    assert _stump_model(_uniform(2), missing_left=False).values_of(X)[0, 0] == 0.0


def test_a_value_outside_the_public_bounds_takes_the_cdf_at_its_end() -> None:
    model = _stump_model(_uniform(2))
    np.testing.assert_array_equal(model.values_of(np.array([[-1e9, 0.0], [1e9, 0.0]]))[:, 0],
                                  [1.0, 0.0])


def test_a_narrow_width_routes_as_the_hard_splits_do() -> None:
    est = _dp_classifier(8.0)
    X = _rows(300, 7)
    routing = est.model_.routing
    assert routing is not None
    narrow = dataclasses.replace(est.model_, routing=SoftRouting(1e-9, routing.bounds,
                                                                 routing.cdf))
    hard = dataclasses.replace(est.model_, routing=None)
    np.testing.assert_allclose(narrow.values_of(X), hard.values_of(X), atol=1e-12)
    assert not np.allclose(est.model_.values_of(X), hard.values_of(X))


@pytest.mark.parametrize("bad", [
    {"width": 0.0}, {"width": 1.5}, {"cdf": np.array([[0.0, 0.6, 0.4, 1.0]] * 2)},
    {"bounds": np.array([[1.0, 0.0]] * 2)}, {"bounds": np.zeros((3, 2))},
    {"cdf": np.array([[0.0, np.nan, 1.0]] * 2)}])
def test_a_malformed_routing_is_refused(bad: dict[str, object]) -> None:
    good = {"width": 0.1, "bounds": np.array([[0.0, 1.0]] * 2),
            "cdf": np.array([[0.0, 0.5, 1.0]] * 2)}
    with pytest.raises(ValueError):
        SoftRouting(**{**good, **bad})  # type: ignore[arg-type]


def test_routing_refuses_a_forest_with_a_categorical_split_or_another_width() -> None:
    tb = stump()
    tb.kind[0] = NodeKind.CATEGORICAL
    tb.sets[0] = [0]
    with pytest.raises(ValueError, match="numeric splits only"):
        ForestModel(task="classification", n_features=2, n_classes=2, trees=[tb.build()],
                    routing=_uniform(2))
    with pytest.raises(ValueError, match="routing has 3 features"):
        _stump_model(_uniform(3))


def _rows(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.exp(0.8 * rng.normal(size=(n, 6)))  # skewed features, as the DP rule expects


def _dp_classifier(epsilon: float, missing: bool = False) -> FedForestClassifier:
    return _fit_dp_classifier(epsilon, missing)


@functools.cache  # one fit per setting and test process: the tests only read the forest
def _fit_dp_classifier(epsilon: float, missing: bool) -> FedForestClassifier:
    X = _rows(400, 0)
    y = (np.log(X[:, 0]) + np.log(X[:, 1]) > 0).astype(int) + (np.log(X[:, 2]) > 1)
    if missing:
        X[np.random.default_rng(1).random(X.shape) < 0.1] = np.nan
    return FedForestClassifier(profile=load_profile("secure-dp", epsilon=epsilon),
                               random_state=0).fit(X, y, client=np.arange(400) % 4)


@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_a_dp_random_split_classifier_carries_the_released_cdf_and_the_rule_width(
        epsilon: float) -> None:
    est = _dp_classifier(epsilon)
    routing = est.model_.routing
    assert routing is not None and routing.width == allocation.SOFT_ROUTING_WIDTH > 0
    assert routing.cdf.shape[0] == 6 and routing.cdf.shape[1] >= 2
    np.testing.assert_allclose(routing.cdf[:, [0, -1]], [[0.0, 1.0]] * 6)
    assert (np.diff(routing.cdf, axis=1) > 0).all()  # the floor keeps it increasing
    # the bounds are the forest's public bounds, the ones its thresholds lie in
    lo, hi = routing.bounds[:, 0], routing.bounds[:, 1]
    for t in est.model_.trees:
        inner = t.kind == NodeKind.NUMERIC
        f = t.feature[inner]
        assert ((t.threshold[inner] >= lo[f]) & (t.threshold[inner] <= hi[f])).all()


def test_forests_without_dp_random_splits_route_hard() -> None:
    X, y = _rows(300, 3), np.arange(300) % 2
    assert FedForestClassifier(profile="secure", n_estimators=4, max_depth=3,
                               random_state=0).fit(X, y, client=np.arange(300) % 3
                                                   ).model_.routing is None
    reg = FedForestRegressor(profile=load_profile("secure-dp", epsilon=8.0), random_state=0)
    assert reg.fit(X, X[:, 0], client=np.arange(300) % 3).model_.routing is None


def test_the_model_file_keeps_the_routing_and_is_format_v3(tmp_path: Path) -> None:
    est = _dp_classifier(8.0)
    path = tmp_path / "model.json"
    est.save(path)
    raw = json.loads(path.read_text())
    assert raw["format"] == FORMAT_ROUTED and raw["routing"]["width"] == est.model_.routing.width
    loaded = FedForestClassifier.load(path)
    X = _rows(200, 9)
    np.testing.assert_array_equal(loaded.predict_proba(X), est.predict_proba(X))
    hard = dataclasses.replace(est.model_, routing=None)
    assert json.loads(hard.to_json())["format"] == FORMAT and "routing" not in hard.to_dict()


def test_to_sklearn_refuses_a_soft_routed_forest_unless_hard_splits_are_asked() -> None:
    est = _dp_classifier(8.0)
    with pytest.raises(ValueError, match="soft routing"):
        est.to_sklearn()
    sk = est.to_sklearn(hard_splits=True)
    X = _rows(200, 5).astype(np.float32).astype(np.float64)
    hard = dataclasses.replace(est.model_, routing=None)
    np.testing.assert_allclose(sk.predict_proba(X), hard.values_of(X), atol=1e-12)


@pytest.mark.parametrize("epsilon,missing", [(8.0, False), (8.0, True), (1.0, True)])
def test_onnx_of_a_soft_routed_forest_predicts_its_probabilities(epsilon: float,
                                                                 missing: bool) -> None:
    pytest.importorskip("onnx")
    rt = pytest.importorskip("onnxruntime")
    est = _dp_classifier(epsilon, missing)
    X = _rows(300, 11)
    X[0, :] = np.nan
    X[1, 0], X[2, 1], X[3, 2] = -1e9, 1e9, 0.0
    t = est.model_.trees[0]
    X[4, int(t.feature[0])] = t.threshold[0]  # a row at a threshold: half to each side
    if missing:
        X[np.random.default_rng(2).random(X.shape) < 0.1] = np.nan
    sess = rt.InferenceSession(est.to_onnx().SerializeToString(),
                               providers=["CPUExecutionProvider"])
    label, proba = sess.run(None, {"X": X})
    np.testing.assert_allclose(proba, est.predict_proba(X), rtol=0, atol=1e-12)
    assert_labels_match(label, est.predict_proba(X), est.classes_, est.predict(X))
