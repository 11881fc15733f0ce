"""The privacy budget of one training job.

:class:`PrivacyAccountant` wraps diffprivlib's ``BudgetAccountant`` (basic composition: epsilons
add up, deltas compose as ``1 - prod(1 - delta_i)``) and records every spend.

How the budget is split
-----------------------
A forest grows level by level; every aggregation round that releases data-dependent sums is one
Gaussian release. The total (epsilon, delta) is divided **equally over the rounds**::

    n_rounds = max_depth * rounds_per_level + extra_rounds      (e.g. leaves: extra_rounds = 1)
    epsilon_r = epsilon / n_rounds
    delta_r   = 1 - (1 - delta) ** (1 / n_rounds)

(each share is shrunk by a relative 1e-9 so that floating-point rounding never makes the last
planned spend exceed the budget). One round's vector covers all trees and all nodes of the level:
a record sits in one node per tree, so nodes of a tree compose in parallel and the trees are
covered by the round's sensitivity (``histogram_sensitivity(n_trees=T)``), not by more spends.

Fail closed: an infinite or missing budget is a :class:`~fedforest_secure.errors.BudgetError`,
and so is any spend beyond the budget (nothing is recorded then).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from diffprivlib import BudgetAccountant
from diffprivlib.utils import BudgetError as _DplBudgetError

from ..errors import BudgetError

if TYPE_CHECKING:
    from .profile import PrivacyProfile

__all__ = ["PrivacyAccountant", "Spend"]

_SHRINK = 1.0 - 1e-9


@dataclass(frozen=True)
class Spend:
    """One recorded release.

    Attributes
    ----------
    label : str
        What was released (e.g. ``"level 3 histograms"``).
    mechanism : str
    epsilon, delta : float
        This release's cost.
    total_epsilon, total_delta : float
        Running total after it (diffprivlib's composition).
    """

    label: str
    mechanism: str
    epsilon: float
    delta: float
    total_epsilon: float
    total_delta: float


class PrivacyAccountant:
    """Budget of one job, split equally over its planned rounds.

    Parameters
    ----------
    epsilon : float
        Total budget, finite and > 0.
    delta : float
        Total delta in (0, 1).
    n_rounds : int
        Planned data-releasing rounds (see module docstring).
    """

    def __init__(self, epsilon: float, delta: float, *, n_rounds: int) -> None:
        if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
            raise BudgetError(f"a DP budget needs a finite epsilon > 0, got {epsilon!r}")
        if not (isinstance(delta, int | float) and 0 < delta < 1):
            raise BudgetError(f"delta must be in (0, 1), got {delta!r}")
        if not isinstance(n_rounds, int) or isinstance(n_rounds, bool) or n_rounds < 1:
            raise BudgetError(f"n_rounds must be an int >= 1, got {n_rounds!r}")
        self._epsilon = float(epsilon)
        self._delta = float(delta)
        self._n_rounds = n_rounds
        self._inner = BudgetAccountant(epsilon=self._epsilon, delta=self._delta)
        self._spends: list[Spend] = []

    @classmethod
    def from_profile(
        cls,
        profile: PrivacyProfile,
        *,
        max_depth: int,
        rounds_per_level: int = 1,
        extra_rounds: int = 1,
    ) -> PrivacyAccountant:
        """Accountant for a forest of depth ``max_depth``.

        Raises
        ------
        BudgetError
            The profile has no ``[dp]`` section.
        """
        if profile.dp is None:
            raise BudgetError(f"profile {profile.name!r} has no [dp] section: no budget")
        for label, v in (("max_depth", max_depth), ("rounds_per_level", rounds_per_level)):
            if not isinstance(v, int) or v < 1:
                raise BudgetError(f"{label} must be an int >= 1, got {v!r}")
        if not isinstance(extra_rounds, int) or extra_rounds < 0:
            raise BudgetError(f"extra_rounds must be an int >= 0, got {extra_rounds!r}")
        n = max_depth * rounds_per_level + extra_rounds
        return cls(profile.dp.epsilon, profile.dp.delta, n_rounds=n)

    @property
    def epsilon(self) -> float:
        """Total epsilon."""
        return self._epsilon

    @property
    def delta(self) -> float:
        """Total delta."""
        return self._delta

    @property
    def n_rounds(self) -> int:
        """Planned rounds."""
        return self._n_rounds

    @property
    def per_round(self) -> tuple[float, float]:
        """Equal (epsilon, delta) share of one round."""
        eps = self._epsilon / self._n_rounds * _SHRINK
        delta = -math.expm1(math.log1p(-self._delta) / self._n_rounds) * _SHRINK
        return eps, delta

    @property
    def spends(self) -> tuple[Spend, ...]:
        """Every recorded release, in order."""
        return tuple(self._spends)

    @property
    def spent(self) -> tuple[float, float]:
        """(epsilon, delta) spent so far."""
        total = self._inner.total()
        return float(total[0]), float(total[1])

    @property
    def rounds_left(self) -> int:
        """How many more equal shares fit in the budget."""
        eps, delta = self.per_round
        spent_eps, _ = self.spent
        return max(0, int(math.floor((self._epsilon - spent_eps) / eps + 1e-6)))

    def spend(
        self,
        label: str,
        *,
        mechanism: str = "gaussian_discrete",
        epsilon: float | None = None,
        delta: float | None = None,
    ) -> Spend:
        """Record one release (default: one equal round share).

        Raises
        ------
        BudgetError
            The spend would exceed the budget; nothing is recorded.
        """
        share_eps, share_delta = self.per_round
        eps = share_eps if epsilon is None else epsilon
        dlt = share_delta if delta is None else delta
        if not (math.isfinite(eps) and eps > 0) or not 0 <= dlt < 1:
            raise BudgetError(f"invalid spend (epsilon={eps}, delta={dlt})")
        try:
            self._inner.spend(eps, dlt)
        except _DplBudgetError:
            spent_eps, spent_delta = self.spent
            raise BudgetError(
                f"privacy budget exhausted: spending (epsilon={eps:.6g}, delta={dlt:.3g}) for "
                f"{label!r} would exceed (epsilon={self._epsilon}, delta={self._delta}); spent "
                f"so far (epsilon={spent_eps:.6g}, delta={spent_delta:.3g})"
            ) from None
        total_eps, total_delta = self.spent
        rec = Spend(label, mechanism, eps, dlt, total_eps, total_delta)
        self._spends.append(rec)
        return rec
