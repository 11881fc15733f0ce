"""Tests for fedforest_secure.privacy.accountant."""

from __future__ import annotations

import math

import pytest

from fedforest_secure.errors import BudgetError
from fedforest_secure.privacy import PrivacyAccountant, load_profile


@pytest.mark.parametrize("n_rounds", [1, 3, 7, 10, 13, 100])
def test_equal_split_spends_exactly_the_budget(n_rounds: int) -> None:
    acc = PrivacyAccountant(1.0, 1e-6, n_rounds=n_rounds)
    eps_r, delta_r = acc.per_round
    assert eps_r == pytest.approx(1.0 / n_rounds, rel=1e-8)
    assert 1 - (1 - delta_r) ** n_rounds == pytest.approx(1e-6, rel=1e-6)
    assert acc.rounds_left == n_rounds
    for r in range(n_rounds):
        rec = acc.spend(f"level {r}")
        assert rec.epsilon == eps_r and rec.delta == delta_r
        assert rec.total_epsilon == pytest.approx((r + 1) * eps_r)
    assert acc.rounds_left == 0
    assert acc.spent[0] <= 1.0 and acc.spent[1] <= 1e-6
    with pytest.raises(BudgetError, match="budget exhausted"):
        acc.spend("one too many")
    assert len(acc.spends) == n_rounds  # the refused spend is not recorded


def test_records_running_totals_and_mechanism() -> None:
    acc = PrivacyAccountant(2.0, 1e-5, n_rounds=4)
    a = acc.spend("sketch", epsilon=0.5, delta=0.0, mechanism="gaussian_discrete")
    b = acc.spend("histograms", epsilon=0.25, delta=1e-6)
    assert (a.label, a.mechanism, a.total_epsilon, a.total_delta) == (
        "sketch",
        "gaussian_discrete",
        0.5,
        0.0,
    )
    assert b.total_epsilon == pytest.approx(0.75) and b.total_delta == pytest.approx(1e-6)
    assert acc.spends == (a, b)
    with pytest.raises(BudgetError, match="'leaves'"):
        acc.spend("leaves", epsilon=1.5)
    assert acc.spent[0] == pytest.approx(0.75)
    with pytest.raises(BudgetError, match="invalid spend"):
        acc.spend("bad", epsilon=-1.0)
    with pytest.raises(BudgetError, match="invalid spend"):
        acc.spend("bad", epsilon=math.nan)


@pytest.mark.parametrize(
    ("eps", "delta", "n"),
    [(math.inf, 1e-6, 3), (0.0, 1e-6, 3), (1.0, 0.0, 3), (1.0, 1.0, 3), (1.0, 1e-6, 0)],
)
def test_fail_closed_without_finite_budget(eps: float, delta: float, n: int) -> None:
    with pytest.raises(BudgetError):
        PrivacyAccountant(eps, delta, n_rounds=n)


def test_from_profile() -> None:
    acc = PrivacyAccountant.from_profile(
        load_profile("secure-dp", epsilon=3.0), max_depth=5, rounds_per_level=2, extra_rounds=2
    )
    assert acc.n_rounds == 12 and acc.epsilon == 3.0 and acc.delta == 1e-6
    assert acc.per_round[0] == pytest.approx(0.25)
    with pytest.raises(BudgetError, match="no \\[dp\\] section"):
        PrivacyAccountant.from_profile(load_profile("secure"), max_depth=3)
    with pytest.raises(BudgetError, match="max_depth"):
        PrivacyAccountant.from_profile(load_profile("secure-dp"), max_depth=0)
