"""Tree arrays shared by the model, the worker and the coordinator.

A tree is a set of parallel arrays indexed by node id (root = 0):

* ``kind``: a :class:`NodeKind` code per node;
* ``feature``, ``threshold``: the split of a numeric node (``x[feature] <= threshold`` goes
  left) and the feature of a categorical node;
* ``left``, ``right``: the children's node ids (-1 for a leaf);
* ``sets``: for categorical and client splits, the levels or client indices that go left;
* ``value``: the node value, the mean of y (regression) or class proportions
  (classification); ``n``: the weighted training rows of the node;
* ``gain``: the split's weighted impurity decrease (0 for a leaf and for data-independent
  random splits), what feature importances add up; absent in model files written before it.
* ``impurity``: the node's impurity (variance, Gini or entropy in bits, as scikit-learn's
  ``tree_.impurity``) from the same aggregated statistics as its value; the mean decrease in
  impurity (``feature_importances_``) is read off it;
* ``missing_left``: where a split node sends a row whose feature is missing (NaN): learned
  from the rows that were missing at the node, else the child with more training rows.

``impurity`` and ``missing_left`` are None in model files that predate them; such a tree
sends a missing value to the child with the larger ``n`` (scikit-learn's rule for a feature
without missing values at training).

The :class:`NodeKind` codes are what the model file stores and what routing tasks carry
(``route_kind``), so their integer values are part of both formats.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["NodeKind", "Tree", "TreeBuilder"]


class NodeKind(enum.IntEnum):
    """What a node does with a row; the values are the codes of the model file and the wire."""

    LEAF = 0
    #: ``x[feature] <= threshold`` goes left
    NUMERIC = 1
    #: the levels in the node's set go left
    CATEGORICAL = 2
    #: the clients in the node's set go left (a split on the client indicator H)
    CLIENT = 3

    @property
    def label(self) -> str:
        """The kind's name in the audit log's split decisions ("numeric", "categorical", ...)."""
        return self.name.lower()


#: a categorical split's level indices stay below this (a file naming level 10^13 would have
#: predict allocate terabytes; no table has a million levels in one feature)
MAX_LEVELS = 1 << 20


@dataclass
class Tree:
    """One trained tree as parallel per-node arrays (module docstring)."""

    kind: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray  # (n_nodes, n_outputs)
    n: np.ndarray  # weighted training rows per node
    sets: dict[int, list[int]] = field(default_factory=dict)
    gain: np.ndarray | None = None  # weighted impurity decrease per split node
    impurity: np.ndarray | None = None  # (n_nodes,) node impurity
    missing_left: np.ndarray | None = None  # (n_nodes,) bool: a missing value goes left

    def missing_goes_left(self) -> np.ndarray:
        """(n_nodes,) bool: where each split node sends a missing value (module docstring)."""
        if self.missing_left is not None:
            return self.missing_left.astype(bool)
        out = np.zeros(self.n_nodes, dtype=bool)
        inner = np.flatnonzero(self.kind != NodeKind.LEAF)
        out[inner] = self.n[self.left[inner]] > self.n[self.right[inner]]
        return out

    @property
    def n_nodes(self) -> int:
        return int(self.kind.size)

    @property
    def depth(self) -> int:
        """The number of levels below the root: one pass per level over its inner nodes."""
        if self.n_nodes == 0:
            return 0
        inner = self.kind != NodeKind.LEAF
        level, frontier = 0, np.zeros(1, dtype=np.int64)
        while True:
            split = frontier[inner[frontier]]
            if split.size == 0:
                return level
            frontier = np.concatenate([self.left[split], self.right[split]]).astype(np.int64)
            level += 1

    @property
    def uses_client(self) -> bool:
        """Whether some node splits on the client indicator H."""
        return bool((self.kind == NodeKind.CLIENT).any())

    def apply(self, X: np.ndarray, client: np.ndarray | None) -> np.ndarray:
        """Leaf id of every row (a missing value, NaN, goes where :meth:`missing_goes_left`
        says)."""
        return self._walk(X, client, None)

    def decision_path(self, X: np.ndarray, client: np.ndarray | None
                      ) -> tuple[np.ndarray, np.ndarray]:
        """The nodes every row passes through, root and leaf included: ``(rows, nodes)``,
        one entry per (row, node) visited."""
        steps: list[tuple[np.ndarray, np.ndarray]] = []
        self._walk(X, client, steps)
        if not steps:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return (np.concatenate([r for r, _ in steps]), np.concatenate([n for _, n in steps]))

    def _walk(self, X: np.ndarray, client: np.ndarray | None,
              steps: list[tuple[np.ndarray, np.ndarray]] | None) -> np.ndarray:
        node = np.zeros(X.shape[0], dtype=np.int64)
        if self.n_nodes == 0:
            return node
        if steps is not None:
            steps.append((np.arange(X.shape[0]), node.copy()))
        nan_left = self.missing_goes_left()
        tables: dict[int, np.ndarray] = {}
        for nd, members in self.sets.items():
            size = max(max(members, default=0) + 1, 1)
            tab = np.zeros(size, dtype=bool)
            tab[members] = True
            tables[nd] = tab
        while True:
            k = self.kind[node]
            active = k != NodeKind.LEAF
            if not active.any():
                return node
            go_left = np.zeros(node.size, dtype=bool)
            num = k == NodeKind.NUMERIC
            if num.any():
                idx = np.flatnonzero(num)
                x = X[idx, self.feature[node[idx]]]
                go_left[idx] = np.where(np.isnan(x), nan_left[node[idx]],
                                        x <= self.threshold[node[idx]])
            for kind in (NodeKind.CATEGORICAL, NodeKind.CLIENT):
                sel = np.flatnonzero(k == kind)
                if not sel.size:
                    continue
                if kind == NodeKind.CLIENT and client is None:
                    raise ValueError("this forest splits on the client indicator H: "
                                     "pass client= to predict")
                for nd in np.unique(node[sel]):
                    at = sel[node[sel] == nd]
                    missing = np.zeros(at.size, dtype=bool)
                    if kind == NodeKind.CATEGORICAL:
                        raw = X[at, self.feature[nd]]
                        missing = np.isnan(raw)
                        vals = np.where(missing, -1, raw).astype(np.int64)
                    else:
                        vals = np.asarray(client)[at].astype(np.int64)
                    tab = tables[int(nd)]
                    inside = (vals >= 0) & (vals < tab.size)
                    go_left[at] = np.where(missing, nan_left[nd],
                                           inside & tab[np.clip(vals, 0, tab.size - 1)])
            node = np.where(active, np.where(go_left, self.left[node], self.right[node]), node)
            if steps is not None:
                moved = np.flatnonzero(active)
                steps.append((moved, node[moved]))

    def check(self, n_features: int, n_clients: int, *, name: str = "the tree") -> None:
        """Raise ValueError, naming ``name`` and the node, unless the arrays fit together
        and with a forest of ``n_features`` features and ``n_clients`` sites: one entry per
        node in each array, a split's children are nodes after it (so every walk ends at a
        leaf), a leaf's are -1, every node has one parent, a numeric or categorical split's
        feature is one of the forest's, numeric thresholds are numbers (+inf allowed),
        values and row counts are finite, and every categorical or client split has its
        set: level indices, or indices of the forest's sites. A tree that passed for these
        counts is not checked again (a model is rebuilt around the same trees by
        ``dataclasses.replace``; trees are not changed in place)."""
        if getattr(self, "_checked_for", None) == (n_features, n_clients):
            return
        size = self.n_nodes
        if self.kind.ndim != 1:
            raise ValueError(f"{name}: kind must be a list of node kinds")
        arrays = {"feature": self.feature, "threshold": self.threshold, "left": self.left,
                  "right": self.right, "n": self.n, "gain": self.gain,
                  "impurity": self.impurity, "missing_left": self.missing_left}
        for field_name, arr in arrays.items():
            if arr is not None and arr.shape != (size,):
                raise ValueError(f"{name}: {field_name} has {arr.size} entries, kind has {size}")
        if self.value.ndim != 2 or self.value.shape[0] != size:
            raise ValueError(f"{name}: value has {self.value.shape[0]} rows, kind has {size}")
        inner = np.flatnonzero(self.kind != NodeKind.LEAF)
        leaves = np.flatnonzero(self.kind == NodeKind.LEAF)
        for side, child in (("left", self.left), ("right", self.right)):
            bad = inner[(child[inner] <= inner) | (child[inner] >= size)]
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"{name}, node {i}: {side} child {int(child[i])} is not a node "
                                 f"after it (the tree has {size} nodes)")
            bad = leaves[child[leaves] != -1]
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"{name}, node {i}: a leaf's {side} child is "
                                 f"{int(child[i])}, not -1 (a leaf has no children)")
        kids = np.concatenate([self.left[inner], self.right[inner]])
        seen = np.bincount(kids, minlength=size) if kids.size else np.zeros(size, np.intp)
        if (seen > 1).any():  # a walk from the root would visit it (and below) twice
            i = int(np.flatnonzero(seen > 1)[0])
            raise ValueError(f"{name}, node {i}: the child of two splits (a node has one "
                             "parent)")
        on_feature = inner[self.kind[inner] != NodeKind.CLIENT]
        bad = on_feature[(self.feature[on_feature] < 0)
                         | (self.feature[on_feature] >= n_features)]
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"{name}, node {i}: feature {int(self.feature[i])} is not one of "
                             f"the forest's {n_features} features")
        numeric = inner[self.kind[inner] == NodeKind.NUMERIC]
        bad = numeric[np.isnan(self.threshold[numeric])]
        if bad.size:
            raise ValueError(f"{name}, node {int(bad[0])}: threshold nan is not a number")
        for field_name, arr in (("value", self.value), ("n", self.n)):
            finite = np.isfinite(arr).reshape(size, -1).all(axis=1)
            if not finite.all():
                raise ValueError(f"{name}: {field_name} is not finite at node "
                                 f"{int(np.argmin(finite))}")
        split_sets = inner[self.kind[inner] != NodeKind.NUMERIC]
        on_client = (self.kind[split_sets] == NodeKind.CLIENT).tolist()
        for i, client in zip(split_sets.tolist(), on_client, strict=True):
            what = "site" if client else "level"
            members = self.sets.get(i)
            if members is None:
                raise ValueError(f"{name}, node {i}: a {'client' if client else 'categorical'} "
                                 f"split without its set of {what}s")
            if not members:
                continue
            # the members' types and range by C-level passes (forests of many categorical
            # splits are loaded in a fraction of a second)
            if any(t is bool or not issubclass(t, int | np.integer)
                   for t in set(map(type, members))):
                m = next(m for m in members
                         if isinstance(m, bool) or not isinstance(m, int | np.integer))
                raise ValueError(f"{name}, node {i}: {what} {m!r} is not a {what} index")
            low, high = min(members), max(members)
            if low < 0:
                raise ValueError(f"{name}, node {i}: {what} {low!r} is not a {what} index")
            if client and high >= n_clients:
                raise ValueError(f"{name}, node {i}: site {high} is not one of the forest's "
                                 f"{n_clients} sites")
            if not client and high >= MAX_LEVELS:
                raise ValueError(f"{name}, node {i}: level {high} is beyond the "
                                 f"{MAX_LEVELS} levels a categorical feature may have")
        self._checked_for = (n_features, n_clients)

    def to_dict(self) -> dict[str, Any]:
        """The tree's entry in a model file (thresholds may be +inf: a split of the present
        values from the missing ones, written as the string "inf")."""
        out: dict[str, Any] = {
            "kind": self.kind.tolist(), "feature": self.feature.tolist(),
            "threshold": [json_float(t) for t in self.threshold], "left": self.left.tolist(),
            "right": self.right.tolist(), "value": self.value.tolist(), "n": self.n.tolist(),
            "sets": {str(k): list(map(int, v)) for k, v in self.sets.items()},
            **({} if self.gain is None else {"gain": [float(g) for g in self.gain]}),
        }
        if self.impurity is not None:
            out["impurity"] = [float(v) for v in self.impurity]
        if self.missing_left is not None:
            out["missing_left"] = [bool(v) for v in self.missing_left]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tree:
        """The tree of a model file's entry.

        Raises
        ------
        ValueError
            A node kind that is not a :class:`NodeKind` code, a kind, feature or child that
            is not an integer of int64's range, a threshold that is not a number (``"inf"``
            and ``"nan"`` are read as numbers), ``sets`` that is not a mapping of node ids to
            lists of indices.
        """
        kind = _indices(d, "kind")
        known = np.array([k.value for k in NodeKind])
        if not np.isin(kind, known).all():
            bad = sorted(set(kind.tolist()) - set(known.tolist()))
            raise ValueError(f"unknown node kind codes {bad} in the model file")
        thr = np.array([_threshold(t, k) for k, t in enumerate(d["threshold"])],
                       dtype=np.float64)
        size = len(d["kind"])
        impurity = missing_left = None
        if "impurity" in d:
            impurity = np.asarray(d["impurity"], dtype=np.float64).reshape(size)
        if "missing_left" in d:
            missing_left = np.asarray(d["missing_left"], dtype=bool).reshape(size)
        return cls(
            kind=kind,
            feature=_indices(d, "feature"),
            threshold=thr,
            left=_indices(d, "left"),
            right=_indices(d, "right"),
            value=np.asarray(d["value"], dtype=np.float64).reshape(len(d["kind"]), -1),
            n=np.asarray(d["n"], dtype=np.float64),
            sets=_sets(d.get("sets", {})),
            gain=(np.array([float(g) for g in d["gain"]], dtype=np.float64)
                  if "gain" in d else None),
            impurity=impurity, missing_left=missing_left,
        )


def _indices(d: dict[str, Any], name: str) -> np.ndarray:
    """A model file's array of node kinds, features or children: a list of integers of
    int64's range; anything else raises ValueError naming the field and the node."""
    values = d[name]
    if not isinstance(values, list):
        raise ValueError(f"{name} must be a list of integers, got "
                         f"{json.dumps(values, default=repr)[:40]}")
    # the types by one C-level pass (a forest's arrays have many thousands of entries)
    if any(t is bool or not issubclass(t, int) for t in set(map(type, values))) or any(
            v < _INT64_MIN or v > _INT64_MAX for v in (min(values, default=0),
                                                       max(values, default=0))):
        node, v = next((i, v) for i, v in enumerate(values)
                       if isinstance(v, bool) or not isinstance(v, int)
                       or not _INT64_MIN <= v <= _INT64_MAX)
        raise ValueError(f"node {node}: {name} {json.dumps(v, default=repr)[:40]} is not an "
                         "integer of int64's range")
    return np.array(values, dtype=np.int64)


