"""Tests for fedforest_secure.privacy.allocation: the allocation rule and the job's noise plan."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fedforest_secure.errors import BudgetError
from fedforest_secure.privacy import ZCdp, epsilon_of, histogram_sensitivity, load_profile
from fedforest_secure.privacy.allocation import (
    PlannedBlock,
    PlannedRelease,
    calibrate,
    dp_forest_settings,
    level_signal_to_noise,
    random_split_depth,
    release_cost,
)

EPS = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]


@pytest.mark.parametrize(("n", "d", "c", "task"), [
    (100, 4, 3, "classification"), (400, 30, 2, "classification"),
    (124, 13, 3, "classification"), (5000, 50, 10, "classification"),
    (300, 10, 0, "regression"), (8000, 8, 0, "regression")])
def test_more_budget_never_makes_the_forest_shallower(n: int, d: int, c: int, task: str) -> None:
    # random splits: 64 trees (classification at epsilon >= 8: 128), 32 marginal bins; the
    # depth depends on the rows, and for regression also grows with epsilon (never past the
    # rows' depth)
    shapes = [dp_forest_settings(e, n, d, c, task) for e in EPS]
    assert {(s.method, s.max_features, s.n_bins) for s in shapes} == {("random", 1, 32)}
    trees = [s.n_estimators for s in shapes]
    assert trees == sorted(trees)  # more budget never gives fewer trees
    assert trees == [128 if task == "classification" and e >= 8 else 64 for e in EPS]
    depths = [s.max_depth for s in shapes]
    assert depths == sorted(depths) and 3 <= depths[0] and depths[-1] <= 8
    assert depths == [random_split_depth(n, task, e) for e in EPS]
    assert depths[-1] <= random_split_depth(n, task)
    if task == "classification":
        assert set(depths) == {random_split_depth(n, task)}
    # greedy splits: the depth grows with epsilon
    depths = [dp_forest_settings(e, n, d, c, task, method="histogram").max_depth for e in EPS]
    assert depths == sorted(depths) and 1 <= depths[0] and depths[-1] <= 3
    for e in EPS:
        got = dp_forest_settings(e, n, d, c, task, method="histogram")
        assert got.n_bins == 4 and got.sampling == "all"
        assert got.max_features == (max(1, d // 10) if task == "classification" else min(2, d))
        # the chosen depth's deepest level clears the threshold (or it is the minimum, 1)
        snr = level_signal_to_noise(e, 1e-6, n, max(c, 2) if c else 1, task, got.n_estimators,
                                    got.max_features, got.max_depth)
        assert got.max_depth == 1 or snr >= (0.6 if task == "classification" else 2.0)


def test_more_rows_never_make_the_forest_shallower() -> None:
    for e, (d, c) in itertools.product(EPS, [(13, 3), (30, 2)]):
        for method in ("random", "histogram"):
            depths = [dp_forest_settings(e, n, d, c, "classification", method=method).max_depth
                      for n in (50, 100, 400, 1600, 6400)]
            assert depths == sorted(depths)


def test_rule_fails_closed() -> None:
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(BudgetError):
            dp_forest_settings(bad, 100, 4, 2, "classification")
    with pytest.raises(BudgetError):
        dp_forest_settings(1.0, 0, 4, 2, "classification")
    with pytest.raises(BudgetError):
        dp_forest_settings(1.0, 100, 4, 2, "ranking")


def _plan(k_min: int = 3, dims: int = 500) -> list[PlannedRelease]:
    count = histogram_sensitivity("class_count", n_features=2, n_trees=8)
    total = histogram_sensitivity("count", n_trees=8)
    return [PlannedRelease("level 0", k_min, (PlannedBlock("count", count, dims, 0.5),)),
            PlannedRelease("leaves", k_min, (PlannedBlock("count", total, dims, 0.3),
                                             PlannedBlock("sum", total.scaled(7.0), dims, 0.2)))]


@pytest.mark.parametrize(("eps", "k_min"), [(0.5, 1), (1.0, 3), (8.0, 3), (8.0, 30)])
def test_calibration_spends_exactly_the_budget(eps: float, k_min: int) -> None:
    plan = _plan(k_min)
    sig = calibrate(plan, eps, 1e-6)
    costs = [release_cost(r, s) for r, s in zip(plan, sig, strict=True)]
    assert epsilon_of(costs, 1e-6) == pytest.approx(eps, rel=1e-6)
    assert epsilon_of(costs, 1e-6) <= eps * (1 + 1e-9)
    # 1% less noise everywhere would overspend
    less = [release_cost(r, [x * 0.99 for x in s]) for r, s in zip(plan, sig, strict=True)]
    assert epsilon_of(less, 1e-6) > eps
    # the shares are as planned when the distributed-sum terms vanish (large noise)
    if eps < 8.0:
        rhos = [b.sensitivity.l2**2 / (2 * k_min * x**2)
                for r, s in zip(plan, sig, strict=True) for b, x in zip(r.blocks, s, strict=True)]
        assert [r / sum(rhos) for r in rhos] == pytest.approx([0.5, 0.3, 0.2], rel=1e-6)
        assert epsilon_of([ZCdp(sum(rhos))], 1e-6) == pytest.approx(eps, rel=1e-6)


def test_calibration_refuses_bad_plans() -> None:
    plan = _plan()
    with pytest.raises(BudgetError):
        calibrate(plan, math.inf, 1e-6)
    with pytest.raises(BudgetError):
        calibrate(plan[:1], 1.0, 1e-6)  # shares add up to 0.5
    with pytest.raises(BudgetError):
        calibrate([], 1.0, 1e-6)


def test_noise_plan_covers_the_missing_values_bin() -> None:
    """A job whose rows may miss values sends one more bin per slot (the missing rows'). The
    plan's block lengths must cover every histogram round actually sent: a shorter planned
    length under-counts the distributed-noise term (tau * d) of the accounting."""
    import numpy as np

    from fedforest_secure import FedForestClassifier, load_profile
    from fedforest_secure.privacy.allocation import job_noise
    from fedforest_secure.secure_sum import noise_units

    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 6))
    y = (X[:, 0] > 0).astype(int)
    X[rng.random(X.shape) < 0.3] = np.nan
    rounds: list = []
    est = FedForestClassifier(method="histogram", n_estimators=2, max_depth=3, n_bins=8,
                              max_features=None,
                              profile=load_profile("secure-dp", epsilon=2.0)).fit(
        X, y, client=np.arange(240) % 3, on_round=rounds.append)
    cfg = est.config_
    assert cfg.has_missing
    plan = job_noise(cfg, noise_units(cfg))
    sent = [r.task for r in rounds if r.task.kind.value == "histogram"]
    assert sent
    for task in sent:
        (block,) = task.layout
        assert block.shape[2] == cfg.n_bins + 1  # candidates' bins + the missing rows' bin
        planned = {b.name: b.dims for b in plan.releases[task.level].blocks}
        assert block.size <= planned["count"]


def test_random_regression_depth_follows_the_leaf_noise() -> None:
    """Random-split regression: small budgets get shallow trees (a leaf keeps about 16 standard
    deviations of the averaged count noise), large ones the rows' depth."""
    assert [random_split_depth(700, "regression", e) for e in (0.5, 1, 2, 4, 8)] == \
        [3, 3, 3, 4, 5]
    assert random_split_depth(700, "regression") == 6
    assert random_split_depth(700, "regression", 1e6) == 6
    assert random_split_depth(5000, "regression", 0.5) == 4


def test_a_budget_no_noise_scale_reaches_is_a_budget_error() -> None:
    """An epsilon the profile accepts but the accountant cannot reach (its orders stop at
    10^4): a BudgetError that says so, not an overflow from doubling the noise forever."""
    from sklearn.datasets import load_breast_cancer

    from fedforest_secure import FedForestClassifier, load_profile

    X, y = load_breast_cancer(return_X_y=True)
    est = FedForestClassifier(profile=load_profile("secure-dp", epsilon=1e-4), n_estimators=4,
                              max_depth=2)
    with pytest.raises(BudgetError, match="below what the accountant certifies"):
        est.fit(X, y, client=np.arange(len(y)) % 4)


@pytest.mark.parametrize(("n", "d", "c"), [(150, 4, 3), (300, 13, 3), (569, 30, 3),
                                           (400, 30, 2), (5000, 50, 10)])
def test_greedy_depth_never_shrinks_as_epsilon_grows_across_the_switch_to_8_trees(
        n: int, d: int, c: int) -> None:
    """At epsilon = 2 the greedy rule may double the trees, which halves each level's budget:
    where that would cost depth, it keeps 4 trees."""
    grid = [round(x, 3) for x in np.arange(1.0, 4.0, 0.1)]
    shapes = [dp_forest_settings(e, n, d, c, "classification", method="histogram")
              for e in grid]
    depths = [s.max_depth for s in shapes]
    assert depths == sorted(depths), list(zip(grid, depths, strict=True))
    assert {s.n_estimators for s, e in zip(shapes, grid, strict=True) if e < 2} == {4}


def test_dp_random_splits_refuse_more_leaves_than_memory_holds_before_any_work() -> None:
    """DP random splits grow every tree to its full depth: max_depth = 20 would build
    8 * 2^20 leaves per forest (a fit that runs out of memory after minutes); it is refused at
    once, naming the count and what to lower. Depth 12 is taken."""
    from fedforest_secure import FedForestClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    y = (X[:, 0] > 0).astype(int)
    h = np.arange(400) % 4
    prof = load_profile("secure-dp")
    est = FedForestClassifier(profile=prof, method="random", n_estimators=8, max_depth=20)
    with pytest.raises(ValueError, match=r"8 trees of 2\^20 leaves .* more than 262,144 "
                                         r"leaves: lower max_depth or n_estimators"):
        est.fit(X, y, client=h)
    FedForestClassifier(profile=prof, method="random", n_estimators=8, max_depth=12).fit(
        X, y, client=h)
