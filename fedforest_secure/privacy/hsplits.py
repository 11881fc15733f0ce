"""Noisy per-client node summaries for H-splits (``h_splits = "noisy"``).

An H-split sends a node's clients left or right by their value of the client indicator ``H``;
the coordinator scores it from per-client node summaries (class counts, or ``(n, sum y,
sum y**2)``), ordering clients by their within-node mean (Fisher). Under ``h_splits = "clear"``
those summaries are disclosed as they are. Under ``"noisy"`` each client adds discrete Gaussian
noise to its own summary before it leaves the site: this is *local* noise, calibrated for a
release by one client alone (``K_min = 1``), because the summary is not summed with anything.

Budget. The noisy summaries are released in addition to the securely aggregated sums, whose
noise every client calibrates from ``dp.epsilon`` (``secure_sum.noise_sigmas``). They spend
their own budget ``dp.h_epsilon`` (with ``dp.delta``): one release per level that can split,
all ``max_depth`` of them calibrated together (zCDP, equal shares) so that they alone are
``(h_epsilon, delta)``-DP. The coordinator's accountant composes both kinds of release in Rényi
DP and converts once; its cap is ``(epsilon + h_epsilon, delta)`` (:func:`job_budget`), which
the composition never exceeds. Without ``h_epsilon`` a noisy H-split job fails closed
(:class:`~fedforest_secure.errors.BudgetError`).

Calibration of one release (the ``(n_nodes, S)`` summary of one level, all trees): a record
sits in one node per tree, so every statistic column is a histogram with ``F = 1``
(:func:`~.sensitivity.histogram_sensitivity` with ``n_trees = T``, or 1 with disjoint row
sampling, times the bootstrap cap). Counts are integers already; sums of ``y`` and ``y**2`` are
rounded to the fixed-point grid ``bound * 2**-frac_bits`` (``bound**2`` for squares) first, and
the sensitivity gets one grid unit per cell for the rounding. Each level's share is split
equally over the statistic kinds, and the scales come from :func:`~.allocation.calibrate` with
a single client (the discrete Gaussian's own zCDP bound). Negative noisy counts are the
coordinator's to post-process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ..errors import BudgetError, RefusedRequest
from ._calibration import check_sampling
from ._sampling import RandomSource, sample_discrete_gaussian
from .accountant import Cost, PrivacyAccountant
from .allocation import PlannedBlock, PlannedRelease, calibrate, release_cost
from .sensitivity import StatKind, abstention_factor, histogram_sensitivity

if TYPE_CHECKING:
    from ..config import JobConfig

__all__ = ["JobBudget", "NodeStatsNoise", "NodeStatsRelease", "job_budget", "node_stats_noise"]


def _h_epsilon(dp: Mapping[str, Any] | None) -> float:
    if not dp:
        raise BudgetError('h_splits = "noisy" adds DP noise to per-client node summaries and '
                          "needs a [dp] section with a budget; refusing to release them")
    h = dp.get("h_epsilon")
    if h is None:
        raise BudgetError('h_splits = "noisy" needs dp.h_epsilon, the budget of the noisy '
                          "per-client node summaries (spent on top of dp.epsilon), e.g. "
                          'load_profile("secure-dp", h_splits="noisy", h_epsilon=0.5)')
    h = float(h)
    if not (math.isfinite(h) and h > 0):
        raise BudgetError(f"dp.h_epsilon must be finite and > 0, got {h}")
    return h


@dataclass(frozen=True)
class JobBudget:
    """How a DP job's budget is capped.

    Attributes
    ----------
    total : (epsilon, delta) the accountant never lets the job exceed: ``dp.epsilon`` (plus
        ``dp.h_epsilon`` with noisy H-splits) at ``dp.delta``
    noisy_h : whether per-client node summaries are released too
    """

    total: tuple[float, float]
    noisy_h: bool

    def accountant(self) -> PrivacyAccountant:
        """A fresh accountant for the whole job."""
        return PrivacyAccountant(self.total[0], self.total[1])


def job_budget(dp: Mapping[str, Any], max_depth: int, *, noisy_h: bool) -> JobBudget:
    """The budget cap of a DP job (module docstring).

    Raises
    ------
    BudgetError
        No budget, or ``noisy_h`` without ``dp.h_epsilon``.
    """
    if not dp:
        raise BudgetError("no [dp] section: no budget")
    if not isinstance(max_depth, int) or max_depth < 1:
        raise BudgetError(f"max_depth must be an int >= 1, got {max_depth!r}")
    eps, delta = float(dp["epsilon"]), float(dp["delta"])
    if not noisy_h:
        return JobBudget((eps, delta), False)
    return JobBudget((eps + _h_epsilon(dp), delta), True)


@dataclass(frozen=True)
class NodeStatsNoise:
    """Per-column noise of one level's node summary of one client.

    Attributes
    ----------
    epsilon, delta : float
        Budget of all the job's node-summary releases together (``h_epsilon``, ``delta``).
    unit : ndarray (S,)
        Value of one integer noise unit per statistic column (1 for counts).
    sigma : ndarray (S,)
        Discrete Gaussian scale per column, in integer units.
    cost : Cost
        Rényi bound of this release (what the accountant records).
    """

    epsilon: float
    delta: float
    unit: NDArray[np.float64]
    sigma: NDArray[np.float64]
    cost: Cost

    @property
    def sigma_values(self) -> NDArray[np.float64]:
        """Noise standard deviation per column in the statistic's own units."""
        return self.sigma * self.unit


