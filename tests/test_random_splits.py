"""Random splits (``method="random"``): thresholds from the pooled marginal counts, the DP job's
two releases, and a client's refusal of any release beyond them."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from engine_driver import released_tasks, stump

from fedforest_secure import _random_splits
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import RefusedRequest
from fedforest_secure.federation import client_seed
from fedforest_secure.privacy import load_profile
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind
from fedforest_secure.worker import Worker


def test_marginal_cdf_is_increasing_from_0_to_1_with_the_floor() -> None:
    counts = np.array([[10.0, -3.0, 0.0, 6.0]])
    cdf = _random_splits.marginal_cdf(counts, 0.5)
    assert cdf.shape == (1, 5)
    assert cdf[0, 0] == 0.0 and cdf[0, -1] == pytest.approx(1.0)
    assert (np.diff(cdf[0]) > 0).all()  # clipped at 0, then every bin gets the floor
    np.testing.assert_allclose(np.diff(cdf[0]), np.array([10.5, 0.5, 0.5, 6.5]) / 18.0)


def test_thresholds_follow_the_marginal_distribution_inside_each_box() -> None:
    """All rows in the first of 10 bins of [0, 100]: the thresholds of a root land there; a
    node whose box lies elsewhere draws inside its own box."""
    rng = np.random.default_rng(0)
    counts = np.zeros((2, 10))
    counts[0, 0] = 1000.0
    counts[1] = 100.0
    cdf = _random_splits.marginal_cdf(counts, 0.5)
    bounds = np.array([[0.0, 100.0], [0.0, 100.0]])
    n = 2000
    feats = np.zeros((n, 1), dtype=np.int64)
    lo = np.zeros((n, 2))
    hi = np.full((n, 2), 100.0)
    f, t = _random_splits.random_splits(rng, feats, lo, hi, cdf, bounds)
    assert (f == 0).all()
    assert np.mean(t <= 10.0) > 0.95  # uniform thresholds: 0.10
    _, tu = _random_splits.random_splits(rng, feats, lo, hi)
    assert np.mean(tu <= 10.0) < 0.2
    # a box [50, 70] on feature 1 (uniform marginal): thresholds uniform inside the box
    lo[:, 1], hi[:, 1] = 50.0, 70.0
    _, t1 = _random_splits.random_splits(rng, np.ones((n, 1), dtype=np.int64), lo, hi, cdf,
                                         bounds)
    assert ((t1 >= 50.0) & (t1 <= 70.0)).all()
    assert abs(np.mean(t1) - 60.0) < 0.5
    # a point box takes its one value
    lo[:, 1] = hi[:, 1] = 42.0
    _, tp = _random_splits.random_splits(rng, np.ones((n, 1), dtype=np.int64), lo, hi, cdf,
                                         bounds)
    assert (tp == 42.0).all()


def _random_dp_job(max_depth: int = 3, profile: str = "secure-dp"
                   ) -> tuple[JobConfig, list[Worker]]:
    rng = np.random.default_rng(5)
    K, n, d = 4, 240, 3
    X = np.exp(rng.normal(size=(n, d)))  # skewed features
    y = (X[:, 0] > np.median(X[:, 0])).astype(np.int64)
    h = np.arange(n) % K
    bounds = tuple((float(X[:, j].min()), float(X[:, j].max())) for j in range(d))
    prof = load_profile(profile, **({"epsilon": 4.0} if profile == "secure-dp" else {}))
    cfg = JobConfig(job_id="job-r", task="classification", n_features=d, n_classes=2,
                    n_clients=K, feature_bounds=bounds, n_estimators=4, max_depth=max_depth,
                    max_features=1, n_bins=16, method="random", row_sampling="all",
                    criterion="gini", profile=prof.to_dict())
    ws = [Worker(cfg, X[h == k], y[h == k], client_index=k, seed=client_seed(cfg, k))
          for k in range(K)]
    return cfg, ws


def test_a_random_dp_job_releases_the_marginal_counts_then_the_leaves() -> None:
    cfg, ws = _random_dp_job()
    coord = Coordinator(cfg)
    released = released_tasks(coord, ws)
    assert [(t.kind, t.level) for t in released] == [(TaskKind.HISTOGRAM, 0),
                                                     (TaskKind.SKETCH, cfg.max_depth)]
    marg = released[0]
    assert marg.params["stats"] == "count"
    assert marg.layout[0].shape == (1, cfg.n_features, cfg.n_bins, 1)
    assert [s["level"] for s in coord.dp_spends] == [0, cfg.max_depth]
    assert coord.dp_spends[-1]["total_epsilon"] == pytest.approx(4.0, rel=1e-6)
    # the thresholds follow the rows: most roots split below the upper quarter of the range
    model = coord.result()
    roots = np.array([(t.feature[0], t.threshold[0]) for t in model.trees])
    lo = np.array([cfg.feature_bounds[int(f)][0] for f in roots[:, 0]])
    hi = np.array([cfg.feature_bounds[int(f)][1] for f in roots[:, 0]])
    assert ((roots[:, 1] - lo) / (hi - lo) < 0.5).all()


def test_a_random_dp_client_refuses_a_third_release() -> None:
    """After the job's two releases, a server re-asks the last level's totals as a new question
    (one more node): the client refuses, whatever the depth allows."""
    cfg, ws = _random_dp_job(max_depth=4)
    coord = Coordinator(cfg)
    released = released_tasks(coord, ws)
    last = released[-1]
    evil = Task(job_id=last.job_id, round_id=last.round_id + 1, kind=last.kind,
                level=last.level, params={**last.params, "n_nodes": last.params["n_nodes"] + 1},
                arrays={}, layout=(type(last.layout[0])(
                    last.layout[0].name, (last.layout[0].shape[0] + 1,
                                          *last.layout[0].shape[1:]),
                    last.layout[0].kinds),), disclose=())
    with pytest.raises(RefusedRequest, match="leaves' totals.*already made"):
        ws[0].handle(evil)


def test_random_splits_without_dp_count_the_marginals_once() -> None:
    cfg, ws = _random_dp_job(profile="secure")
    coord = Coordinator(cfg)
    released = released_tasks(coord, ws)
    assert released[0].kind is TaskKind.HISTOGRAM and coord.accountant is None
    assert coord.rounds_by_kind["histogram"] == 1


def test_shrunk_leaf_values_add_pseudo_rows_of_the_parents_proportions() -> None:
    """shrink = 4: the root's counts (the sum of its leaves', (7, -2), clipped at 0) get 4
    pseudo-rows of uniform proportions; each leaf gets 4 pseudo-rows of the root's value, so
    a leaf whose noisy counts are all below 0 takes its parent's value."""
    tb = stump()
    totals = np.array([[9.0, 1.0], [-2.0, -3.0]])
    _random_splits.values_from_leaves([tb], np.array([0, 0]), np.array([1, 2]), totals,
                                      "classification", 1.0, shrink=4.0)
    root = (np.array([7.0, 0.0]) + 4.0 * np.array([0.5, 0.5])) / (7.0 + 4.0)
    np.testing.assert_allclose(tb.value[0], root)
    np.testing.assert_allclose(tb.value[1], (np.array([9.0, 1.0]) + 4.0 * root) / 14.0)
    np.testing.assert_allclose(tb.value[2], root)  # clipped counts (0, 0): the parent's
    assert tb.n[0] == pytest.approx(7.0)
    # without shrinkage a trusted leaf keeps its own proportions
    tb0 = stump()
    _random_splits.values_from_leaves([tb0], np.array([0, 0]), np.array([1, 2]), totals,
                                      "classification", 1.0)
    np.testing.assert_allclose(tb0.value[1], [0.9, 0.1])
    with pytest.raises(ValueError, match="shrink"):
        _random_splits.values_from_leaves([tb0], np.array([0, 0]), np.array([1, 2]), totals,
                                          "classification", 1.0, shrink=-1.0)


