"""The trained forest: prediction and a JSON file format that round-trips exactly.

Each tree is a :class:`~fedforest_secure._tree.Tree`: parallel arrays indexed by node id, the
node kinds stored as their :class:`~fedforest_secure._tree.NodeKind` codes (0 leaf, 1 numeric,
2 categorical, 3 client split).

Floats are written with ``repr`` precision (JSON numbers from Python floats round-trip exactly),
so a loaded model predicts bit-for-bit the same.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._tree import Tree
from .errors import SchemaError

__all__ = ["ForestModel", "Tree"]

FORMAT = "fedforest-secure/model/v1"


@dataclass
class ForestModel:
    """A trained forest, independent of how it was trained."""

    task: str
    n_features: int
    n_classes: int
    trees: list[Tree]
    n_clients: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def uses_client(self) -> bool:
        return any(t.uses_client for t in self.trees)

    def _check(self, X: Any, client: Any) -> tuple[np.ndarray, np.ndarray | None]:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise SchemaError(f"X must have shape (n, {self.n_features}), got {X.shape}")
        if client is not None:
            client = np.asarray(client)
            if client.shape != (X.shape[0],):
                raise SchemaError("client must have one entry per row")
            if self.uses_client and ((client < 0) | (client >= self.n_clients)).any():
                raise SchemaError(f"client indices must be in [0, {self.n_clients})")
        return X, client

    def predict_values(self, X: Any, client: Any = None) -> np.ndarray:
        """Average of the trees' leaf values: shape (n, 1) or (n, C)."""
        X, client = self._check(X, client)
        out = np.zeros((X.shape[0], 1 if self.task == "regression" else self.n_classes))
        for tree in self.trees:
            out += tree.value[tree.apply(X, client)]
        return out / max(len(self.trees), 1)

    def predict(self, X: Any, client: Any = None) -> np.ndarray:
        v = self.predict_values(X, client)
        return v[:, 0] if self.task == "regression" else np.argmax(v, axis=1)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "task": self.task, "n_features": self.n_features,
                "n_classes": self.n_classes, "n_clients": self.n_clients, "meta": self.meta,
                "trees": [t.to_dict() for t in self.trees]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> ForestModel:
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        return cls(task=d["task"], n_features=int(d["n_features"]), n_classes=int(d["n_classes"]),
                   n_clients=int(d.get("n_clients", 0)), meta=dict(d.get("meta", {})),
                   trees=[Tree.from_dict(t) for t in d["trees"]])

    def digest(self) -> str:
        """SHA-256 of the canonical JSON (what the audit log records)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> ForestModel:
        return cls.from_json(Path(path).read_text())
