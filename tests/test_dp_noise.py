"""Calibration and distribution of the distributed discrete Gaussian noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fedforest_secure.errors import AbortedRound, BudgetError
from fedforest_secure.privacy import (
    Sensitivity,
    add_distributed_noise,
    central_sigma,
    histogram_sensitivity,
    load_profile,
    min_survivors,
    plan_distributed_noise,
    require_dp_ready,
    rho_for,
    zcdp_delta,
)
from fedforest_secure.schema import Schema

COUNT = histogram_sensitivity("count")


def test_diffprivlib_imports() -> None:
    """diffprivlib 0.6.6 breaks with scikit-learn >= 1.9 (the pin in pyproject.toml)."""
    import diffprivlib
    from diffprivlib.mechanisms import GaussianDiscrete

    assert diffprivlib.__version__
    assert GaussianDiscrete(epsilon=1.0, delta=1e-6).randomise(0) is not None


def _analytic_delta(sigma: float, sens: float, eps: float) -> float:
    """Exact delta of the continuous Gaussian mechanism (Balle & Wang 2018, Thm. 8)."""
    a = sens / (2 * sigma)
    b = eps * sigma / sens
    return float(stats.norm.cdf(a - b) - math.exp(eps) * stats.norm.cdf(-a - b))


@pytest.mark.parametrize(("eps", "delta"), [(0.1, 1e-6), (1.0, 1e-6), (4.0, 1e-9)])
def test_rho_conversion_is_valid_and_tight(eps: float, delta: float) -> None:
    rho = rho_for(eps, delta)
    assert zcdp_delta(rho, eps) <= delta
    assert zcdp_delta(rho * 1.001, eps) > delta
    # never looser than the classical bound eps = rho + 2 sqrt(rho log 1/delta)
    assert rho >= (math.sqrt(eps + math.log(1 / delta)) - math.sqrt(math.log(1 / delta))) ** 2
    # rho-zCDP Gaussian with sensitivity 1: sigma = 1/sqrt(2 rho); its exact delta must fit
    assert _analytic_delta(1 / math.sqrt(2 * rho), 1.0, eps) <= delta


@pytest.mark.parametrize(("eps", "delta"), [(0.5, 1e-6), (1.0, 1e-6), (2.0, 1e-5)])
def test_single_client_plan_against_diffprivlib(eps: float, delta: float) -> None:
    plan = plan_distributed_noise(eps, delta, COUNT, n_clients=1, dropout_tolerance=0, dims=1)
    assert plan.k_min == 1
    assert plan.sigma_central == pytest.approx(central_sigma(eps, delta, COUNT))
    # at least diffprivlib's exact 1-D calibration, and not absurdly above it
    assert plan.sigma_central <= plan.sigma_client <= 1.2 * plan.sigma_central
    assert _analytic_delta(plan.sigma_client, 1.0, eps) <= delta


def test_central_sigma_uses_diffprivlib() -> None:
    from diffprivlib.mechanisms import GaussianAnalytic, GaussianDiscrete

    assert central_sigma(1.0, 1e-6, COUNT) == GaussianDiscrete(epsilon=1.0, delta=1e-6)._scale
    vec = histogram_sensitivity("count", n_features=9)
    expect = GaussianAnalytic(epsilon=1.0, delta=1e-6, sensitivity=3.0)._scale
    assert central_sigma(1.0, 1e-6, vec) == pytest.approx(expect)


def test_min_survivors() -> None:
    assert min_survivors(10, 0.3) == 7
    assert min_survivors(10, 0.0) == 10
    assert min_survivors(3, 0.33) == 3
    assert min_survivors(3, 0.34) == 2
    assert min_survivors(1, 0.9) == 1
    with pytest.raises(BudgetError):
        min_survivors(0, 0.1)
    with pytest.raises(BudgetError):
        min_survivors(5, 1.0)


def test_plan_monotonicity_and_tau() -> None:
    def plan(**kw: float) -> float:
        args = {
            "epsilon": 1.0,
            "delta": 1e-6,
            "n_clients": 10,
            "dropout_tolerance": 0.3,
            "dims": 100,
        }
        args.update(kw)
        return plan_distributed_noise(
            args["epsilon"],
            args["delta"],
            COUNT,
            n_clients=int(args["n_clients"]),
            dropout_tolerance=args["dropout_tolerance"],
            dims=int(args["dims"]),
        ).sigma_client

    assert plan(epsilon=2.0) < plan()
    assert plan(n_clients=20) < plan()
    assert plan(dropout_tolerance=0.5) > plan()
    # with many clients each share is small; the distributed bound (tau) then needs more noise
    # for long vectors than sigma/sqrt(K_min) alone
    many = plan_distributed_noise(1.0, 1e-6, COUNT, n_clients=200, dropout_tolerance=0, dims=1)
    long = plan_distributed_noise(1.0, 1e-6, COUNT, n_clients=200, dropout_tolerance=0, dims=10**6)
    assert long.sigma_client > many.sigma_client * 1.2


def test_aggregate_noise_scale_matches_calibration() -> None:
    """Seeded: the sum of K_min clients' noise has variance sigma_client**2 * K_min."""
    plan = plan_distributed_noise(1.0, 1e-6, COUNT, n_clients=10, dropout_tolerance=0.3, dims=1)
    assert plan.k_min == 7
    rng = np.random.default_rng(2024)
    n = 40_000
    total = sum(plan.sample(n, rng).astype(float) for _ in range(plan.k_min))
    assert total.var() == pytest.approx(plan.sigma_sum**2, rel=0.04)
    assert plan.sigma_sum >= plan.sigma_central  # the survivors' sum carries the target noise
    assert abs(total.mean()) < 5 * plan.sigma_sum / math.sqrt(n)
    # every client surviving only adds noise
    all10 = total + sum(plan.sample(n, rng).astype(float) for _ in range(3))
    assert all10.var() == pytest.approx(plan.sigma_client**2 * 10, rel=0.04)


