"""Routing a client's (tree, row) pairs through a level's splits (the worker's side).

Every sketch round after the first carries the previous level's decisions as arrays over its
nodes (``route_kind``, ``route_feature``, ``route_threshold``, ``route_left``, ``route_right``
and the left sets in CSR form, ``route_set_ptr`` / ``route_set_vals``). :func:`route` sends
every pair of the client to its child in the new level, for all pairs at once. A job with
missing values adds ``route_missing_left``: where each node sends a row missing its feature.

A split on the client indicator H (``NodeKind.CLIENT``) sends whole sites left or right, so a
node below it can hold one site's rows alone, and its sum over every site is that site's own
statistics. A client follows one only where its own profile allows H-splits and the job splits
on the client (:func:`check_client_splits`); otherwise it refuses the task.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _kernels
from ._level_stats import CodeBook
from ._sorted import has_repeats
from ._tree import NodeKind
from .config import JobConfig
from .errors import ProtocolError, RefusedRequest
from .privacy.profile import with_profile_defaults

__all__ = ["check_client_splits", "check_one_parent", "route"]


def check_client_splits(config: JobConfig, profile: Mapping[str, Any]) -> None:
    """Refuse to follow a split on the client indicator H unless this client's own ``profile``
    allows H-splits (``h_splits`` "clear" or "noisy") and the job splits on the client
    (``config.split_on_client``): the honest coordinator sends one only then.

    Raises
    ------
    RefusedRequest
        (code ``"disclosure"``) H-splits are off for this client or this job.
    """
    h = profile.get("h_splits", "off")
    if h in ("clear", "noisy") and config.split_on_client:
        return
    why = (f"This site's privacy profile {profile.get('name', '?')!r} has h_splits={h!r}"
           if h not in ("clear", "noisy") else "The job was created with split_on_client=false")
    raise RefusedRequest(
        "refusing a task that routes rows by the site indicator H (a split on the client): it "
        "can put one site's rows alone in a node, whose sum over all sites is then that site's "
        f"own statistics. {why}, so this site follows no H-splits, and an honest server sends "
        "none in this job (nothing to change on this site)", code="disclosure")


def check_one_parent(kind: np.ndarray, left: np.ndarray, right: np.ndarray) -> None:
    """Refuse a routing in which a new node has two parents (two nodes' children, or both
    children of one split, given the same id): such a node holds a record's copies from
    several trees, or its parent's rows again, so one record moves one of its statistics more
    than once (the DP noise is calibrated for a record in one node per tree). The honest
    coordinator numbers every child once.

    Raises
    ------
    RefusedRequest
        (code ``"disclosure"``) a new node id is given to more than one child.
    """
    inner = kind != NodeKind.LEAF
    kids = np.concatenate([left[inner], right[inner]])
    kids = kids[kids >= 0]
    if has_repeats(kids):
        raise RefusedRequest(
            "refusing a task whose routing sends the rows of two nodes (or both sides of a "
            "split) to one new node: a record would then count more than once in that node's "
            "statistics (across trees), more than its differential-privacy noise is "
            "calibrated for; an honest server gives every child its own node",
            code="disclosure")


def route(arrays: Mapping[str, np.ndarray], *, n_nodes: int, node: np.ndarray, row: np.ndarray,
          node_ptr: np.ndarray | None, codes: np.ndarray, n_rows: int, book: CodeBook,
          config: JobConfig, client_index: int) -> np.ndarray:
    """The new level's node of every pair, -1 where the pair leaves the level (its node is a
    leaf).

    ``node``, ``row``: the pairs' nodes in the current level (of ``n_nodes``) and their rows;
    ``node_ptr``: the start of each node's pairs when the pairs are in node order, else None;
    ``codes``: the client's integer codes, feature-major (``codes[j * n_rows + row]``).

    Raises
    ------
    ProtocolError
        The routing does not describe this level's nodes or names an unknown feature.
    RefusedRequest
        The routing splits on the client indicator H where this client follows no H-splits
        (:func:`check_client_splits`), or gives a new node two parents
        (:func:`check_one_parent`).
    """
    a = arrays
    kind = a["route_kind"]
    if kind.shape != (n_nodes,):
        raise ProtocolError(
            f"routing describes {kind.shape[0]} nodes, this client has {n_nodes}")
    if (kind == NodeKind.CLIENT).any():
        # the job's profile as this client accepted it: equal to the site's pinned profile
        # where it pins one (checked at join); an unpinned site takes the server's
        # (threat model S10)
        check_client_splits(config, with_profile_defaults(config.profile))
    feat = a["route_feature"].astype(np.int64)
    thr = a["route_threshold"]
    left = a["route_left"].astype(np.int64)
    right = a["route_right"].astype(np.int64)
    check_one_parent(kind, left, right)
    ptr = a["route_set_ptr"].astype(np.int64)
    vals = a["route_set_vals"].astype(np.int64)
    miss_left = a.get("route_missing_left")
    if miss_left is not None and miss_left.shape != (n_nodes,):
        raise ProtocolError("route_missing_left must have one entry per node")
    is_num = kind == NodeKind.NUMERIC
    num_nodes = np.flatnonzero(is_num)
    if (feat[num_nodes] < 0).any() or (feat[num_nodes] >= config.n_features).any():
        raise ProtocolError("routing names a feature this job does not have")
    # numeric splits, for every pair at once: x <= t  <=>  code < (distinct values <= t)
    cut = np.zeros(kind.size, dtype=np.int64)
    for j in np.unique(feat[num_nodes]):
        sel = num_nodes[feat[num_nodes] == j]
        cut[sel] = np.searchsorted(book.uniq[j], thr[sel], side="right")
    # a level of numeric splits and leaves only: one compiled pass over the pairs
    kernels = _kernels.KERNELS
    if (kernels is not None and miss_left is None and node.dtype == np.int32
            and row.dtype == np.int32 and codes.dtype == np.int32
            and bool(((kind == NodeKind.NUMERIC) | (kind == NodeKind.LEAF)).all())):
        leaf = kind == NodeKind.LEAF
        out = np.empty(node.size, dtype=np.int64)
        kernels.route_pairs(node, row, np.ascontiguousarray(codes),
                            np.where(is_num, feat, 0) * n_rows, cut,
                            np.where(leaf, -1, left), np.where(leaf, -1, right), out)
        return out
    # per-node values for every pair: repeated over each node's run when the pairs are in
    # node order (after a grouped level), else gathered pair by pair
    runs = np.diff(node_ptr) if node_ptr is not None and node_ptr.size == kind.size + 1 \
        else None

    def per_pair(v: np.ndarray) -> np.ndarray:
        return np.repeat(v, runs) if runs is not None else v[node]

    fbase = np.where(is_num, feat, 0) * n_rows  # per node: start of its codes
    idx = per_pair(fbase)
    idx += row
    code = codes[idx]
    del idx
    go_left = code < per_pair(cut)
    if miss_left is not None:  # a missing value's code is its feature's missing code
        mcode = np.where(is_num, book.missing_code[np.where(is_num, feat, 0)], -1)
        go_left = np.where(code == per_pair(mcode), per_pair(miss_left.astype(bool)), go_left)
    del code
    k = None
    if (kind == NodeKind.CATEGORICAL).any():
        k = kind[node]
        cat = k == NodeKind.CATEGORICAL
        cat_nodes = np.flatnonzero(kind == NodeKind.CATEGORICAL)
        max_l = max(config.levels) if config.levels else 1
        table = np.zeros((cat_nodes.size, max(max_l, 1)), dtype=bool)
        pos = np.full(kind.size, -1, dtype=np.int64)
        pos[cat_nodes] = np.arange(cat_nodes.size)
        for i, nd in enumerate(cat_nodes):
            table[i, vals[ptr[nd]:ptr[nd + 1]]] = True
        fc = feat[node[cat]]
        ccode = codes[fc * n_rows + row[cat]]
        missing = ccode == book.missing_code[fc]
        at = np.clip(book.uniq_off[fc] + np.where(missing, 0, ccode), 0,
                     max(book.uniq_all.size - 1, 0))
        lv = (book.uniq_all[at] if book.uniq_all.size else np.zeros(at.size)).astype(np.int64)
        nan_left = (miss_left.astype(bool)[node[cat]] if miss_left is not None
                    else np.zeros(lv.size, dtype=bool))
        go_left[cat] = np.where(missing, nan_left, table[pos[node[cat]], lv])
    if (kind == NodeKind.CLIENT).any():
        k = kind[node] if k is None else k
        cli = k == NodeKind.CLIENT
        mine = np.zeros(kind.size, dtype=bool)
        for nd in np.flatnonzero(kind == NodeKind.CLIENT):
            mine[nd] = client_index in set(vals[ptr[nd]:ptr[nd + 1]].tolist())
        go_left[cli] = mine[node[cli]]
    # a leaf's pairs leave the level whatever the task says of its children
    left_eff = np.where(kind == NodeKind.LEAF, -1, left)
    right_eff = np.where(kind == NodeKind.LEAF, -1, right)
    return np.where(go_left, per_pair(left_eff), per_pair(right_eff))
