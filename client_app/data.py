"""Load and validate the site's table against the federation's schema, before any network I/O."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from fedforest_secure.errors import SchemaError
from fedforest_secure.schema import Schema
from fedforest_secure.tablecheck import check_table, read_raw

__all__ = ["load_site_table", "schema_sha256"]


def schema_sha256(path: Path) -> str:
    """SHA-256 of the schema file's text, without a byte-order mark (the server's hash of the
    job's schema leaves it out too: a copy saved with one is the same schema)."""
    return hashlib.sha256(Path(path).read_text(encoding="utf-8-sig").encode()).hexdigest()


def load_site_table(data: Path, schema: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` of the site's CSV, validated against ``schema``: one site's rows (a schema's
    ``client_column`` holds one value), each fitting the schema.

    Raises
    ------
    SchemaError
        Listing every problem of the table (:func:`~fedforest_secure.tablecheck.check_table`),
        not only the first.
    """
    sch = Schema.load(schema)
    try:
        X, y, client = sch.read_csv(data)
    except SchemaError as first:
        try:
            listed = _every_problem(data, schema, sch)
        except SchemaError as exc:  # the file itself is unreadable: that is the error
            raise exc from None
        if listed is None:
            raise
        raise listed from first
    if client is not None and len(set(client.tolist())) > 1:
        # the rows of several sites (a pooled file given to each site): every row would be
        # counted once per site that gives it
        listed = _every_problem(data, schema, sch)
        raise listed or SchemaError(
            f"{data}: column {sch.client_column!r} names several sites: a site's table holds "
            "that site's rows only")
    if y is None:
        raise SchemaError(f"{data}: the table has no target column")
    return np.asarray(X, dtype=np.float64), np.asarray(y)


def _every_problem(data: Path, schema: Path, sch: Schema) -> SchemaError | None:
    """Every error :func:`check_table` finds in ``data``, as one error; None when it finds
    none."""
    problems = [p for p in check_table(read_raw(data), sch) if p.severity == "error"]
    if not problems:
        return None
    listed = "\n  ".join(str(p) for p in problems)
    return SchemaError(f"{data} does not fit the schema {schema} ({len(problems)} "
                       f"problem{'s' if len(problems) > 1 else ''}; `fedforest check "
                       f"--data {data} --schema {schema}` says the same):\n  {listed}")
