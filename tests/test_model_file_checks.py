"""A model file that does not agree with itself or is no model file is refused when it is
loaded, naming the file: a job's schema that disagrees with its forest, and a file that is not
text (an ONNX export, a pickle, a gzip'd model)."""

from __future__ import annotations

import gzip
import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from job_models import job_model_file, site_rows

from fedforest_secure import FedForestClassifier, FedForestRegressor, ForestModel


@pytest.fixture(scope="module")
def job_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A classification job's model on age (continuous), cp (categorical, 4 levels), chol."""
    return job_model_file(tmp_path_factory.mktemp("job"), "classification", profile="open",
                          n_estimators=2, max_depth=3)


def _categorical_split(d: dict[str, Any], feature: int, levels: list[int]) -> None:
    """Tree 0's root made a categorical split on ``feature`` sending ``levels`` left."""
    tree = d["trees"][0]
    tree["kind"][0], tree["feature"][0] = 2, feature
    tree["sets"]["0"] = levels


def _features(d: dict[str, Any]) -> list[dict[str, Any]]:
    feats: list[dict[str, Any]] = d["schema"]["features"]
    return feats


EDITS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "a feature lost": (lambda d: _features(d).pop(1),
                       "the schema has 2 features, the forest 3"),
    "features in another order": (
        lambda d: _features(d).reverse(),
        "the schema's features are chol, cp, age; the forest's (feature_names) are age, cp, "
        "chol: the trees index the features in that order"),
    "a feature renamed": (
        lambda d: _features(d)[2].__setitem__("name", "cholesterol"),
        "the schema's features are age, cp, cholesterol; the forest's (feature_names) are "
        "age, cp, chol: the trees index the features in that order"),
    "no feature names": (lambda d: d.pop("feature_names"),
                         "feature_names is missing: a model with a schema names its "
                         "features as the schema does (age, cp, chol)"),
    "not a mapping": (lambda d: d.__setitem__("schema", "oops"),
                      "invalid schema: a schema must be a mapping, got str"),
    "features null": (lambda d: d["schema"].__setitem__("features", None),
                      "invalid schema: features: "),
    "a regression target": (
        lambda d: d["schema"].__setitem__("target", {"name": "num", "kind": "regression",
                                                     "bounds": [0.0, 1.0]}),
        "the schema's target 'num' is a regression target, the forest a classification "
        "forest"),
    "other classes": (
        lambda d: d["schema"]["target"].__setitem__("classes", ["lo", "mid"]),
        "the schema's classes are 'lo', 'mid'; the forest's (classes) are 'lo', 'hi'"),
    "a categorical split on a continuous feature": (
        lambda d: _categorical_split(d, 2, [0]),
        "tree 0, node 0: a categorical split on 'chol', which the schema calls continuous"),
    "a level beyond the schema's": (
        lambda d: _categorical_split(d, 1, [0, 4]),
        "tree 0, node 0: level 4 of 'cp', which has 4 levels in the schema"),
}


@pytest.mark.parametrize("case", EDITS)
def test_a_schema_that_disagrees_with_the_forest_is_refused_naming_the_file(
        job_file: Path, tmp_path: Path, case: str) -> None:
    edit, said = EDITS[case]
    doc = json.loads(job_file.read_text())
    edit(doc)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    for load in (FedForestClassifier.load, ForestModel.load):
        with pytest.raises(ValueError) as info:
            load(path)
        assert str(info.value).startswith(f"{path}: {said}"), str(info.value)


def test_an_honest_jobs_model_with_a_categorical_split_loads_and_its_classes_sort(
        job_file: Path, tmp_path: Path) -> None:
    """The forest's classes in the schema's order ("lo", "hi"); the estimator sorts them."""
    doc = json.loads(job_file.read_text())
    _categorical_split(doc, 1, [0, 3])
    path = tmp_path / "cat.json"
    path.write_text(json.dumps(doc))
    est = FedForestClassifier.load(path)
    assert list(est.classes_) == ["hi", "lo"] and est.model_.schema == doc["schema"]
    rows = site_rows("classification")[0].head(20)
    assert est.predict_proba(rows).shape == (20, 2)
    assert ForestModel.load(path).to_json() == ForestModel.from_dict(doc).to_json()


def _not_text(tmp_path: Path, job_file: Path) -> dict[str, Path]:
    est = FedForestClassifier.load(job_file)
    files = {"model.pkl": pickle.dumps(est), "model.json.gz": gzip.compress(
        job_file.read_bytes()), "latin1.json": b'{"format": "caf\xe9"}',
        "model.onnx": b"\x08\x07\x12\x07skl2onnx\x1a\x051.0\xc6\x00"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return {name: tmp_path / name for name in files}


@pytest.mark.parametrize("load", [FedForestClassifier.load, FedForestRegressor.load,
                                  ForestModel.load])
def test_a_file_that_is_not_text_is_named_as_no_model_file(
        job_file: Path, tmp_path: Path, load: Callable[[Path], Any]) -> None:
    for name, path in _not_text(tmp_path, job_file).items():
        with pytest.raises(ValueError) as info:
            load(path)
        assert re.fullmatch(
            re.escape(f"{path}: not a model file (not UTF-8 text: ") + r".+ at byte \d+"
            + re.escape("); a model file is the JSON text that a job's client, fedforest "
                        "model download or an estimator's save writes"),
            str(info.value)), (name, str(info.value))
        assert not isinstance(info.value, UnicodeDecodeError)


def test_forest_model_load_names_the_file_of_every_refusal(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text("{")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: not a model file \("
                                         r"Expecting property name"):
        ForestModel.load(path)
    path.write_text('{"format": "other"}')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: not a model file "
                                         r"\(fedforest-secure/model/v1 or "):
        ForestModel.load(path)
    with pytest.raises(ValueError,
                       match=rf"^cannot read model file {re.escape(str(tmp_path / 'no'))}: "):
        ForestModel.load(tmp_path / "no")
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    FedForestRegressor(n_estimators=2, max_depth=2).fit(X, X[:, 0]).save(path)
    assert ForestModel.load(path).task == "regression"
