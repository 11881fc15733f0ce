"""The data schema both sides of a federation share.

A schema names the features (continuous with public bounds, or categorical with levels), the
target (regression with public bounds, or classification with classes) and, optionally, the column
that says which client a row belongs to. The coordinator and every client load the same schema
file; a client validates its table against it before anything leaves the site.

Schema files are TOML or JSON::

    client_column = "hospital"

    [target]
    name = "los"
    kind = "regression"
    bounds = [0.0, 365.0]

    [[features]]
    name = "age"
    kind = "continuous"
    bounds = [0.0, 120.0]

    [[features]]
    name = "sex"
    kind = "categorical"
    levels = ["F", "M"]

    [[features]]
    name = "chol"
    kind = "continuous"
    bounds = [80.0, 600.0]
    missing = "allowed"      # cells "?", "NA", empty ... read as missing (NaN)

Bounds are *public*: they fix fixed-point scales, the secure sketch grid and differential-privacy
sensitivities. Data outside them is an error, never silently clipped.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tomli_w
from numpy.typing import ArrayLike, NDArray
from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from . import _schema_tables
from ._cells import _Column
from ._schema_checks import (
    _Bounds,
    _bounds_field,
    _check_labels,
    _check_name,
    _format_error,
    _name_field,
)
from ._schema_infer import inferred_schema
from .errors import SchemaError
from .files import write_atomic

__all__ = ["Feature", "Schema", "Target"]


def _stored(info: ValidationInfo) -> bool:
    """Whether the schema validated is one a model or a job already carries
    (:meth:`Schema.from_dict`'s ``stored``)."""
    return isinstance(info.context, Mapping) and bool(info.context.get("stored"))


class Feature(BaseModel):
    """One input column.

    Attributes
    ----------
    name : str
        Column name in the table.
    kind : {"continuous", "categorical"}
        A number on a public range, or one of a fixed list of labels.
    bounds : (float, float) or None
        Public ``[lo, hi]`` range of a continuous feature (finite, ``lo < hi``).
    levels : list of str or None
        Levels of a categorical feature (at least 2, unique); encoded as codes ``0..L-1``.
    missing : {"forbidden", "allowed"}
        Whether a row may miss this feature. Where allowed, a missing cell (``?``, ``NA``,
        empty, ...) is read as NaN and every split learns where such rows go; where forbidden,
        it is an error.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: Literal["continuous", "categorical"]
    bounds: _Bounds | None = None
    levels: list[str] | None = None
    missing: Literal["forbidden", "allowed"] = "forbidden"

    @property
    def may_miss(self) -> bool:
        """Whether the schema allows rows without this feature."""
        return self.missing == "allowed"

    _name = field_validator("name")(_name_field)
    _bounds = field_validator("bounds")(_bounds_field)

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if v is not None:
            _check_labels(v, "levels", stored=_stored(info))
        return v

    @model_validator(mode="after")
    def _validate(self) -> Feature:
        if self.kind == "continuous":
            if self.levels is not None:
                raise ValueError("a continuous feature has no levels")
        else:
            if self.bounds is not None:
                raise ValueError("a categorical feature has no bounds")
            if self.levels is None:
                raise ValueError("a categorical feature needs levels")
        return self


class Target(BaseModel):
    """The response column.

    Attributes
    ----------
    name : str
        Column name of the target in the table.
    kind : {"regression", "classification"}
        A number to predict, or a class label.
    bounds : (float, float) or None
        Public range of a regression target (needed for fixed-point scales and DP).
    classes : list of str or None
        Class labels of a classification target (at least 2, unique); encoded as ``0..C-1``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: Literal["regression", "classification"]
    bounds: _Bounds | None = None
    classes: list[str] | None = None

    _name = field_validator("name")(_name_field)
    _bounds = field_validator("bounds")(_bounds_field)

    @field_validator("classes")
    @classmethod
    def _classes(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if v is not None:
            _check_labels(v, "classes", stored=_stored(info))
        return v

    @model_validator(mode="after")
    def _validate(self) -> Target:
        if self.kind == "regression":
            if self.classes is not None:
                raise ValueError("a regression target has no classes")
        else:
            if self.bounds is not None:
                raise ValueError("a classification target has no bounds")
            if self.classes is None:
                raise ValueError("a classification target needs classes")
        return self


class Schema(BaseModel):
    """Feature kinds, public bounds and target of a federated table.

    Attributes
    ----------
    features : list of Feature
        The input columns, one ``[[features]]`` table each, in the order the model uses them.
    target : Target
        The ``[target]`` table: the column to predict.
    client_column : str or None
        Column holding each row's client (site) identifier, if the table has one (one value
        in a site's own table; several where a pooled table is split into sites in process).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    features: list[Feature]
    target: Target
    client_column: str | None = None

    @model_validator(mode="after")
    def _validate(self) -> Schema:
        if not self.features:
            raise ValueError("features: at least one feature is needed")
        names = [f.name for f in self.features] + [self.target.name]
        if self.client_column is not None:
            _check_name(self.client_column)
            names.append(self.client_column)
        seen: set[str] = set()
        for n in names:
            if n in seen:
                raise ValueError(f"duplicate column name {n!r}")
            seen.add(n)
        return self

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | Path | None = None,
                  stored: bool = False) -> Schema:
        """Validate a schema given as a mapping; ``source`` (a file the mapping was read
        from) is named in the errors.

        ``stored``: the schema a model file or a stored job carries, validated when it was
        written. It is read as written, also where its levels or classes list one number
        twice (``"1"`` and ``"1.0"``, allowed before such schemas were refused): the model
        was trained and scores on those labels (a cell matches a label's exact text first),
        and its bytes are what the audit log's digest covers. A schema written or adopted
        now (a schema file, a job's schema, a draft) lists each number once.

        Raises
        ------
        SchemaError
            Naming every offending field, e.g. ``features[2] ('age').bounds: ...``.
        """
        what = "invalid schema" if source is None else f"invalid schema file {source}"
        if not isinstance(data, Mapping):
            raise SchemaError(f"{what}: a schema must be a mapping, got {type(data).__name__}")
        try:
            return cls.model_validate(dict(data), context={"stored": stored})
        except ValidationError as exc:
            raise SchemaError(f"{what}: {_format_error(exc, data, Schema)}") from None

    @classmethod
    def load(cls, path: str | Path) -> Schema:
        """Read a schema from a ``.toml`` or ``.json`` file."""
        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise SchemaError(f"cannot read schema file {p}: {exc.strerror}") from None
        try:
            text = raw.decode("utf-8-sig")  # a byte-order mark (Windows editors) is no text
            data = json.loads(text) if p.suffix.lower() == ".json" else tomllib.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise SchemaError(f"cannot parse schema file {p}: {exc}") from None
        return cls.from_dict(data, source=p)

    def to_dict(self) -> dict[str, Any]:
        """JSON/TOML-ready mapping (absent optional fields and defaults left out)."""
        return self.model_dump(mode="json", exclude_none=True, exclude_defaults=True)

    def dump(self, path: str | Path) -> None:
        """Write the schema to ``path`` (TOML unless the suffix is ``.json``), whole or not at
        all: an interrupt or a full disk leaves the file there as it was."""
        p = Path(path)
        if p.suffix.lower() == ".json":
            write_atomic(p, json.dumps(self.to_dict(), indent=2) + "\n")
        else:
            write_atomic(p, tomli_w.dumps(self.to_dict()))

    @classmethod
    def infer(
        cls,
        X: ArrayLike,
        y: ArrayLike,
        feature_names: Sequence[str] | None = None,
        task: Literal["regression", "classification"] = "regression",
        categorical: Sequence[int | str] | None = None,
    ) -> Schema:
        """Build a schema from in-process data.

        .. warning::
           Disclosure: the bounds and levels are taken *from the data*, so the schema reveals
           each feature's pooled minimum and maximum (and the set of target classes). This is for
           the in-process scikit-learn facade only; a real federation writes its public bounds
           into a schema file.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,)
        feature_names : sequence of str, optional
            Default ``x0, x1, ...``.
        task : {"regression", "classification"}
        categorical : sequence of int or str, optional
            Indices or names of categorical features; their levels are the sorted unique values.
        """
        return cls.from_dict(
            inferred_schema(X, y, feature_names, task, categorical))

    # ------------------------------------------------------------------ helpers
    @property
    def n_features(self) -> int:
        """Number of features ``d``."""
        return len(self.features)

    @property
    def feature_names(self) -> list[str]:
        """Feature names in column order."""
        return [f.name for f in self.features]

    @property
    def feature_kinds(self) -> list[str]:
        """``"continuous"`` or ``"categorical"`` per feature."""
        return [f.kind for f in self.features]

    @property
    def missing_allowed(self) -> list[bool]:
        """Per feature, whether rows may miss it (``missing = "allowed"``)."""
        return [f.may_miss for f in self.features]

    @property
    def n_levels(self) -> list[int]:
        """Number of levels per feature (0 for continuous features)."""
        return [len(f.levels) if f.levels is not None else 0 for f in self.features]

    @property
    def bounds_array(self) -> NDArray[np.float64]:
        """Array of shape (d, 2): public ``[lo, hi]`` per feature, NaN where absent."""
        out = np.full((self.n_features, 2), np.nan)
        for j, f in enumerate(self.features):
            if f.bounds is not None:
                out[j] = f.bounds
        return out

    @property
    def is_classification(self) -> bool:
        """Whether the target is a class label."""
        return self.target.kind == "classification"

    @property
    def n_classes(self) -> int:
        """Number of classes (0 for regression)."""
        return len(self.target.classes) if self.target.classes is not None else 0

    def missing_bounds(self) -> list[str]:
        """Names of continuous features (and a regression target) without public bounds."""
        out = [f.name for f in self.features if f.kind == "continuous" and f.bounds is None]
        if self.target.kind == "regression" and self.target.bounds is None:
            out.append(self.target.name)
        return out

    # ------------------------------------------------------------------ tables
    def read_csv(
        self, path: str | Path, *, with_target: bool = True
    ) -> tuple[NDArray[np.float64], NDArray[Any] | None, NDArray[np.str_] | None]:
        """Read and validate a CSV file with a header row.

        Parameters
        ----------
        path : str or Path
        with_target : bool, default True
            False for tables to predict on (no target column needed, ``y`` is None).

        Returns
        -------
        X : ndarray of shape (n_samples, n_features), float64
            Continuous values as read; categorical features as level codes ``0..L-1``.
        y : ndarray of shape (n_samples,) or None
            float64 for regression, int64 class codes ``0..C-1`` for classification.
        client : ndarray of str of shape (n_samples,) or None
            The client column when the schema names one.

        Raises
        ------
        SchemaError
            Naming the column and the 1-based data row of the first problem.
        """
        return _schema_tables.read_csv(self, path, with_target=with_target)

    def validate_table(
        self, table: Any, *, with_target: bool = True
    ) -> tuple[NDArray[np.float64], NDArray[Any] | None, NDArray[np.str_] | None]:
        """Validate an in-memory table; same checks and outputs as :meth:`read_csv`.

        Parameters
        ----------
        table : DataFrame-like, mapping of column -> sequence, or iterable of row mappings
            Anything with ``.columns`` and ``table[col]`` (e.g. a pandas DataFrame), a dict of
            columns, or a list of ``{column: value}`` rows.
        """
        return _schema_tables.validate_table(self, table, with_target=with_target)

    def check_arrays(
        self, X: ArrayLike, y: ArrayLike | None = None
    ) -> tuple[NDArray[np.float64], NDArray[Any] | None]:
        """Validate numpy input against the schema.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Columns in schema order; categorical columns hold level labels (or numbers whose
            canonical text is a level, e.g. ``1.0`` for level ``"1"``).
        y : array-like of shape (n_samples,), optional

        Returns
        -------
        X : ndarray of shape (n_samples, n_features), float64 with categorical level codes
        y : ndarray of shape (n_samples,) or None
            float64 for regression, int64 class codes for classification.
        """
        return _schema_tables.check_arrays(self, X, y)

    def encode_features(self, columns: Mapping[str, _Column], n_rows: int
                        ) -> NDArray[np.float64]:
        """The features of rows to predict: continuous columns as numbers (outside the public
        bounds is allowed: a tree routes any number), categorical columns as level codes.

        Returns
        -------
        X : ndarray of shape (n_rows, n_features)

        Raises
        ------
        SchemaError
            A missing column, a non-number, an unknown level.
        """
        return _schema_tables.encode_features(self, columns, n_rows)

    def encode_target(self, y: ArrayLike) -> NDArray[Any]:
        """Validate and encode a target vector (float64, or int64 class codes)."""
        return _schema_tables.encode_target(self, y)
