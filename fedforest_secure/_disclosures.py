"""What a client discloses beyond sums: the items its own privacy profile allows, and the
per-client sketch items (quantile points and counts, Top-L shortlists, distinct values) a
sketch round hands back for the nodes of a level order.

A server cannot widen the disclosure: a worker refuses every item its own profile does not
name, whatever the task asks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._level_stats import LevelStatistics
from .errors import ProtocolError, RefusedRequest
from .protocol import Task

__all__ = ["MAX_SKETCH_POINTS", "check_sketch_size", "profile_disclosures", "sketch_items"]

#: the most quantile points a sketch round may ask per (node, slot) (the compiled loops' limit)
MAX_SKETCH_POINTS = 1 << 24


def profile_disclosures(profile: Mapping[str, Any]) -> set[str]:
    """What a client's own ``profile`` lets it disclose beyond sums (see
    :meth:`~fedforest_secure.worker.Worker.allowed_disclosures`)."""
    prof = profile
    # --- node summaries for H-splits (h_splits: "off" never, "clear" as they are,
    # "noisy" only with the client's own DP noise, privacy/hsplits.py) ---
    h = prof.get("h_splits")
    node_stats = h == "clear" and not prof.get("dp") or h == "noisy" and bool(prof.get("dp"))
    if not prof.get("secure_aggregation"):
        return {"sketch_points", "top_l", "unique", "minmax"} | (
            set() if h == "off" else {"node_stats"})
    allowed: set[str] = set()
    if prof.get("sketch") == "quantiles" and not prof.get("dp"):
        allowed.add("sketch_points")
    if node_stats:
        allowed.add("node_stats")
    return allowed


def present_counts(stats: LevelStatistics, feats: np.ndarray, counts: np.ndarray
                   ) -> np.ndarray:
    """(n_nodes, m): each node's (weighted) row count ``counts`` less, per slot, its rows
    missing the slot's feature: the rows the slot's quantile points summarise, the weight
    the pooled sketch mixes them with. Without missing values every slot holds its node's
    count."""
    n_nodes, m = feats.shape
    out = np.repeat(np.asarray(counts, dtype=np.float64).reshape(n_nodes, 1), m, axis=1)
    order = stats.order
    if not stats.config.has_missing or order.size == 0:
        return out
    flat = out.reshape(-1)
    edges = order.all_edges()
    fl = feats.reshape(-1)
    for b0, b1 in order.chunks(edges):
        e0, e1 = int(edges[b0]), int(edges[b1])
        if e1 == e0:
            continue
        start, end = edges[b0:b1] - e0, edges[b0 + 1:b1 + 1] - e0
        # a block's missing entries sort last (their code is one past the distinct values)
        blk = np.arange(b0, b1, dtype=np.int64)
        mcode = stats.book.missing_code[fl[b0:b1].clip(0)]
        cut = np.maximum(np.minimum(end, order.search((blk << stats.book.cbits) | mcode,
                                                      e0, e1)), start)
        cw0 = np.zeros(e1 - e0 + 1)
        np.cumsum(order.weights(e0, e1), out=cw0[1:])
        flat[b0:b1] -= cw0[end] - cw0[cut]
    return out


def check_sketch_size(task: Task, n_bins: int) -> None:
    """Refuse a task that discloses sketches (points or a top-L ranking) of another number of
    intervals than the job's ``n_bins`` (B, as the coordinator asks them): sketches of the same
    rows at other numbers of points would show their quantiles at other ranks, and together
    nearly every value, whatever ``rows_per_sketch_point`` bounds one sketch to.

    Raises
    ------
    ProtocolError
        ``n_points`` is not a count from 1 to :data:`MAX_SKETCH_POINTS`.
    RefusedRequest
        (code ``disclosure``) ``n_points`` is not ``n_bins``.
    """
    if not {"sketch_points", "top_l"} & set(task.disclose):
        return
    n_points = int(task.params["n_points"])
    if not 1 <= n_points <= MAX_SKETCH_POINTS:
        raise ProtocolError(f"a sketch of {n_points} points was asked; from 1 to "
                            f"{MAX_SKETCH_POINTS}")
    if n_points != n_bins:
        raise RefusedRequest(
            f"a sketch of {n_points} intervals was asked; this job's sketches have "
            f"n_bins = {n_bins}: sketches of the same rows at other numbers of points would "
            "show more of this client's values than its profile allows", code="disclosure")


def sketch_items(task: Task, stats: LevelStatistics, feats: np.ndarray, counts: np.ndarray,
                 profile: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The sketch disclosures the task asks, for the nodes of the level order of ``stats``
    (``counts``: the nodes' row counts; ``profile``: the client's own). ``sketch_counts`` is
    per (node, slot): the rows that have the slot's feature (:func:`present_counts`). The
    caller checked the task's sketch size first (:func:`check_sketch_size`)."""
    want = set(task.disclose)
    out: dict[str, np.ndarray] = {}
    if "sketch_points" in want or "top_l" in want:
        rows_per_point = int(profile.get("rows_per_sketch_point", 0) or 0)
        n_points = int(task.params["n_points"])  # checked: check_sketch_size
        pts = stats.quantile_points(feats, n_points, rows_per_point)
        if "sketch_points" in want:
            out["sketch_points"] = pts
            out["sketch_counts"] = present_counts(stats, feats, counts)
        if "top_l" in want:
            out["top_l"] = stats.top_l(feats, pts, int(task.params["top_l"]))
    if "unique" in want:
        ptr, vals = stats.unique_values(feats)
        out["unique_ptr"] = ptr
        out["unique_vals"] = vals
    return out
