"""The coordinator's level planner: the frontier of growing nodes, feature sampling, node
groups, and growing the trees by a level's chosen splits.

A level's nodes (over all trees) are the *frontier*. For every frontier node the planner knows
which tree and node id it is, its parent's value (the fallback of an empty or noisy node) and,
with public feature bounds, its box (the bounds intersected with its ancestors' numeric
splits). After a level's splits are chosen, :func:`grow` adds the children to the trees and
returns the next frontier and the routing arrays the next sketch round sends to the clients.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ._tree import NodeKind, TreeBuilder, json_float
from .protocol import Block, Task, TaskKind

__all__ = ["AskRound", "Disclosures", "Frontier", "LevelContext", "NodeGrouping", "Received",
           "grow", "sample_features"]

#: per-client items disclosed in a round, by client index
Disclosures = dict[int, dict[str, np.ndarray]]
#: what a round hands back to the coordinator: the summed blocks and the disclosures
Received = tuple[dict[str, np.ndarray], Disclosures]


class AskRound(Protocol):
    """Opens the next round (the coordinator's task factory)."""

    def __call__(self, kind: TaskKind, level: int, params: dict[str, Any],
                 arrays: dict[str, np.ndarray], layout: tuple[Block, ...],
                 disclose: tuple[str, ...] = ()) -> Task: ...


@dataclass
class LevelContext:
    """What the evaluation of a level's nodes needs to know about the level."""

    level: int
    feats: np.ndarray  # (n_nodes, m) sampled features
    totals: np.ndarray  # (n_nodes, S) node totals
    n: np.ndarray  # (n_nodes,) weighted counts
    is_cat: np.ndarray  # (d,) categorical features
    box_lo: np.ndarray | None  # (n_nodes, d) the nodes' boxes, with public bounds
    box_hi: np.ndarray | None
    lohi: np.ndarray | None  # (d, 2) histogram method: the grid's range per feature


@dataclass
class Frontier:
    """The growing nodes of a level, in level order."""

    tree: np.ndarray  # (n_nodes,) tree index
    node: np.ndarray  # (n_nodes,) node id in its tree
    #: (n_nodes, n_out) the parent's value (a root: what a tree knowing nothing predicts,
    #: a regression's centred 0 or every class alike)
    parent_value: np.ndarray
    box_lo: np.ndarray | None  # (n_nodes, d) with public feature bounds
    box_hi: np.ndarray | None
    #: (n_nodes,) weighted rows, as the parents' split statistics predict them (None: unknown)
    count: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.tree.size)

    @classmethod
    def roots(cls, trees: Sequence[TreeBuilder], n_out: int,
              bounds: np.ndarray | None) -> Frontier:
        """Level 0: a root per tree (added to ``trees``), boxes equal to the public bounds.
        A root's parent value, which a root too small to trust takes (under DP, a noisy count
        below ``min_samples_leaf``), is 0 for a regression (the centred mean) and ``1 / C``
        for each of a classification's ``C = n_out > 1`` classes: class proportions that sum
        to 1, as every other node's."""
        T = len(trees)
        node = np.array([t.add() for t in trees], dtype=np.int64)
        box_lo = np.tile(bounds[:, 0], (T, 1)) if bounds is not None else None
        box_hi = np.tile(bounds[:, 1], (T, 1)) if bounds is not None else None
        value = np.full((T, n_out), 1.0 / n_out) if n_out > 1 else np.zeros((T, n_out))
        return cls(np.arange(T, dtype=np.int64), node, value, box_lo, box_hi)

    def record(self, trees: Sequence[TreeBuilder], values: np.ndarray, n: np.ndarray,
               impurity: np.ndarray) -> None:
        """Store every frontier node's value, weighted count and impurity in its tree."""
        for i in range(self.size):
            tb = trees[self.tree[i]]
            tb.value[self.node[i]] = values[i]
            tb.n[self.node[i]] = float(n[i])
            tb.impurity[self.node[i]] = float(impurity[i])


def sample_features(rng: np.random.Generator, n_nodes: int, d: int, m: int) -> np.ndarray:
    """``m`` of the ``d`` features per node, without replacement: shape (n_nodes, m)."""
    if m == d:
        return np.tile(np.arange(d, dtype=np.int64), (n_nodes, 1))
    keys = rng.random((n_nodes, d))
    return np.argsort(keys, axis=1)[:, :m].astype(np.int64)


