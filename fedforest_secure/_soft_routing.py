"""Soft routing at prediction: a row near a split's threshold is shared between its children.

A random-split forest under differential privacy has small leaves whose released counts carry
noise of several rows (docs/privacy.md §2.6). Soft routing is post-processing of that released
forest (no budget, no round): at a numeric split on feature ``f`` with threshold ``t``, a row
``x`` goes left with probability

    p = clip(1/2 + (F_f(t) - F_f(x)) / (2 w), 0, 1)

where ``F_f`` is the feature's released marginal CDF (the piecewise-linear CDF on fixed-width
bins of the public bounds that the thresholds were drawn from,
:func:`~fedforest_secure._random_splits.marginal_cdf`) and ``w`` the routing width, a share of
the federation's rows. A row more than ``w`` of the rows away from the threshold goes where
the split sends it; a nearer row is shared between both children, so a tree's value for it is
``sum over leaves of P(leaf) * value(leaf)``, an average over the leaves around it, whose noise
is partly independent. A missing value (NaN) goes where the split's ``missing_left`` says.

Only numeric splits can be soft (random splits are all numeric); :class:`SoftRouting` refuses
a tree with any other split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._random_splits import cdf_edges
from ._tree import NodeKind, Tree

__all__ = ["SoftRouting"]


@dataclass(frozen=True)
class SoftRouting:
    """How a forest's numeric splits route a row softly (module docstring).

    Parameters
    ----------
    width : the routing width ``w`` in (0, 1], a share of the rows
    bounds : (d, 2) the public bounds of every feature (the fixed-width bins' range)
    cdf : (d, nb + 1) every feature's released marginal CDF at its bins' edges, from 0 to 1
    """

    width: float
    bounds: np.ndarray
    cdf: np.ndarray

    def __post_init__(self) -> None:
        bounds = np.asarray(self.bounds, dtype=np.float64)
        cdf = np.asarray(self.cdf, dtype=np.float64)
        if not 0.0 < float(self.width) <= 1.0:
            raise ValueError(f"the routing width must be in (0, 1], got {self.width!r}")
        if bounds.ndim != 2 or bounds.shape[1] != 2 or cdf.ndim != 2 or \
                cdf.shape[0] != bounds.shape[0] or cdf.shape[1] < 2:
            raise ValueError("routing needs bounds of shape (d, 2) and a CDF of shape "
                             "(d, nb + 1) with nb >= 1")
        if not (np.isfinite(bounds).all() and np.isfinite(cdf).all()) or \
                (bounds[:, 1] < bounds[:, 0]).any() or (np.diff(cdf, axis=1) < 0).any():
            raise ValueError("routing bounds must be finite with lo <= hi, and each CDF "
                             "finite and non-decreasing")
        object.__setattr__(self, "width", float(self.width))
        object.__setattr__(self, "bounds", bounds)
        object.__setattr__(self, "cdf", cdf)

    @property
    def n_features(self) -> int:
        return int(self.bounds.shape[0])

    def edges(self) -> np.ndarray:
        """(d, nb + 1) the bins' edges on every feature's public range."""
        return cdf_edges(self.bounds, self.cdf.shape[1] - 1)

    def positions(self, X: np.ndarray) -> np.ndarray:
        """(n, d) ``F_f(X[:, f])`` for every feature: 0 below its range, 1 above, NaN where
        ``X`` is missing."""
        edges = self.edges()
        out = np.full(X.shape, np.nan)
        for f in range(X.shape[1]):
            col = X[:, f]
            ok = ~np.isnan(col)
            out[ok, f] = _cdf_at(col[ok], edges[f], self.cdf[f])
        return out

    def threshold_positions(self, tree: Tree) -> np.ndarray:
        """(n_nodes,) ``F_f(t)`` of every split node's threshold (0 at the leaves)."""
        edges = self.edges()
        out = np.zeros(tree.n_nodes)
        split = tree.kind == NodeKind.NUMERIC
        for f in np.unique(tree.feature[split]):
            at = split & (tree.feature == f)
            out[at] = _cdf_at(tree.threshold[at], edges[f], self.cdf[f])
        return out

    def check(self, tree: Tree) -> None:
        """Raise ValueError unless every split of ``tree`` is numeric, on a known feature."""
        inner = tree.kind != NodeKind.LEAF
        if (tree.kind[inner] != NodeKind.NUMERIC).any():
            raise ValueError("soft routing applies to numeric splits only: this forest has "
                             "categorical or client splits")
        if inner.any() and int(tree.feature[inner].max()) >= self.n_features:
            raise ValueError("a split names a feature the routing has no CDF for")

    def tree_values(self, tree: Tree, Z: np.ndarray) -> np.ndarray:
        """(n, n_outputs) the tree's value for every row: its leaves' values weighted by the
        rows' probabilities of reaching them. ``Z`` is :meth:`positions` of the rows.

        The tree is walked a depth at a time with every (row, node, probability) of the
        depth in three arrays: a row goes to one child, or to both where its share of the
        left child is strictly between 0 and 1. A leaf keeps its rows (its "left child" is
        itself, with share 1) until every row has reached a leaf.
        """
        n = Z.shape[0]
        out = np.zeros((n, tree.value.shape[1]))
        if tree.n_nodes == 0:
            return out
        leaf = tree.kind == NodeKind.LEAF
        itself = np.arange(tree.n_nodes)
        go_left = np.where(leaf, itself, tree.left)
        go_right = np.where(leaf, itself, tree.right)
        feature = np.where(leaf, 0, tree.feature)
        at = np.where(leaf, np.inf, self.threshold_positions(tree))
        nan_share = np.where(leaf | tree.missing_goes_left(), 1.0, 0.0)
        half = 0.5 / self.width
        zt = np.ascontiguousarray(Z.T).ravel()  # feature-major: a node's rows read one column
        rows, nodes, p = np.arange(n), np.zeros(n, dtype=np.int64), np.ones(n)
        while not leaf[nodes].all():
            z = zt[feature[nodes] * n + rows]
            share = np.clip(0.5 + (at[nodes] - z) * half, 0.0, 1.0)
            share = np.where(np.isnan(z), nan_share[nodes], share)
            both = np.flatnonzero((share > 0.0) & (share < 1.0))
            to_left = share > 0.0
            extra = (rows[both], go_right[nodes[both]], p[both] * (1.0 - share[both]))
            nodes = np.where(to_left, go_left[nodes], go_right[nodes])
            p = p * np.where(to_left, share, 1.0 - share)
            if both.size:
                rows = np.concatenate([rows, extra[0]])
                nodes = np.concatenate([nodes, extra[1]])
                p = np.concatenate([p, extra[2]])
        for j in range(out.shape[1]):
            out[:, j] = np.bincount(rows, weights=p * tree.value[nodes, j], minlength=n)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"width": self.width, "bounds": self.bounds.tolist(), "cdf": self.cdf.tolist()}

    @classmethod
    def from_dict(cls, d: Any) -> SoftRouting:
        if not isinstance(d, dict) or not {"width", "bounds", "cdf"} <= set(d):
            raise ValueError("a routing entry needs width, bounds and cdf")
        return cls(width=float(d["width"]), bounds=np.asarray(d["bounds"], dtype=np.float64),
                   cdf=np.asarray(d["cdf"], dtype=np.float64))


def _cdf_at(x: np.ndarray, edges: np.ndarray, cdf: np.ndarray) -> np.ndarray:
    """The piecewise-linear CDF through ``(edges, cdf)`` at ``x``: 0 below, 1 above (a
    degenerate range, lo == hi: 0 below, 1 from lo on)."""
    if edges[-1] > edges[0]:
        out: np.ndarray = np.interp(x, edges, cdf, left=0.0, right=1.0)
        return out
    return np.where(x < edges[0], 0.0, 1.0)
