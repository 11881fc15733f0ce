"""What a histogram releases, slot by slot: the keys a worker records so that it releases each
histogram slot once, whatever form the task asks it in.

A histogram (a HISTOGRAM task, or the level's first histogram a SKETCH task carries in
``grid_*``) releases, per listed node and feature slot, the statistics of the node's rows in
the bins its thresholds cut. What is released is fixed by the level, the node, the feature and
the cuts alone, so a slot's key is made of those: the cuts in the canonical form of the
question key (distinct finite thresholds, ascending, -0.0 as 0.0) without the thresholds
outside the feature's public bounds (they cut nothing). A categorical feature's values are its
public level codes 0..L-1 and a row goes left where its code is <= the threshold, so every
threshold in [k, k + 1) makes the cut k + 0.5, and one below 0 or at L - 1 or above cuts
nothing: the key holds the cuts k + 0.5 the thresholds make. Not in the key, because they do not
change what is released: the task's kind (a sketch's grid or a histogram round), the slot's
position in the node's row, the other slots and nodes of the task, and the statistics mode
(``count`` is inside ``moments``, which is inside ``full``; ``gain`` carries the left counts):
the worker compares modes itself (:class:`~fedforest_secure._answered.AnsweredRounds`).

A slot without a finite cut has one bin: its node's totals (with missing values, those of the
rows that have the feature, and the rest in the missing bin). Without missing values every
such slot of a node releases the same totals, so they share one key whatever the feature.

Keys are 64-bit hashes (splitmix64 over the key's fields), computed for all slots at once.
The same slot always gets the same key; two different slots share one with probability about
``n^2 / 2^64`` for ``n`` slots, which would make a worker refuse, never answer twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ._sorted import distinct
from .config import JobConfig
from .protocol import SealedTask, Task, TaskKind
from .protocol.tasks import canonical_thresholds

__all__ = ["SlotKeys", "slot_keys"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def _mix(h: np.ndarray, v: np.ndarray) -> np.ndarray:
    return _splitmix(h ^ _splitmix(v))


@dataclass(frozen=True)
class SlotKeys:
    """The slots one histogram task releases: per slot its key, node and feature (-1 for a
    node's totals, a slot without a cut when the job has no missing values), and the task's
    statistics mode."""

    keys: np.ndarray  # uint64
    nodes: np.ndarray  # int64
    features: np.ndarray  # int64
    mode: str

    @cached_property
    def distinct(self) -> np.ndarray:
        """The distinct keys, ascending (made once: every client of an in-process federation
        records the same task's)."""
        out: np.ndarray = distinct(self.keys)
        return out


def canonical_cuts(config: JobConfig, feats: np.ndarray, thr: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per (node, slot): its distinct finite thresholds inside the feature's public bounds,
    ascending (-0.0 as 0.0), +inf padded, and how many there are; ``feats`` (E, m) int64,
    ``thr`` (E, m, W) float64 without NaN. The coordinator's form (per slot increasing
    thresholds inside the bounds, then +inf) is recognised in a few passes and kept."""
    t = thr
    cat = np.array([k == "categorical" for k in config.kinds], dtype=bool)
    f = np.clip(feats, 0, max(config.n_features - 1, 0))
    if cat.any() and t.size:
        on = cat[f] & (feats >= 0)
        if on.any():
            fin = np.isfinite(t)
            top = np.asarray(config.levels, dtype=np.float64)[f] - 1.0  # L - 1
            with np.errstate(invalid="ignore"):
                k = np.floor(t)
                kept = fin & on[:, :, None]
                cut = kept & (k >= 0) & (k < top[:, :, None])
                t = np.where(cut, k + 0.5, np.where(kept, np.inf, t))
    if t.shape[2] > 1:
        with np.errstate(invalid="ignore"):  # +inf - +inf: padding after padding
            ordered = not (np.diff(t, axis=2) <= 0).any()
        # a -inf that no step above flags stands first in its slot
        ordered = ordered and not (t[:, :, 0] == -np.inf).any()
    else:
        ordered = not (t == -np.inf).any()
    if ordered:  # increasing finite thresholds, then +inf
        n = (t < np.inf).sum(axis=2)
        bounds = config.feature_bounds
        if bounds is None or not t.size:
            return t + 0.0, n
        lohi = np.asarray(bounds, dtype=np.float64)[f]  # (E, m, 2)
        last = np.take_along_axis(t, np.maximum(n - 1, 0)[:, :, None], axis=2)[:, :, 0]
        has = n > 0
        if not ((has & ((t[:, :, 0] < lohi[:, :, 0]) | (last >= lohi[:, :, 1]))).any()):
            return t + 0.0, n
    # the general form: thresholds outside the bounds and -inf cut nothing, as +inf
    fin = np.isfinite(t)
    bounds = config.feature_bounds
    if bounds is not None and t.size:
        lohi = np.asarray(bounds, dtype=np.float64)[f]
        with np.errstate(invalid="ignore"):
            fin &= (t >= lohi[:, :, 0][:, :, None]) & (t < lohi[:, :, 1][:, :, None])
    t = canonical_thresholds(np.where(fin, t, np.inf))  # the question key's canonical form
    return t, (t < np.inf).sum(axis=2)


def slot_keys(config: JobConfig, task: Task) -> SlotKeys | None:
    """The slots ``task`` releases, or None: it asks no histogram, or one whose arrays the
    worker refuses anyway (:func:`~fedforest_secure._task_checks.histogram_arrays`).
    Derived once per sealed task and job (every client of an in-process federation reads the
    same one)."""
    memo = task.derived if isinstance(task, SealedTask) else None
    key = ("slot_keys", config.feature_bounds, config.has_missing, config.n_features,
           config.kinds, config.levels)
    hit = memo.get(key) if memo is not None else None
    if isinstance(hit, SlotKeys):
        return hit
    out = _slot_keys(config, task)
    if memo is not None and out is not None:
        memo[key] = out
    return out


def _slot_keys(config: JobConfig, task: Task) -> SlotKeys | None:
    prefix = "" if task.kind is TaskKind.HISTOGRAM else "grid_"
    if task.kind not in (TaskKind.HISTOGRAM, TaskKind.SKETCH):
        return None
    a = task.arrays
    nodes, feats, thr = (a.get(prefix + k) for k in ("nodes", "features", "thresholds"))
    if (nodes is None or feats is None or thr is None or nodes.ndim != 1 or feats.ndim != 2
            or thr.ndim != 3 or feats.shape[0] != nodes.size or thr.shape[:2] != feats.shape
            or nodes.dtype.kind not in "iu" or feats.dtype.kind not in "iu"
            or thr.dtype.kind not in "fiu"):
        return None
    f = feats.astype(np.int64, copy=False)
    t = thr.astype(np.float64, copy=False)
    if np.isnan(t).any() or (f >= config.n_features).any():
        return None
    mode = str(task.params.get("stats", "full"))
    cuts, n_cuts = canonical_cuts(config, f, t)
    feat = f
    if not config.has_missing:
        feat = np.where(n_cuts == 0, -1, f)  # the node's totals
    node = np.broadcast_to(nodes.astype(np.int64)[:, None], f.shape)
    h = _mix(np.full(f.shape, np.uint64(task.level)), node.astype(np.uint64))
    h = _mix(h, feat.astype(np.uint64))
    h = _mix(h, n_cuts.astype(np.uint64))
    # the cuts (finite first, ascending), each times an odd constant of its position, summed;
    # the +inf padding adds nothing (its terms are taken off again), so a slot's key does not
    # depend on the other slots of the task. A collision could make a worker refuse a slot,
    # never answer one twice
    width = int(n_cuts.max()) if n_cuts.size else 0
    total = np.zeros(f.shape, dtype=np.uint64)
    if width:
        c = cuts[:, :, :width]
        bits = c.view(np.uint64) if c.flags.c_contiguous else np.ascontiguousarray(c).view(
            np.uint64)
        odd = _splitmix(np.arange(width, dtype=np.uint64)) | np.uint64(1)
        total = ((bits ^ (bits >> np.uint64(29))) * odd).sum(axis=2, dtype=np.uint64)
        inf = np.array([np.inf]).view(np.uint64)
        pad = np.zeros(width + 1, dtype=np.uint64)  # pad[j]: the padding's terms from j on
        pad[:width] = np.cumsum(((inf ^ (inf >> np.uint64(29))) * odd)[::-1],
                                dtype=np.uint64)[::-1]
        total -= pad[n_cuts]
    h = _mix(h, total)
    rows, cols = np.nonzero(f >= 0)
    h, node, feat = h[rows, cols], node[rows, cols], feat[rows, cols]
    return SlotKeys(h, node, feat, mode)
