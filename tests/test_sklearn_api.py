"""Tests for fedforest_secure._sklearn_api: per-tree arrays, importances and the export to a
fitted scikit-learn forest (and on through skl2onnx to onnxruntime).

scikit-learn and ONNX read X as float32, the federated forest compares float64 values: the
claims are made on inputs whose values are float32 numbers (``_f32``), where ``x <= t`` is the
same comparison for all three (skl2onnx shifts each float32 threshold so that
``float32(x) <= t'`` is scikit-learn's ``float32(x) <= t``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.inspection import permutation_importance

from fedforest_secure import FedForestClassifier, FedForestRegressor, load_profile


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32).astype(np.float64)


def _data(task: str, n: int = 500, missing: bool = False, seed: int = 0
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = _f32(rng.normal(size=(n, 5)))
    signal = X[:, 0] + np.sin(2 * X[:, 1]) - 0.5 * X[:, 2]
    y = signal + 0.3 * rng.normal(size=n) if task == "regression" else \
        np.digitize(signal, [-0.5, 0.6])  # three classes
    if missing:
        X[rng.random(X.shape) < 0.15] = np.nan
    return X, y, np.arange(n) % 3


def _fit(task: str, missing: bool = False, **kw: Any) -> tuple[Any, np.ndarray]:
    X, y, h = _data(task, missing=missing)
    cls = FedForestRegressor if task == "regression" else FedForestClassifier
    est = cls(n_estimators=8, max_depth=6, random_state=0, **kw).fit(X, y, client=h)
    Xt, _, _ = _data(task, n=400, missing=missing, seed=1)
    return est, Xt


@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("profile", ["open", "secure"])
def test_to_sklearn_predicts_what_the_federated_forest_predicts(missing: bool,
                                                                profile: str) -> None:
    reg, Xr = _fit("regression", missing, profile=profile)
    sk = reg.to_sklearn()
    assert type(sk).__name__ == "RandomForestRegressor" and len(sk.estimators_) == 8
    np.testing.assert_allclose(sk.predict(Xr), reg.predict(Xr), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(sk.apply(Xr), reg.apply(Xr))
    np.testing.assert_allclose(sk.feature_importances_, reg.feature_importances_, atol=1e-12)
    clf, Xc = _fit("classification", missing, profile=profile)
    skc = clf.to_sklearn()
    np.testing.assert_array_equal(skc.classes_, clf.classes_)
    np.testing.assert_array_equal(skc.predict(Xc), clf.predict(Xc))
    np.testing.assert_allclose(skc.predict_proba(Xc), clf.predict_proba(Xc), rtol=0, atol=1e-12)


def test_exported_forest_works_with_scikit_learn_tools() -> None:
    clf, Xc = _fit("classification")
    sk = clf.to_sklearn()
    _, y, _ = _data("classification", n=400, seed=1)
    res = permutation_importance(sk, Xc, y, n_repeats=3, random_state=0)
    assert res.importances_mean.argmax() in (0, 1)


def test_to_sklearn_refuses_client_splits() -> None:
    X, y, h = _data("regression")
    est = FedForestRegressor(n_estimators=2, max_depth=2, max_features=None,
                             split_on_client=True, random_state=0).fit(X, y + 5 * h, client=h)
    assert est.model_.uses_client
    with pytest.raises(ValueError, match="client"):
        est.to_sklearn()


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_onnx_round_trip_predicts_what_the_federated_forest_predicts(task: str) -> None:
    """to_sklearn() through skl2onnx and onnxruntime: every tree reaches the same leaf for
    every row (ONNX's decision_leaf output), so the classes are identical and the regression
    values, our float64 leaf values at those leaves, equal ours to 1e-9. onnxruntime's own
    TreeEnsembleRegressor output is float32 (it refuses double outputs): within float32
    rounding of ours."""
    import onnxruntime as rt
    from skl2onnx import to_onnx

    est, Xt = _fit(task)
    sk = est.to_sklearn()
    options = {id(sk): {"decision_leaf": True, **({"zipmap": False}
                                                   if task == "classification" else {})}}
    onx = to_onnx(sk, Xt[:1].astype(np.float32), options=options,
                  target_opset={"": 17, "ai.onnx.ml": 3})
    sess = rt.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    out = dict(zip([o.name for o in sess.get_outputs()],
                   sess.run(None, {sess.get_inputs()[0].name: Xt.astype(np.float32)}),
                   strict=True))
    leaves = out["decision_leaf"].reshape(Xt.shape[0], -1)
    np.testing.assert_array_equal(leaves, est.apply(Xt))
    if task == "regression":
        values = np.mean([t.tree_.value[leaves[:, i], 0, 0]
                          for i, t in enumerate(est.estimators_)], axis=0)
        np.testing.assert_allclose(values, est.predict(Xt), rtol=0, atol=1e-9)
        np.testing.assert_allclose(out["variable"].ravel(), est.predict(Xt), rtol=1e-5,
                                   atol=1e-5)
    else:
        np.testing.assert_array_equal(out["label"], est.predict(Xt))
        np.testing.assert_allclose(out["probabilities"], est.predict_proba(Xt), atol=1e-6)


def test_to_sklearn_predicts_the_same_on_the_float64_rows_it_was_trained_on() -> None:
    """The open profile's thresholds are data values (x <= t sends the value t left), whose
    float32 often rounds above them: scikit-learn reads X as float32, so the thresholds are
    exported as float32 numbers and the training rows themselves go the same way in both."""
    from sklearn.datasets import load_diabetes, load_wine

    X, y = load_diabetes(return_X_y=True)
    h = np.arange(len(y)) % 4
    reg = FedForestRegressor(n_estimators=10, max_depth=8, random_state=0).fit(X, y, client=h)
    np.testing.assert_allclose(reg.to_sklearn().predict(X), reg.predict(X), rtol=0, atol=1e-9)
    Xw, yw = load_wine(return_X_y=True)
    clf = FedForestClassifier(method="avgimp", n_estimators=10, max_depth=6,
                              random_state=3).fit(Xw, yw, client=np.arange(len(yw)) % 4)
    np.testing.assert_allclose(clf.to_sklearn().predict_proba(Xw), clf.predict_proba(Xw),
                               rtol=0, atol=1e-12)


def test_a_dp_forest_of_noisy_counts_exports_probabilities() -> None:
    """Under secure-dp (its default epsilon) the leaves hold noisy class counts (some negative)
    that the forest sums before it votes: scikit-learn averages per-tree probabilities, so
    each leaf is exported as its counts' proportions (clipped at 0), never as counts."""
    X, y, h = _data("classification")
    clf = FedForestClassifier(profile="secure-dp", n_estimators=8, max_depth=4,
                              random_state=3).fit(X, y, client=h)
    assert clf.model_.vote == "counts"
    p = clf.to_sklearn(hard_splits=True).predict_proba(X)
    assert p.min() >= 0.0 and p.max() <= 1.0
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("kind", ["dp", "abstention"])
def test_exported_node_counts_are_a_trees_counts(kind: str) -> None:
    """Under DP a leaf's count is noisy (below zero too), with abstention a leaf can count
    0 rows and children fewer than their parent: scikit-learn's feature_importances_ went
    negative, SHAP's TreeExplainer refused the export. Exported, every leaf counts at least
    one row and every inner node the sum of its children, the importances are the
    estimator's (>= 0) and the predictions stay the estimator's."""
    X, y, h = _data("regression", n=900)
    prof = load_profile("secure-dp", epsilon=0.3) if kind == "dp" else \
        load_profile("secure", abstain_below=6)
    reg = FedForestRegressor(n_estimators=6, max_depth=6, random_state=0,
                             profile=prof).fit(X, y, client=h)
    raw = np.concatenate([t.n[t.kind == 0] for t in reg.model_.trees])
    assert raw.min() < 1  # the model's own leaf counts: below one row somewhere
    sk = reg.to_sklearn()
    for est in sk.estimators_:
        tr = est.tree_
        inner = np.flatnonzero(tr.children_left >= 0)
        for counts in (tr.n_node_samples, tr.weighted_n_node_samples):
            assert counts.min() >= 1
            np.testing.assert_array_equal(counts[inner], counts[tr.children_left[inner]]
                                          + counts[tr.children_right[inner]])
    assert sk.feature_importances_.min() >= 0
    np.testing.assert_allclose(sk.feature_importances_, reg.feature_importances_, atol=1e-12)
    # the same predictions, on the rows no threshold shares a float32 number with (DP's
    # noise moves the thresholds: one may land beside a row's value)
    near = np.zeros(len(X), dtype=bool)
    for t in reg.model_.trees:
        for j, thr in zip(t.feature[t.kind == 1], t.threshold[t.kind == 1], strict=True):
            near |= X[:, j].astype(np.float32) == np.float32(thr)
    assert near.mean() < 0.05
    np.testing.assert_allclose(sk.predict(X)[~near], reg.predict(X)[~near], rtol=0, atol=1e-9)


def test_to_sklearn_keeps_the_secure_sketchs_cut_below_an_integer_value() -> None:
    """On integer-valued columns the secure sketch cuts just below a value (119.99999...
    below 120): rounded to the nearest float32 that cut is 120 itself, and the rows of 120
    would go left in scikit-learn. Such a cut goes out as the float32 number below 120, so
    every row goes the same way in both."""
    from fedforest_secure._sklearn_api import _float32_thresholds

    rng = np.random.default_rng(0)
    X = np.column_stack([rng.integers(20, 80, 600), rng.integers(90, 200, 600),
                         rng.integers(0, 4, 600)]).astype(float)
    y = X[:, 0] * 0.5 + (X[:, 1] > 130) * 10 + rng.normal(size=600)
    reg = FedForestRegressor(profile="secure", n_estimators=5, max_depth=6,
                             random_state=0).fit(X, y, client=np.arange(600) % 3)
    np.testing.assert_allclose(reg.to_sklearn().predict(X), reg.predict(X), rtol=0, atol=1e-9)
    cuts = _float32_thresholds(np.array([119.99999644677146, 120.0, 0.1, -0.044641636506989144]))
    assert cuts[0] < 120.0 and cuts[1] == 120.0  # 120 goes right of the first, left of itself
    assert cuts[2] == float(np.float32(0.1)) and cuts[3] == float(np.float32(-0.044641636506989144))


def _float32_range(a: np.float32) -> tuple[float, float]:
    """The least and the largest float64 value whose float32 number is ``a``."""
    x = float(a)
    lo = (x + float(np.nextafter(a, np.float32(-np.inf)))) / 2.0
    hi = (x + float(np.nextafter(a, np.float32(np.inf)))) / 2.0
    if np.float32(lo) != a:
        lo = float(np.nextafter(lo, np.inf))
    if np.float32(hi) != a:
        hi = float(np.nextafter(hi, -np.inf))
    return lo, hi


def _stump(t: float) -> Any:
    from fedforest_secure.model import Tree

    return Tree(kind=np.array([1, 0, 0]), feature=np.array([0, -1, -1]),
                threshold=np.array([t, 0.0, 0.0]), left=np.array([1, -1, -1]),
                right=np.array([2, -1, -1]), value=np.array([[0.0], [-1.0], [1.0]]),
                n=np.array([2.0, 1.0, 1.0]))


def test_to_sklearn_routes_every_value_near_a_threshold_the_forest_does_where_it_can() -> None:
    """Stumps at thresholds beside float32 numbers (ties, one float64 step away, large
    integers, a sketch's cut below 120), each probed with the values around it: a value
    whose float32 number is not the threshold's goes the same way in scikit-learn as in
    the forest; of the values that share the threshold's float32 number (which scikit-learn
    cannot tell apart) all go as in the forest where the threshold is the largest of them,
    the threshold itself goes left where it is a short decimal (a data value, even halfway
    between two float32 numbers as -99327204 is), else every float32 value goes as in the
    forest where the threshold is a float32 number or halfway between two, and 120 goes
    right of the cut just below it."""
    from fedforest_secure._sklearn_api import to_sklearn_forest

    def f32(x: float) -> np.float32:
        return np.float32(x)

    cases: list[tuple[float, str]] = []
    for a in map(f32, [0.3, 2.18, 13.6, -0.0446416, 120.0, 1.0, 2.0**24, 2.0**25 + 4,
                       -99327200.0, 99999996.0, 3.0e7 + 2, 1e-20, 12345.678]):
        up = float(np.nextafter(a, np.float32(np.inf)))
        down = float(np.nextafter(a, np.float32(-np.inf)))
        lo, hi = _float32_range(a)
        cases += [(hi, "all"), (float(a), "float32"), ((down + float(a)) / 2.0, "float32"),
                  ((float(a) + up) / 2.0, "float32"), (lo, ""),
                  (float(np.nextafter(float(a), -np.inf)), ""),
                  (float(np.nextafter(float(a), np.inf)), ""),
                  (float(np.nextafter(lo, np.inf)), ""), (float(np.nextafter(hi, -np.inf)), "")]
    cases += [(-99327204.0, ""), (16777219.0, ""), (99999999.0, ""), (12345678.91, ""),
              (0.35, ""), (119.99999644677146, "cut")]
    trees = [_stump(t) for t, _ in cases]
    sk = to_sklearn_forest(trees, "regression", 1)
    for (t, kind), tree, exported in zip(cases, trees, sk.estimators_, strict=True):
        a = f32(t)
        lo, hi = _float32_range(a)
        probes = np.array([t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf), float(a),
                           float(np.nextafter(a, np.float32(-np.inf))),
                           float(np.nextafter(a, np.float32(np.inf))), lo, hi,
                           np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf),
                           np.round(t) - 1, np.round(t), np.round(t) + 1, 120.0])
        ours = tree.apply(probes[:, None], None)
        theirs = exported.apply(probes[:, None].astype(np.float32))
        other = probes.astype(np.float32) != a
        np.testing.assert_array_equal(theirs[other], ours[other], err_msg=f"threshold {t!r}")
        if kind == "all":
            np.testing.assert_array_equal(theirs, ours, err_msg=f"threshold {t!r}")
        short = float(f"{t:.12g}") == t  # a data value, which goes left: first of all
        if kind == "float32" and not short:  # the float32 numbers among the probes
            f32s = probes == probes.astype(np.float32)
            np.testing.assert_array_equal(theirs[f32s], ours[f32s], err_msg=f"threshold {t!r}")
        if short:
            assert theirs[0] == ours[0] == 1, f"threshold {t!r}"
        if kind == "cut":
            assert theirs[-1] == ours[-1] == 2  # 120 goes right


