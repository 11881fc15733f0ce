"""The calibration of a DP job's noise: planned releases, their Rényi cost, and the client noise
scales that make all of them together spend exactly (epsilon, delta).

A release ``r`` has blocks ``b`` (statistic kinds with their own sensitivity ``D_b``, in integer
units, and length ``d_b``) and a share ``w_b`` of the budget (the shares of all blocks of all
releases add up to 1). For a multiplier ``s`` each client adds ``N_Z(0, sigma_b**2)`` with
``sigma_b = s * D_b / sqrt(2 w_b K_min)``, so that without the distributed-sum terms block ``b``
would be exactly ``w_b / s**2``-zCDP. The smallest ``s`` whose composed Rényi curve (with the
``tau`` terms of :func:`~.dp.ddg_cost`) converts to at most epsilon at delta is found by
bisection (:func:`calibrate`; :mod:`.accountant`: Rényi curves add up, one conversion).
:class:`JobNoise` holds the result for a job's planned releases (:func:`~.allocation.job_noise`).
:func:`check_sampling` refuses a plan whose scales the sampler cannot draw, before any round.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import BudgetError
from ._sampling import MAX_SIGMA
from .accountant import Cost, ZCdp, epsilon_of
from .dp import ddg_cost, rho_for
from .sensitivity import Sensitivity

__all__ = ["JobNoise", "PlannedBlock", "PlannedRelease", "calibrate", "check_sampling",
           "release_cost"]


@dataclass(frozen=True)
class PlannedBlock:
    """One block of a planned release: a statistic kind with its own noise scale.

    Attributes
    ----------
    name : str
        The statistic kind (``"count"``, ``"sum"``, ``"sumsq"``).
    sensitivity : Sensitivity
        Of the block, in the integer units the noise is added in.
    dims : int
        Upper bound on the block's length (the distributed-sum terms grow with it).
    weight : float
        Share of the job's zCDP budget, in (0, 1].
    """

    name: str
    sensitivity: Sensitivity
    dims: int
    weight: float


@dataclass(frozen=True)
class PlannedRelease:
    """One planned release: its label, the sites whose noise it holds for (``k_min``: the
    honest survivors, ``K_min`` less the job's ``dp.colluders``), its blocks."""

    label: str
    k_min: int
    blocks: tuple[PlannedBlock, ...]


def release_cost(release: PlannedRelease, sigmas: Sequence[float],
                 dims: Sequence[int] | None = None) -> Cost:
    """Rényi bound of ``release`` with client scales ``sigmas`` (per block); ``dims`` gives
    the blocks' actual lengths (default: the planned upper bounds)."""
    lengths = [b.dims for b in release.blocks] if dims is None else list(dims)
    blocks: list[tuple[ZCdp, ...]] = []
    for b, s, d in zip(release.blocks, sigmas, lengths, strict=True):
        if b.sensitivity.l2 == 0 or d == 0:
            continue
        blocks.extend(ddg_cost(float(s), release.k_min, b.sensitivity, int(d)).blocks)
    if not blocks:
        raise BudgetError(f"release {release.label!r} has nothing to cost")
    return Cost(tuple(blocks))


def calibrate(releases: Sequence[PlannedRelease], epsilon: float,
              delta: float) -> tuple[tuple[float, ...], ...]:
    """Client noise scales (per release, per block) that spend exactly (epsilon, delta).

    Raises
    ------
    BudgetError
        A budget that is not finite and positive, weights that do not add up to 1, or an
        empty plan.
    """
    rho = rho_for(epsilon, delta)  # validates the budget
    blocks = [b for r in releases for b in r.blocks]
    if not blocks:
        raise BudgetError("a DP job needs at least one planned release")
    weights = [b.weight for b in blocks]
    if not all(math.isfinite(w) and w > 0 for w in weights) or abs(sum(weights) - 1) > 1e-9:
        raise BudgetError(f"the releases' budget shares must be > 0 and add up to 1, got "
                          f"{sum(weights)}")

    def sigmas(s: float) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(s * b.sensitivity.l2 / math.sqrt(2.0 * b.weight * r.k_min)
                           for b in r.blocks) for r in releases)

    def eps_at(s: float) -> float:
        sig = sigmas(s)
        return epsilon_of([release_cost(r, g) for r, g in zip(releases, sig, strict=True)],
                          delta)

    lo = 0.5 / math.sqrt(rho)  # four times the budget: never enough noise
    hi = 1.0 / math.sqrt(rho)
    while eps_at(hi) > epsilon:
        lo, hi = hi, 2.0 * hi
        if hi > 1e100:  # the accountant's orders stop (10^4): no noise scale reaches epsilon
            raise BudgetError(f"(epsilon={epsilon}, delta={delta}) is below what the "
                              "accountant certifies for this job at any noise scale (its Renyi "
                              "orders stop at 10^4): ask for a larger epsilon or delta")
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if eps_at(mid) > epsilon:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * hi:
            break
    return sigmas(hi)


