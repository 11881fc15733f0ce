"""An evaluation job scores models on the sites' rows encoded as the schema says, column by
column and class by class: a model that names its features or classes in another order is
refused when the job is created, as it would be scored on the wrong columns or with its
classes mixed up (an accuracy of 0.07 for 0.93)."""

from __future__ import annotations

import numpy as np
import pytest

from fedforest_secure import FedForestClassifier
from fedforest_secure.schema import Schema
from server_app.evaljob import EvaluationParams, evaluation_of
from server_app.settings import ConfigError

SCHEMA = {"features": [{"name": f"f{j}", "kind": "continuous", "bounds": [-5.0, 5.0]}
                       for j in range(3)],
          "target": {"name": "fruit", "kind": "classification",
                     "classes": ["zebra", "apple", "mango"]}}
FACTS = {"task": "classification", "n_features": 3, "n_classes": 3}


def _model(columns: list[str], labels: np.ndarray) -> str:
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.normal(size=(150, 3)), columns=columns)
    est = FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(
        X, labels[np.arange(150) % 3], client=np.arange(150) % 3)
    return est.model_.to_json()


def _job(model: str) -> dict:
    return evaluation_of("evaluate", EvaluationParams(models=["m.json"], model_texts=[model],
                                                       names=["m"]),
                         Schema.from_dict(SCHEMA), FACTS)


def test_a_model_whose_classes_or_columns_are_in_another_order_is_refused() -> None:
    sorted_classes = _model(["f0", "f1", "f2"], np.array(["zebra", "apple", "mango"]))
    with pytest.raises(ConfigError) as err:
        _job(sorted_classes)
    assert str(err.value) == (
        "evaluation: model 'm' predicts the classes apple, mango, zebra in that order; the "
        "schema lists the same labels as zebra, apple, mango: the sites count its probability "
        "columns in the schema's order, so each would be read as another class. Evaluate a "
        "model that lists the classes in the schema's order (a training job's model on this "
        "schema), or a schema listing them as apple, mango, zebra")
    reordered = _model(["f1", "f0", "f2"], np.array([0, 1, 2]))
    with pytest.raises(ConfigError, match=r"takes its features as f1, f0, f2; the schema's "
                                          r"are f0, f1, f2"):
        _job(reordered)


def test_models_in_the_schemas_order_or_on_its_class_codes_are_taken() -> None:
    assert _job(_model(["f0", "f1", "f2"], np.array([0, 1, 2])))["names"] == ["m"]


INT_SCHEMA = {"features": SCHEMA["features"],
              "target": {"name": "y", "kind": "classification", "classes": ["1", "0"]}}


def _int_job(model: str, classes: list[str]) -> dict:
    schema = {**INT_SCHEMA, "target": {**INT_SCHEMA["target"], "classes": classes}}
    return evaluation_of("evaluate", EvaluationParams(models=["m.json"], model_texts=[model],
                                                       names=["m"]),
                         Schema.from_dict(schema),
                         {"task": "classification", "n_features": 3, "n_classes": 2})


def test_integer_labels_in_another_order_than_the_schemas_are_refused_not_read_as_codes(
        ) -> None:
    # fitted on the raw labels 0/1 (classes [0, 1]) under a schema listing "1" before "0":
    # its column 0 is label 0, which the sites count as class index 1
    raw = _model(["f0", "f1", "f2"], np.array([0, 1, 0]))
    with pytest.raises(ConfigError, match=r"^evaluation: model 'm' predicts the classes 0, 1 "
                                          r"in that order; the schema lists the same labels "
                                          r"as 1, 0: .* or a schema listing them as 0, 1$"):
        _int_job(raw, ["1", "0"])
    assert _int_job(raw, ["0", "1"])["names"] == ["m"]


def test_a_model_naming_the_schemas_integer_labels_in_its_order_is_taken() -> None:
    from fedforest_secure.model import ForestModel
    raw = _model(["f0", "f1", "f2"], np.array([0, 1, 0]))
    job_model = ForestModel.from_json(raw)
    job_model.classes = ["1", "0"]  # as a training job on that schema names them
    assert _int_job(job_model.to_json(), ["1", "0"])["names"] == ["m"]
