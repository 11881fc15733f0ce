"""The privacy budget of one training job, accounted in Rényi / zero-concentrated DP.

Every noisy release of a job is described by its Rényi-DP curve ``eps(alpha)``: a Gaussian or
discrete Gaussian release is ``(xi, rho)``-zCDP, ``eps(alpha) = xi + rho * alpha`` for all
``alpha > 1`` (Bun & Steinke 2016); the distributed discrete Gaussian of
:func:`~.dp.ddg_cost` is the pointwise minimum of two such lines. Releases compose by adding
their curves (on the fixed grid :data:`ORDERS` of orders), and the job's (epsilon, delta) comes
from **one** conversion of the composed curve (Canonne, Kamath & Steinke 2020, Prop. 12)::

    epsilon(delta) = min_alpha  eps(alpha) + log(1 - 1/alpha) - log(delta * alpha) / (alpha - 1)

This is the formula (and, given the same orders, the number) of Google's ``dp-accounting``
(``RdpAccountant`` with ``ZCDpEvent`` releases); ``tests/test_privacy_accountant.py`` checks the
two agree. Compared with splitting epsilon over the releases (basic composition) it lets k
releases of equal noise each have about ``1/k`` of the zCDP budget instead of ``1/k`` of
epsilon, i.e. noise growing like ``sqrt(k)`` instead of ``k``.

Fail closed: a budget that is not a finite epsilon > 0 with delta in (0, 1) is a
:class:`~fedforest_secure.errors.BudgetError`, and so is any spend that would take the composed
epsilon past the budget (nothing is recorded then).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ..errors import BudgetError

__all__ = ["ORDERS", "PrivacyAccountant", "Spend", "ZCdp", "Cost", "epsilon_of_curve",
           "epsilon_of"]

#: Rényi orders the curves are kept on: dense near 1 (small budgets) and up to 10^4 (large
#: ones). Orders below 1.01 give no bound in the conversion.
ORDERS: NDArray[np.float64] = 1.0 + np.geomspace(0.0101, 1.0e4, 1200)

#: Relative slack of the budget check (floating-point rounding of a calibrated plan).
_SLACK = 1e-9


@dataclass(frozen=True)
class ZCdp:
    """A ``(xi, rho)``-zCDP guarantee: Rényi DP ``xi + rho * alpha`` at every order alpha."""

    rho: float
    xi: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rho) and self.rho >= 0):
            raise BudgetError(f"rho must be finite and >= 0, got {self.rho}")
        if not (math.isfinite(self.xi) and self.xi >= 0):
            raise BudgetError(f"xi must be finite and >= 0, got {self.xi}")

    def rdp(self, orders: NDArray[np.float64] = ORDERS) -> NDArray[np.float64]:
        """The Rényi DP of the release at ``orders``."""
        return self.xi + self.rho * orders


@dataclass(frozen=True)
class Cost:
    """Rényi curve of one release: a sum over blocks with independent noise (a product
    mechanism: Rényi divergences add), each block the pointwise minimum of its valid bounds."""

    blocks: tuple[tuple[ZCdp, ...], ...]

    def __post_init__(self) -> None:
        if not self.blocks or not all(self.blocks):
            raise BudgetError("a release needs at least one privacy bound per block")

    @classmethod
    def of(cls, *branches: ZCdp) -> Cost:
        """One block satisfying every one of ``branches``."""
        return cls((tuple(branches),))

    def rdp(self, orders: NDArray[np.float64] = ORDERS) -> NDArray[np.float64]:
        """The release's Rényi DP at ``orders``."""
        out = np.zeros_like(orders)
        for block in self.blocks:
            out = out + np.min(np.stack([b.rdp(orders) for b in block]), axis=0)
        return out

    def best(self, delta: float) -> ZCdp:
        """One ``(xi, rho)`` summary (per block, the branch with the smaller epsilon on its
        own, added up), for records; the accounting itself uses :meth:`rdp`."""
        rho = xi = 0.0
        for block in self.blocks:
            own = [epsilon_of_curve(b.rdp(), delta) for b in block]
            pick = block[int(np.argmin(own))]
            rho, xi = rho + pick.rho, xi + pick.xi
        return ZCdp(rho, xi)