def _sets(raw: Any) -> dict[int, list[Any]]:
    """A model file's ``sets``: node id (a decimal string, JSON's keys being text) to the
    list of a categorical split's levels or a client split's sites (their range is checked
    by :meth:`Tree.check`); anything else raises ValueError naming the field."""
    if not isinstance(raw, dict):
        raise ValueError(f"sets must be a mapping of node ids to lists, got "
                         f"{json.dumps(raw, default=repr)[:40]}")
    out: dict[int, list[Any]] = {}
    for key, members in raw.items():
        if not (isinstance(key, str) and key.isdecimal() and len(key) <= 18):
            raise ValueError(f"sets: {key!r} is not a node id")
        if not isinstance(members, list):
            raise ValueError(f"sets, node {key}: {json.dumps(members, default=repr)[:40]} is "
                             "not a list of indices")
        out[int(key)] = members
    return out


_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


def _threshold(t: Any, node: int) -> float:
    """A model file's threshold: a number, or its text ("inf", as :func:`json_float` writes
    it); anything else raises ValueError naming the node."""
    if not isinstance(t, bool) and isinstance(t, int | float | str):
        try:
            return float(t)
        except ValueError:
            pass
    raise ValueError(f"node {node}: threshold {json.dumps(t, default=repr)} is not a number")


