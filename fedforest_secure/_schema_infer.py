"""A schema taken from in-process data.

Bounds are each continuous feature's (and a regression target's) minimum and maximum, levels and
classes the sorted distinct labels: this discloses the pooled data, so it serves the in-process
scikit-learn facade only (:meth:`~fedforest_secure.schema.Schema.infer`, which documents it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from ._cells import _canon, _label_sort_key, _numeric_column
from .errors import SchemaError


def inferred_schema(
    X: ArrayLike,
    y: ArrayLike,
    feature_names: Sequence[str] | None = None,
    task: Literal["regression", "classification"] = "regression",
    categorical: Sequence[int | str] | None = None,
) -> dict[str, Any]:
    """The schema mapping (``features`` and ``target``) read from ``X`` and ``y``."""
    Xa = np.asarray(X)
    ya = np.asarray(y)
    if Xa.ndim != 2 or Xa.shape[0] == 0 or Xa.shape[1] == 0:
        raise SchemaError(f"X must be a non-empty 2-D array, got shape {Xa.shape}")
    if ya.ndim != 1 or ya.shape[0] != Xa.shape[0]:
        raise SchemaError(f"y must have shape ({Xa.shape[0]},), got {ya.shape}")
    d = Xa.shape[1]
    names = [f"x{j}" for j in range(d)] if feature_names is None else list(feature_names)
    if len(names) != d:
        raise SchemaError(f"feature_names has {len(names)} names for {d} columns")
    cat: set[int] = set()
    for c in categorical or ():
        if isinstance(c, str):
            if c not in names:
                raise SchemaError(f"categorical: unknown feature {c!r}")
            cat.add(names.index(c))
        elif isinstance(c, int | np.integer) and 0 <= int(c) < d:
            cat.add(int(c))
        else:
            raise SchemaError(f"categorical: bad feature index {c!r}")
    feats: list[dict[str, Any]] = []
    for j, name in enumerate(names):
        col = Xa[:, j]
        if j in cat:
            levels = sorted({_canon(v) for v in col}, key=_label_sort_key)
            feats.append({"name": name, "kind": "categorical", "levels": levels})
        else:
            vals = _numeric_column(col, name)
            lo, hi = float(vals.min()), float(vals.max())
            if lo == hi:
                hi = lo + 1.0
            feats.append({"name": name, "kind": "continuous", "bounds": (lo, hi)})
    target: dict[str, Any] = {"name": "y", "kind": task}
    if task == "classification":
        target["classes"] = sorted({_canon(v) for v in ya}, key=_label_sort_key)
    elif task == "regression":
        yv = _numeric_column(ya, "y")
        lo, hi = float(yv.min()), float(yv.max())
        target["bounds"] = (lo, hi if hi > lo else lo + 1.0)
    else:
        raise SchemaError(f"task must be 'regression' or 'classification', got {task!r}")
    return {"features": feats, "target": target}