def test_to_sklearn_predicts_the_same_on_integer_columns_beyond_float32s_integers() -> None:
    """Prices in cents between 2 x 10^7 and 10^8 (whole numbers that float32 rounds to a
    multiple of 2, 4 or 8): the open profile's thresholds are such numbers, and the rows
    equal to one went right in scikit-learn (52 of 750 held-out rows got other
    probabilities). Training and held-out rows now go the same way, as on space_ga."""
    rng = np.random.default_rng(0)
    levels = 20_000_000 + rng.integers(0, 80_000_000, 400)
    price = levels[rng.integers(0, 400, 3000)]
    X = np.column_stack([price, rng.normal(size=3000)]).astype(float)
    y = (price > 60_000_000).astype(int) ^ (rng.random(3000) < 0.1)
    h = rng.integers(0, 3, 3000)
    clf = FedForestClassifier(n_estimators=20, random_state=0).fit(X[:2250], y[:2250],
                                                                   client=h[:2250])
    np.testing.assert_allclose(clf.to_sklearn().predict_proba(X), clf.predict_proba(X),
                               rtol=0, atol=1e-12)
    from fedforest_secure.errors import FedForestError
    from fedforest_secure.experiments import loaders

    try:
        ds = loaders.load_dataset("space_ga")
    except FedForestError:
        pytest.skip("shared data directory (../shared/data or $FEDFOREST_DATA_DIR) is missing")
    reg = FedForestRegressor(n_estimators=10, random_state=1).fit(
        ds.X, ds.y, client=np.random.default_rng(0).integers(0, 4, ds.y.size))
    np.testing.assert_allclose(reg.to_sklearn().predict(ds.X), reg.predict(ds.X), rtol=0,
                               atol=1e-9)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_to_sklearn_refuses_a_split_on_a_feature_the_schema_calls_categorical(
        task: str, tmp_path: Path) -> None:
    """A DP job's random splits cut the categorical cp at its level codes, which scikit-learn
    would compare with the site's own values: refused, naming the feature (with hard_splits
    too)."""
    import pandas as pd
    from job_models import job_model_file

    cls = FedForestRegressor if task == "regression" else FedForestClassifier
    est = cls.load(job_model_file(tmp_path, task, n_estimators=4, max_depth=3))
    assert any((t.feature[t.kind == 1] == 1).any() for t in est.model_.trees)
    with pytest.raises(ValueError, match="categorical feature 'cp'"):
        est.to_sklearn(hard_splits=True)
    plain = cls.load(job_model_file(tmp_path, task, profile="open", by_chol=True,
                                    n_estimators=2, max_depth=1, max_features=None))
    assert all((t.feature[t.kind == 1] == 2).all() for t in plain.model_.trees)
    site = pd.DataFrame({"age": [30.0, 60.0], "cp": ["1", "x"], "chol": [150.0, 390.0]})
    codes = site.assign(cp=[0.0, 3.0])
    export = plain.to_sklearn()
    np.testing.assert_array_equal(export.apply(codes), plain.apply(site))
    if task == "classification":
        np.testing.assert_array_equal(export.predict(codes), plain.predict(site))
    else:  # the same leaves; the export adds y_offset_ to each tree's values, then averages
        np.testing.assert_allclose(export.predict(codes), plain.predict(site), rtol=1e-15,
                                   atol=0)