def json_float(v: float) -> float | str:
    """A threshold as JSON: a number, or "inf" (JSON has no infinity; ``float("inf")``
    reads it back)."""
    v = float(v)
    return "inf" if v == np.inf else v


class TreeBuilder:
    """A tree grown node by node (the coordinator's side), frozen into a :class:`Tree`."""

    def __init__(self, n_out: int) -> None:
        self.kind: list[int] = []
        self.feature: list[int] = []
        self.threshold: list[float] = []
        self.left: list[int] = []
        self.right: list[int] = []
        self.value: list[np.ndarray] = []
        self.n: list[float] = []
        self.gain: list[float] = []
        self.impurity: list[float] = []
        self.missing_left: list[bool] = []
        self.sets: dict[int, list[int]] = {}
        self.n_out = n_out
        # the value of a new leaf until one is set (values are replaced, never written into)
        self._zero = np.zeros(n_out)
        self._zero.setflags(write=False)

    def add(self) -> int:
        """A new leaf; returns its node id."""
        self.kind.append(NodeKind.LEAF)
        self.feature.append(-1)
        self.threshold.append(0.0)
        self.left.append(-1)
        self.right.append(-1)
        self.value.append(self._zero)
        self.n.append(0.0)
        self.gain.append(0.0)
        self.impurity.append(0.0)
        self.missing_left.append(False)
        return len(self.kind) - 1

    def add_children(self) -> tuple[int, int]:
        """Two new leaves (a split's children); returns their node ids."""
        n = len(self.kind)
        self.kind += (NodeKind.LEAF, NodeKind.LEAF)
        self.feature += (-1, -1)
        self.threshold += (0.0, 0.0)
        self.left += (-1, -1)
        self.right += (-1, -1)
        self.value += (self._zero, self._zero)
        self.n += (0.0, 0.0)
        self.gain += (0.0, 0.0)
        self.impurity += (0.0, 0.0)
        self.missing_left += (False, False)
        return n, n + 1

    def build(self) -> Tree:
        return Tree(kind=np.array(self.kind, dtype=np.int64),
                    feature=np.array(self.feature, dtype=np.int64),
                    threshold=np.array(self.threshold, dtype=np.float64),
                    left=np.array(self.left, dtype=np.int64),
                    right=np.array(self.right, dtype=np.int64),
                    value=np.array(self.value, dtype=np.float64).reshape(len(self.kind), -1),
                    n=np.array(self.n, dtype=np.float64), sets=dict(self.sets),
                    gain=np.array(self.gain, dtype=np.float64),
                    impurity=np.array(self.impurity, dtype=np.float64),
                    missing_left=np.array(self.missing_left, dtype=bool))