class NodeGrouping:
    """Which levels are evaluated in groups of nodes, and the groups.

    A level with more nodes than ``max_nodes``, or whose estimated state exceeds
    ``max_bytes``, is evaluated in consecutive groups, each within both limits (see
    :class:`~fedforest_secure.coordinator.Coordinator`). Both None: never.
    """

    def __init__(self, max_nodes: int | None, max_bytes: float | None) -> None:
        if max_nodes is not None and (not isinstance(max_nodes, numbers.Integral)
                                      or isinstance(max_nodes, bool) or max_nodes < 1):
            raise ValueError(f"max_nodes_per_round must be a whole number >= 1, not "
                             f"{max_nodes!r}")
        if max_bytes is not None and (not isinstance(max_bytes, numbers.Real)
                                      or isinstance(max_bytes, bool) or not max_bytes > 0):
            raise ValueError(f"max_round_bytes must be a number > 0, not {max_bytes!r}")
        self.max_nodes = max_nodes
        self.max_bytes = max_bytes

    def applies(self, n_nodes: int, weight: float, m: int, node_bytes: float) -> bool:
        """Whether a level of ``n_nodes`` is grouped: a limit is set and the level exceeds
        it. ``weight`` bounds the sum of the level's weighted node counts; ``node_bytes`` is
        the coordinator's memory per evaluated node."""
        if self.max_nodes is not None and n_nodes > self.max_nodes:
            return True
        if self.max_bytes is not None:
            return 8.0 * m * weight + node_bytes * n_nodes > self.max_bytes
        return False

    def groups(self, ev: np.ndarray, n: np.ndarray, m: int, node_bytes: float
               ) -> list[tuple[int, int]]:
        """Consecutive ranges ``[a, b)`` of the evaluated nodes ``ev``, each one group.

        A group holds at most ``max_nodes`` nodes and, estimated from the node totals, at most
        ``max_bytes`` of the state its rounds create: every client's sorted level order (at
        most one 8-byte entry per unit of weight and feature slot, so ``8 m n_nu`` over all
        clients) and ``node_bytes`` per node (the candidate method's
        :meth:`~fedforest_secure._candidates.CandidateMethod.node_bytes`: a client's
        histogram reply and the running sum, ``16 m B S`` with S the class counts or
        ``(n, sum y)``, and with quantile sketches the coordinator's copy of every client's
        sketch, ``8 K m (B + 1)``). A group has at least one node.
        """
        E = ev.size
        if E == 0:
            return []
        cap = self.max_nodes if self.max_nodes is not None else E
        if self.max_bytes is None:
            return [(a, min(a + cap, E)) for a in range(0, E, cap)]
        per_node = 8.0 * m * np.maximum(n[ev], 0.0) + node_bytes
        cum = np.concatenate([[0.0], np.cumsum(per_node)])
        out: list[tuple[int, int]] = []
        a = 0
        while a < E:
            b = int(np.searchsorted(cum, cum[a] + self.max_bytes, side="right")) - 1
            b = min(max(b, a + 1), a + cap, E)
            out.append((a, b))
            a = b
        return out


@dataclass(frozen=True)
class Growth:
    """What :func:`grow` made of a level's splits."""

    frontier: Frontier  # the next level's nodes
    routing: dict[str, np.ndarray]  # the next sketch round's routing arrays
    splits: list[dict[str, Any]]  # the level's split decisions, for the audit log