def test_a_trees_apply_checks_its_input_as_the_forests_apply_does() -> None:
    """``estimators_[i].apply`` takes a DataFrame's columns by name (any order; a missing or
    unknown column refused) and an array of the fit's width; it took columns by position,
    extra columns silently, and a narrow array failed with a bare IndexError."""
    import pandas as pd

    from fedforest_secure._sklearn_api import FederatedTree
    from fedforest_secure.errors import SchemaError

    X, y, h = _data("classification")
    df = pd.DataFrame(X, columns=["a", "b", "c", "d", "e"])
    est = FedForestClassifier(n_estimators=3, max_depth=4, random_state=0).fit(df, y, client=h)
    tree = est.estimators_[1]
    np.testing.assert_array_equal(tree.apply(df[["e", "d", "c", "b", "a"]]), est.apply(df)[:, 1])
    with pytest.raises(SchemaError, match=r"unknown column 'extra'"):
        tree.apply(df.assign(extra=0.0))
    with pytest.raises(SchemaError, match=r"missing column 'a'"):
        tree.apply(df.drop(columns="a"))
    plain = FedForestClassifier(n_estimators=3, max_depth=4, random_state=0).fit(X, y, client=h)
    one = plain.estimators_[0]
    np.testing.assert_array_equal(one.apply(X), plain.apply(X)[:, 0])
    bare = FederatedTree(plain.model_.trees[0], 5)  # without the estimator: the width only
    np.testing.assert_array_equal(bare.apply(X), one.apply(X))
    for bad in (X[:, :3], np.hstack([X, X[:, :1]])):
        for t in (one, bare):
            with pytest.raises(ValueError, match=r"X has \d features, but .* expecting 5"):
                t.apply(bad)


def test_the_scikit_learn_view_takes_a_leaf_by_its_kind_whatever_its_child_entries() -> None:
    """A tree made in code (not checked as a model file is) whose leaf holds the root as its
    left child: the view gives that leaf no children, and its counts are the tree's."""
    import signal

    from fedforest_secure._sklearn_api import tree_arrays
    from fedforest_secure._tree import Tree

    tree = Tree(kind=np.array([1, 0, 0]), feature=np.array([0, -1, -1]),
                threshold=np.array([0.5, 0.0, 0.0]), left=np.array([1, 0, -1]),
                right=np.array([2, -1, -1]), value=np.array([[0.0], [1.0], [2.0]]),
                n=np.array([5.0, -2.0, 3.0]))

    def _stuck(*_: object) -> None:
        raise AssertionError("tree_arrays did not return within 20 s")

    old = signal.signal(signal.SIGALRM, _stuck)
    signal.alarm(20)
    try:
        arrays = tree_arrays(tree)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert arrays.children_left.tolist() == [1, -1, -1]
    assert arrays.children_right.tolist() == [2, -1, -1]
    assert arrays.weighted_n_node_samples.tolist() == [4.0, 1.0, 3.0]
