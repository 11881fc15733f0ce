"""The classes' row totals of a random-split DP classifier at small epsilon: released with the
level-0 marginal counts (``allocation.class_totals_scale`` times over, one noise scale),
accounted in that release, and the source of the class priors instead of the leaves."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from engine_driver import released_tasks

from fedforest_secure import _random_splits
from fedforest_secure._layouts import CLASS_TOTALS_BLOCK, class_totals_block
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import ProtocolError
from fedforest_secure.federation import client_seed
from fedforest_secure.privacy import allocation, load_profile
from fedforest_secure.privacy.accountant import ZCdp, epsilon_of
from fedforest_secure.protocol import Task, TaskKind
from fedforest_secure.worker import Worker

K, N, D = 4, 400, 6


def _job(epsilon: float, profile: str = "secure-dp", n_features: int = D
         ) -> tuple[JobConfig, list[Worker], np.ndarray]:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(N, n_features))
    y = (X[:, 0] > 0.85).astype(np.int64)  # about 80 / 20
    h = np.arange(N) % K
    bounds = tuple((float(X[:, j].min()), float(X[:, j].max())) for j in range(n_features))
    prof = load_profile(profile, **({"epsilon": epsilon} if profile == "secure-dp" else {}))
    cfg = JobConfig(job_id="job-c", task="classification", n_features=n_features,
                    n_classes=2, n_clients=K, feature_bounds=bounds, n_estimators=16,
                    max_depth=4, max_features=1, n_bins=16, method="random",
                    row_sampling="all", criterion="gini", profile=prof.to_dict())
    ws = [Worker(cfg, X[h == k], y[h == k], client_index=k, seed=client_seed(cfg, k))
          for k in range(K)]
    return cfg, ws, y


def test_the_scale_is_planned_at_small_epsilon_for_dp_random_classification_only() -> None:
    """a = ceil(sqrt(d * share / MARGINAL_SHARE)): 6 features at a 5% share give
    ceil(sqrt(3)) = 2, 8 give 2, 9 give 3, 1 gives 1; none above CLASS_TOTALS_MAX_EPSILON,
    without DP, for regression or greedy splits."""
    assert allocation.CLASS_TOTALS_SHARE == 0.05
    assert allocation.CLASS_TOTALS_MAX_EPSILON == 2.0
    cfg, _, _ = _job(0.5)
    assert allocation.class_totals_scale(cfg) == 2
    assert allocation.class_totals_scale(_job(2.0)[0]) == 2
    assert allocation.class_totals_scale(_job(4.0)[0]) == 0
    assert allocation.class_totals_scale(_job(0.5, "secure")[0]) == 0
    assert allocation.class_totals_scale(_job(0.5, n_features=1)[0]) == 1
    assert allocation.class_totals_scale(_job(0.5, n_features=8)[0]) == 2
    assert allocation.class_totals_scale(_job(0.5, n_features=9)[0]) == 3
    assert allocation.class_totals_scale(dataclasses.replace(cfg, method="histogram")) == 0


def test_a_small_epsilon_job_releases_the_class_totals_with_the_marginal_counts() -> None:
    """Still two releases; the level-0 one carries the (1, C) block after the counts, and the
    coordinator decodes the rows per class from it (this harness sums the replies without
    their noise, so exactly)."""
    cfg, ws, y = _job(0.5)
    coord = Coordinator(cfg)
    released = released_tasks(coord, ws)
    assert [(t.kind, t.level) for t in released] == [(TaskKind.HISTOGRAM, 0),
                                                     (TaskKind.SKETCH, cfg.max_depth)]
    assert [b.name for b in released[0].layout] == ["counts", CLASS_TOTALS_BLOCK]
    assert released[0].layout[1].shape == (1, 2)
    totals = coord._class_totals
    assert totals is not None
    noise = coord.policy.class_totals_noise()
    assert noise is not None and noise > 0
    np.testing.assert_array_equal(totals, np.bincount(y, minlength=2))
    # a job above the threshold releases the marginal counts alone
    cfg8, ws8, _ = _job(8.0)
    coord8 = Coordinator(cfg8)
    assert [b.name for b in released_tasks(coord8, ws8)[0].layout] == ["counts"]
    assert coord8._class_totals is None and coord8.policy.class_totals_noise() is None


def test_the_class_totals_are_accounted_in_the_level_0_release() -> None:
    """The recorded zCDP cost of the level-0 release is that of a sum of K_min discrete-Gaussian
    vectors of the published scale with L2 sensitivity sqrt(d + a**2) (the d marginal counts
    and a times the record's class), not sqrt(d): the class totals are paid for, and the job's
    total equals the conversion of the recorded costs (dp-accounting's formula, checked
    against dp-accounting in test_privacy_accountant.py) and the budget."""
    cfg, ws, _ = _job(0.5)
    coord = Coordinator(cfg)
    released_tasks(coord, ws)
    from fedforest_secure import secure_sum

    a = allocation.class_totals_scale(cfg)
    k_min = allocation.job_noise(cfg, secure_sum.noise_units(cfg)).k_min
    first = coord.dp_spends[0]
    sigma = first["sigma_client"]["count"]
    assert first["rho"] == pytest.approx((D + a * a) / (2.0 * k_min * sigma**2), rel=1e-9)
    assert first["rho"] > 1.5 * D / (2.0 * k_min * sigma**2)
    events = [ZCdp(s["rho"], s["xi"]) for s in coord.dp_spends]
    assert epsilon_of(events, 1e-6) == pytest.approx(
        coord.dp_spends[-1]["total_epsilon"], rel=1e-6)
    assert coord.dp_spends[-1]["total_epsilon"] == pytest.approx(0.5, rel=1e-6)


def test_the_class_totals_take_their_share_from_the_leaves() -> None:
    """With the class totals planned the leaves' noise grows (their share is 1 - MARGINAL_SHARE
    * (1 + a**2 / d)), the marginal counts' noise stays that of their own share."""
    from fedforest_secure import secure_sum

    cfg, _, _ = _job(0.5)
    units = secure_sum.noise_units(cfg)
    with_totals = allocation.job_noise(cfg, units)
    saved = allocation.CLASS_TOTALS_SHARE
    try:
        allocation.CLASS_TOTALS_SHARE = 0.0
        allocation._job_noise.cache_clear()
        without = allocation.job_noise(cfg, units)
    finally:
        allocation.CLASS_TOTALS_SHARE = saved
        allocation._job_noise.cache_clear()
    a = allocation.class_totals_scale(cfg)
    leaf_ratio = with_totals.level_sigmas(cfg.max_depth)["count"] / without.level_sigmas(
        cfg.max_depth)["count"]
    assert leaf_ratio == pytest.approx(math.sqrt((1 - allocation.MARGINAL_SHARE) / (
        1 - allocation.MARGINAL_SHARE * (1 + a * a / D))), rel=0.02)
    assert with_totals.level_sigmas(0)["count"] == pytest.approx(
        without.level_sigmas(0)["count"], rel=0.02)


