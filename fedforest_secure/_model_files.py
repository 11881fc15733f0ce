"""A model file as it is loaded: its text, read with errors that name the file
(:func:`model_text`), and a job's schema checked against the forest it came with
(:func:`check_schema`): predict reads a table by the schema and indexes the features in the
order of ``feature_names``, so the two must agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._tree import NodeKind
from .errors import SchemaError

if TYPE_CHECKING:
    from .model import ForestModel

__all__ = ["check_schema", "model_document", "model_text", "not_text"]

#: what a model file is, for the message of a file that is none
WHAT_IT_IS = ("a model file is the JSON text that a job's client, fedforest model download or "
              "an estimator's save writes")


def not_text(path: str | Path, exc: UnicodeDecodeError) -> str:
    """The message for a model file that is not UTF-8 text (an ONNX export, a pickle, a
    gzip'd file)."""
    return (f"{path}: not a model file (not UTF-8 text: {exc.reason} at byte {exc.start}); "
            f"{WHAT_IT_IS}")


def model_text(path: str | Path) -> str:
    """The text of the model file ``path``.

    Raises
    ------
    ValueError
        The file cannot be read, or is not UTF-8 text; the message names the file.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read model file {path}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(not_text(path, exc)) from None


def model_document(path: str | Path) -> Any:
    """The JSON document of the model file ``path`` (:func:`model_text`, then parsed).

    Raises
    ------
    ValueError
        The file cannot be read, is not UTF-8 text or not JSON; the message names the file.
    """
    text = model_text(path)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path}: not a model file ({exc})") from None


def _listed(labels: list[object]) -> str:
    return ", ".join(map(repr, labels))


def check_schema(model: ForestModel) -> None:
    """Raise ValueError unless ``model.schema`` is a schema that agrees with the forest: its
    features are ``feature_names``, in that order; its target is of the forest's task, with
    the forest's classes (in any order: the estimators sort them); every categorical split
    is on a feature the schema calls categorical, and sends only its levels. A model
    without a schema passes."""
    from .schema import Schema

    if model.schema is None:
        return
    try:
        schema = Schema.from_dict(model.schema, stored=True)
    except SchemaError as exc:
        raise ValueError(str(exc)) from None
    names = schema.feature_names
    if schema.n_features != model.n_features:
        raise ValueError(f"the schema has {schema.n_features} features, the forest "
                         f"{model.n_features}")
    if model.feature_names is None:
        raise ValueError("feature_names is missing: a model with a schema names its features "
                         f"as the schema does ({', '.join(names)})")
    if model.feature_names != names:
        raise ValueError(f"the schema's features are {', '.join(names)}; the forest's "
                         f"(feature_names) are {', '.join(model.feature_names)}: the trees "
                         "index the features in that order")
    target = schema.target
    if target.kind != model.task:
        raise ValueError(f"the schema's target {target.name!r} is a {target.kind} target, the "
                         f"forest a {model.task} forest")
    if model.task == "classification":
        want = list(target.classes or [])
        got = model.classes
        if got is None:
            raise ValueError("classes is missing: a model with a schema has the schema's "
                             f"classes ({_listed(list(want))})")
        if not all(isinstance(c, str) for c in got) or sorted(got) != sorted(want):
            raise ValueError(f"the schema's classes are {_listed(list(want))}; the forest's "
                             f"(classes) are {_listed(list(got))}")
    kinds, levels = schema.feature_kinds, schema.n_levels
    for i, tree in enumerate(model.trees):
        for nd in np.flatnonzero(tree.kind == NodeKind.CATEGORICAL).tolist():
            f = int(tree.feature[nd])
            if kinds[f] != "categorical":
                raise ValueError(f"tree {i}, node {nd}: a categorical split on {names[f]!r}, "
                                 "which the schema calls continuous")
            top = max(tree.sets.get(nd) or [-1])
            if top >= levels[f]:
                raise ValueError(f"tree {i}, node {nd}: level {top} of {names[f]!r}, which has "
                                 f"{levels[f]} levels in the schema")
