"""DP of an evaluation: sensitivities hold under brute-force record removal, the calibrated
noise spends exactly the budget and has the calibrated scale, and it fails closed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from fedforest_secure.config import JobConfig
from fedforest_secure.errors import BudgetError, ProtocolError
from fedforest_secure.evaluation import EvalSpec, eval_layout
from fedforest_secure.evaluation.coordinator import EvalCoordinator
from fedforest_secure.evaluation.encoding import encode_statistics
from fedforest_secure.evaluation.inprocess import eval_config
from fedforest_secure.evaluation.layout import EvalLayout
from fedforest_secure.evaluation.noise import block_sensitivity, config_layout, eval_noise
from fedforest_secure.evaluation.stats import model_statistics
from fedforest_secure.privacy import load_profile
from fedforest_secure.privacy.accountant import epsilon_of


def _encoded(layout: EvalLayout, preds: list[np.ndarray], y: np.ndarray) -> np.ndarray:
    per = [model_statistics(layout, v, y) for v in preds]
    stats = {b.name: np.stack([s[b.name] for s in per]) for b in layout.blocks}
    return encode_statistics(layout, stats, len(y), dp=True)


def _blocks(layout: EvalLayout, vec: np.ndarray) -> dict[str, np.ndarray]:
    out, start = {}, 0
    for b in layout.blocks:
        size = layout.n_models * b.size
        out[b.name] = vec[start:start + size]
        start += size
    return out


def _adversarial_classification(rng: np.random.Generator, n: int, c: int) -> np.ndarray:
    p = rng.dirichlet(np.full(c, 0.5), size=n)
    p[::7] = np.eye(c)[rng.integers(0, c, size=len(p[::7]))]  # certain, and often wrong
    p[1::11] = 1.0 / c
    return p


@pytest.mark.parametrize("n_classes", [2, 4])
def test_classification_sensitivity_holds_under_brute_force_removal(n_classes: int) -> None:
    rng = np.random.default_rng(n_classes)
    n = 60
    y = rng.integers(0, n_classes, size=n)
    preds = [_adversarial_classification(rng, n, n_classes) for _ in range(2)]
    spec = EvalSpec(models=("{}", "{}"), names=("a", "b"), score_bins=8, calibration_bins=5)
    layout = eval_layout(spec, "classification", n_classes, 0.0, dp=True)
    _check_removal(layout, preds, y)


def test_regression_sensitivity_holds_under_brute_force_removal() -> None:
    rng = np.random.default_rng(3)
    n = 60
    lo, hi = -4.0, 10.0
    y = rng.uniform(lo, hi, size=n)
    y[::5] = hi
    y[1::5] = lo
    preds = [np.where(rng.random(n) < 0.5, lo, hi), rng.uniform(lo - 5, hi + 5, size=n)]
    spec = EvalSpec(models=("{}", "{}"), names=("a", "b"), pva_bins=6, target_range=(lo, hi))
    layout = eval_layout(spec, "regression", 0, hi, dp=True)
    _check_removal(layout, preds, y)


def _check_removal(layout: EvalLayout, preds: list[np.ndarray], y: np.ndarray) -> None:
    full = _blocks(layout, _encoded(layout, preds, y))
    worst = {b.name: 0.0 for b in layout.blocks}
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        less = _blocks(layout, _encoded(layout, [v[keep] for v in preds], y[keep]))
        for b in layout.blocks:
            d = full[b.name] - less[b.name]
            sens = block_sensitivity(layout, b)
            assert np.abs(d).sum() <= sens.l1 + 1e-9, b.name
            assert np.sqrt((d * d).sum()) <= sens.l2 + 1e-9, b.name
            assert np.abs(d).max() <= sens.linf + 1e-9, b.name
            worst[b.name] = max(worst[b.name], float(np.sqrt((d * d).sum())))
    for b in layout.blocks:  # the bounds are not vacuous: some record comes close
        assert worst[b.name] >= 0.5 * block_sensitivity(layout, b).l2, b.name


def _dp_config(epsilon: float = 1.0, n_clients: int = 4, **spec_kw: Any) -> JobConfig:
    from sklearn.datasets import make_classification

    from fedforest_secure import FedForestClassifier

    X, y = make_classification(n_samples=80, n_features=4, random_state=0)
    model = FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(X, y)
    spec = EvalSpec(models=(model.model_.to_json(),), **spec_kw)
    return eval_config("ev", spec, task="classification", n_features=4, n_clients=n_clients,
                       n_classes=2, profile=load_profile("secure-dp", epsilon=epsilon).to_dict())


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0])
def test_the_release_spends_exactly_the_budget(epsilon: float) -> None:
    config = _dp_config(epsilon)
    noise = eval_noise(config)
    assert noise.k_min == 3  # 4 sites, threshold 0.67
    assert epsilon_of([noise.cost()], noise.delta) == pytest.approx(epsilon, rel=1e-6)
    coord = EvalCoordinator(config)
    spends, _ = coord.pop_events()
    assert len(spends) == 1 and spends[0]["total_epsilon"] == pytest.approx(epsilon, rel=1e-6)


def test_more_budget_means_less_noise() -> None:
    small = eval_noise(_dp_config(0.5)).sigmas
    large = eval_noise(_dp_config(4.0)).sigmas
    assert all(large[k] < small[k] for k in small)


def test_site_noise_has_the_calibrated_scale() -> None:
    config = _dp_config(1.0, score_bins=40)
    noise = eval_noise(config)
    layout = config_layout(config)
    draws = np.stack([noise.sample(layout) for _ in range(300)])
    start = 0
    for b in layout.blocks:
        size = layout.n_models * b.size
        got = draws[:, start:start + size].std()
        start += size
        # >= 300 samples per block: 5 standard errors of a std is < 21 % at 300, ~4 % for
        # the score bins' 24,000
        se = 1.0 / math.sqrt(2.0 * draws.shape[0] * size)
        assert abs(got / noise.sigmas[b.name] - 1.0) < 5 * se + 0.01, b.name


def test_a_sum_over_fewer_sites_than_the_noise_is_calibrated_for_is_not_released() -> None:
    config = _dp_config(1.0)
    coord = EvalCoordinator(config)
    task = coord.next_task()
    assert task is not None
    total = np.zeros(sum(b.size for b in task.layout))
    with pytest.raises(ProtocolError, match="calibrated for at least 3"):
        coord.submit(task.round_id, total, participants=[0, 1])
    coord.submit(task.round_id, total, participants=[0, 1, 2])
    assert coord.done


def test_a_dp_evaluation_fails_closed_without_a_budget() -> None:
    config = _dp_config(1.0)
    prof = dict(config.profile)
    prof["dp"] = None
    from dataclasses import replace

    no_budget = replace(config, profile=prof)
    with pytest.raises(BudgetError):
        eval_noise(no_budget)
