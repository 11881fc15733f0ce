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

from ._layouts import CLASS_TOTALS_BLOCK, stats_kinds
from ._tree import NodeKind
from .config import JobConfig
from .errors import ProtocolError
from .protocol import SealedTask, StatKind, Task, TaskKind

__all__ = ["bounded_question", "check_class_totals", "check_feature_slots", "check_level_nodes",
           "check_random_root", "check_reply_kinds", "check_sketch_grid", "group_arrays",
           "histogram_arrays", "level_features", "level_node_cap", "sketch_n_nodes"]


def sketch_n_nodes(task: Task) -> int:
    """The number of the level's nodes a sketch task gives."""
    try:
        n_nodes = int(task.params["n_nodes"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError("sketch task lacks a valid n_nodes") from exc
    if n_nodes < 0:
        raise ProtocolError("sketch task lacks a valid n_nodes")
    return n_nodes


def level_node_cap(task: Task, level_nodes: int, *, routes: bool) -> int:
    """The most nodes the level of a whole-level sketch task can have: with ``routes`` (the
    task routes the client's pairs from its current level of ``level_nodes`` nodes to the
    next), two children per node of that level the routing splits (every other node is a
    leaf); else the current level's ``level_nodes`` (at level 0: the job's trees)."""
    if not routes:
        return level_nodes
    kind = task.arrays.get("route_kind")
    if kind is None or kind.shape != (level_nodes,):
        return 2 * level_nodes  # the routing's own check refuses it
    return 2 * int(np.count_nonzero(kind != NodeKind.LEAF))


def check_level_nodes(task: Task, n_nodes: int, cap: int) -> None:
    """Refuse a whole-level sketch task whose ``n_nodes`` is more than its level can have
    (``cap``: :func:`level_node_cap`): the client sizes its per-node totals, and the vector
    it uploads, by it."""
    if n_nodes > cap:
        raise ProtocolError(f"the sketch task of level {task.level} gives n_nodes {n_nodes}; "
                            f"the level has at most {cap} nodes (the job's trees at level 0, "
                            f"else two children per node its routing splits)")


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
    ``n_nodes`` nodes. Checked and converted once per sealed task, level size and feature
    count (every client of an in-process federation reads the same arrays, read-only); a task
    that fails the checks is refused by every reader."""
    memo = task.derived if isinstance(task, SealedTask) else None
    key = ("histogram_arrays", prefix, n_nodes, n_features)
    hit = memo.get(key) if memo is not None else None
    if isinstance(hit, tuple):
        return hit
    out = _histogram_arrays(task, n_nodes, n_features, prefix)
    if memo is not None:
        for arr in out[:3]:
            arr.flags.writeable = False  # shared by the task's readers
        memo[key] = out
    return out


def _histogram_arrays(task: Task, n_nodes: int, n_features: int, prefix: str
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    try:
        nodes = task.arrays[prefix + "nodes"].astype(np.int64)
        feats = task.arrays[prefix + "features"].astype(np.int64)
        # float64 thresholds are read in place (a level's grid is as large as its histogram):
        # a read-only view, so no reader writes into the task, whose own array stays as it was
        thr = np.asarray(task.arrays[prefix + "thresholds"], dtype=np.float64).view()
        thr.flags.writeable = False
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


def plan_slots(config: JobConfig, level: int) -> int:
    """The feature slots per node the job's plan evaluates at ``level``: ``max_features``
    (resolved to a count), and at level 0 of a random-split job every feature (the marginal
    counts release all d)."""
    if config.method == "random" and level == 0:
        return config.n_features
    return config.max_features


def check_feature_slots(config: JobConfig, task: Task) -> None:
    """Refuse feature slots the job's plan does not evaluate: more slots per node than
    :func:`plan_slots`, an index below -1 (-1: an empty slot), or a feature twice in one node.

    The noise of a release is calibrated for the plan's slots: every further slot of a feature
    is a fresh noisy copy of its statistics, so copies averaged remove the noise.
    """
    limit = plan_slots(config, task.level)
    memo = task.derived if isinstance(task, SealedTask) else None
    key = ("feature_slots", limit)
    if memo is not None and key in memo:
        return  # checked for this limit already (a task that fails is never recorded)
    _check_feature_slots(task, limit)
    if memo is not None:
        memo[key] = True


def _check_feature_slots(task: Task, limit: int) -> None:
    for name in ("features", "grid_features"):
        feats = task.arrays.get(name)
        if feats is None or feats.ndim != 2 or feats.size == 0:
            continue  # absent or malformed: the task's own checks refuse a malformed one
        m = int(feats.shape[1])
        if m > limit:
            raise ProtocolError(f"the task's {name} asks {m} feature slots per node; the "
                                f"job's plan evaluates at most {limit} (max_features, or the "
                                f"d features of the random-split marginal counts)")
        if (feats < -1).any():
            raise ProtocolError(f"the task's {name} holds an index below -1: a slot is -1 "
                                f"(an empty slot) or a feature of the job")
        srt = np.sort(feats, axis=1)
        dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
        if dup.any():
            row, col = (int(v[0]) for v in np.nonzero(dup))
            listed = task.arrays.get("grid_nodes" if name == "grid_features" else "nodes")
            node = int(listed[row]) if listed is not None and row < listed.size else row
            raise ProtocolError(f"the task's {name}: node {node} repeats feature "
                                f"{int(srt[row, col + 1])} (a node's slots are distinct "
                                f"features; a repeat is a second noisy copy)")


def _mode_kinds(config: JobConfig, mode: str) -> tuple[StatKind, ...]:
    """The statistic kinds of a histogram in statistics mode ``mode`` (see
    :mod:`~fedforest_secure._layouts`)."""
    if mode == "count":
        return (StatKind.COUNT,)
    if mode == "gain":
        return (StatKind.GAIN, StatKind.COUNT)
    if mode == "moments" and config.task == "regression":
        return (StatKind.COUNT, StatKind.SUM)
    return stats_kinds(config)


def check_reply_kinds(config: JobConfig, task: Task, size: int) -> None:
    """Refuse a layout whose blocks are not the pieces of the reply, of ``size`` entries, this
    client computed: each piece's size and statistic kinds (node totals, a histogram in the
    task's statistics mode, class totals), in order.

    The codec's scale and the DP noise of an entry follow the kinds its block gives: a sum
    labelled a count would get count noise.
    """
    pieces: list[tuple[int, tuple[StatKind, ...]]] = []
    rest = size
    if task.kind == TaskKind.SKETCH:
        if task.params.get("totals", True):
            nodes = task.arrays.get("nodes")
            rows = int(nodes.size) if nodes is not None else int(task.params["n_nodes"])
            pieces.append((rows * config.n_stats, stats_kinds(config)))
            rest -= rows * config.n_stats
        if "grid_thresholds" in task.arrays:
            pieces.append((rest, _mode_kinds(config, str(task.params.get("stats")))))
    else:
        tail = [(config.n_classes, (StatKind.COUNT,) * config.n_classes)] \
            if any(b.name == CLASS_TOTALS_BLOCK for b in task.layout) else []
        rest -= sum(n for n, _ in tail)
        pieces = [(rest, _mode_kinds(config, str(task.params.get("stats", "full")))), *tail]
    want = [(n, kinds) for n, kinds in pieces if n > 0]
    got = [(b.size, tuple(b.kinds)) for b in task.layout if b.size > 0]
    if got != want:
        def show(blocks: list[tuple[int, tuple[StatKind, ...]]]) -> str:
            return ", ".join(f"{n} x ({'/'.join(k.value for k in kinds)})"
                             for n, kinds in blocks) or "none"
        raise ProtocolError(f"the task's layout gives statistic kinds {show(got)} (entries x "
                            f"kinds); this client's reply has {show(want)}: a block's kinds "
                            f"decide its scale and noise")


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
    public bounds, or with none of those thresholds, ``question`` itself. Derived once per
    sealed task and bounds (every client of an in-process federation reads the same one)."""
    bounds = config.feature_bounds
    memo = task.derived if isinstance(task, SealedTask) else None
    key = ("bounded_question", question, bounds)
    hit = memo.get(key) if memo is not None else None
    if isinstance(hit, bytes):
        return hit
    out = _bounded_question(task, question, bounds)
    if memo is not None:
        memo[key] = out
    return out


def _bounded_question(task: Task, question: bytes,
                      bounds: tuple[tuple[float, float], ...] | None) -> bytes:
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
