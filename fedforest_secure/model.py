"""The trained forest: prediction and a JSON file format that round-trips exactly.

Each tree is a set of parallel arrays indexed by node id (root = 0):

* ``kind``: 0 leaf, 1 numeric split ``x[feature] <= threshold`` goes left, 2 categorical split
  (levels in the node's set go left), 3 client split (clients in the node's set go left);
* ``feature``, ``threshold``, ``left``, ``right``;
* ``sets``: for kinds 2 and 3, the levels or client indices that go left;
* ``value``: the leaf value, the mean of y (regression) or class proportions (classification).

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

from .errors import SchemaError

__all__ = ["ForestModel", "Tree"]

FORMAT = "fedforest-secure/model/v1"


@dataclass
class Tree:
    kind: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray  # (n_nodes, n_outputs)
    n: np.ndarray  # weighted training rows per node
    sets: dict[int, list[int]] = field(default_factory=dict)

    @property
    def n_nodes(self) -> int:
        return int(self.kind.size)

    @property
    def depth(self) -> int:
        depth = np.zeros(self.n_nodes, dtype=np.int64)
        for i in range(self.n_nodes):
            if self.kind[i] != 0:
                depth[self.left[i]] = depth[self.right[i]] = depth[i] + 1
        return int(depth.max()) if depth.size else 0

    def apply(self, X: np.ndarray, client: np.ndarray | None) -> np.ndarray:
        """Leaf id of every row."""
        node = np.zeros(X.shape[0], dtype=np.int64)
        if self.n_nodes == 0:
            return node
        tables: dict[int, np.ndarray] = {}
        for nd, members in self.sets.items():
            size = max(max(members, default=0) + 1, 1)
            tab = np.zeros(size, dtype=bool)
            tab[members] = True
            tables[nd] = tab
        while True:
            k = self.kind[node]
            active = k != 0
            if not active.any():
                return node
            go_left = np.zeros(node.size, dtype=bool)
            num = k == 1
            if num.any():
                idx = np.flatnonzero(num)
                go_left[idx] = X[idx, self.feature[node[idx]]] <= self.threshold[node[idx]]
            for kind_code in (2, 3):
                sel = np.flatnonzero(k == kind_code)
                if not sel.size:
                    continue
                if kind_code == 3 and client is None:
                    raise ValueError("this forest splits on the client indicator H: "
                                     "pass client= to predict")
                for nd in np.unique(node[sel]):
                    rows = sel[node[sel] == nd]
                    vals = (X[rows, self.feature[nd]] if kind_code == 2 else client[rows])  # type: ignore[index]
                    vals = vals.astype(np.int64)
                    tab = tables[int(nd)]
                    inside = (vals >= 0) & (vals < tab.size)
                    go_left[rows] = inside & tab[np.clip(vals, 0, tab.size - 1)]
            node = np.where(active, np.where(go_left, self.left[node], self.right[node]), node)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.tolist(), "feature": self.feature.tolist(),
            "threshold": [float(t) for t in self.threshold], "left": self.left.tolist(),
            "right": self.right.tolist(), "value": self.value.tolist(), "n": self.n.tolist(),
            "sets": {str(k): list(map(int, v)) for k, v in self.sets.items()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tree:
        thr = np.array([float(t) for t in d["threshold"]], dtype=np.float64)
        return cls(
            kind=np.asarray(d["kind"], dtype=np.int64),
            feature=np.asarray(d["feature"], dtype=np.int64),
            threshold=thr,
            left=np.asarray(d["left"], dtype=np.int64),
            right=np.asarray(d["right"], dtype=np.int64),
            value=np.asarray(d["value"], dtype=np.float64).reshape(len(d["kind"]), -1),
            n=np.asarray(d["n"], dtype=np.float64),
            sets={int(k): list(v) for k, v in d.get("sets", {}).items()},
        )


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
        return any((t.kind == 3).any() for t in self.trees)

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
