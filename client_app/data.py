"""Load and validate the site's table against the federation's schema, before any network I/O."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from fedforest_secure.errors import SchemaError
from fedforest_secure.schema import Schema

__all__ = ["load_site_table", "schema_sha256"]


def schema_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_text().encode()).hexdigest()


def load_site_table(data: Path, schema: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` of the site's CSV, validated against ``schema`` (a :class:`SchemaError`)."""
    sch = Schema.load(schema)
    X, y, _client = sch.read_csv(data)
    if y is None:
        raise SchemaError(f"{data}: the table has no target column")
    return np.asarray(X, dtype=np.float64), np.asarray(y)