def test_the_leaf_shrinkage_is_off_as_shipped_and_scales_with_the_leaf_noise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As shipped (LEAF_SHRINK = 0) no pseudo-rows; with LEAF_SHRINK = c, c standard
    deviations of the summed noise on one class count of the leaves' release, fewer as
    epsilon grows; 0 without DP."""
    from fedforest_secure import secure_sum
    from fedforest_secure._release import ReleasePolicy
    from fedforest_secure.privacy import allocation
    from fedforest_secure.privacy.allocation import job_noise

    cfg, _ = _random_dp_job()
    assert allocation.LEAF_SHRINK == 0.0 and ReleasePolicy(cfg).leaf_shrinkage() == 0.0
    monkeypatch.setattr(allocation, "LEAF_SHRINK", 0.5)
    plan = job_noise(cfg, secure_sum.noise_units(cfg))
    lam = ReleasePolicy(cfg).leaf_shrinkage()
    assert lam == pytest.approx(0.5 * plan.level_sigmas(cfg.max_depth)["count"]
                                * np.sqrt(cfg.n_clients))
    prof8 = load_profile("secure-dp", epsilon=8.0).to_dict()
    assert 0 < ReleasePolicy(dataclasses.replace(cfg, profile=prof8)).leaf_shrinkage() < lam
    cfg_open, _ = _random_dp_job(profile="secure")
    assert ReleasePolicy(cfg_open).leaf_shrinkage() == 0.0


def test_a_random_dp_forest_with_leaf_shrinkage_stores_the_shrunk_leaf_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end, LEAF_SHRINK = 0.5: every leaf value of a random-split DP forest is a
    probability vector with every class above 0 (the pseudo-rows of the parent's proportions),
    where the rule without shrinkage gives a one-hot vector to any leaf with a single noisy
    class count above 0 (the leaf weights of large epsilon, which scale the leaves' values,
    are off here: tests/test_leaf_weights.py)."""
    from fedforest_secure.privacy import allocation

    monkeypatch.setattr(allocation, "LEAF_SHRINK", 0.5)
    monkeypatch.setattr(allocation, "LEAF_WEIGHT_NOISE", 0.0)
    cfg, ws = _random_dp_job()
    coord = Coordinator(cfg)
    released_tasks(coord, ws)
    model = coord.result()
    for t in model.trees:
        leaves = t.left == -1
        vals = t.value[leaves]
        np.testing.assert_allclose(vals.sum(axis=1), 1.0)
        assert (vals > 0).all()


