"""Leaf weights of a random-split DP classifier at large epsilon (off as shipped:
``LEAF_WEIGHT_NOISE = 0``; the tests that exercise them set 1): a leaf's vote is its class
proportions times ``n / (n + lam)``, ``lam = LEAF_WEIGHT_NOISE * sigma`` where the noise
``sigma`` on one summed class count is at most ``LEAF_WEIGHT_BELOW`` times the rows per leaf
(``privacy.allocation.leaf_vote_weight``); post-processing of the leaves' release, so a job
makes the same two releases and spends the same budget with or without them."""

from __future__ import annotations

import numpy as np
import pytest
from engine_driver import released_tasks, stump

from fedforest_secure import _random_splits
from fedforest_secure._release import ReleasePolicy
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.federation import client_seed
from fedforest_secure.model import ForestModel
from fedforest_secure.privacy import allocation
from fedforest_secure.protocol import TaskKind
from fedforest_secure.worker import Worker
from server_app.jobspec import JobSpec, build_config


@pytest.fixture
def weights1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocation, "LEAF_WEIGHT_NOISE", 1.0)


def test_leaf_weights_are_off_as_shipped() -> None:
    assert allocation.LEAF_WEIGHT_NOISE == 0.0
    assert allocation.LEAF_WEIGHT_BELOW == 4.0
    assert allocation.leaf_vote_weight(3.0, 400, 6) == 0.0


@pytest.mark.usefixtures("weights1")
def test_the_rule_weights_leaves_only_where_the_noise_is_within_four_rows_per_leaf() -> None:
    # 400 rows in 2**6 leaves: 6.25 rows per leaf
    assert allocation.leaf_vote_weight(4 * 6.25, 400, 6) == pytest.approx(25.0)
    assert allocation.leaf_vote_weight(3.0, 400, 6) == pytest.approx(3.0)
    assert allocation.leaf_vote_weight(4 * 6.25 * 1.01, 400, 6) == 0.0
    # one level deeper halves the rows per leaf
    assert allocation.leaf_vote_weight(4 * 6.25 * 0.6, 400, 7) == 0.0
    assert allocation.leaf_vote_weight(float("nan"), 400, 6) == 0.0
    assert allocation.leaf_vote_weight(0.0, 400, 6) == 0.0


def test_the_weights_scale_with_leaf_weight_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocation, "LEAF_WEIGHT_NOISE", 2.0)
    assert allocation.leaf_vote_weight(3.0, 400, 6) == pytest.approx(6.0)


def test_a_leaf_value_is_its_proportions_times_its_rows_over_rows_plus_lam() -> None:
    """Leaves (3, 1) and (-2, 0.5): n = 4 and 0.5 (clipped; below min_count 1: the root's
    value, (1, 1.5) / 2.5). lam = 2: weights 4 / 6 and 0.5 / 2.5; the root keeps its
    proportions."""
    tb = stump()
    totals = np.array([[3.0, 1.0], [-2.0, 0.5]])
    _random_splits.values_from_leaves([tb], np.array([0, 0]), np.array([1, 2]), totals,
                                      "classification", 1.0, leaf_weight=2.0)
    np.testing.assert_allclose(tb.value[0], [0.4, 0.6])
    np.testing.assert_allclose(tb.value[1], np.array([0.75, 0.25]) * 4.0 / 6.0)
    np.testing.assert_allclose(tb.value[2], np.array([0.4, 0.6]) * 0.5 / 2.5)
    plain = stump()
    _random_splits.values_from_leaves([plain], np.array([0, 0]), np.array([1, 2]), totals,
                                      "classification", 1.0)
    np.testing.assert_allclose(plain.value[1], [0.75, 0.25])


def test_a_negative_leaf_weight_is_refused() -> None:
    with pytest.raises(ValueError, match="leaf_weight"):
        _random_splits.values_from_leaves([stump()], np.array([0, 0]), np.array([1, 2]),
                                          np.ones((2, 2)), "classification", 1.0,
                                          leaf_weight=-1.0)


