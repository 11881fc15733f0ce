"""The trained forest: one JSON file format for every model, and prediction on tables.

A model file is what the server stores at the end of a job, what a site downloads (and its
client writes to ``--out``), and what :meth:`FedForestClassifier.save` /
:meth:`FedForestRegressor.save` write; :meth:`ForestModel.load` and the estimators' ``load``
read any of them. Besides the trees it carries what prediction on a site's table needs:

* ``feature_names`` and the ``schema`` (kinds, categorical levels, public bounds, target):
  :meth:`ForestModel.predict_values` on a DataFrame (or any table with named columns) takes the
  columns by name, in any order, and refuses a missing one; a categorical column holds its
  levels as labels (``"M"``, ``2``), as in the site's CSV file; the table's other columns
  (target, client column, columns the schema does not name) are left, as
  :meth:`Schema.read_csv` leaves them (a model without a schema refuses an unknown column);
* ``classes``: the class labels, in the order of the probability columns;
* ``clients``: the site labels in index order (a forest that splits on the site indicator);
* ``y_offset``: added to a regression forest's predictions;
* ``vote``: ``"proportions"`` (the default, not written) averages the trees' leaf values;
  ``"counts"`` (a DP classifier whose leaf values are noisy class counts, or class proportions
  weighted by the leaves' rows against the noise, docs/privacy.md §2.6) clips that average at
  0 and normalises it per row (uniform where nothing is left);
* ``routing``: absent for hard splits (a row goes where the split sends it); for a DP
  random-split forest, the width and the released marginal CDF with which a row near a
  threshold is shared between both children (:mod:`~fedforest_secure._soft_routing`). A model
  file with it is of format v3, so that a version that reads only v1 and v2 refuses it rather
  than predict with hard splits;
* ``estimator``: the estimator's parameters and job configuration (files the estimators wrote).

Each tree is a :class:`~fedforest_secure._tree.Tree`: parallel arrays indexed by node id, the
node kinds stored as their :class:`~fedforest_secure._tree.NodeKind` codes (0 leaf, 1 numeric,
2 categorical, 3 client split), with each split's weighted impurity decrease (``gain``) that
:meth:`ForestModel.feature_importances` adds up.

A file whose parts do not fit together (an unknown task, no tree, a node kind, child or feature
index that is no integer or out of range, a leaf with a child, a node with two parents, split sets
that are no mapping of lists, class labels or value columns that disagree with ``n_classes``, site
or feature names that disagree with their counts, a ``"proportions"`` classifier's leaf value that
is not class proportions, a ``y_offset`` that is no finite number, a ``schema`` that disagrees with
the forest: other features or another order than ``feature_names``, another task or classes, a
categorical split on a continuous feature or beyond its levels) is refused with a ValueError naming
the field, the tree and (:meth:`ForestModel.load`) the file.

Floats are written with ``repr`` precision (JSON numbers from Python floats round-trip exactly),
so a loaded model predicts bit-for-bit the same. Files of the first format
(``fedforest-secure/model/v1``, trees only) still load; a model without ``routing`` is written
as v2.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._cells import _numeric_column
from ._model_files import check_schema, model_document, model_text
from ._soft_routing import SoftRouting
from ._tree import NodeKind, Tree
from .errors import SchemaError
from .files import write_atomic

__all__ = ["ForestModel", "Tree", "finite_number", "model_text"]

def finite_number(value: object) -> bool:
    """A real number (not a bool) that is a finite float: not NaN nor infinite, nor an
    integer too large for a float (as a model file's JSON may hold)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


FORMAT = "fedforest-secure/model/v2"
#: the format of a model file with soft routing
FORMAT_ROUTED = "fedforest-secure/model/v3"
_READS = ("fedforest-secure/model/v1", FORMAT, FORMAT_ROUTED)
_VOTES = ("proportions", "counts")
_TASKS = ("regression", "classification")
#: rows a soft-routed forest predicts at a time
ROUTED_ROWS = 16384
#: how far a leaf's class proportions may stray from [0, 1] and a sum of 1 (rounding)
_PROPORTION_SLACK = 1e-6


def _column_names(X: Any) -> list[str] | None:
    """The column names of a table (a pandas DataFrame or anything with ``.columns``) whose
    labels are all strings; None for other input and for labels that are not all strings
    (``pd.DataFrame(array)``'s 0, 1, ...): scikit-learn's feature names, its columns then taken
    by position."""
    cols = getattr(X, "columns", None)
    if cols is None or isinstance(X, np.ndarray):
        return None
    labels = list(cols)
    if not all(isinstance(c, str) for c in labels):
        return None
    return labels


def _check_proportions(tree: Tree, name: str) -> None:
    """Refuse a leaf of a ``"proportions"`` vote whose value is not class proportions: every
    training path writes each in [0, 1], adding up to 1, or all 0 (a DP root whose noisy
    count is too small takes the zeros a root inherits, and its leaves with it); only a
    ``"counts"`` vote's leaves hold noisy counts, negative ones too. The average of other
    values is no probability."""
    leaves = np.flatnonzero(tree.kind == NodeKind.LEAF)
    values = tree.value[leaves]
    total = values.sum(axis=1)
    bad = ((values < 0.0) | (values > 1.0 + _PROPORTION_SLACK)).any(axis=1) \
        | ((np.abs(total - 1.0) > _PROPORTION_SLACK) & (total != 0.0))
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"{name}, node {int(leaves[k])}: leaf value {values[k].tolist()} is "
                         "not class proportions (each in [0, 1], adding up to 1, or all 0)")


