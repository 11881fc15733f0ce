"""Tables read against a schema.

A CSV file, an in-memory table (DataFrame-like, mapping of columns, rows of mappings) or numpy
arrays become the arrays the engine uses: a float64 feature matrix (categorical features as level
codes ``0..L-1``), the encoded target (float64, or int64 class codes) and the client column. Every
cell is checked against the schema; errors name the column and the row. These are the bodies of
the table methods of :class:`~fedforest_secure.schema.Schema`, which document them, and the
reading of a site's CSV file to predict on (:func:`feature_cells`, the estimators' ``read_rows``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._cells import (
    _canon,
    _CellError,
    _Column,
    _is_missing,
    _label_codes,
    _numeric_column,
    blank_columns,
    header_defects,
    read_csv_rows,
    without_columns,
)
from ._schema_checks import _Bounds
from .errors import SchemaError
from .printable import normalisation_twin


class ColumnSpec(Protocol):
    """What a table is read against of a column the schema names (a feature, the target)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def bounds(self) -> _Bounds | None: ...


class FeatureSpec(ColumnSpec, Protocol):
    """What a table is read against of a feature (:class:`~fedforest_secure.schema.Feature`)."""

    @property
    def levels(self) -> list[str] | None: ...
    @property
    def may_miss(self) -> bool: ...


class TargetSpec(ColumnSpec, Protocol):
    """What a table is read against of the target (:class:`~fedforest_secure.schema.Target`)."""

    @property
    def classes(self) -> list[str] | None: ...


class SchemaSpec(Protocol):
    """What a table is read against of a schema (:class:`~fedforest_secure.schema.Schema`,
    which imports this module for its table methods)."""

    @property
    def features(self) -> Sequence[FeatureSpec]: ...
    @property
    def target(self) -> TargetSpec: ...
    @property
    def client_column(self) -> str | None: ...
    @property
    def n_features(self) -> int: ...
    @property
    def feature_names(self) -> list[str]: ...


def read_csv(
    schema: SchemaSpec, path: str | Path, *, with_target: bool = True
) -> tuple[NDArray[np.float64], NDArray[Any] | None, NDArray[np.str_] | None]:
    """``X, y, client`` of a CSV file with a header row (:meth:`Schema.read_csv`)."""
    p = Path(path)
    columns, lines = csv_columns(p)
    n = len(lines)
    try:
        return _encode(schema, columns, n, with_target=with_target)
    except _CellError as exc:  # the file's line, as fedforest check names it
        raise SchemaError(f"{p}, line {lines[exc.row - 1]}: column {exc.column!r}: "
                          f"{exc.what}") from None
    except SchemaError as exc:
        raise SchemaError(f"{p}: {exc}") from None


def csv_columns(p: Path) -> tuple[dict[str, list[str]], list[int]]:
    """A CSV file's columns of text cells by name, as :func:`read_csv` reads them (names
    stripped, an export's empty trailing columns left out), and the line each data row
    starts on.

    Raises
    ------
    SchemaError
        Unreadable, empty, a header with unnamed or repeated columns, a row whose cells are
        not one per column.
    """
    rows, lines = read_csv_rows(p)
    if not rows:
        raise SchemaError(f"{p}: empty file, expected a header row")
    header = [h.strip() for h in rows.pop(0)]
    blank = blank_columns(header, rows)  # an export's empty trailing columns: left out
    defects = header_defects(header, blank)
    if defects:
        raise SchemaError(f"{p}: " + "; ".join(f"{what}: {todo}" for what, todo in defects))
    if blank:
        header, rows = without_columns([header], blank)[0], without_columns(rows, blank)
    for row, line in zip(rows, lines[1:], strict=True):
        if len(row) != len(header):
            raise SchemaError(
                f"{p}, line {line}: has {len(row)} cells, the header has {len(header)} "
                "columns"
            )
    return {h: [r[k] for r in rows] for k, h in enumerate(header)}, lines[1:]


def feature_cells(schema: SchemaSpec, path: str | Path) -> NDArray[np.object_]:
    """The text cells of a CSV file's feature columns, shape (n_rows, n_features) in the
    schema's order, as :func:`read_csv` reads the file (the other columns left), each checked
    as :func:`encode_features` reads it: a value outside the public bounds is kept.

    Raises
    ------
    SchemaError
        What :func:`csv_columns` refuses, a missing feature column, a cell that is no number
        or no level (naming the file's line).
    """
    p = Path(path)
    columns, lines = csv_columns(p)
    try:
        encode_features(schema, columns, len(lines))
    except _CellError as exc:
        raise SchemaError(f"{p}, line {lines[exc.row - 1]}: column {exc.column!r}: "
                          f"{exc.what}") from None
    except SchemaError as exc:
        raise SchemaError(f"{p}: {exc}") from None
    out = np.empty((len(lines), schema.n_features), dtype=object)
    for j, name in enumerate(schema.feature_names):
        out[:, j] = columns[name]
    return out


