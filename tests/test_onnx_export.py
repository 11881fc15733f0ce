"""Tests for fedforest_secure._onnx_export: the estimators' ``to_onnx()`` model, run by
onnxruntime in double precision, predicts what the federated forest predicts on float64
inputs (values that are not float32 numbers, values at and next to the thresholds, NaN)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx_labels import assert_labels_match

from fedforest_secure import FedForestClassifier, FedForestRegressor

rt = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


def _data(task: str, n: int, missing: bool, seed: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    signal = X[:, 0] + np.sin(2 * X[:, 1]) - 0.5 * X[:, 2]
    y = 50 + signal + 0.3 * rng.normal(size=n) if task == "regression" else \
        np.digitize(signal, [-0.5, 0.6])
    if missing:
        X[rng.random(X.shape) < 0.15] = np.nan
    return X, y, np.arange(n) % 3


def _fit(task: str, missing: bool, **kw: Any) -> tuple[Any, np.ndarray]:
    X, y, h = _data(task, 500, missing, 0)
    cls = FedForestRegressor if task == "regression" else FedForestClassifier
    est = cls(n_estimators=8, max_depth=6, random_state=0, **kw).fit(X, y, client=h)
    Xt, _, _ = _data(task, 400, missing, 1)
    return est, np.vstack([Xt, _at_thresholds(est, Xt[0])])


def _at_thresholds(est: Any, row: np.ndarray) -> np.ndarray:
    """Rows with one feature set to a split threshold, and to the float64 numbers right below
    and above it: float32 comparisons route some of them the wrong way."""
    out = []
    for t in est.model_.trees:
        for f, thr in zip(t.feature[t.kind == 1], t.threshold[t.kind == 1], strict=True):
            if not np.isfinite(thr):
                continue
            for v in (np.nextafter(thr, -np.inf), thr, np.nextafter(thr, np.inf)):
                r = np.nan_to_num(row.copy())
                r[f] = v
                out.append(r)
    return np.array(out)


def _run(onx: Any, X: np.ndarray) -> dict[str, np.ndarray]:
    sess = rt.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {"X": X}), strict=True))


@pytest.mark.parametrize("profile", ["open", "secure-dp"])  # secure-dp: y_offset != 0
@pytest.mark.parametrize("missing", [False, True])
def test_onnx_regressor_predicts_what_the_federated_forest_predicts(missing: bool,
                                                                   profile: str) -> None:
    est, Xt = _fit("regression", missing, profile=profile)
    assert est.y_offset_ != 0  # regression targets are centred: the export adds it back
    assert Xt.dtype == np.float64 and (Xt.astype(np.float32) != Xt).any()
    assert np.isnan(Xt).any() == missing
    out = _run(est.to_onnx(), Xt)
    assert out["variable"].dtype == np.float64 and out["variable"].shape == (Xt.shape[0], 1)
    np.testing.assert_allclose(out["variable"][:, 0], est.predict(Xt), rtol=0, atol=1e-9)


@pytest.mark.parametrize("missing", [False, True])
def test_onnx_classifier_predicts_what_the_federated_forest_predicts(missing: bool) -> None:
    est, Xt = _fit("classification", missing)
    out = _run(est.to_onnx(), Xt)
    np.testing.assert_allclose(out["probabilities"], est.predict_proba(Xt), rtol=0, atol=1e-12)
    assert_labels_match(out["label"], est.predict_proba(Xt), est.classes_, est.predict(Xt))


def test_onnx_missing_values_follow_the_learned_direction() -> None:
    """A row of NaNs reaches, in every tree, the leaf the missing-value directions lead to;
    with every direction flipped, the ONNX model predicts something else."""
    est, _ = _fit("regression", True)
    nan_row = np.full((1, 5), np.nan)
    out = _run(est.to_onnx(), nan_row)
    np.testing.assert_allclose(out["variable"][:, 0], est.predict(nan_row), rtol=0, atol=1e-9)
    onx = est.to_onnx()
    forest = onx.graph.node[0]
    tracks = next(a for a in forest.attribute if a.name == "nodes_missing_value_tracks_true")
    flipped = [1 - v for v in tracks.ints]
    del tracks.ints[:]
    tracks.ints.extend(flipped)
    assert abs(_run(onx, nan_row)["variable"][0, 0] - est.predict(nan_row)[0]) > 1e-6


def test_onnx_classifier_with_string_labels_and_a_file(tmp_path: Path) -> None:
    X, y, h = _data("classification", 300, False, 2)
    labels = np.array(["low", "mid", "high"])[y]
    est = FedForestClassifier(n_estimators=4, max_depth=4, random_state=0).fit(X, labels,
                                                                              client=h)
    path = tmp_path / "forest.onnx"
    est.to_onnx(path)
    out = _run(onnx.load(str(path)), X)
    assert_labels_match(out["label"], est.predict_proba(X), est.classes_, est.predict(X))
    np.testing.assert_allclose(out["probabilities"], est.predict_proba(X), rtol=0, atol=1e-12)


def test_onnx_single_leaf_trees_predict_the_leaf_value() -> None:
    X, y, h = _data("regression", 60, False, 3)
    est = FedForestRegressor(n_estimators=3, max_depth=6, min_samples_leaf=40,
                             random_state=0).fit(X, y, client=h)
    assert all(t.n_nodes == 1 for t in est.model_.trees)
    out = _run(est.to_onnx(), X[:5])
    np.testing.assert_allclose(out["variable"][:, 0], est.predict(X[:5]), rtol=0, atol=1e-9)


def test_to_onnx_refuses_client_splits() -> None:
    X, y, h = _data("regression", 500, False, 0)
    est = FedForestRegressor(n_estimators=2, max_depth=2, max_features=None,
                             split_on_client=True, random_state=0).fit(X, y + 5 * h, client=h)
    assert est.model_.uses_client
    with pytest.raises(ValueError, match="client"):
        est.to_onnx()


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_to_onnx_refuses_a_split_on_a_feature_the_schema_calls_categorical(
        task: str, tmp_path: Path) -> None:
    """A DP job's random splits cut the categorical cp at its level codes: the ONNX model
    would compare the site's own values (levels "1", "2", "4", "x") with code thresholds, so
    it is refused, naming the feature. A job's forest that splits on its continuous features
    only exports."""
    import pandas as pd
    from job_models import job_model_file

    cls = FedForestRegressor if task == "regression" else FedForestClassifier
    est = cls.load(job_model_file(tmp_path, task, n_estimators=4, max_depth=3))
    assert any((t.feature[t.kind == 1] == 1).any() for t in est.model_.trees)
    with pytest.raises(ValueError, match="categorical feature 'cp'"):
        est.to_onnx()
    plain = cls.load(job_model_file(tmp_path, task, profile="open", by_chol=True,
                                    n_estimators=2, max_depth=1, max_features=None))
    assert all((t.feature[t.kind == 1] == 2).all() for t in plain.model_.trees)
    site = pd.DataFrame({"age": [30.0, 60.0], "cp": ["1", "x"], "chol": [150.0, 390.0]})
    out = _run(plain.to_onnx(), np.array([[30.0, 0.0, 150.0], [60.0, 3.0, 390.0]]))
    got = out["variable"][:, 0] if task == "regression" else out["label"]
    np.testing.assert_array_equal(got, plain.predict(site))


def test_unsigned_labels_beyond_int64_are_refused_naming_the_label() -> None:
    """ONNX holds integer labels as int64: a uint64 label of 2^63 or more is a ValueError
    with the remedy (fit refuses such labels before; this guards other callers)."""
    from fedforest_secure._onnx_export import _label_tensor_values

    with pytest.raises(ValueError, match=r"class label 9223372036854775813 does not fit ONNX's "
                                         r"int64 labels; map the classes to smaller integers "
                                         r"or to text"):
        _label_tensor_values(np.array([1, 2**63 + 5], dtype=np.uint64))
    assert _label_tensor_values(np.array([1, 2**63 - 1], dtype=np.uint64))[1] == [1, 2**63 - 1]


_EXPORT_PAST_A_SIZE_LIMIT = """\
import resource, sys
import numpy as np
from fedforest_secure import FedForestRegressor
rng = np.random.default_rng(0)
X = rng.normal(size=(400, 4)); y = X[:, 0] + rng.normal(size=400); h = np.arange(400) % 3
small = FedForestRegressor(n_estimators=1, max_depth=2, random_state=0).fit(X, y, client=h)
big = FedForestRegressor(n_estimators=8, max_depth=6, random_state=0).fit(X, y, client=h)
small.to_onnx(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
try:
    big.to_onnx(sys.argv[1])
except OSError as exc:
    print("refused:", exc)
"""


def test_an_export_that_fails_midway_keeps_the_onnx_file_there_was(tmp_path: Path) -> None:
    """A write cut short (here the file size limit, as a full disk does) leaves the model
    exported before whole: the export is written whole or not at all."""
    import subprocess
    import sys

    from fedforest_cli.sim_processes import child_env

    path = tmp_path / "model.onnx"
    done = subprocess.run([sys.executable, "-c", _EXPORT_PAST_A_SIZE_LIMIT, str(path)],
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    model = onnx.load(str(path))  # whole: the small forest's
    assert len(model.graph.node) >= 1 and path.stat().st_size < 4096
    assert done.stdout.startswith(f"refused: [Errno 27] cannot write {path}: "), done.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
