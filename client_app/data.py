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
    """``(X, y)`` of the site's CSV, validated against ``schema``.

    Raises
    ------
    SchemaError
        Listing every problem of the table (:func:`~fedforest_secure.tablecheck.check_table`),
        not only the first.
    """
    sch = Schema.load(schema)
    try:
        X, y, _client = sch.read_csv(data)
    except SchemaError as first:
        try:
            problems = [p for p in check_table(read_raw(data), sch) if p.severity == "error"]
        except SchemaError as exc:
            raise exc from None
        if not problems:
            raise
        listed = "\n  ".join(str(p) for p in problems)
        raise SchemaError(f"{data} does not fit the schema {schema} ({len(problems)} "
                          f"problem{'s' if len(problems) > 1 else ''}; `fedforest check "
                          f"--data {data} --schema {schema}` says the same):\n  "
                          f"{listed}") from first
    if y is None:
        raise SchemaError(f"{data}: the table has no target column")
    return np.asarray(X, dtype=np.float64), np.asarray(y)