def check_sampling(sigmas: Mapping[str, float], sigmas_at: Callable[[int], Mapping[str, float]],
                   frac_bits: int, budget: tuple[str, float]) -> None:
    """Refuse a noise plan with a client scale the discrete Gaussian sampler cannot draw.

    Parameters
    ----------
    sigmas : the plan's client scales in ring units, by a name that says where they apply
    sigmas_at : the same plan's scales at another ``frac_bits`` (the scales of real sums grow
        with ``2**frac_bits``; those of counts do not)
    frac_bits : the profile's
    budget : the name and value of the budget that sets the scales (``("epsilon", 0.002)``)

    Raises
    ------
    BudgetError
        A scale of at least :data:`~._sampling.MAX_SIGMA`, naming the budget, ``frac_bits``
        and the largest ``frac_bits`` whose plan the sampler can draw (if any does).
    """
    over = {k: s for k, s in sigmas.items() if not s < MAX_SIGMA}
    if not over:
        return
    where, worst = max(over.items(), key=lambda kv: kv[1])
    # one bit less at most halves a scale: no frac_bits above this one fits
    f = frac_bits - 1
    if math.isfinite(worst):
        f = min(f, frac_bits + math.floor(math.log2(MAX_SIGMA / worst)))
    while f >= 0 and not all(s < MAX_SIGMA for s in sigmas_at(f).values()):
        f -= 1
    name, value = budget
    todo = (f"raise {name}, or lower frac_bits to {f} or less (the noise on sums of y and y^2 "
            "scales with 2^frac_bits)" if f >= 0 else f"raise {name}")
    raise BudgetError(
        f"{name} = {value:g} with frac_bits = {frac_bits} needs each client's noise on the "
        f"{where} at a scale of {worst:.3g} ring units, more than the discrete Gaussian "
        f"sampler draws (below 2^45 = {MAX_SIGMA:.3g}): {todo}")


# ----------------------------------------------------------------------------- engine plan
@dataclass(frozen=True)
class JobNoise:
    """The noise plan of a DP job (:func:`~.allocation.job_noise`).

    Attributes
    ----------
    releases : tuple of PlannedRelease
        The planned releases, in order.
    levels : tuple of int
        The level each release happens at (greedy splits: one per splitting level
        ``0 .. max_depth - 1``; random splits: the leaves, ``max_depth``).
    sigmas : tuple of tuple of float
        Each client's scale per release and block, in integer (ring) units.
    k_min : int
        Survivors a release needs (``K_min``): fewer must not be released. Each release's
        noise holds for its ``k_min``, ``K_min`` less the job's ``dp.colluders``.
    epsilon, delta : float
        The job's budget, spent exactly by the whole plan.
    vector_bound : int
        The fewest colluders that can get the server one site's vector
        (:func:`~.dp.single_vector_bound`).
    """

    releases: tuple[PlannedRelease, ...]
    levels: tuple[int, ...]
    sigmas: tuple[tuple[float, ...], ...]
    k_min: int
    epsilon: float
    delta: float
    vector_bound: int

    def _index(self, level: int) -> int:
        if level not in self.levels:
            raise BudgetError(f"no release is planned at level {level}; the plan releases at "
                              f"levels {list(self.levels)}")
        return self.levels.index(level)

    def level_sigmas(self, level: int) -> dict[str, float]:
        """Client scale per statistic kind of the release at ``level``."""
        i = self._index(level)
        rel = self.releases[i]
        return {b.name: s for b, s in zip(rel.blocks, self.sigmas[i], strict=True)}

    def cost(self, level: int, dims: Mapping[str, int] | None = None) -> Cost:
        """Rényi bound of the release at ``level`` (``dims``: its blocks' actual lengths)."""
        i = self._index(level)
        rel = self.releases[i]
        lengths = None if dims is None else [min(int(dims.get(b.name, 0)), b.dims)
                                             for b in rel.blocks]
        return release_cost(rel, self.sigmas[i], lengths)

    def epsilon_against(self, colluders: int) -> float:
        """The whole plan's epsilon (at its delta) for an honest site's data against the server
        and ``colluders`` colluding sites: each colluder knows (or never adds) its own noise
        and the server may drop honest sites down to ``k_min``, so each release carries the
        noise of ``k_min - colluders`` sites; from ``vector_bound`` colluders (or ``k_min``)
        on, the server may hold one site's vector, which carries that site's noise alone.
        At most the job's epsilon for up to the ``dp.colluders`` the plan was calibrated for;
        more for more colluders.

        Raises
        ------
        BudgetError
            ``colluders`` below 0.
        """
        if colluders < 0:
            raise BudgetError(f"colluders must be >= 0, got {colluders}")
        honest = self.k_min - colluders
        if colluders > 0 and colluders >= self.vector_bound or honest < 1:
            honest = 1
        costs = [release_cost(PlannedRelease(r.label, honest, r.blocks), s)
                 for r, s in zip(self.releases, self.sigmas, strict=True)]
        return epsilon_of(costs, self.delta)

    def sum_count_std(self, level: int, n_clients: int) -> float:
        """Standard deviation of the noise on one summed count of the release at ``level``
        when ``n_clients`` clients contribute (counts are integers: one unit per row)."""
        return self.level_sigmas(level)["count"] * math.sqrt(n_clients)