@pytest.mark.parametrize("m", [1, 2, 4])
def test_the_split_feature_is_uniform_over_the_sampled_features(m: int) -> None:
    """Every node splits on one of its sampled features, each about equally often: with all 4
    features asked (``sample_features`` gives them in order), as with a random subset."""
    from fedforest_secure._planner import sample_features

    rng = np.random.default_rng(3)
    n, d = 4000, 4
    feats = sample_features(rng, n, d, m)
    lo, hi = np.zeros((n, d)), np.ones((n, d))
    f, _ = _random_splits.random_splits(rng, feats, lo, hi)
    assert (f[:, None] == feats).any(axis=1).all()
    share = np.bincount(f, minlength=d) / n
    np.testing.assert_allclose(share, 1.0 / d, atol=0.03)  # 3 standard deviations: 0.02


@pytest.mark.parametrize(("max_features", "dp"), [(None, True), (1.0, True), (None, False)])
def test_a_random_forest_with_all_features_splits_on_every_feature(
        max_features: float | None, dp: bool) -> None:
    """Random splits with all features per node (DP and not): each feature carries about a
    quarter of the splits, and a problem the features 1 and 2 decide is learned about as well
    as with 2 features per node (before, every split was on feature 0: accuracy 0.54)."""
    from fedforest_secure import FedForestClassifier
    from fedforest_secure._tree import NodeKind

    rng = np.random.default_rng(0)
    n = 800
    X = rng.uniform(0.0, 1.0, size=(n, 4))
    y = np.where(X[:, 1] + X[:, 2] > 1.0, 1, 0)
    h = np.arange(n) % 3
    kw: dict[str, Any] = ({"profile": load_profile("secure-dp", epsilon=4.0)} if dp
                          else {"method": "random", "max_depth": 6, "n_estimators": 32})
    model = FedForestClassifier(max_features=max_features, random_state=1, **kw).fit(X, y, client=h)
    feats = np.concatenate([t.feature[t.kind != NodeKind.LEAF] for t in model.model_.trees])
    share = np.bincount(feats, minlength=4) / feats.size
    assert feats.size > 500
    np.testing.assert_allclose(share, 0.25, atol=0.05)
    two = FedForestClassifier(max_features=2, random_state=1, **kw).fit(X, y, client=h)
    assert model.score(X, y) > 0.85
    assert model.score(X, y) > two.score(X, y) - 0.05