def test_a_weighted_forest_votes_for_the_leaf_that_holds_more_rows_than_noise() -> None:
    """Tree 0's left leaf: counts (1, 0); tree 1's: (10, 30). Averaged proportions vote
    (1 + 0.25) / 2 for class 0; with lam = 10 tree 0's leaf weighs 1 / 11 and tree 1's
    40 / 50, so class 1 wins, and the probabilities still add up to 1."""
    trees = [stump(), stump()]
    totals = np.array([[1.0, 0.0], [2.0, 2.0], [10.0, 30.0], [-3.0, 5.0]])
    _random_splits.values_from_leaves(trees, np.array([0, 0, 1, 1]), np.array([1, 2, 1, 2]),
                                      totals, "classification", 1.0, leaf_weight=10.0)
    model = ForestModel(task="classification", n_features=1, n_classes=2,
                        trees=[t.build() for t in trees], vote="counts")
    p = model.predict_values(np.array([[0.2]]))
    expected = np.array([1.0 / 11.0, 0.0]) + np.array([0.25, 0.75]) * 0.8
    np.testing.assert_allclose(p[0], expected / expected.sum())
    assert model.predict(np.array([[0.2]]))[0] == 1


def _job_config(epsilon: float, public_rows: int) -> JobConfig:
    return build_config(JobSpec.model_validate({
        "id": "j", "clients": ["a", "b", "c", "d"], "profile": "secure-dp",
        "profile_overrides": {"epsilon": epsilon}, "public_rows": public_rows,
        "data": {"task": "classification", "n_features": 4, "n_classes": 2,
                 "feature_bounds": [(0.0, 1.0)] * 4}}))


def _run(cfg: JobConfig, n: int) -> tuple[ForestModel, list[TaskKind], Coordinator]:
    rng = np.random.default_rng(3)
    X = rng.random((n, 4))
    y = (X[:, 0] + 0.3 * rng.random(n) > 0.65).astype(np.int64)
    h = np.arange(n) % 4
    ws = [Worker(cfg, X[h == k], y[h == k], client_index=k, seed=client_seed(cfg, k))
          for k in range(4)]
    coord = Coordinator(cfg)
    kinds = [t.kind for t in released_tasks(coord, ws)]
    return coord.result(), kinds, coord


@pytest.mark.usefixtures("weights1")
@pytest.mark.parametrize(("epsilon", "weighted"), [(0.5, False), (2.0, False), (4.0, True),
                                                   (8.0, True)])
def test_a_job_file_forest_is_weighted_where_the_leaf_noise_is_within_four_rows_per_leaf(
        epsilon: float, weighted: bool) -> None:
    """64 trees (128 at epsilon = 8) of depth 7 for 700 rows: 5.5 rows per leaf; the noise on
    a summed leaf count is about 90, 25, 12 and 9.5 rows at epsilon = 0.5, 2, 4, 8."""
    cfg = _job_config(epsilon, 700)
    assert (cfg.n_estimators, cfg.max_depth) == (128 if epsilon >= 8 else 64, 7)
    std = ReleasePolicy(cfg).leaf_vote_noise()
    assert std is not None
    assert (allocation.leaf_vote_weight(std, 700, 7) > 0) is weighted


@pytest.mark.parametrize(("noise", "weighted"), [(1.0, True), (0.0, False)])
def test_a_deployed_job_without_forest_settings_weights_its_leaves_at_large_epsilon(
        monkeypatch: pytest.MonkeyPatch, noise: float, weighted: bool) -> None:
    """A job file's forest at epsilon = 8 (128 trees, depth 7 for 700 rows): with the weights
    on the leaves' values are weighted proportions and the model normalises its vote per row;
    with them off, as shipped, every leaf keeps one vote (proportions). Either way the job
    makes the same two releases and its accountant spends exactly its budget."""
    monkeypatch.setattr(allocation, "LEAF_WEIGHT_NOISE", noise)
    epsilon = 8.0
    cfg = _job_config(epsilon, 700)
    model, kinds, coord = _run(cfg, 700)
    assert kinds == [TaskKind.HISTOGRAM, TaskKind.SKETCH]
    acct = coord.policy.accountant
    assert acct is not None
    assert acct.spent[0] == pytest.approx(epsilon, rel=1e-6)
    assert model.vote == ("counts" if weighted else "proportions")
    sums = np.concatenate([t.value[t.kind == 0] for t in model.trees]).sum(axis=1)
    if weighted:  # weighted proportions: every leaf's values add up to less than 1
        assert np.all(sums < 1.0)
        p = model.predict_values(np.random.default_rng(0).random((20, 4)))
        np.testing.assert_allclose(p.sum(axis=1), 1.0)
    else:
        np.testing.assert_allclose(sums, 1.0)
