"""Distributed discrete-Gaussian noise: calibration, per-client sampling, fail-closed checks.

Each of the ``K`` clients of a round adds integer noise to its fixed-point statistic vector
*before* masking, so the server only ever sees the noisy sum. The sum must carry the target
noise even if up to ``floor(K * dropout_tolerance)`` clients drop, so each client adds
``N_Z(0, sigma_client**2)`` with

    sigma_client**2 >= sigma**2 / K_min,   K_min = ceil(K * (1 - dropout_tolerance)),

where ``sigma`` is the central scale. :func:`plan_distributed_noise` takes the larger of two
calibrations of ``sigma_client``:

1. diffprivlib's central calibration divided by ``sqrt(K_min)``: ``GaussianDiscrete`` (exact
   privacy-loss analysis of the 1-D discrete Gaussian) when only one integer coordinate can
   change, ``GaussianAnalytic`` (Balle & Wang 2018) on the L2 sensitivity otherwise;
2. the Rényi-DP bound of a *vector* of discrete Gaussians summed over ``K_min`` clients
   (:func:`ddg_cost`), converted to (epsilon, delta) (Canonne, Kamath & Steinke 2020, Prop. 12).

:func:`ddg_cost` is Kairouz, Liu & Steinke (ICML 2021), Prop. 14 / Eq. (17), in the form of the
authors' accounting code: the sum ``Z`` of ``n`` i.i.d. ``N_Z(0, s**2)`` vectors of dimension
``d`` and a change ``D`` with ``||D||_2 <= D2`` satisfy, for every order ``alpha >= 1``,

    D_alpha(Z || Z + D) <= min( alpha * D2**2 / (2 n s**2) + tau * d,
                                alpha / 2 * (D2 / (sqrt(n) s) + tau * sqrt(d))**2 ),
    tau = 10 * sum_{k=1}^{n-1} exp(-2 pi**2 s**2 k / (k + 1)),

i.e. the minimum of a ``(xi = tau d, rho = D2**2 / (2 n s**2))``-zCDP and a
``(D2 / (sqrt(n) s) + tau sqrt(d))**2 / 2``-zCDP bound. The ``tau d`` term is additive (it does
not grow with alpha), and with one client ``tau = 0``: the discrete Gaussian's own
``D2**2 / (2 s**2)``-zCDP (Canonne, Kamath & Steinke 2020). A job's releases compose in
the accountant (:mod:`.accountant`), which converts their summed curves once.

Clients with more survivors than ``K_min`` only add noise. A round with fewer survivors than
``K_min`` must not be released (:meth:`NoisePlan.check_survivors`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from diffprivlib.mechanisms import GaussianAnalytic, GaussianDiscrete
from numpy.typing import ArrayLike, NDArray

from ..errors import AbortedRound, BudgetError
from ._sampling import ChaChaRandom, RandomSource, sample_discrete_gaussian
from .accountant import Cost, ZCdp, epsilon_of
from .sensitivity import Sensitivity

if TYPE_CHECKING:
    from ..schema import Schema
    from .profile import PrivacyProfile

__all__ = [
    "ChaChaRandom",
    "NoisePlan",
    "add_distributed_noise",
    "central_sigma",
    "ddg_cost",
    "honest_noise_adders",
    "single_vector_bound",
    "min_survivors",
    "plan_distributed_noise",
    "require_dp_ready",
    "rho_for",
    "sample_discrete_gaussian",
    "zcdp_delta",
]

_LOG_ALPHA_GRID = np.logspace(-5.0, 7.0, 6000)  # alpha - 1
_MAX_EXACT_DISCRETE = 1000  # diffprivlib's exact 1-D search stops converging beyond this


def _check_eps_delta(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise BudgetError(f"epsilon must be finite and > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise BudgetError(f"delta must be in (0, 1), got {delta}")


def zcdp_delta(rho: float, epsilon: float) -> float:
    """Smallest delta such that ``rho``-zCDP implies (epsilon, delta)-DP.

    Canonne, Kamath & Steinke (2020), Cor. 13:
    ``delta = inf_{a > 1} exp((a-1)(a rho - epsilon)) / (a-1) * (1 - 1/a)**a``, taken over a
    dense grid of ``a`` (a grid minimum over-estimates the infimum: the safe direction).
    """
    if rho <= 0:
        return 0.0
    am1 = _LOG_ALPHA_GRID
    a = am1 + 1.0
    log_d = am1 * (a * rho - epsilon) - np.log(am1) + a * np.log1p(-1.0 / a)
    return float(min(1.0, math.exp(min(0.0, float(log_d.min())))))


def rho_for(epsilon: float, delta: float) -> float:
    """Largest zCDP parameter ``rho`` that still implies (epsilon, delta)-DP."""
    _check_eps_delta(epsilon, delta)
    lo, hi = 1e-12, epsilon  # rho >= epsilon can never give delta < 1/e
    if zcdp_delta(lo, epsilon) > delta:
        raise BudgetError(f"(epsilon={epsilon}, delta={delta}) is too small to calibrate")
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if zcdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-10:
            break
    return lo


def central_sigma(epsilon: float, delta: float, sensitivity: Sensitivity) -> float:
    """Central noise scale from diffprivlib for one (epsilon, delta) release.

    ``GaussianDiscrete`` when one integer coordinate changes (``l1 == linf``, integer, at most
    1000), else ``GaussianAnalytic`` on ``sensitivity.l2``.
    """
    _check_eps_delta(epsilon, delta)
    if sensitivity.l2 == 0:
        return 0.0
    single = sensitivity.l1 == sensitivity.linf
    if single and float(sensitivity.l1).is_integer() and sensitivity.l1 <= _MAX_EXACT_DISCRETE:
        mech = GaussianDiscrete(epsilon=epsilon, delta=delta, sensitivity=int(sensitivity.l1))
        return float(mech._scale)
    return float(GaussianAnalytic(epsilon=epsilon, delta=delta, sensitivity=sensitivity.l2)._scale)


def min_survivors(n_clients: int, dropout_tolerance: float) -> int:
    """``K_min = ceil(K * (1 - dropout_tolerance))``: survivors the noise is calibrated for."""
    if not isinstance(n_clients, int) or n_clients < 1:
        raise BudgetError(f"n_clients must be an int >= 1, got {n_clients!r}")
    if not 0 <= dropout_tolerance < 1:
        raise BudgetError(f"dropout_tolerance must be in [0, 1), got {dropout_tolerance}")
    drops = math.floor(n_clients * dropout_tolerance + 1e-9)
    return max(1, n_clients - drops)


def _sparse(n_clients: int, neighbours: int | None) -> bool:
    return neighbours is not None and neighbours < n_clients - 1  # secagg's rule


def _job_t(threshold: float, n_clients: int) -> int:
    from ..secagg._rounds import resolve_threshold

    return resolve_threshold(threshold, n_clients)


def single_vector_bound(n_clients: int, threshold: float, neighbours: int | None = None) -> int:
    """The fewest sites that, colluding with the server, can get it one site's vector, which
    carries that site's own noise share alone (threat_model.md §2.2): ``min(2t - n, t - 1)``
    on the complete graph (``t`` the unmasking threshold of the job's ``n`` sites; S15, and at
    ``t = n`` the last site's vector from the sum); 1 on a SecAgg+ graph (``neighbours``
    below ``n - 1``), where colluders around one site suffice on a graph the server may redraw
    each round (S19).
    """
    if _sparse(n_clients, neighbours):
        return 1
    t = _job_t(threshold, n_clients)
    return max(1, min(2 * t - n_clients, t - 1))


def honest_noise_adders(n_clients: int, k_min: int, colluders: int, *, threshold: float,
                        neighbours: int | None = None) -> int:
    """``K_min - colluders``: the sites whose noise a released sum holds against the server
    and ``colluders`` colluding sites (each colluder knows, or never adds, its own noise, and
    the server may drop honest sites down to ``K_min``). Each site's noise is calibrated for
    this many sites, so the job's epsilon holds against up to ``colluders`` of them.
    ``threshold`` and ``neighbours`` are the profile's.

    Raises
    ------
    BudgetError
        ``colluders`` not an int >= 0; not below ``K_min`` (no honest site's noise would
        remain in a sum of ``K_min`` survivors); or not below :func:`single_vector_bound`
        (that many colluders can get the server one site's vector, which carries that site's
        noise alone): on a SecAgg+ graph any ``colluders`` above 0.
    """
    if not isinstance(colluders, int) or isinstance(colluders, bool) or colluders < 0:
        raise BudgetError(f"dp.colluders must be an int >= 0, got {colluders!r}")
    if colluders == 0:
        return k_min
    if _sparse(n_clients, neighbours):
        raise BudgetError(
            f"dp.colluders = {colluders} needs the complete graph: with neighbours = "
            f"{neighbours} (SecAgg+) a few colluders around one site can get the server that "
            "site's vector, on a graph the server may redraw each round, and that vector "
            "carries the site's own noise alone; remove neighbours from the profile, or set "
            "colluders to 0")
    bound = single_vector_bound(n_clients, threshold)
    if colluders >= k_min and k_min <= bound:
        raise BudgetError(
            f"dp.colluders = {colluders} is not below K_min = {k_min}, the survivors a sum of "
            f"this job's {n_clients} sites may be released with: no honest site's noise would "
            f"remain against that many colluders; set colluders to at most {k_min - 1}, or add "
            "sites")
    if colluders >= bound:
        raise BudgetError(
            f"dp.colluders = {colluders} is not below min(2t - n, t - 1) = {bound} for this "
            f"job's n = {n_clients} sites at threshold t = {_job_t(threshold, n_clients)}: "
            "that many colluders can get the server one site's vector, which carries that "
            "site's noise alone, so no calibration for K_min - colluders sites holds against "
            f"them; set colluders to at most {bound - 1}, or add sites")
    return k_min - colluders


def _tau(sigma: float, n: int) -> float:
    if n <= 1:
        return 0.0
    k = np.arange(1, n, dtype=np.float64)
    return float(10.0 * np.exp(-2.0 * math.pi**2 * sigma**2 * k / (k + 1.0)).sum())


def ddg_cost(sigma: float, n: int, sensitivity: Sensitivity, dims: int) -> Cost:
    """Rényi-DP bound of the sum of ``n`` clients' ``N_Z(0, sigma**2)`` vectors (module doc).

    Parameters
    ----------
    sigma : float
        Each client's scale, in the integer units of ``sensitivity`` (> 0).
    n : int
        Clients whose noise the sum is guaranteed to hold (``K_min``).
    sensitivity : Sensitivity
        Of the vector, in integer units (only ``l2`` enters).
    dims : int
        Length of the vector (the ``tau`` terms grow with it).
    """
    if not (math.isfinite(sigma) and sigma > 0):
        raise BudgetError(f"sigma must be finite and > 0, got {sigma}")
    if not isinstance(n, int) or n < 1 or not isinstance(dims, int) or dims < 1:
        raise BudgetError(f"n and dims must be ints >= 1, got {n!r}, {dims!r}")
    tau = _tau(sigma, n)
    scale = sensitivity.l2 / (math.sqrt(n) * sigma)
    first = ZCdp(rho=0.5 * scale**2, xi=tau * dims)
    second = ZCdp(rho=0.5 * (scale + tau * math.sqrt(dims)) ** 2)
    return Cost.of(first, second)


def _ddg_epsilon(sigma: float, n: int, sens: Sensitivity, dims: int, delta: float) -> float:
    return epsilon_of([ddg_cost(sigma, n, sens, dims)], delta)


@dataclass(frozen=True)
class NoisePlan:
    """How much integer noise each client adds for one release.

    Attributes
    ----------
    epsilon, delta : float
        Budget of this release.
    sensitivity : Sensitivity
        In the integer (fixed-point) units the noise is added in.
    dims : int
        Length of the statistic vector.
    n_clients : int
        Clients asked to contribute (``K``).
    k_min : int
        Survivors the noise is calibrated for; fewer must abort the round.
    sigma_central : float
        diffprivlib's central scale for the release.
    sigma_client : float
        Scale of each client's ``N_Z(0, sigma_client**2)`` noise.
    """

    epsilon: float
    delta: float
    sensitivity: Sensitivity
    dims: int
    n_clients: int
    k_min: int
    sigma_central: float
    sigma_client: float

    @property
    def sigma_sum(self) -> float:
        """Noise standard deviation (scale) of the sum when exactly ``k_min`` clients survive."""
        return self.sigma_client * math.sqrt(self.k_min)

    def check_survivors(self, n_survivors: int) -> None:
        """Refuse to release a sum over fewer than ``k_min`` noisy contributions.

        Raises
        ------
        AbortedRound
        """
        if n_survivors < self.k_min:
            raise AbortedRound(
                f"{n_survivors} of {self.n_clients} clients survived; the DP noise is calibrated "
                f"for at least {self.k_min}: the sum is not released"
            )

    def sample(self, size: int | None = None, rng: RandomSource | None = None) -> NDArray[np.int64]:
        """One client's noise vector (``size`` defaults to ``dims``)."""
        return sample_discrete_gaussian(self.sigma_client, self.dims if size is None else size, rng)


