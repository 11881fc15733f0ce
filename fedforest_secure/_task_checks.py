"""What a worker accepts in a task before it reads its rows: the checks of a task's fields,
arrays and parameters (shapes, node and feature indices, sorted thresholds, statistics modes,
the layout of class totals).

The form of a task (its fields and their types:
:func:`~fedforest_secure.protocol.check_task_form`) is checked before these. A malformed or
out-of-plan request is refused with :class:`~fedforest_secure.errors.ProtocolError` saying what
is wrong; the checks read the job's configuration and the task, never the site's table.
"""

from __future__ import annotations

import numpy as np

from ._layouts import CLASS_TOTALS_BLOCK
from .config import JobConfig
from .errors import ProtocolError
from .protocol import Task, TaskKind

__all__ = ["bounded_question", "check_class_totals", "check_random_root", "check_sketch_grid",
           "group_arrays", "histogram_arrays", "level_features", "sketch_n_nodes"]


def sketch_n_nodes(task: Task) -> int:
    """The number of the level's nodes a sketch task gives."""
    try:
        n_nodes = int(task.params["n_nodes"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError("sketch task lacks a valid n_nodes") from exc
    return n_nodes


def level_features(task: Task, n_nodes: int, n_features: int) -> np.ndarray | None:
    """The features a whole-level sketch task sorts the level by (one row per node of the
    level), checked, or None: the task sorts nothing."""
    feats = task.arrays.get("features")
    if feats is not None and (feats.ndim != 2 or feats.shape[0] != n_nodes
                              or (feats >= n_features).any()):
        raise ProtocolError("features must have one row per node and valid indices")
    return feats


def check_sketch_grid(task: Task) -> None:
    """Refuse a sketch task asking part of a histogram, or one beside a node group."""
    grid = [k for k in ("grid_nodes", "grid_features", "grid_thresholds")
            if k in task.arrays]
    if grid and (len(grid) < 3 or "stats" not in task.params or "nodes" in task.arrays) \
            or "stats" in task.params and not grid:
        # a histogram in a sketch task comes whole (nodes, features, thresholds and the
        # statistics), in a whole-level sketch; a parameter it does not use is refused
        raise ProtocolError("a sketch task asks a histogram with grid_nodes, "
                            "grid_features, grid_thresholds and stats, or none of them")


def group_arrays(task: Task, n_nodes: int, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """The listed nodes and their features (int64) of a node group's sketch task, checked:
    distinct ascending node indices of the level's ``n_nodes``, one row of feature indices
    per listed node."""
    a = task.arrays
    nodes = a["nodes"]
    feats = a.get("features")
    if (nodes.ndim != 1 or nodes.dtype.kind not in "iu" or nodes.size == 0
            or nodes.min() < 0 or nodes.max() >= n_nodes
            or (nodes.size > 1 and (np.diff(nodes) <= 0).any())):
        raise ProtocolError("nodes must be distinct ascending node indices of the level")
    if feats is None or feats.ndim != 2 or feats.shape[0] != nodes.size \
            or (feats >= n_features).any():
        raise ProtocolError("features must have one row per listed node and valid indices")
    nodes = nodes.astype(np.int64)
    feats = feats.astype(np.int64)
    return nodes, feats


def histogram_arrays(task: Task, n_nodes: int, n_features: int, prefix: str = ""
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """The evaluated nodes, features, thresholds and statistics mode a task asks a
    histogram of (``prefix``: ``"grid_"`` in a sketch task), checked against a level of
    ``n_nodes`` nodes."""
    try:
        nodes = task.arrays[prefix + "nodes"].astype(np.int64)
        feats = task.arrays[prefix + "features"].astype(np.int64)
        thr = task.arrays[prefix + "thresholds"].astype(np.float64)
    except KeyError as exc:
        raise ProtocolError(f"histogram task lacks {exc}") from exc
    if (nodes.ndim != 1 or feats.ndim != 2 or thr.ndim != 3
            or feats.shape[0] != nodes.size or thr.shape[:2] != feats.shape
            or (nodes.size and (nodes.min() < 0 or nodes.max() >= n_nodes))
            or (nodes.size > 1 and (np.diff(nodes) <= 0).any())
            or (feats >= n_features).any() or np.isnan(thr).any()):
        raise ProtocolError("histogram task arrays are inconsistent")
    if thr.shape[2] and (thr[:, :, 1:] < thr[:, :, :-1]).any():
        raise ProtocolError("thresholds must be sorted per node and slot")
    mode = task.params.get("stats", "full")
    if mode not in ("full", "count", "gain", "moments"):
        raise ProtocolError(f"unknown statistics mode {mode!r}")
    return nodes, feats, thr, mode


def check_random_root(config: JobConfig, task: Task, nodes: np.ndarray) -> None:
    """Refuse the level-0 counts of a DP random-split job asked of more than one root."""
    cfg = config
    if (cfg.dp is not None and cfg.method == "random" and task.level == 0
            and cfg.sampling != "disjoint" and nodes.size > 1):
        # the marginal counts (and class totals) of a DP random-split job: every tree holds
        # every row, so the plan's sensitivity holds for one root's counts only
        raise ProtocolError("the level-0 counts of a DP random-split job are asked of one "
                            "root (every tree holds every row)")


def check_class_totals(config: JobConfig, task: Task, mode: str, a: int) -> None:
    """Refuse class totals (``a`` times over, 0: the plan releases none) where the plan
    releases none or in a layout other than one ``(1, n_classes)`` block after the counts."""
    cfg = config
    names = [b.name for b in task.layout]
    if (a < 1 or task.level != 0 or mode != "count" or names[-1:] != [CLASS_TOTALS_BLOCK]
            or names.count(CLASS_TOTALS_BLOCK) != 1
            or task.layout[-1].shape != (1, cfg.n_classes)):
        raise ProtocolError("class totals are released only with the level-0 marginal "
                            "counts of a DP random-split classification job that plans "
                            "them, as one (1, n_classes) block after the counts")


def bounded_question(config: JobConfig, task: Task, question: bytes) -> bytes:
    """The question digest of ``task`` (``question``: :meth:`Task.question_digest`) with
    every finite histogram threshold that cuts nothing within its feature's public bounds
    (``config.feature_bounds``: below the lower bound or at or above the upper one) taken as
    +inf, which the question's canonical form leaves out: a histogram re-asked with such a
    threshold appended has the same non-empty bins, so it is the same question. Without
    public bounds, or with none of those thresholds, ``question`` itself."""
    bounds = config.feature_bounds
    prefix = "" if task.kind is TaskKind.HISTOGRAM else "grid_"
    thr = task.arrays.get(prefix + "thresholds")
    feats = task.arrays.get(prefix + "features")
    if (bounds is None or thr is None or feats is None or thr.ndim != 3 or feats.ndim != 2
            or thr.shape[:2] != feats.shape or feats.dtype.kind not in "iu"
            or thr.dtype.kind not in "fiu"):
        return question  # no histogram, or one the client refuses (histogram_arrays)
    f = feats.astype(np.int64)
    used = (f >= 0) & (f < len(bounds))
    lohi = np.asarray(bounds, dtype=np.float64)[np.where(used, f, 0)]
    t = thr.astype(np.float64)
    with np.errstate(invalid="ignore"):
        out = (np.isfinite(t) & used[:, :, None]
               & ((t < lohi[:, :, :1]) | (t >= lohi[:, :, 1:])))
    if not out.any():
        return question
    arrays = {**task.arrays, prefix + "thresholds": np.where(out, np.inf, t)}
    return Task(job_id=task.job_id, round_id=task.round_id, kind=task.kind, level=task.level,
                params=task.params, arrays=arrays, layout=task.layout,
                disclose=task.disclose).question_digest()
