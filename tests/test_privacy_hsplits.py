"""Tests for fedforest_secure.privacy.hsplits: H-splits on DP-noised per-client node summaries."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from fedforest_secure._tree import NodeKind
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import BudgetError, RefusedRequest
from fedforest_secure.estimators import FedForestClassifier, FedForestRegressor
from fedforest_secure.federation import RoundRecord, client_seed, make_aggregator, run_in_process
from fedforest_secure.privacy import (
    ZCdp,
    epsilon_of,
    histogram_sensitivity,
    load_profile,
    plan_distributed_noise,
)
from fedforest_secure.privacy.hsplits import (
    NodeStatsRelease,
    add_node_stats_noise,
    job_budget,
    node_stats_noise,
)
from fedforest_secure.protocol import TaskKind
from fedforest_secure.worker import Worker


def _noisy(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"h_splits": "noisy", "epsilon": 4.0, "h_epsilon": 2.0}
    base.update(kw)
    return load_profile("secure-dp", **base).to_dict()


def _cfg(**kw: Any) -> JobConfig:
    base: dict[str, Any] = dict(
        job_id="hjob", task="classification", n_features=3, n_clients=4, n_classes=3,
        feature_bounds=((-4.0, 4.0),) * 3, target_bound=1.0, n_estimators=2, max_depth=2,
        min_samples_leaf=5, max_features=2, n_bins=4, row_sampling="all",
        split_on_client=True, criterion="gini", random_state=3, profile=_noisy())
    base.update(kw)
    return JobConfig(**base)


def _client_shift(n: int = 800, K: int = 4, seed: int = 0
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two groups of clients with opposite labels; the features carry no signal."""
    rng = np.random.default_rng(seed)
    h = np.repeat(np.arange(K), n // K)
    X = rng.normal(size=(n, 3))
    y = (h >= K // 2).astype(np.int64)
    flip = rng.random(n) < 0.05
    return X, np.where(flip, 1 - y, y), h


# ------------------------------------------------------------------ training
def test_noisy_h_split_run_trains_and_splits_on_the_client_when_its_effect_is_strong() -> None:
    X, y, h = _client_shift()
    prof = load_profile("secure-dp", h_splits="noisy", epsilon=4.0, h_epsilon=2.0)
    est = FedForestClassifier(n_estimators=3, max_depth=2, split_on_client=True,
                              profile=prof, random_state=0).fit(X, y, client=h)
    roots = [int(t.kind[0]) for t in est.model_.trees]
    assert roots == [NodeKind.CLIENT] * 3
    for t in est.model_.trees:  # the root separates the two groups of clients
        assert sorted(t.sets[0]) in ([0, 1], [2, 3])
    assert est.score(X, y, client=h) > 0.9
    # without the client column the features cannot explain the labels
    plain = FedForestClassifier(n_estimators=3, max_depth=2, profile=prof,
                                random_state=0).fit(X, y, client=h)
    assert not plain.model_.uses_client
    assert plain.score(X, y) < 0.75


def test_noisy_h_split_regression_isolates_the_client_level() -> None:
    rng = np.random.default_rng(1)
    n, K = 600, 3
    h = np.repeat(np.arange(K), n // K)
    X = rng.normal(size=(n, 2))
    y = 0.3 * X[:, 0] + 10.0 * (h == 2) + 0.1 * rng.normal(size=n)
    prof = load_profile("secure-dp", h_splits="noisy", epsilon=4.0, h_epsilon=2.0)
    est = FedForestRegressor(n_estimators=2, max_depth=2, split_on_client=True,
                             profile=prof, random_state=0).fit(X, y, client=h)
    assert all(int(t.kind[0]) == NodeKind.CLIENT for t in est.model_.trees)
    pred = est.predict(X, client=h)
    assert abs(pred[h == 2].mean() - 10.0) < 1.5 and abs(pred[h < 2].mean()) < 1.5


def test_released_summaries_are_noisy_disclosures_of_the_splitting_levels() -> None:
    X, y, h = _client_shift(n=400)
    cfg = _cfg(n_estimators=3)
    clients = [(X[h == k], y[h == k]) for k in range(4)]
    recs: list[RoundRecord] = []
    run_in_process(cfg, clients, on_round=recs.append)
    sketch = [r for r in recs if r.task.kind == TaskKind.SKETCH]
    assert [("node_stats" in r.task.disclose) for r in sketch] == [True, True, False]
    level0 = sketch[0]
    assert level0.task.layout == ()  # the node summaries are the round's only release
    for k, (_, yk) in enumerate(clients):
        got = level0.disclosed[k]["node_stats"]
        true = np.tile(np.bincount(yk, minlength=3).astype(float), (3, 1))  # sampling "all"
        assert got.shape == true.shape
        assert not np.array_equal(got, true)  # noised ...
        assert np.array_equal(got, np.round(got))  # ... with integer (discrete) noise


# ------------------------------------------------------------------ calibration
def test_node_stats_noise_scale_follows_the_sensitivity_and_the_budget() -> None:
    cfg = _cfg()
    noise = node_stats_noise(cfg, n_nodes=2)
    # a record sits in one node per tree: L2 = sqrt(T) over the level's class counts; the
    # max_depth local releases (no tau term with one client) together are (h_epsilon, delta)-DP
    sens = histogram_sensitivity("class_count", n_trees=cfg.n_estimators)
    rho_h = sens.l2**2 / (2 * float(noise.sigma[0]) ** 2)
    assert epsilon_of([ZCdp(rho_h)] * cfg.max_depth, 1e-6) == pytest.approx(2.0, rel=1e-6)
    assert noise.cost.rdp() == pytest.approx(ZCdp(rho_h).rdp())
    # composing in zCDP: less noise than splitting h_epsilon over the levels and calibrating
    # each release alone
    alone = plan_distributed_noise(1.0, 1e-6 / 2, sens, n_clients=1, dropout_tolerance=0.0,
                                   dims=2 * 3)
    assert (noise.sigma_values < alone.sigma_client).all()
    # 4x the trees: twice the L2 sensitivity, twice the noise; twice the budget: less noise
    assert np.allclose(node_stats_noise(_cfg(n_estimators=8), 2).sigma_values,
                       2 * noise.sigma_values, rtol=0.02)
    richer = _cfg(profile=_noisy(h_epsilon=4.0))
    assert (node_stats_noise(richer, 2).sigma_values < noise.sigma_values).all()
    # disjoint row sampling: each record in one tree only
    assert (node_stats_noise(_cfg(n_estimators=8, row_sampling="disjoint"), 2).sigma_values
            < noise.sigma_values).all()


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_released_summaries_carry_noise_of_the_calibrated_scale(task: str) -> None:
    """Seeded: the residual of many releases has the calibrated std, zero mean."""
    kw: dict[str, Any] = {} if task == "classification" else dict(
        task="regression", n_classes=0, criterion="mse", target_bound=3.0)
    cfg = _cfg(**kw)
    n_nodes = 20_000
    noise = node_stats_noise(cfg, n_nodes)
    rng = np.random.default_rng(2024)
    if task == "classification":
        true = rng.integers(0, 50, size=(n_nodes, 3)).astype(float)
    else:
        cnt = rng.integers(1, 50, size=n_nodes).astype(float)
        s = rng.uniform(-3, 3, n_nodes) * cnt
        true = np.stack([cnt, s, np.abs(s) * 3.0], axis=1)
    got = add_node_stats_noise(true, noise, rng=np.random.default_rng(7))
    resid = got - true
    sd = resid.std(axis=0)
    target = noise.sigma_values
    # std of a sample std of 20000 Gaussians is ~0.5%: 3% is > 5 standard errors
    assert np.allclose(sd, target, rtol=0.03), (sd, target)
    assert (np.abs(resid.mean(axis=0)) < 5 * target / math.sqrt(n_nodes)).all()
    if task == "classification":
        assert np.array_equal(got, np.round(got))


def test_worker_releases_follow_the_calibration_end_to_end() -> None:
    """The node summaries a real worker discloses differ from its totals by the calibrated
    noise (fresh cryptographic randomness: a loose, many-entries check)."""
    T = 200  # 600 noisy entries: the std is known to ~3%, the bounds are 7 standard errors
    cfg = _cfg(n_estimators=T, n_clients=3)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 3))
    y = rng.integers(0, 3, size=90)
    w = Worker(cfg, X, y, client_index=0, seed=client_seed(cfg, 0))
    task = Coordinator(cfg).next_task()
    assert task is not None and "node_stats" in task.disclose
    got = w.handle(task).disclosed["node_stats"]
    true = np.tile(np.bincount(y, minlength=3).astype(float), (T, 1))
    resid = (got - true).ravel()
    sigma = float(node_stats_noise(cfg, T).sigma_values[0])
    assert 0.8 * sigma < resid.std() < 1.2 * sigma


# ------------------------------------------------------------------ refusals
def _level0_task_with_node_stats() -> Any:
    task = Coordinator(_cfg()).next_task()
    assert task is not None and "node_stats" in task.disclose
    return task


@pytest.mark.parametrize("profile", [
    load_profile("secure-dp", epsilon=4.0).to_dict(),  # h_splits = "off"
    load_profile("secure").to_dict(),
    load_profile("open", h_splits="off").to_dict(),
])
def test_worker_refuses_node_stats_when_its_own_profile_says_off(profile: dict[str, Any]
                                                                 ) -> None:
    assert profile["h_splits"] == "off"
    task = _level0_task_with_node_stats()  # the server asks under a noisy-H job config
    cfg = _cfg(profile=profile, split_on_client=False)
    w = Worker(cfg, np.zeros((10, 3)), np.zeros(10, dtype=np.int64), client_index=0)
    assert "node_stats" not in w.allowed_disclosures()
    with pytest.raises(RefusedRequest, match="node_stats"):
        w.handle(task)


def test_noisy_profile_allows_node_stats_only_with_noise() -> None:
    w = Worker(_cfg(), np.zeros((10, 3)), np.zeros(10, dtype=np.int64), client_index=0)
    assert w.allowed_disclosures() == {"node_stats"}
    # a profile dict claiming noisy H-splits without [dp] is refused (no noise scale)
    no_dp = dict(_noisy(), dp=None)
    w2 = Worker(_cfg(profile=no_dp, split_on_client=False), np.zeros((10, 3)),
                np.zeros(10, dtype=np.int64), client_index=0)
    assert "node_stats" not in w2.allowed_disclosures()


def test_a_client_releases_one_noisy_summary_per_splitting_level() -> None:
    cfg = _cfg()
    rel = NodeStatsRelease(cfg, rng=np.random.default_rng(0))
    totals = np.ones((2, 3))
    rel.release(0, totals)
    with pytest.raises(RefusedRequest, match="already"):
        rel.release(0, totals)  # fresh noise at the same level would be averaged out
    rel.release(1, totals)
    with pytest.raises(RefusedRequest, match="max_depth"):
        rel.release(cfg.max_depth, totals)
    assert rel.released_levels == {0, 1}


# ------------------------------------------------------------------ budget
def _train(cfg: JobConfig, clients: list[tuple[np.ndarray, np.ndarray]]) -> Coordinator:
    """run_in_process, keeping the coordinator (its accountant and spends)."""
    coord = Coordinator(cfg)
    workers = [Worker(cfg, Xk, yk, client_index=k, seed=client_seed(cfg, k))
               for k, (Xk, yk) in enumerate(clients)]
    agg = make_aggregator(cfg)
    while (task := coord.next_task()) is not None:
        replies = {k: w.handle(task) for k, w in enumerate(workers)}
        coord.submit(task.round_id, agg.aggregate(task, replies),
                     {k: r.disclosed for k, r in replies.items() if r.disclosed},
                     participants=sorted(replies))
    return coord


def test_budget_accounting_includes_the_node_summaries() -> None:
    X, y, h = _client_shift(n=400)
    cfg = _cfg(max_depth=3)
    coord = _train(cfg, [(X[h == k], y[h == k]) for k in range(4)])
    coord_spends = coord.dp_spends
    h_sp = [s for s in coord_spends if s["kind"] == "node_stats"]
    sum_sp = [s for s in coord_spends if s["kind"] != "node_stats"]
    assert [s["level"] for s in h_sp] == [0, 1, 2]  # one per splitting level
    assert len(sum_sp) == 3
    # each kind alone spends its own budget exactly (one conversion of its composed curve)
    assert epsilon_of([ZCdp(s["rho"], s["xi"]) for s in h_sp], 1e-6) == pytest.approx(
        2.0, rel=1e-4)
    assert epsilon_of([ZCdp(s["rho"], s["xi"]) for s in sum_sp], 1e-6) == pytest.approx(
        4.0, rel=1e-4)
    # together: one conversion of both, below epsilon + h_epsilon (basic composition)
    eps_total, delta_total = coord.accountant.spent
    assert eps_total == pytest.approx(coord_spends[-1]["total_epsilon"])
    assert 4.0 < eps_total < 4.0 + 2.0
    assert coord.accountant.epsilon == 6.0 and delta_total == coord.accountant.delta == 1e-6
    assert all("sigma_client" in s for s in h_sp)  # what the audit log records


def test_without_noisy_h_the_budget_has_no_h_share() -> None:
    cfg = _cfg(split_on_client=False, profile=load_profile("secure-dp", epsilon=4.0).to_dict())
    b = job_budget(cfg.dp or {}, cfg.max_depth, noisy_h=False)
    assert not b.noisy_h and b.total == (4.0, 1e-6)


def test_noisy_h_splits_fail_closed_without_a_budget() -> None:
    no_dp = dict(_noisy(), dp=None)
    with pytest.raises(BudgetError, match="budget"):
        Coordinator(_cfg(profile=no_dp))
    no_h = load_profile("secure-dp", h_splits="noisy", epsilon=4.0).to_dict()
    with pytest.raises(BudgetError, match="h_epsilon"):
        Coordinator(_cfg(profile=no_h))
    # the estimator surfaces the same error before any round
    X, y, h = _client_shift(n=200)
    est = FedForestClassifier(n_estimators=2, max_depth=2, split_on_client=True,
                              profile=load_profile("secure-dp", h_splits="noisy"))
    with pytest.raises(BudgetError, match="h_epsilon"):
        est.fit(X, y, client=h)
    with pytest.raises(Exception, match="h_epsilon must be finite"):
        load_profile("secure-dp", h_splits="noisy", h_epsilon=-1.0)