def grow(trees: Sequence[TreeBuilder], frontier: Frontier, ev: np.ndarray, splits: np.ndarray,
         kind: np.ndarray, feature: np.ndarray, threshold: np.ndarray,
         sets: Sequence[list[int]], child_values: Mapping[int, np.ndarray],
         node_values: np.ndarray, gains: np.ndarray | None = None,
         child_counts: Mapping[int, np.ndarray] | None = None,
         missing_left: np.ndarray | None = None, route_missing: bool = False) -> Growth:
    """Split the frontier nodes ``ev[e]`` for every ``e`` with ``splits[e]``.

    ``kind``, ``feature``, ``threshold`` and ``sets`` are the chosen split per evaluated node;
    the children get the values ``child_values[e]`` (two rows) where given, else the parent's
    ``node_values[ev[e]]`` (their fallback). A numeric split narrows the children's boxes.
    ``gains[e]`` (if given) is recorded as the split node's weighted impurity decrease.
    With ``child_counts`` (the weighted rows of the left and right child of every split), the
    next frontier knows its nodes' counts before their own round (:attr:`Frontier.count`).
    ``missing_left[e]``: where the split sends a row missing its feature (stored in the tree);
    with ``route_missing`` the routing carries it as ``route_missing_left`` (a job whose rows
    may miss values).
    """
    n_nodes = frontier.size
    r_kind = np.full(n_nodes, NodeKind.LEAF, dtype=np.int32)
    r_feat = np.full(n_nodes, -1, dtype=np.int32)
    r_thr = np.zeros(n_nodes)
    r_left = np.full(n_nodes, -1, dtype=np.int32)
    r_right = np.full(n_nodes, -1, dtype=np.int32)
    r_miss = np.zeros(n_nodes, dtype=bool)
    set_lists: list[list[int]] = [[] for _ in range(n_nodes)]
    nt: list[int] = []
    nn: list[int] = []
    pv: list[np.ndarray] = []
    counts: list[float] = []
    box_lo, box_hi = frontier.box_lo, frontier.box_hi
    # Python scalars up front: one conversion per array, not one per element
    tree_of, node_of = frontier.tree.tolist(), frontier.node.tolist()
    kinds, feats, thrs = kind.tolist(), feature.tolist(), threshold.tolist()
    gain_of = gains.tolist() if gains is not None else None
    for e in np.flatnonzero(splits).tolist():
        i = int(ev[e])
        t, nd = tree_of[i], node_of[i]
        tb = trees[t]
        k = int(kinds[e])
        feat = int(feats[e])
        tb.kind[nd] = k
        tb.feature[nd] = feat
        if gain_of is not None:
            tb.gain[nd] = float(gain_of[e])
        r_kind[i], r_feat[i] = k, feat
        if missing_left is not None:
            tb.missing_left[nd] = r_miss[i] = bool(missing_left[e])
        if k == NodeKind.NUMERIC:
            tb.threshold[nd] = r_thr[i] = float(thrs[e])
        else:
            tb.sets[nd] = sets[e]
            set_lists[i] = sets[e]
        lc, rc = tb.add_children()
        tb.left[nd], tb.right[nd] = lc, rc
        r_left[i], r_right[i] = len(nt), len(nt) + 1
        nt += [t, t]
        nn += [lc, rc]
        if child_counts is not None:
            cc = child_counts.get(e)
            counts += [float(cc[0]), float(cc[1])] if cc is not None else [np.nan, np.nan]
        child = child_values.get(e)
        if child is not None:
            pv += [child[0], child[1]]
        else:
            pv += [node_values[i], node_values[i]]
    labels = {int(k): k.label for k in NodeKind}
    r_kinds, r_feats, r_thrs = r_kind.tolist(), r_feat.tolist(), r_thr.tolist()
    inf = float("inf")
    decided = [
        {"tree": tree_of[i], "node": node_of[i], "kind": labels[r_kinds[i]],
         "feature": r_feats[i],
         "threshold": r_thrs[i] if r_thrs[i] != inf else json_float(inf),  # "inf": JSON
         "left_set": list(map(int, set_lists[i])) if set_lists[i] else []}
        for i in np.flatnonzero(r_kind != NodeKind.LEAF).tolist()]
    if box_lo is not None and box_hi is not None:
        # each split node's box twice (left child, right child), in the children's order; a
        # numeric split at a finite threshold (+inf: present | missing) narrows the feature
        par = np.repeat(ev[np.flatnonzero(splits)], 2)
        nxt_box_lo, nxt_box_hi = box_lo[par], box_hi[par]
        left, right = np.arange(0, par.size, 2), np.arange(1, par.size, 2)
        pl = par[0::2]
        cut = (r_kind[pl] == NodeKind.NUMERIC) & np.isfinite(r_thr[pl])
        f, t = r_feat[pl][cut].astype(np.int64), r_thr[pl][cut]
        hi, lo = nxt_box_hi[left[cut], f], nxt_box_lo[right[cut], f]
        nxt_box_hi[left[cut], f] = np.where(t < hi, t, hi)  # Python's min(hi, t)
        nxt_box_lo[right[cut], f] = np.where(t > lo, t, lo)  # Python's max(lo, t)
    ptr = np.zeros(n_nodes + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(s) for s in set_lists])
    vals = np.array([v for s in set_lists for v in s], dtype=np.int32)
    routing: dict[str, np.ndarray] = {
        "route_kind": r_kind, "route_feature": r_feat, "route_threshold": r_thr,
        "route_left": r_left, "route_right": r_right,
        "route_set_ptr": ptr, "route_set_vals": vals}
    if route_missing:
        routing["route_missing_left"] = r_miss
    n_out = frontier.parent_value.shape[1]
    d = box_lo.shape[1] if box_lo is not None else 0
    nxt = Frontier(
        tree=np.array(nt, dtype=np.int64), node=np.array(nn, dtype=np.int64),
        parent_value=np.array(pv).reshape(-1, n_out),
        box_lo=nxt_box_lo.reshape(-1, d) if box_lo is not None else None,
        box_hi=nxt_box_hi.reshape(-1, d) if box_hi is not None else None,
        count=np.array(counts, dtype=np.float64) if child_counts is not None else None)
    return Growth(nxt, routing, decided)
