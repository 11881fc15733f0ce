"""Tests for fedforest_secure.privacy.accountant: Rényi/zCDP composition, one conversion,
checked against Google's dp-accounting."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fedforest_secure.errors import BudgetError
from fedforest_secure.estimators import FedForestClassifier, FedForestRegressor
from fedforest_secure.privacy import (
    Cost,
    PrivacyAccountant,
    ZCdp,
    epsilon_of,
    histogram_sensitivity,
    load_profile,
    plan_distributed_noise,
)
from fedforest_secure.privacy.accountant import ORDERS

dp_accounting = pytest.importorskip("dp_accounting")


def _reference(events: list[ZCdp], delta: float, orders: np.ndarray = ORDERS) -> float:
    """dp-accounting's RDP accountant on the same releases and orders."""
    acc = dp_accounting.rdp.RdpAccountant(orders=list(orders))
    acc.compose(dp_accounting.ComposedDpEvent(
        [dp_accounting.ZCDpEvent(rho=e.rho, xi=e.xi) for e in events]))
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize("rho", [0.003, 0.02, 0.3, 1.0, 5.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-6, 1e-9])
def test_conversion_equals_dp_accounting(rho: float, delta: float) -> None:
    events = [ZCdp(rho / 3), ZCdp(rho / 3, xi=1e-4), ZCdp(rho / 3)]
    assert epsilon_of(events, delta) == pytest.approx(_reference(events, delta), rel=1e-12)
    # the fixed grid is fine enough: a 20x denser one changes epsilon by < 0.1%
    dense = 1.0 + np.geomspace(0.0101, 1.0e4, 24000)
    ref = _reference(events, delta, dense)
    assert ref <= epsilon_of(events, delta) <= ref * 1.001


def _dp_job(cls: type, task: str, eps: float, method: str) -> tuple[object, float]:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(240, 5))
    y = (X[:, 0] > 0).astype(int) if task == "classification" else X[:, 0] + rng.normal(size=240)
    est = cls(profile=load_profile("secure-dp", epsilon=eps), n_estimators=3, max_depth=3,
              max_features=2, n_bins=4, random_state=1, method=method)
    seen: list[object] = []
    est.fit(X, y, client=np.arange(240) % 4, on_round=seen.append)
    return est, eps


def _coordinator_of(monkeypatch: pytest.MonkeyPatch, fit: Callable[[], object]) -> Any:
    """The one coordinator ``fit()`` made (its DP spends, its accountant)."""
    from fedforest_secure import coordinator as coordinator_mod

    made: list[coordinator_mod.Coordinator] = []
    real_init = coordinator_mod.Coordinator.__init__

    def spy(self: coordinator_mod.Coordinator, *a: object, **kw: object) -> None:
        real_init(self, *a, **kw)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(coordinator_mod.Coordinator, "__init__", spy)
    fit()
    (coord,) = made
    return coord


@pytest.mark.parametrize(("cls", "task"), [(FedForestClassifier, "classification"),
                                           (FedForestRegressor, "regression")])