def node_stats_noise(config: JobConfig, n_nodes: int = 1) -> NodeStatsNoise:
    """Calibrate one client's noise for one level's node summaries (module docstring).

    A pure function of the job's public configuration: each client computes it from its own
    profile, never from the task.

    Raises
    ------
    BudgetError
        No ``[dp]`` section or no ``dp.h_epsilon``; missing target bounds for regression; a
        scale the sampler cannot draw (a small ``h_epsilon`` with a large ``frac_bits``).
    """
    frac = int(config.profile.get("frac_bits", 24))
    noise = _node_stats_noise(config, n_nodes, frac)
    names = ["class counts"] if config.task == "classification" else [
        "counts", "sums of y", "sums of y^2"]

    def named(sigma: NDArray[np.float64]) -> dict[str, float]:
        return {f"node summaries' {n}": float(v) for n, v in zip(names, sigma, strict=False)}

    check_sampling(named(noise.sigma), lambda bits: named(
        _node_stats_noise(config, n_nodes, bits).sigma), frac, ("h_epsilon", noise.epsilon))
    return noise


def _node_stats_noise(config: JobConfig, n_nodes: int, frac: int) -> NodeStatsNoise:
    """:func:`node_stats_noise` on the grid of ``frac`` bits, not checked against the sampler."""
    dp = config.dp
    eps, delta = _h_epsilon(dp), float((dp or {})["delta"])
    trees = 1 if config.sampling == "disjoint" else config.n_estimators
    mult = 1 if config.sampling in ("disjoint", "all") else int(
        (dp or {}).get("max_multiplicity", 4))
    mult *= abstention_factor(config.profile)  # abstention moves m rows per record
    kinds: list[tuple[StatKind, float]]
    if config.task == "classification":
        kinds = [("class_count", 1.0)] * config.n_classes
        n_kinds = 1  # one class per record: the columns together are one histogram
    else:
        b = float(config.target_bound)
        if not (math.isfinite(b) and b > 0):
            raise BudgetError("noisy node summaries of a regression need a public target bound")
        kinds = [("count", 1.0), ("sum", b * 2.0**-frac), ("sum_sq", b * b * 2.0**-frac)]
        n_kinds = 3
    dims = max(int(n_nodes), 1) * (config.n_stats if n_kinds == 1 else 1)
    max_dims = trees * 2 ** (config.max_depth - 1) * (config.n_stats if n_kinds == 1 else 1)
    units: list[float] = []
    blocks: list[PlannedBlock] = []
    for stat, unit in kinds[:n_kinds]:
        sens = histogram_sensitivity(stat, n_features=1, n_trees=trees, max_multiplicity=mult,
                                     target_bounds=(-config.target_bound, config.target_bound))
        if stat in ("sum", "sum_sq"):  # rounding to the grid: one more unit per changed cell
            sens = sens.scaled(1.0 / unit).rounded(trees)
        blocks.append(PlannedBlock(stat, sens, max(max_dims, dims),
                                   1.0 / (n_kinds * config.max_depth)))
    release = PlannedRelease("node summaries", 1, tuple(blocks))
    plan = calibrate([release] * config.max_depth, eps, delta)[0]
    sigmas = [plan[0]] * config.n_classes if n_kinds == 1 else list(plan)
    units = [u for _, u in kinds]
    return NodeStatsNoise(eps, delta, np.array(units), np.array(sigmas),
                          release_cost(release, plan, [dims] * len(blocks)))


def add_node_stats_noise(totals: NDArray[np.float64], noise: NodeStatsNoise,
                         rng: RandomSource | None = None) -> NDArray[np.float64]:
    """``totals`` (n_nodes, S) with one draw of discrete Gaussian noise per entry.

    Each column is rounded to its integer grid (counts are integers already) before the noise
    is added; the result is in the statistic's own units.
    """
    totals = np.asarray(totals, dtype=np.float64)
    if totals.ndim != 2 or totals.shape[1] != noise.unit.size:
        raise BudgetError(f"node summaries must have shape (n, {noise.unit.size}), "
                          f"got {totals.shape}")
    ints = np.rint(totals / noise.unit).astype(np.int64)
    out = np.empty_like(totals)
    for c in range(ints.shape[1]):
        z = sample_discrete_gaussian(float(noise.sigma[c]), ints.shape[0], rng)
        out[:, c] = (ints[:, c] + z) * noise.unit[c]
    return out


class NodeStatsRelease:
    """One client's noisy node summaries over a job: at most one release per splitting level.

    A server asking twice at a level (fresh noise to average out) or at a level that cannot
    split is refused, so the job never spends more than ``h_epsilon``.
    """

    def __init__(self, config: JobConfig, rng: RandomSource | None = None) -> None:
        self._config = config
        self._rng = rng
        self._levels: set[int] = set()

    @property
    def released_levels(self) -> frozenset[int]:
        return frozenset(self._levels)

    def release(self, level: int, totals: NDArray[np.float64]) -> NDArray[np.float64]:
        """The noisy summary of ``level`` (refused beyond one per level below ``max_depth``).

        Raises
        ------
        RefusedRequest
            A second release at the same level, or a level >= ``max_depth``.
        BudgetError
            No budget for noisy summaries (see :func:`node_stats_noise`).
        """
        if not 0 <= level < self._config.max_depth:
            raise RefusedRequest(f"noisy node summaries are released only at levels below "
                                 f"max_depth={self._config.max_depth}, not at level {level}")
        if level in self._levels:
            raise RefusedRequest(f"the noisy node summaries of level {level} were already "
                                 "released; a second draw would spend budget twice")
        noise = node_stats_noise(self._config, totals.shape[0])
        out = add_node_stats_noise(totals, noise, self._rng)
        self._levels.add(level)
        return out