def _tree_of(entry: Any, i: int) -> Tree:
    """Tree ``i`` of a model file, a ValueError naming it for an entry that is none."""
    if not isinstance(entry, dict):
        raise ValueError(f"tree {i}: not a mapping of node arrays")
    try:
        return Tree.from_dict(entry)
    except KeyError as exc:
        raise ValueError(f"tree {i}: no {exc.args[0]!r} field") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tree {i}{',' if str(exc).startswith('node') else ':'} {exc}") \
            from None


@dataclass
class ForestModel:
    """A trained forest, independent of how it was trained (module docstring)."""

    task: str
    n_features: int
    n_classes: int
    trees: list[Tree]
    n_clients: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    feature_names: list[str] | None = None
    classes: list[Any] | None = None
    schema: dict[str, Any] | None = None
    clients: list[Any] | None = None
    y_offset: float = 0.0
    estimator: dict[str, Any] | None = None
    vote: str = "proportions"
    routing: SoftRouting | None = None

    def __post_init__(self) -> None:
        """Refuse a forest whose parts do not fit together (a damaged or edited model file),
        naming the field and the tree: predict would fail on it, or predict wrongly."""
        if self.task not in _TASKS:
            raise ValueError(f"task must be 'regression' or 'classification', got {self.task!r}")
        if self.vote not in _VOTES:
            raise ValueError(f"vote must be one of {_VOTES}, got {self.vote!r}")
        if self.n_features < 1:
            raise ValueError(f"n_features must be at least 1, got {self.n_features}")
        if self.n_clients < 0:
            raise ValueError(f"n_clients must be at least 0, got {self.n_clients}")
        if not self.trees:
            raise ValueError("trees is empty: a forest has at least one tree")
        if not finite_number(self.y_offset):
            raise ValueError(f"y_offset must be a finite number, got {self.y_offset!r}")
        self.y_offset = float(self.y_offset)
        outputs = 1 if self.task == "regression" else self.n_classes
        for i, tree in enumerate(self.trees):
            tree.check(self.n_features, self.n_clients, name=f"tree {i}")
            if tree.value.shape[1] != outputs:
                owner = ("a regression forest's value has 1" if self.task == "regression"
                         else f"the forest's n_classes is {self.n_classes}")
                raise ValueError(f"tree {i}: value has {tree.value.shape[1]} columns, {owner}")
            if self.task == "classification" and self.vote == "proportions":
                _check_proportions(tree, f"tree {i}")
        if self.task == "classification" and self.classes is not None \
                and len(self.classes) != self.n_classes:
            raise ValueError(f"classes has {len(self.classes)} labels, n_classes is "
                             f"{self.n_classes}")
        if self.feature_names is not None:
            if not isinstance(self.feature_names, list | tuple):
                raise ValueError(f"feature_names must be a list of column names, got "
                                 f"{self.feature_names!r}")
            self.feature_names = list(self.feature_names)  # a tuple from the Python API too
            text = [c for c in self.feature_names if not isinstance(c, str)]
            if text:
                raise ValueError(f"feature_names must be text (the column names), got "
                                 f"{text[0]!r}")
            if len(self.feature_names) != self.n_features:
                raise ValueError(f"feature_names has {len(self.feature_names)} names, "
                                 f"n_features is {self.n_features}")
        if self.clients is not None and len(self.clients) != self.n_clients:
            raise ValueError(f"clients has {len(self.clients)} sites, n_clients is "
                             f"{self.n_clients}")
        check_schema(self)
        if self.routing is not None:
            if self.routing.n_features != self.n_features:
                raise ValueError(f"the routing has {self.routing.n_features} features, the "
                                 f"forest {self.n_features}")
            for tree in self.trees:
                self.routing.check(tree)

    @property
    def uses_client(self) -> bool:
        return any(t.uses_client for t in self.trees)

    def categorical_features(self) -> dict[int, str]:
        """The features the schema calls categorical, by index, with their names (none
        without a schema)."""
        if self.schema is None:
            return {}
        from .schema import Schema

        schema = Schema.from_dict(self.schema, stored=True)
        return {i: name for i, (name, kind) in
                enumerate(zip(schema.feature_names, schema.feature_kinds, strict=True))
                if kind == "categorical"}

    # ------------------------------------------------------------------ a job's model
    def for_job(self, schema_text: str | None, clients: Sequence[str]) -> ForestModel:
        """This forest with the job's schema (its schema file's TOML or JSON text, read as
        stored: :meth:`Schema.from_dict`; a job's ``[data]`` facts, JSON without ``features``
        and ``target``, or None add none) and its sites' names: the model file the server
        stores and the audit log's digest covers. Raises SchemaError for text that is no TOML
        or JSON, a schema that is not valid or has another number of features."""
        from .schema import Schema

        schema = None
        if schema_text:
            try:
                raw = (json.loads(schema_text) if schema_text.lstrip().startswith("{")
                       else tomllib.loads(schema_text))
            except ValueError as exc:  # tomllib.TOMLDecodeError too
                raise SchemaError(f"cannot parse the job's schema: {exc}") from None
            if isinstance(raw, dict) and ("features" in raw or "target" in raw):
                schema = Schema.from_dict(raw, stored=True)
        if schema is not None and schema.n_features != self.n_features:
            raise SchemaError(f"the schema has {schema.n_features} features, the forest "
                              f"{self.n_features}")
        return dataclasses.replace(
            self, clients=[str(c) for c in clients],
            schema=None if schema is None else schema.to_dict(),
            feature_names=None if schema is None else schema.feature_names,
            classes=(schema.target.classes if schema is not None and self.task ==
                     "classification" else self.classes))

    # ------------------------------------------------------------------ prediction
    def prepare(self, X: Any) -> np.ndarray:
        """``X`` as the forest's float64 input, shape (n, n_features).

        A table with named columns is matched to ``feature_names`` by name (any order, no
        missing column); with a schema, categorical columns are read as levels and the
        table's other columns (the target, the client column, columns the schema does not
        name) are left, as :meth:`Schema.read_csv` leaves them; without one, a column the
        forest does not know is refused.
        An array is taken in the forest's column order.

        Raises
        ------
        SchemaError
            A missing or unknown column, an unknown level, a non-number, a wrong shape.
        """
        names = _column_names(X)
        if names is not None and self.feature_names is not None:
            missing = [c for c in self.feature_names if c not in names]
            # with a schema, a site's table predicts as it is: the features are taken by name
            # and every other column (the target, the client column, columns the schema does
            # not name) is left, as Schema.read_csv leaves it; without one, a column the
            # forest does not know is refused
            unknown = [] if self.schema is not None else \
                [c for c in names if c not in self.feature_names]
            if missing or unknown:
                parts = []
                if missing:
                    parts.append(f"missing column{'s' if len(missing) > 1 else ''} "
                                 f"{', '.join(map(repr, missing))}")
                if unknown:
                    parts.append(f"unknown column{'s' if len(unknown) > 1 else ''} "
                                 f"{', '.join(map(repr, unknown))}")
                advice = " (drop the target and any other column)" if unknown else ""
                raise SchemaError(f"{' and '.join(parts)}: the model's columns are "
                                  f"{', '.join(self.feature_names)}{advice}")
            twice = sorted({c for c in names if names.count(c) > 1} & set(self.feature_names))
            if twice:
                raise SchemaError(f"duplicate column {twice[0]!r}: each of the model's columns "
                                  "must appear once")
            columns = {c: list(X[c]) for c in self.feature_names}
        elif self.schema is not None:
            arr = np.asarray(X, dtype=object)
            if arr.ndim != 2 or arr.shape[1] != self.n_features:
                raise SchemaError(f"X must have shape (n, {self.n_features}), got {arr.shape}")
            columns = {name: list(arr[:, j]) for j, name in enumerate(self.feature_names or [])}
        else:
            Xf = np.asarray(X, dtype=np.float64)
            if Xf.ndim != 2 or Xf.shape[1] != self.n_features:
                raise SchemaError(f"X must have shape (n, {self.n_features}), got {Xf.shape}")
            return Xf
        if self.schema is None:  # missing cells (NaN, None, pandas' NA) are NaN
            # bools are 0 and 1 and text is a number or an error ("?", "NA", "": no schema
            # declares them missing), as the estimators' fit reads them (scikit-learn's
            # validate_data)
            return np.column_stack([_numeric_column(columns[c], c, allow_missing=True,
                                                    bools=True, missing_words=False)
                                    for c in columns]).reshape(-1, self.n_features)
        from .schema import Schema

        schema = Schema.from_dict(self.schema, stored=True)
        n = len(next(iter(columns.values()))) if columns else 0
        if n == 0:
            return np.empty((0, self.n_features))
        return schema.encode_features(columns, n)

    def _check_client(self, client: Any, n: int) -> np.ndarray | None:
        """Site indices of ``n`` rows: indices as given, or site names looked up in
        ``clients`` (a name the forest does not know predicts as a new site where the forest
        never splits on H)."""
        if client is None:
            return None
        codes: np.ndarray = np.asarray(client)
        if codes.shape != (n,):
            raise SchemaError("client must have one entry per row")
        if codes.dtype.kind == "O" and all(isinstance(c, numbers.Integral)
                                           and not isinstance(c, bool) for c in codes.tolist()):
            codes = codes.astype(np.int64)  # indices held as Python objects (a pandas Series)
        if codes.dtype.kind not in "iu":
            if codes.dtype.kind == "b" or (codes.dtype.kind == "f" and not (
                    np.isfinite(codes).all() and (codes == np.round(codes)).all()
                    and (np.abs(codes) < 2**62).all())):
                raise SchemaError("client must hold site indices (integers) or site names")
            if codes.dtype.kind == "f":
                codes = codes.astype(np.int64)
            else:
                index = {str(c): k for k, c in enumerate(self.clients or [])}
                if not index:
                    raise SchemaError("this model names no sites: client must hold site "
                                      f"indices in [0, {self.n_clients})")
                unknown = sorted({str(c) for c in codes.tolist()} - set(index))
                if unknown and self.uses_client:
                    raise SchemaError(f"unknown site {unknown[0]!r}; the forest knows "
                                      f"{list(index)}")
                codes = np.array([index.get(str(c), -1) for c in codes.tolist()],
                                 dtype=np.int64)
        if self.uses_client and ((codes < 0) | (codes >= self.n_clients)).any():
            raise SchemaError(f"client indices must be in [0, {self.n_clients})")
        return codes

    def predict_values(self, X: Any, client: Any = None) -> np.ndarray:
        """Average of the trees' leaf values: shape (n, 1) or (n, C) (without ``y_offset``);
        a ``"counts"`` vote's average clipped at 0 and normalised per row."""
        return self.values_of(self.prepare(X), client)

    def values_of(self, Xf: np.ndarray, client: Any = None) -> np.ndarray:
        """:meth:`predict_values` of input that :meth:`prepare` already made."""
        codes = self._check_client(client, Xf.shape[0])
        out = np.zeros((Xf.shape[0], 1 if self.task == "regression" else self.n_classes))
        if self.routing is not None:
            # a block of rows at a time: the walk's arrays stay in the cache
            for a in range(0, Xf.shape[0], ROUTED_ROWS):
                Z = self.routing.positions(Xf[a:a + ROUTED_ROWS])
                for tree in self.trees:
                    out[a:a + ROUTED_ROWS] += self.routing.tree_values(tree, Z)
        else:
            for tree in self.trees:
                out += tree.value[tree.apply(Xf, codes)]
        out /= max(len(self.trees), 1)
        if self.vote == "counts" and self.task != "regression":
            out = np.maximum(out, 0.0)
            total = out.sum(axis=1, keepdims=True)
            out = np.where(total > 0, out / np.where(total > 0, total, 1.0),
                           1.0 / max(out.shape[1], 1))
        return out

    def outputs_of(self, Xf: np.ndarray, client: Any = None) -> np.ndarray:
        """:meth:`values_of` with a regressor's ``y_offset`` added: class probabilities, or the
        predicted values, of input that :meth:`prepare` already made."""
        v = self.values_of(Xf, client)
        out: np.ndarray = v + self.y_offset if self.task == "regression" else v
        return out

    def predict(self, X: Any, client: Any = None) -> np.ndarray:
        """Regression: the predicted values (``y_offset`` added). Classification: the index of
        the most probable class (``classes[i]`` is its label)."""
        v = self.outputs_of(self.prepare(X), client)
        out: np.ndarray = v[:, 0] if self.task == "regression" else np.argmax(v, axis=1)
        return out

    def feature_importances(self) -> np.ndarray:
        """Mean decrease in impurity per feature, shape (n_features,), summing to 1 (zeros
        for a forest without informative splits), as the estimators' ``feature_importances_``:
        from the nodes' impurities and weights (scikit-learn's rule; a decrease that DP noise
        makes negative counts as none), each tree normalised, averaged over the trees that
        split. A file without node impurities falls back on the recorded split gains. Splits
        on the site indicator H count for no feature.

        Raises
        ------
        ValueError
            A model file with neither node impurities nor split gains.
        """
        if self.trees and all(t.impurity is not None for t in self.trees):
            from ._sklearn_api import FederatedTree, forest_importances

            return forest_importances([FederatedTree(t, self.n_features) for t in self.trees],
                                      self.n_features)
        total = np.zeros(self.n_features)
        for tree in self.trees:
            if tree.gain is None:
                raise ValueError("this model file does not record split gains; retrain to get "
                                 "feature importances")
            per = np.zeros(self.n_features)
            split = (tree.kind == NodeKind.NUMERIC) | (tree.kind == NodeKind.CATEGORICAL)
            np.add.at(per, tree.feature[split], np.maximum(tree.gain[split], 0.0))
            if per.sum() > 0:
                total += per / per.sum()
        return total / total.sum() if total.sum() > 0 else total

    # ------------------------------------------------------------------ the file
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT if self.routing is None else FORMAT_ROUTED, "task": self.task,
            "n_features": self.n_features, "n_classes": self.n_classes,
            "n_clients": self.n_clients, "meta": self.meta,
            "trees": [t.to_dict() for t in self.trees]}
        for key in ("feature_names", "classes", "schema", "clients", "estimator"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.y_offset:
            out["y_offset"] = self.y_offset
        if self.vote != "proportions":
            out["vote"] = self.vote
        if self.routing is not None:
            out["routing"] = self.routing.to_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, d: Any) -> ForestModel:
        """A model from its file's mapping.

        Raises
        ------
        ValueError
            Not a model file of a format this version reads, or one whose parts do not fit
            together (the message names the field and the tree).
        """
        if not isinstance(d, dict) or d.get("format") not in _READS:
            raise ValueError(f"not a model file ({' or '.join(_READS)})")
        try:
            trees = d["trees"]
            if not isinstance(trees, list):
                raise ValueError("trees must be a list of trees")
            meta = d.get("meta", {})
            if not isinstance(meta, dict):
                raise ValueError(f"meta must be a mapping, got {meta!r}")
            return cls(task=d["task"], n_features=int(d["n_features"]),
                       n_classes=int(d["n_classes"]), n_clients=int(d.get("n_clients", 0)),
                       meta=dict(meta), trees=[_tree_of(t, i) for i, t in enumerate(trees)],
                       feature_names=d.get("feature_names"), classes=d.get("classes"),
                       schema=d.get("schema"), clients=d.get("clients"),
                       y_offset=d.get("y_offset", 0.0), estimator=d.get("estimator"),
                       vote=str(d.get("vote", "proportions")),
                       routing=(SoftRouting.from_dict(d["routing"]) if "routing" in d
                                else None))
        except KeyError as exc:
            raise ValueError(f"not a model file: no {exc.args[0]!r} field") from None
        except TypeError as exc:  # a field of another JSON type than the format's
            raise ValueError(f"not a model file: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> ForestModel:
        return cls.from_dict(json.loads(text))

    def digest(self) -> str:
        """SHA-256 of the canonical JSON (what the audit log records)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> ForestModel:
        """The model of the file ``path``.

        Raises
        ------
        ValueError
            The file cannot be read, is not a model file (not UTF-8 text, not JSON, not of a
            format this version reads) or one whose parts do not fit together; the message
            names the file.
        """
        doc = model_document(path)
        try:
            return cls.from_dict(doc)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