@pytest.mark.parametrize("eps", [0.5, 2.0, 8.0])
@pytest.mark.parametrize(("method", "n_releases"), [("histogram", 3), ("random", 2)])
def test_a_jobs_epsilon_equals_dp_accounting(cls: type, task: str, eps: float, method: str,
                                             n_releases: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A real DP job: the accountant's total equals dp-accounting's on the recorded releases,
    and the calibration spends the whole budget (greedy splits: a histogram release per
    splitting level; random splits: the marginal counts and the leaves' totals)."""
    coord = _coordinator_of(monkeypatch, lambda: _dp_job(cls, task, eps, method))
    spends = coord.dp_spends
    assert len(spends) == n_releases
    events = [ZCdp(s["rho"], s["xi"]) for s in spends]
    # the recorded (rho, xi) is the bound in force at every order (tau is negligible here)
    for s, rec in zip(coord.accountant.spends, events, strict=True):
        assert s.rho == rec.rho
    total = coord.accountant.spent[0]
    ref = _reference(events, 1e-6)
    if all(e.xi < 1e-12 for e in events):  # one bound holds at every order: the same curve
        assert total == pytest.approx(ref, rel=1e-9)
    else:  # small noise on integer counts: the accountant takes the smaller bound per order
        assert total <= ref * (1 + 1e-12) and ref == pytest.approx(total, rel=1e-3)
    assert total == pytest.approx(spends[-1]["total_epsilon"], rel=1e-12)
    assert total <= eps * (1 + 1e-9) and total == pytest.approx(eps, rel=1e-4)


def test_an_auditor_recomputes_a_jobs_epsilon_from_its_dp_spend_entries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's dp_spend entries carry each release's (rho, xi): composing them gives the
    job's total ε, as the last entry's total_epsilon says (per-release ε do not add up)."""
    from server_app.audit_hook import record_events

    coord = _coordinator_of(
        monkeypatch, lambda: _dp_job(FedForestClassifier, "classification", 1.0, "histogram"))

    class Sink:
        enabled = True

        def __init__(self) -> None:
            self.entries: list[dict[str, object]] = []

        def append(self, job_id: str, kind: str, payload: dict[str, object],
                   arrays: object = None) -> None:
            self.entries.append({"kind": kind, **payload})

    sink = Sink()
    record_events(sink, "j", 1, coord.dp_spends, [])  # type: ignore[arg-type]
    logged = [e for e in sink.entries if e["kind"] == "dp_spend"]
    assert len(logged) == 3
    events = [ZCdp(float(e["rho"]), float(e["xi"])) for e in logged]  # type: ignore[arg-type]
    assert epsilon_of(events, 1e-6) == pytest.approx(float(logged[-1]["total_epsilon"]),
                                                     rel=1e-9)
    assert sum(float(e["epsilon"]) for e in logged) > 1.0  # type: ignore[arg-type]


def test_zcdp_saves_budget_over_basic_composition() -> None:
    """Noise calibrated release by release for basic composition (three releases of
    epsilon = 1/3) composes in zCDP to epsilon < 0.6, not 1."""
    sens = histogram_sensitivity("class_count", n_features=3, n_trees=8)
    basic = plan_distributed_noise(1 / 3, 1e-6 / 3, sens, n_clients=4, dropout_tolerance=0.25,
                                   dims=1000)
    rho = sens.l2**2 / (2 * 3 * basic.sigma_client**2)
    assert 0.5 < epsilon_of([ZCdp(rho)] * 3, 1e-6) < 0.6


def test_spends_accumulate_and_refuse_past_the_budget() -> None:
    acc = PrivacyAccountant(1.0, 1e-6)
    assert acc.spent == (0.0, 0.0)
    a = acc.spend("level 0", ZCdp(0.008), mechanism="gaussian_discrete")
    b = acc.spend("level 1", Cost.of(ZCdp(0.008), ZCdp(0.5)))  # the smaller bound counts
    assert a.total_epsilon < b.total_epsilon == pytest.approx(epsilon_of([ZCdp(0.016)], 1e-6))
    assert b.total_epsilon < a.epsilon + b.epsilon  # composition beats adding epsilons
    assert acc.spends == (a, b) and a.label == "level 0" and a.rho == 0.008
    before = acc.rdp
    with pytest.raises(BudgetError, match="'level 2'"):
        acc.spend("level 2", ZCdp(0.05))
    assert acc.spends == (a, b) and np.array_equal(acc.rdp, before)  # nothing recorded
    acc.spend("small", ZCdp(0.001))


@pytest.mark.parametrize(("eps", "delta"), [(math.inf, 1e-6), (0.0, 1e-6), (-1.0, 1e-6),
                                            (math.nan, 1e-6), (1.0, 0.0), (1.0, 1.0)])
def test_fail_closed_without_finite_budget(eps: float, delta: float) -> None:
    with pytest.raises(BudgetError):
        PrivacyAccountant(eps, delta)


def test_bad_bounds_are_refused() -> None:
    for rho, xi in [(-1.0, 0.0), (math.inf, 0.0), (0.1, -1.0), (math.nan, 0.0)]:
        with pytest.raises(BudgetError):
            ZCdp(rho, xi)
    with pytest.raises(BudgetError):
        Cost(())
    with pytest.raises(BudgetError):
        epsilon_of([ZCdp(0.1)], 0.0)