def _evil_marginals(cfg: JobConfig, ws: list[Worker]) -> Task:
    """Drive a coordinator to its level-0 marginal counts round; returns that task."""
    coord = Coordinator(cfg)
    task = coord.next_task()
    while task is not None and not task.layout:
        for w in ws:
            w.handle(task)
        coord.submit(task.round_id, np.zeros(0), participants=range(len(ws)))
        task = coord.next_task()
    assert task is not None and task.kind is TaskKind.HISTOGRAM and task.level == 0
    return task


def test_a_client_whose_plan_has_no_class_totals_refuses_to_send_them() -> None:
    """A server asks the class totals at epsilon = 8 (the plan has none), and at small epsilon
    twice or in a wrong shape: the client refuses before anything leaves it."""
    cfg8, ws8, _ = _job(8.0)
    task = _evil_marginals(cfg8, ws8)
    evil = dataclasses.replace(task, layout=(*task.layout, class_totals_block(2)))
    with pytest.raises(ProtocolError, match="class totals"):
        ws8[0].handle(evil)
    cfg, ws, _ = _job(0.5)
    task = _evil_marginals(cfg, ws)
    for layout in ((*task.layout, class_totals_block(2)),
                   (task.layout[0], dataclasses.replace(task.layout[1], shape=(2, 2)))):
        with pytest.raises(ProtocolError, match="class totals"):
            ws[1].handle(dataclasses.replace(task, layout=layout))


def test_class_weights_from_released_totals_ignore_the_leaves() -> None:
    """Exact totals (300, 100): the inverse frequencies, whatever the leaves say; totals within
    their noise: uniform weights; some noise: James-Stein shrinkage towards uniform."""
    leaves = np.array([[5.0, 5.0], [5.0, 5.0]])
    np.testing.assert_allclose(
        _random_splits.class_weights(leaves, 1, 0.0, np.array([300.0, 100.0]), 0.0),
        [0.5 / 0.75, 0.5 / 0.25])
    np.testing.assert_array_equal(
        _random_splits.class_weights(leaves, 1, 0.0, np.array([30.0, 10.0]), 20.0), [1.0, 1.0])
    s = 40.0  # v = s**2 / 400**2 = 0.01, ||p - u||**2 = 0.125: f = 0.92
    f = 1.0 - (s**2 / 400.0**2) / 0.125
    q = 0.5 + f * np.array([0.25, -0.25])
    np.testing.assert_allclose(
        _random_splits.class_weights(leaves, 1, 0.0, np.array([300.0, 100.0]), s), 0.5 / q)


