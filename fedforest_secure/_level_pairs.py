"""The active pairs of a worker's level: for every (tree, row) with a non-zero bootstrap
multiplicity ``w`` that sits in a node still growing, its row and the index of its node in
the level's node list (three parallel arrays ``node``, ``row``, ``w``).

Here: the row statistics summed per node, the pairs put in node order with the start of each
node's pairs, the pairs of one group of the level's nodes, and where a group's nodes sit in
the level order sorted for it.
"""

from __future__ import annotations

import numpy as np

from . import _kernels
from ._order import LevelOrder
from .config import JobConfig
from .errors import ProtocolError

__all__ = ["by_node", "group_pairs", "node_totals", "order_positions"]


def node_totals(config: JobConfig, stats_cm: np.ndarray, row: np.ndarray, node: np.ndarray,
                w: np.ndarray, n_nodes: int) -> np.ndarray:
    """The row statistics ``stats_cm`` (one row per statistic) summed per node over the
    pairs, shape (n_nodes, n_stats)."""
    S = config.n_stats
    out = np.zeros((n_nodes, S))
    weight_first = config.task == "regression"
    if _kernels.KERNELS is not None and w.dtype.kind in "iu":  # the same sums, one pass
        _kernels.KERNELS.node_totals(_kernels.i64(node), _kernels.i64(row), _kernels.i64(w),
                                     _kernels.f64(stats_cm), out, S, int(weight_first))
        return out
    # indices converted once (numpy converts int32 indices on every gather and bincount)
    rows = row.astype(np.intp)
    node = node.astype(np.intp)
    for c in range(S):
        if c == 0 and weight_first:
            # statistic 1 per row: the weights themselves (integer sums, exact either way)
            out[:, 0] = np.bincount(node, weights=w, minlength=n_nodes)
            continue
        wc = stats_cm[c][rows]
        wc *= w
        out[:, c] = np.bincount(node, weights=wc, minlength=n_nodes)
    return out


def by_node(node: np.ndarray, row: np.ndarray, w: np.ndarray, n_nodes: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The pairs in node order (the same arrays when they already are) and the start of each
    node's pairs (``n_nodes + 1`` entries).

    A stable sort: the pairs of one node keep their order, so every per-node sum is unchanged.
    """
    if node.size > 1 and (node[1:] < node[:-1]).any():
        perm = np.argsort(node, kind="stable")
        node, row, w = node[perm], row[perm], w[perm]
        del perm
    ptr = np.searchsorted(node, np.arange(n_nodes + 1))
    return node, row, w, ptr


def group_pairs(node: np.ndarray, row: np.ndarray, w: np.ndarray, ptr: np.ndarray,
                nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairs of the listed nodes (ascending) among pairs in node order (``ptr``: the start
    of each node's pairs, :func:`by_node`): their position in ``nodes``, rows and weights,
    in the pairs' order."""
    first, last = int(nodes[0]), int(nodes[-1])
    lo, hi = int(ptr[first]), int(ptr[last + 1])
    loc = node[lo:hi] - np.int32(first)
    row, w = row[lo:hi], w[lo:hi]
    if nodes.size != last + 1 - first:  # nodes not listed lie in between: drop theirs
        table = np.full(last + 1 - first, -1, dtype=np.int32)
        table[nodes - first] = np.arange(nodes.size, dtype=np.int32)
        loc = table[loc]
        keep = np.flatnonzero(loc >= 0)
        loc, row, w = loc[keep], row[keep], w[keep]
    return loc, row, w


def order_positions(order: LevelOrder, group: np.ndarray | None, feats: np.ndarray,
                    nodes: np.ndarray) -> np.ndarray:
    """The positions of ``nodes`` in ``order`` (sorted for the nodes ``group``, None: the whole
    level), checking the features match the ones it was sorted for."""
    local = nodes
    if group is not None:
        local = np.searchsorted(group, nodes)
        if nodes.size and (local.max() >= group.size or (group[local] != nodes).any()):
            raise ProtocolError("histogram asks for nodes outside the last sketched group")
    ref = order.feats[local]
    if ref.shape != feats.shape or ((feats >= 0) & (feats != ref)).any():
        raise ProtocolError("histogram features differ from the level's sketch features")
    return local