def _run_to(coord: Coordinator, ws: list[Worker], stop: Any, fake_level_0: bool = False
            ) -> Task:
    """Answer the coordinator's rounds until a task with ``stop(task)``; ``fake_level_0``:
    the level-0 marginal release is never sent to the clients (the server fakes its sum)."""
    from fedforest_secure.protocol import layout_size

    task = coord.next_task()
    while task is not None and not stop(task):
        if fake_level_0 and task.layout and task.level == 0:
            total = np.ones(layout_size(task.layout))
        else:
            total = np.sum([w.handle(task).summable for w in ws], axis=0)
        coord.submit(task.round_id, total, participants=range(len(ws)))
        task = coord.next_task()
    assert task is not None
    return task


def test_a_random_dp_client_refuses_the_level_0_counts_over_all_roots_as_sketch_totals(
        ) -> None:
    """Every tree holds every row: a server asks the level-0 sketch with node totals over all
    T roots (T copies of each client's class counts, each with the marginal counts' noise;
    their mean over the roots takes the noise away). The plan has no level-0 sketch release:
    the client refuses."""
    from fedforest_secure._layouts import totals_block

    cfg, ws = _random_dp_job()
    T = cfg.n_estimators
    honest = Coordinator(cfg).next_task()
    assert honest is not None and honest.kind is TaskKind.SKETCH and honest.level == 0
    assert honest.params["totals"] is False and honest.layout == ()
    evil = dataclasses.replace(honest, params={**honest.params, "totals": True},
                               layout=(totals_block(cfg, T),))
    with pytest.raises(RefusedRequest, match="plan.*no level-0 sketch release"):
        ws[0].handle(evil)


def test_a_random_dp_client_refuses_the_leaf_totals_asked_again_as_a_histogram() -> None:
    """A server skips the level-0 marginal release and asks the leaves' totals twice (once in
    the last level's sketch, once as a histogram without thresholds), both with the leaves'
    noise: their mean halves the noise's variance. The client makes the leaf release once and
    refuses the histogram, a release its plan does not have."""
    cfg, ws = _random_dp_job()
    coord = Coordinator(cfg)
    last = _run_to(coord, ws, lambda t: t.kind is TaskKind.SKETCH and t.level == cfg.max_depth,
                   fake_level_0=True)
    n = int(last.params["n_nodes"])
    for w in ws:
        w.handle(last)
    again = Task(job_id=cfg.job_id, round_id=last.round_id + 1, kind=TaskKind.HISTOGRAM,
                 level=cfg.max_depth, params={"stats": "full"},
                 arrays={"nodes": np.arange(n, dtype=np.int64),
                         "features": np.zeros((n, 1), dtype=np.int64),
                         "thresholds": np.zeros((n, 1, 0))},
                 layout=(Block("hist", (n, 1, 1, 2), (StatKind.COUNT, StatKind.COUNT)),))
    with pytest.raises(RefusedRequest, match="no level-3 histogram release"):
        ws[0].handle(again)


def test_a_random_dp_client_makes_the_marginal_release_once() -> None:
    """A server asks the level-0 marginal counts twice (the second with other thresholds: a
    new question), skipping the leaves: the client refuses the second release of the same
    planned one."""
    cfg, ws = _random_dp_job()
    coord = Coordinator(cfg)
    marg = _run_to(coord, ws, lambda t: bool(t.layout))
    assert marg.kind is TaskKind.HISTOGRAM and marg.level == 0
    ws[0].handle(marg)
    thr = marg.arrays["thresholds"] + 1e-3
    again = dataclasses.replace(marg, round_id=marg.round_id + 1,
                                arrays={**marg.arrays, "thresholds": thr})
    with pytest.raises(RefusedRequest, match="level-0 histogram release .*already"):
        ws[0].handle(again)