def plan_distributed_noise(
    epsilon: float,
    delta: float,
    sensitivity: Sensitivity,
    *,
    n_clients: int,
    dropout_tolerance: float,
    dims: int,
) -> NoisePlan:
    """Calibrate per-client discrete Gaussian noise for one release (module docstring).

    Parameters
    ----------
    epsilon, delta : float
        Budget of this release (one round's share from the accountant).
    sensitivity : Sensitivity
        Of the whole statistic vector, in integer units (scale fixed-point statistics first).
    n_clients : int
        Clients of the round, ``K``.
    dropout_tolerance : float
        Fraction in [0, 1) that may drop while the sum keeps the full noise.
    dims : int
        Length of the vector (enters the distributed bound).

    Raises
    ------
    BudgetError
        Non-finite or non-positive budget, bad sizes.
    """
    _check_eps_delta(epsilon, delta)
    if not isinstance(dims, int) or dims < 1:
        raise BudgetError(f"dims must be an int >= 1, got {dims!r}")
    k_min = min_survivors(n_clients, dropout_tolerance)
    s_central = central_sigma(epsilon, delta, sensitivity)
    if sensitivity.l2 == 0:
        sigma = 0.0
    else:
        rho = rho_for(epsilon, delta)
        lo = 0.5 * sensitivity.l2 / math.sqrt(2.0 * rho * k_min)
        hi = 2.0 * lo
        while _ddg_epsilon(hi, k_min, sensitivity, dims, delta) > epsilon:
            lo, hi = hi, 2.0 * hi
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if _ddg_epsilon(mid, k_min, sensitivity, dims, delta) > epsilon:
                lo = mid
            else:
                hi = mid
            if hi - lo < 1e-10 * hi:
                break
        sigma = max(hi, s_central / math.sqrt(k_min))
    return NoisePlan(
        epsilon=epsilon,
        delta=delta,
        sensitivity=sensitivity,
        dims=dims,
        n_clients=n_clients,
        k_min=k_min,
        sigma_central=s_central,
        sigma_client=sigma,
    )