def test_add_distributed_noise_and_survivors() -> None:
    plan = plan_distributed_noise(1.0, 1e-6, COUNT, n_clients=5, dropout_tolerance=0.4, dims=4)
    assert plan.k_min == 3
    out = add_distributed_noise(np.array([10, 20, 30, 40]), plan, np.random.default_rng(1))
    assert out.dtype == np.int64 and out.shape == (4,)
    assert not np.array_equal(out, [10, 20, 30, 40])
    with pytest.raises(BudgetError, match="integer"):
        add_distributed_noise(np.zeros(4), plan)
    with pytest.raises(BudgetError, match="length 4"):
        add_distributed_noise(np.zeros(3, dtype=np.int64), plan)
    plan.check_survivors(3)
    with pytest.raises(AbortedRound, match="not released"):
        plan.check_survivors(2)


def test_fixed_point_scaled_sensitivity() -> None:
    sens = histogram_sensitivity("sum", target_bounds=(0.0, 10.0)).scaled(2.0**10)
    plan = plan_distributed_noise(1.0, 1e-6, sens, n_clients=4, dropout_tolerance=0.25, dims=8)
    unit = plan_distributed_noise(1.0, 1e-6, COUNT, n_clients=4, dropout_tolerance=0.25, dims=8)
    assert plan.sigma_client == pytest.approx(unit.sigma_client * 10 * 2**10, rel=1e-3)


def test_fail_closed() -> None:
    for eps, delta in [(float("inf"), 1e-6), (0.0, 1e-6), (-1.0, 1e-6), (1.0, 0.0), (1.0, 1.0)]:
        with pytest.raises(BudgetError):
            plan_distributed_noise(eps, delta, COUNT, n_clients=3, dropout_tolerance=0, dims=1)
    with pytest.raises(BudgetError):
        plan_distributed_noise(1.0, 1e-6, COUNT, n_clients=3, dropout_tolerance=0, dims=0)
    with pytest.raises(BudgetError):
        Sensitivity(l1=float("inf"), l2=1.0, linf=1.0)
    schema = Schema.from_dict(
        {
            "target": {"name": "y", "kind": "regression"},
            "features": [{"name": "a", "kind": "continuous"}],
        }
    )
    with pytest.raises(BudgetError, match=r"public bounds for \['a', 'y'\]"):
        require_dp_ready(load_profile("secure-dp"), schema)
    with pytest.raises(BudgetError, match="no \\[dp\\] section"):
        require_dp_ready(load_profile("secure"), schema)
    ok = Schema.from_dict(
        {
            "target": {"name": "y", "kind": "classification", "classes": ["a", "b"]},
            "features": [{"name": "a", "kind": "continuous", "bounds": [0, 1]}],
        }
    )
    require_dp_ready(load_profile("secure-dp"), ok)