def epsilon_of_curve(rdp: NDArray[np.float64], delta: float,
                     orders: NDArray[np.float64] = ORDERS) -> float:
    """Smallest epsilon such that the Rényi curve ``rdp`` implies (epsilon, delta)-DP.

    Canonne, Kamath & Steinke (2020), Prop. 12, minimised over ``orders``.
    """
    if not 0 < delta < 1:
        raise BudgetError(f"delta must be in (0, 1), got {delta}")
    rdp = np.asarray(rdp, dtype=np.float64)
    if rdp.shape != orders.shape:
        raise BudgetError("the Rényi curve and its orders differ in length")
    if not np.all(rdp >= 0):
        raise BudgetError("a Rényi curve is never negative")
    eps = rdp + np.log1p(-1.0 / orders) - np.log(delta * orders) / (orders - 1.0)
    return float(max(0.0, float(eps.min())))


def epsilon_of(releases: Iterable[Cost | ZCdp], delta: float,
               orders: NDArray[np.float64] = ORDERS) -> float:
    """Epsilon at ``delta`` of the composition of ``releases`` (one conversion)."""
    total = np.zeros_like(orders)
    for rel in releases:
        total = total + rel.rdp(orders)
    return epsilon_of_curve(total, delta, orders)


@dataclass(frozen=True)
class Spend:
    """One recorded release.

    Attributes
    ----------
    label : str
        What was released (e.g. ``"round 3 (histogram, level 1)"``).
    mechanism : str
    rho, xi : float
        The release's zCDP bound (for a pointwise minimum of bounds: the branch with the
        smaller epsilon on its own).
    epsilon, delta : float
        The release's own (epsilon, delta) at the job's delta.
    total_epsilon, total_delta : float
        The job's (epsilon, delta) after this release: its composed Rényi curve, converted once.
    """

    label: str
    mechanism: str
    rho: float
    xi: float
    epsilon: float
    delta: float
    total_epsilon: float
    total_delta: float


def _check_budget(epsilon: float, delta: float) -> None:
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
        raise BudgetError(f"a DP budget needs a finite epsilon > 0, got {epsilon!r}")
    if not (isinstance(delta, int | float) and 0 < delta < 1):
        raise BudgetError(f"delta must be in (0, 1), got {delta!r}")


class PrivacyAccountant:
    """Budget of one job: Rényi curves add up, converted to (epsilon, delta) at the job's delta.

    Parameters
    ----------
    epsilon : float
        Total budget, finite and > 0.
    delta : float
        The job's delta in (0, 1).
    """

    def __init__(self, epsilon: float, delta: float) -> None:
        _check_budget(epsilon, delta)
        self._epsilon = float(epsilon)
        self._delta = float(delta)
        self._rdp = np.zeros_like(ORDERS)
        self._spends: list[Spend] = []

    @property
    def epsilon(self) -> float:
        """Total epsilon of the budget."""
        return self._epsilon

    @property
    def delta(self) -> float:
        """The job's delta."""
        return self._delta

    @property
    def spends(self) -> tuple[Spend, ...]:
        """Every recorded release, in order."""
        return tuple(self._spends)

    @property
    def rdp(self) -> NDArray[np.float64]:
        """Composed Rényi curve so far, on :data:`ORDERS` (a copy)."""
        return self._rdp.copy()

    @property
    def spent(self) -> tuple[float, float]:
        """(epsilon, delta) of everything released so far (0 before the first release)."""
        if not self._spends:
            return 0.0, 0.0
        return epsilon_of_curve(self._rdp, self._delta), self._delta

    def spend(self, label: str, cost: Cost | ZCdp, *,
              mechanism: str = "gaussian_discrete") -> Spend:
        """Record one release whose Rényi curve is ``cost``.

        Raises
        ------
        BudgetError
            The composed epsilon would exceed the budget; nothing is recorded.
        """
        rel = cost.rdp()
        total = self._rdp + rel
        total_eps = epsilon_of_curve(total, self._delta)
        if total_eps > self._epsilon * (1.0 + _SLACK):
            spent_eps = self.spent[0]
            raise BudgetError(
                f"privacy budget exhausted: releasing {label!r} would take the job to "
                f"epsilon={total_eps:.6g} (delta={self._delta:.3g}), past its budget "
                f"epsilon={self._epsilon}; spent so far epsilon={spent_eps:.6g}"
            )
        best = cost if isinstance(cost, ZCdp) else cost.best(self._delta)
        self._rdp = total
        rec = Spend(label, mechanism, best.rho, best.xi, epsilon_of_curve(rel, self._delta),
                    self._delta, total_eps, self._delta)
        self._spends.append(rec)
        return rec
