"""Random (data-independent) splits and node values from the leaves' totals (``method="random"``).

Every node splits on one feature drawn at random (the first of its sampled features) at a
threshold drawn uniformly inside the node's public box (the schema bounds intersected with its
ancestors' splits). The structure therefore depends on the seed and the public bounds only, and
under differential privacy the whole budget goes to one release: the leaves' node totals at the
last level (:func:`~fedforest_secure.privacy.allocation.job_noise`).

Node values are post-processing of those totals (:func:`values_from_leaves`): an internal node's
statistics are the sums of its leaves', and a node whose count (for classification: of its class
counts clipped at 0) is below a threshold (too small to trust, or too noisy) takes the value of
its nearest ancestor that is not, the root falling back to uniform class proportions
(classification) or 0 (regression; the estimator centres y).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from . import _impurity, _splits

__all__ = ["random_splits", "values_from_leaves"]


class _Builder(Protocol):
    left: list[int]
    right: list[int]
    value: list[np.ndarray]
    n: list[float]
    impurity: list[float]


def random_splits(rng: np.random.Generator, feats: np.ndarray, box_lo: np.ndarray,
                  box_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Feature and threshold per node: the node's first sampled feature, a threshold uniform in
    its box on that feature (the middle when the box is a point).

    Parameters
    ----------
    feats : (n_nodes, m) sampled features
    box_lo, box_hi : (n_nodes, d) the nodes' boxes

    Returns
    -------
    feature (n_nodes,), threshold (n_nodes,)
    """
    n_nodes = feats.shape[0]
    feature = feats[:, 0].astype(np.int64)
    rows = np.arange(n_nodes)
    lo, hi = box_lo[rows, feature], box_hi[rows, feature]
    u = rng.random(n_nodes)
    threshold = np.where(hi > lo, lo + u * (hi - lo), lo)
    return feature, threshold


def values_from_leaves(trees: Sequence[Any], leaf_tree: np.ndarray, leaf_node: np.ndarray,
                       leaf_totals: np.ndarray, task: str, min_count: float,
                       bound: float | None = None, criterion: str = "gini") -> None:
    """Set every node's value, count and impurity in ``trees`` from the leaves' (noisy)
    totals (``criterion``: the impurity's, for classification).

    Parameters
    ----------
    trees : tree builders (nodes added parent first: a child's id exceeds its parent's)
    leaf_tree, leaf_node : (L,) the leaves' tree index and node id
    leaf_totals : (L, S) their statistics (class counts, or n, sum y, sum y**2)
    min_count : a node whose count is below this takes its nearest trusted ancestor's value
    bound : regression values are clipped to ``[-bound, bound]`` (the public target bound)
    """
    S = leaf_totals.shape[1]
    n_out = 1 if task == "regression" else S
    prior = np.zeros(n_out) if task == "regression" else np.full(n_out, 1.0 / n_out)
    for t, tb in enumerate(trees):
        b: _Builder = tb
        size = len(b.left)
        stats = np.zeros((size, S))
        mine = leaf_tree == t
        stats[leaf_node[mine]] = leaf_totals[mine]
        parent = np.full(size, -1, dtype=np.int64)
        for node in range(size - 1, -1, -1):  # children after parents: sum bottom-up
            left, right = b.left[node], b.right[node]
            if left >= 0:
                stats[node] = stats[left] + stats[right]
                parent[left] = parent[right] = node
        vals = _impurity.node_values(stats, task)
        if task == "classification":  # noisy class counts clipped at 0, then normalised
            n = np.maximum(stats, 0.0).sum(axis=1)
        else:
            n = _impurity.counts_of(stats, task)
        if task == "regression" and bound is not None:
            vals = np.clip(vals, -bound, bound)
        clean = _splits.clean_noisy_groups(stats, task, bound)
        imp = _impurity.impurity(clean, task, "mse" if task == "regression" else criterion)
        for node in range(size):  # parents first: top-down fallback
            if n[node] >= min_count and np.isfinite(vals[node]).all():
                value = vals[node]
            else:
                value = prior if parent[node] < 0 else b.value[parent[node]]
            b.value[node] = np.asarray(value, dtype=np.float64).reshape(n_out)
            b.n[node] = float(n[node])
            b.impurity[node] = float(imp[node])

