"""Node values and stopping rules from a level's node statistics (the coordinator's side).

A node's value is the mean of y (regression) or its class proportions (classification) from
its summed statistics; an empty node takes its parent's value. A node may split when it holds
enough rows for two leaves and is not pure. Under DP the statistics are noisy and are
post-processed by the release policy (:meth:`~fedforest_secure._release.ReleasePolicy.
node_values`); these rules then read the noisy counts.
"""

from __future__ import annotations

import numpy as np

from . import _impurity
from ._tree import TreeBuilder
from .config import JobConfig

__all__ = ["PURE_TOLERANCE", "noisy_level_totals", "node_values", "reconcile_split_nodes",
           "splittable", "splittable_noisy"]

#: a regression node is pure when ``n * Var`` is at most this fraction of its sum of y^2
#: (y as the sites centred it): ``sum y^2 - (sum y)^2 / n`` from float sums over the node's rows
#: is exact only to a multiple of float64's epsilon times ``sum y^2`` that grows with the rows
#: summed one by one (1e-12 is about 4500 epsilon), so below it equal targets and real spread
#: cannot be told apart. Rows far from the centre raise ``sum y^2`` and with it this floor:
#: the centre is what keeps it below the data's spread (``estimators``, ``_spread_checks``).
PURE_TOLERANCE = 1e-12


def node_values(totals: np.ndarray, task: str, fallback: np.ndarray) -> np.ndarray:
    """Values of nodes with statistics ``totals`` (n_nodes, S); ``fallback`` where empty."""
    n = _impurity.counts_of(totals, task)
    values = _impurity.node_values(totals, task)
    empty = n <= 0
    values[empty] = fallback[empty]
    return values


def splittable(config: JobConfig, totals: np.ndarray) -> np.ndarray:
    """Nodes (exact statistics) that may split: at least ``min_samples_split`` rows and room
    for two leaves of ``min_samples_leaf``, not empty, not pure (impurity within rounding
    of zero, relative to the node's scale)."""
    cfg = config
    n = _impurity.counts_of(totals, cfg.task)
    imp = _impurity.weighted_impurity(totals, cfg.task, cfg.criterion)
    scale = np.maximum(totals[:, 2] / np.maximum(n, 1e-300), 1e-300) \
        if cfg.task == "regression" else np.ones(n.size)
    pure = imp <= PURE_TOLERANCE * np.maximum(n, 1.0) * scale
    can: np.ndarray = ((n >= cfg.min_samples_split) & (n >= 2 * cfg.min_samples_leaf)
                       & ~pure & ~(n <= 0))
    return can


def splittable_noisy(config: JobConfig, n: np.ndarray) -> np.ndarray:
    """Nodes with noisy counts ``n`` that may split (the count rules only)."""
    return (n >= config.min_samples_split) & (n >= 2 * config.min_samples_leaf) & ~(n <= 0)


def noisy_level_totals(hist: np.ndarray, feats: np.ndarray) -> np.ndarray:
    """Node totals (n_nodes, S) from a level's noisy histogram (n_nodes, m, bins, S): every
    evaluated slot's histogram sums to the node's totals, so their mean is the estimate."""
    valid_slot = (feats >= 0)[..., None]
    slot_tot = hist.sum(axis=2)
    totals: np.ndarray = (slot_tot * valid_slot).sum(axis=1) / np.maximum(valid_slot.sum(axis=1),
                                                                          1)
    return totals


def reconcile_split_nodes(tb: TreeBuilder, totals: dict[int, np.ndarray], task: str,
                          criterion: str) -> None:
    """Give every split node of ``tb`` the statistics of its children's rows together (sums
    of the leaves' exact ``totals``, by node id, from the leaves up): its weighted count,
    value and impurity. For a job a site left midway: the levels before its drop counted its
    rows, the later ones did not, and a parent's count would otherwise not be its children's.
    A node all of whose rows left is empty (count and impurity 0) and keeps its value. A split
    node with a child whose totals were not recorded keeps its own statistics."""
    summed: dict[int, np.ndarray] = {}
    for node in range(len(tb.kind) - 1, -1, -1):  # children come after their parents
        left, right = tb.left[node], tb.right[node]
        if left < 0:
            if node in totals:
                summed[node] = totals[node]
            continue
        if left not in summed or right not in summed:
            continue
        stats = (summed[left] + summed[right])[None, :]
        summed[node] = stats[0]
        n = float(_impurity.counts_of(stats, task)[0])
        tb.n[node] = max(n, 0.0)
        if n > 0:
            tb.value[node] = _impurity.node_values(stats, task)[0]
            tb.impurity[node] = float(_impurity.impurity(stats, task, criterion)[0])
        else:  # no row below it any more (they all left): empty, its value kept
            tb.impurity[node] = 0.0