def test_a_small_epsilon_forest_balances_its_roots_with_the_released_totals(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """80 / 20 rows at epsilon = 0.5 (replies summed without their noise, so the assumed
    noise alone decides): from the leaves' summed counts, whose noise is that of 2**4 leaves
    per tree, the weights are shrunk far towards 1 and the trees' roots keep 0.60 of the
    majority class; from the released class totals they are near the inverse frequencies and
    the roots near (0.5, 0.5)."""
    shares = {}
    for share in (0.0, allocation.CLASS_TOTALS_SHARE):
        monkeypatch.setattr(allocation, "CLASS_TOTALS_SHARE", share)
        allocation._job_noise.cache_clear()
        cfg, ws, _ = _job(0.5)
        coord = Coordinator(cfg)
        released_tasks(coord, ws)
        model = coord.result()
        weights = np.mean([t.value[0][0] for t in model.trees])
        shares[share] = float(weights)
    allocation._job_noise.cache_clear()
    assert abs(shares[allocation.CLASS_TOTALS_SHARE] - 0.5) < 0.04
    assert shares[0.0] > 0.58


def test_with_the_class_totals_the_forest_votes_with_weighted_summed_counts() -> None:
    """As shipped (``CLASS_TOTALS_COUNT_VOTES``) a job with the class totals stores a counts
    vote whose leaves hold their class counts times the class weights (over one common
    constant); above epsilon = 2 the leaves hold proportions."""
    assert allocation.CLASS_TOTALS_COUNT_VOTES is True
    cfg, ws, y = _job(0.5)
    coord = Coordinator(cfg)
    released_tasks(coord, ws)
    model = coord.result()
    assert model.vote == "counts"
    noise = coord.policy.class_totals_noise()
    assert coord._class_totals is not None and noise is not None
    w = _random_splits.class_weights(np.zeros((1, 2)), 1, 0.0, coord._class_totals, noise)
    assert w[1] > 1.5 * w[0]  # 80 / 20: the minority class weighs more
    leaves = np.concatenate([t.value[t.kind == 0] for t in model.trees])
    totals = leaves.sum(axis=0)  # every row once per tree, weighted, over a common constant
    counts = np.bincount(y, minlength=2) * cfg.n_estimators
    np.testing.assert_allclose(totals / totals.sum(), counts * w / (counts * w).sum())
    cfg8, ws8, _ = _job(8.0)
    coord8 = Coordinator(cfg8)
    released_tasks(coord8, ws8)
    assert coord8.result().vote == "proportions"


def test_a_client_refuses_the_level_0_counts_over_more_than_one_root_of_shared_rows() -> None:
    """Every tree holds every row (``sampling = "all"``): a server that sketches and then asks
    the level-0 marginal counts and class totals over all the trees' roots instead of one
    would get every record T times in the class totals (T * a in one entry, the plan accounts
    a) and T copies of the marginal counts (L2 sqrt(T d), the plan accounts sqrt(d)). The
    client refuses."""
    for with_totals in (True, False):
        cfg, ws, _ = _job(0.5)
        T = cfg.n_estimators
        nodes = np.arange(T, dtype=np.int64)
        coord = Coordinator(cfg)
        task = coord.next_task()
        while task is not None and not task.layout:
            if task.kind is TaskKind.SKETCH and "nodes" in task.arrays:  # the group sketch
                task = dataclasses.replace(task, arrays={
                    "nodes": nodes, "features": np.repeat(task.arrays["features"], T, axis=0)})
            for w in ws:
                w.handle(task)
            coord.submit(task.round_id, np.zeros(0), participants=range(len(ws)))
            task = coord.next_task()
        assert task is not None and task.kind is TaskKind.HISTOGRAM and task.level == 0
        counts = task.layout[0]
        layout = (dataclasses.replace(counts, shape=(T, *counts.shape[1:])),
                  *task.layout[1:with_totals + 1])
        evil = dataclasses.replace(task, layout=layout, arrays={
            "nodes": nodes, "features": np.repeat(task.arrays["features"], T, axis=0),
            "thresholds": np.repeat(task.arrays["thresholds"], T, axis=0)})
        with pytest.raises(ProtocolError, match="one root"):
            ws[2].handle(evil)