@pytest.mark.parametrize("case", ["random", "random_class_totals", "random_regression",
                                  "random_disjoint", "random_bootstrap", "histogram",
                                  "quantiles", "noisy_h_splits"])
def test_an_honest_dp_job_makes_each_planned_release_once(case: str) -> None:
    """Every DP path of the honest coordinator trains in process with clients that refuse
    anything outside their plan: each round that releases a noisy aggregate is one of the
    plan's (:func:`~fedforest_secure._answered.planned_releases`, at the levels of
    ``job_noise``), each made once."""
    from fedforest_secure._answered import planned_releases
    from fedforest_secure.privacy.allocation import job_noise
    from fedforest_secure.secure_sum import noise_units

    rng = np.random.default_rng(7)
    K, n, d = 4, 240, 3
    X = rng.uniform(-2, 2, size=(n, d))
    h = np.arange(n) % K
    task = "regression" if case == "random_regression" else "classification"
    y: np.ndarray = (X[:, 0] > 0).astype(np.int64) if task == "classification" \
        else np.clip(3 * X[:, 0] + rng.normal(size=n), -8, 8)
    prof: dict[str, Any] = {"epsilon": 0.5 if case == "random_class_totals" else 4.0}
    kw: dict[str, Any] = dict(method="random", row_sampling="all", max_features=1)
    if case == "random_disjoint":
        kw["row_sampling"] = "disjoint"
    elif case == "random_bootstrap":
        kw["row_sampling"] = "bootstrap"
    elif case in ("histogram", "quantiles"):
        kw = dict(method=case, max_features=2)
    elif case == "noisy_h_splits":
        kw = dict(method="histogram", max_features=2, split_on_client=True, row_sampling="all")
        prof.update(h_splits="noisy", h_epsilon=2.0)
    extra: dict[str, Any] = ({"n_classes": 2, "criterion": "gini"} if task == "classification"
                             else {"target_bound": 8.0})
    cfg = JobConfig(job_id="job-p", task=task, n_features=d, n_clients=K,
                    feature_bounds=((-2.0, 2.0),) * d, n_estimators=3, max_depth=3,
                    min_samples_leaf=3, n_bins=4,
                    profile=load_profile("secure-dp", **prof).to_dict(), **extra, **kw)
    ws = [Worker(cfg, X[h == k], y[h == k], client_index=k, seed=client_seed(cfg, k))
          for k in range(K)]
    coord = Coordinator(cfg)
    released = released_tasks(coord, ws)
    plan = planned_releases(cfg)
    assert [(t.level, t.kind) for t in released] == list(plan)
    assert [lv for lv, _ in plan] == list(job_noise(cfg, noise_units(cfg)).levels)
    assert coord.result() is not None


def test_a_random_dp_client_releases_the_leaves_totals_alone_and_the_marginals_as_counts(
        ) -> None:
    """The planned releases in another form: the last level's sketch with a histogram of the
    leaves beside their totals (the totals twice in one vector), or the marginal counts asked
    with full statistics: refused."""
    cfg, ws = _random_dp_job()
    coord = Coordinator(cfg)
    marg = _run_to(coord, ws, lambda t: bool(t.layout))
    full = dataclasses.replace(marg, params={**marg.params, "stats": "full"})
    with pytest.raises(RefusedRequest, match="marginal counts only \\(stats 'count'\\)"):
        ws[0].handle(full)
    last = _run_to(coord, ws, lambda t: t.kind is TaskKind.SKETCH and t.level == cfg.max_depth)
    n = int(last.params["n_nodes"])
    grid = dataclasses.replace(last, params={**last.params, "stats": "count"}, arrays={
        **last.arrays, "grid_nodes": np.arange(n, dtype=np.int64),
        "grid_features": np.zeros((n, 1), dtype=np.int64),
        "grid_thresholds": np.zeros((n, 1, 0))}, layout=(*last.layout, Block(
            "hist", (n, 1, 1, 1), (StatKind.COUNT,))))
    with pytest.raises(RefusedRequest, match="leaves' totals only, without a histogram"):
        ws[1].handle(grid)