def validate_table(
    schema: SchemaSpec, table: Any, *, with_target: bool = True
) -> tuple[NDArray[np.float64], NDArray[Any] | None, NDArray[np.str_] | None]:
    """``X, y, client`` of an in-memory table (:meth:`Schema.validate_table`)."""
    columns: dict[str, list[Any]]
    if hasattr(table, "columns") and not isinstance(table, Mapping):
        columns = {str(c): list(table[c]) for c in table.columns}
    elif isinstance(table, Mapping):
        columns = {str(k): list(v) for k, v in table.items()}
    elif isinstance(table, Iterable):
        rows = list(table)
        columns = {}
        for i, row in enumerate(rows, start=1):
            if not isinstance(row, Mapping):
                raise SchemaError(f"row {i}: expected a mapping of column to value")
        names = _needed_columns(schema, with_target)
        for name in names:
            col = []
            for i, row in enumerate(rows, start=1):
                if name not in row:
                    raise SchemaError(f"column {name!r}, row {i}: missing")
                col.append(row[name])
            columns[name] = col
    else:
        raise SchemaError(f"cannot read a table from {type(table).__name__}")
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise SchemaError("columns have different lengths")
    n = lengths.pop() if lengths else 0
    return _encode(schema, columns, n, with_target=with_target)


def check_arrays(
    schema: SchemaSpec, X: ArrayLike, y: ArrayLike | None = None
) -> tuple[NDArray[np.float64], NDArray[Any] | None]:
    """``X, y`` of numpy input in schema column order (:meth:`Schema.check_arrays`)."""
    Xa = np.asarray(X)
    if Xa.ndim != 2 or Xa.shape[1] != schema.n_features:
        raise SchemaError(f"X must have shape (n, {schema.n_features}), got {Xa.shape}")
    columns: dict[str, _Column] = {f.name: Xa[:, j] for j, f in enumerate(schema.features)}
    if y is not None:
        ya = np.asarray(y)
        if ya.shape != (Xa.shape[0],):
            raise SchemaError(f"y must have shape ({Xa.shape[0]},), got {ya.shape}")
        columns[schema.target.name] = ya
    Xo, yo, _ = _encode(schema, columns, Xa.shape[0], with_target=y is not None,
                        with_client=False)
    return Xo, yo


def encode_features(schema: SchemaSpec, columns: Mapping[str, _Column], n_rows: int
                    ) -> NDArray[np.float64]:
    """The features of rows to predict, bounds not enforced (:meth:`Schema.encode_features`)."""
    X = np.empty((n_rows, schema.n_features), dtype=np.float64)
    for j, f in enumerate(schema.features):
        if f.name not in columns:
            twin = normalisation_twin(f.name, columns)
            raise SchemaError(f"column {f.name!r}: missing from the table"
                              + (f" ({twin})" if twin else ""))
        col = columns[f.name]
        if f.kind == "continuous":
            X[:, j] = _numeric_column(col, f.name, allow_missing=f.may_miss)
        else:
            X[:, j] = _label_codes(col, f.name, f.levels or [], "level",
                                   allow_missing=f.may_miss)
    return X


def encode_target(schema: SchemaSpec, y: ArrayLike) -> NDArray[Any]:
    """A validated, encoded target vector (:meth:`Schema.encode_target`)."""
    ya = np.asarray(y)
    if ya.ndim != 1:
        raise SchemaError(f"y must be 1-D, got shape {ya.shape}")
    return _encode_target(schema, ya)


def _needed_columns(schema: SchemaSpec, with_target: bool, with_client: bool = True) -> list[str]:
    names = schema.feature_names
    if with_target:
        names.append(schema.target.name)
    if with_client and schema.client_column is not None:
        names.append(schema.client_column)
    return names


def _encode(
    schema: SchemaSpec,
    columns: Mapping[str, _Column],
    n_rows: int,
    *,
    with_target: bool,
    with_client: bool = True,
) -> tuple[NDArray[np.float64], NDArray[Any] | None, NDArray[np.str_] | None]:
    for name in _needed_columns(schema, with_target, with_client):
        if name not in columns:
            twin = normalisation_twin(name, columns)
            raise SchemaError(f"column {name!r}: missing from the table"
                              + (f" ({twin})" if twin else ""))
    if n_rows == 0:
        raise SchemaError("the table has no data rows")
    X = np.empty((n_rows, schema.n_features), dtype=np.float64)
    for j, f in enumerate(schema.features):
        col = columns[f.name]
        if f.kind == "continuous":
            X[:, j] = _numeric_column(col, f.name, f.bounds, allow_missing=f.may_miss)
        else:
            X[:, j] = _label_codes(col, f.name, f.levels or [], "level",
                                   allow_missing=f.may_miss)
    y = _encode_target(schema, columns[schema.target.name]) if with_target else None
    client = None
    if with_client and schema.client_column is not None:
        raw = columns[schema.client_column]
        for i, v in enumerate(raw, start=1):
            if _is_missing(v):
                raise _CellError(schema.client_column, i, "missing value")
        client = np.array([_canon(v) for v in raw], dtype=np.str_)
    return X, y, client


def _encode_target(schema: SchemaSpec, col: _Column) -> NDArray[Any]:
    t = schema.target
    if t.kind == "regression":
        return _numeric_column(col, t.name, t.bounds)
    return _label_codes(col, t.name, t.classes or [], "class").astype(np.int64)
