"""The summable blocks of the engine's rounds, shared by the coordinator and the worker.

A round's :class:`~fedforest_secure.protocol.Block` layout says how the clients' summable
vectors are cut into statistics and which kind each column is (counts, sums, sums of squares,
gains): the coordinator sets it in the task, every client's reply follows it, and the
fixed-point codec and the DP calibration read the kinds from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .protocol import Block, StatKind
from .protocol.tasks import CLASS_TOTALS_BLOCK  # the one block name part of a question's key

if TYPE_CHECKING:  # config imports the candidate registry, which uses these layouts
    from .config import JobConfig

__all__ = ["CLASS_TOTALS_BLOCK", "categorical_cuts", "class_totals_block", "counts_block",
           "gain_block", "hist_block", "moments_block", "stats_kinds", "totals_block"]


def stats_kinds(config: JobConfig) -> tuple[StatKind, ...]:
    """Kinds of the statistics axis for this job: (n, sum y, sum y^2) or class counts."""
    if config.task == "regression":
        return (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)
    return (StatKind.COUNT,) * config.n_classes


def totals_block(config: JobConfig, n_nodes: int) -> Block:
    """Node totals of a sketch round: (n_nodes, S)."""
    return Block("totals", (n_nodes, config.n_stats), stats_kinds(config))


def hist_block(config: JobConfig, n_nodes: int, m: int, n_bins: int) -> Block:
    """Per-bin statistics of a histogram round: (n_nodes, m slots, n_bins, S)."""
    return Block("hist", (n_nodes, m, n_bins, config.n_stats), stats_kinds(config))


def moments_block(config: JobConfig, n_nodes: int, m: int, n_bins: int) -> Block:
    """Per-bin statistics a split's gain needs, (n_nodes, m slots, n_bins, S'): (n, sum y)
    for regression (the gain of a split is ``S_L^2/n_L + S_R^2/n_R - S^2/n``: sums of y^2
    cancel), the class counts for classification."""
    if config.task == "regression":
        return Block("hist", (n_nodes, m, n_bins, 2), (StatKind.COUNT, StatKind.SUM))
    return Block("hist", (n_nodes, m, n_bins, config.n_stats), stats_kinds(config))


def gain_block(n_nodes: int, m: int, n_thresholds: int) -> Block:
    """AvgImp's summed local gains and left counts per threshold: (n_nodes, m, Bt, 2)."""
    return Block("gain", (n_nodes, m, n_thresholds, 2), (StatKind.GAIN, StatKind.COUNT))


def class_totals_block(n_classes: int) -> Block:
    """The classes' row totals (times the plan's scale, see
    :func:`~fedforest_secure.privacy.allocation.class_totals_scale`): (1, n_classes), named
    :data:`CLASS_TOTALS_BLOCK`, in the level-0 marginal counts of a DP random-split
    classification job."""
    return Block(CLASS_TOTALS_BLOCK, (1, n_classes), (StatKind.COUNT,) * n_classes)


def counts_block(n_nodes: int, m: int, n_bins: int) -> Block:
    """Row counts per bin of a secure-CDF sketch round: (n_nodes, m, n_bins, 1)."""
    return Block("counts", (n_nodes, m, n_bins, 1), (StatKind.COUNT,))


def categorical_cuts(thr: np.ndarray, feats: np.ndarray, is_cat: np.ndarray,
                     levels: tuple[int, ...]) -> np.ndarray:
    """Categorical slots get cuts k + 0.5 so that the histogram bins are the levels."""
    if not is_cat.any() or feats.size == 0:
        return thr
    width = max(thr.shape[2], max(levels) - 1)
    out = np.full(thr.shape[:2] + (width,), np.inf)
    out[:, :, : thr.shape[2]] = thr
    cat_slot = (feats >= 0) & is_cat[np.maximum(feats, 0)]
    for e, s in zip(*np.nonzero(cat_slot), strict=True):
        nl = levels[feats[e, s]]
        out[e, s, :] = np.inf
        out[e, s, : nl - 1] = np.arange(nl - 1) + 0.5
    return out