def add_distributed_noise(
    values: ArrayLike, plan: NoisePlan, rng: RandomSource | None = None
) -> NDArray[np.int64]:
    """Add one client's noise to its integer (fixed-point) statistic vector.

    Parameters
    ----------
    values : array-like of int, shape (plan.dims,)
    plan : NoisePlan
    rng : RandomSource, optional
        Default: a fresh :class:`ChaChaRandom` (tests may pass a seeded source).

    Returns
    -------
    ndarray of shape (plan.dims,), int64
    """
    v = np.asarray(values)
    if v.dtype.kind not in "iu":
        raise BudgetError(f"noise is added to integer (fixed-point) vectors, got dtype {v.dtype}")
    if v.shape != (plan.dims,):
        raise BudgetError(f"expected a vector of length {plan.dims}, got shape {v.shape}")
    return v.astype(np.int64) + plan.sample(rng=ChaChaRandom() if rng is None else rng)


def require_dp_ready(profile: PrivacyProfile, schema: Schema) -> None:
    """Fail closed before a DP job: finite budget and every public bound present.

    diffprivlib only warns when bounds are inferred from data; here missing bounds are an error.

    Raises
    ------
    BudgetError
        The profile has no ``[dp]`` section, or the schema lacks bounds of a continuous feature
        or of a regression target.
    """
    if profile.dp is None:
        raise BudgetError(f"profile {profile.name!r} has no [dp] section")
    _check_eps_delta(profile.dp.epsilon, profile.dp.delta)
    missing = schema.missing_bounds()
    if missing:
        raise BudgetError(
            f"differential privacy needs public bounds for {missing}; refusing to infer them "
            "from data"
        )
