"""Leaf votes of a random-split DP classifier: summed noisy class counts where the rule of
``privacy.allocation.leaf_votes_are_counts`` picks them (off as shipped:
``LEAF_VOTE_COUNTS_ABOVE = inf``; the tests that exercise it set 4) or the class totals are
released (epsilon <= 2, ``CLASS_TOTALS_COUNT_VOTES``), averaged proportions otherwise; the
model file's ``vote``, ``predict_proba`` and the ONNX export agree."""

from __future__ import annotations

import json

import numpy as np
import pytest
from engine_driver import released_tasks, stump
from onnx_labels import assert_labels_match

from fedforest_secure import _random_splits
from fedforest_secure._release import ReleasePolicy
from fedforest_secure._tree import TreeBuilder
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.federation import client_seed
from fedforest_secure.model import ForestModel
from fedforest_secure.privacy import allocation, load_profile
from fedforest_secure.worker import Worker
from server_app.jobspec import JobSpec, build_config


@pytest.fixture
def votes4(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocation, "LEAF_VOTE_COUNTS_ABOVE", 4.0)


def test_count_votes_are_off_as_shipped() -> None:
    assert allocation.LEAF_VOTE_COUNTS_ABOVE == np.inf
    assert not allocation.leaf_votes_are_counts(1e9, 1.0, 8)


@pytest.mark.usefixtures("votes4")
def test_the_rule_picks_counts_when_the_leaf_noise_is_large_against_the_rows_per_leaf() -> None:
    c = allocation.LEAF_VOTE_COUNTS_ABOVE
    # 400 rows in 2**6 leaves: 6.25 rows per leaf
    assert allocation.leaf_votes_are_counts(c * 6.25, 400, 6)
    assert not allocation.leaf_votes_are_counts(c * 6.25 * 0.99, 400, 6)
    # one level deeper halves the rows per leaf
    assert allocation.leaf_votes_are_counts(c * 6.25 * 0.6, 400, 7)
    # no rows left after the noise: counts; no noise: proportions
    assert allocation.leaf_votes_are_counts(0.1, -50.0, 6)
    assert not allocation.leaf_votes_are_counts(0.0, 400, 6)
    assert not allocation.leaf_votes_are_counts(float("nan"), 400, 6)


def _job_config(epsilon: float, public_rows: int) -> JobConfig:
    spec = JobSpec.model_validate({
        "id": "j", "clients": ["a", "b", "c", "d"], "profile": "secure-dp",
        "profile_overrides": {"epsilon": epsilon}, "public_rows": public_rows,
        "data": {"task": "classification", "n_features": 4, "n_classes": 2,
                 "feature_bounds": [(0.0, 1.0)] * 4}})
    return build_config(spec)


@pytest.mark.usefixtures("votes4")
@pytest.mark.parametrize(("epsilon", "counts"), [(0.5, True), (1.0, True), (8.0, False)])
def test_the_rule_at_given_epsilon_and_rows_of_a_job_file_without_forest_settings(
        epsilon: float, counts: bool) -> None:
    """A job file's forest (the allocation rule: 64 trees, 128 at epsilon = 8, depth 7 for
    700 rows): the noise on one summed leaf count against the 700 / 2**7 rows per leaf
    decides."""
    cfg = _job_config(epsilon, 700)
    assert (cfg.n_estimators, cfg.max_depth) == (128 if epsilon >= 8 else 64, 7)
    std = ReleasePolicy(cfg).leaf_vote_noise()
    assert std is not None
    assert allocation.leaf_votes_are_counts(std, 700, 7) is counts


def test_the_vote_noise_is_none_without_dp_or_for_regression() -> None:
    cfg = build_config(JobSpec.model_validate({
        "id": "j", "clients": ["a", "b", "c"], "profile": "secure",
        "data": {"task": "classification", "n_features": 2, "n_classes": 2,
                 "feature_bounds": [(0.0, 1.0)] * 2}}))
    assert ReleasePolicy(cfg).leaf_vote_noise() is None
    reg = build_config(JobSpec.model_validate({
        "id": "j", "clients": ["a", "b", "c", "d"], "profile": "secure-dp",
        "profile_overrides": {"epsilon": 0.5},
        "data": {"task": "regression", "n_features": 2, "target_bound": 10.0,
                 "feature_bounds": [(0.0, 1.0)] * 2}}))
    assert ReleasePolicy(reg).leaf_vote_noise() is None


def _two_stumps(count_votes: bool) -> ForestModel:
    """Tree 0's left leaf: counts (1, 0); tree 1's left leaf: counts (10, 30). Averaged
    proportions vote (1 + 0.25) / 2 for class 0, summed counts 30 of 41 for class 1."""
    trees = [stump(), stump()]
    totals = np.array([[1.0, 0.0], [2.0, 2.0], [10.0, 30.0], [-3.0, 5.0]])
    _random_splits.values_from_leaves(trees, np.array([0, 0, 1, 1]), np.array([1, 2, 1, 2]),
                                      totals, "classification", 1.0, count_votes=count_votes)
    return ForestModel(task="classification", n_features=1, n_classes=2,
                       trees=[t.build() for t in trees],
                       vote="counts" if count_votes else "proportions")


def test_count_votes_predict_the_argmax_of_the_summed_noisy_counts() -> None:
    X = np.array([[0.0], [1.0]])
    summed = np.array([[11.0, 30.0], [-1.0, 7.0]])  # left leaves, right leaves
    counts = _two_stumps(True)
    rows_per_leaf = 47.0 / 4  # all leaves' counts over their number
    np.testing.assert_allclose(counts.trees[1].value[1], [10.0 / rows_per_leaf,
                                                          30.0 / rows_per_leaf])
    proba = counts.values_of(X)
    clipped = np.maximum(summed, 0.0)
    np.testing.assert_allclose(proba, clipped / clipped.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(counts.predict(X), np.argmax(summed, axis=1))
    # the same leaves averaged as proportions vote class 0 on the left
    assert _two_stumps(False).predict(X)[0] == 0 and counts.predict(X)[0] == 1


def test_count_votes_with_nothing_left_after_clipping_give_uniform_probabilities() -> None:
    tb = TreeBuilder(3)
    tb.add()
    _random_splits.values_from_leaves([tb], np.array([0]), np.array([0]),
                                      np.array([[-2.0, -1.0, -4.0]]), "classification", 1.0,
                                      count_votes=True)
    model = ForestModel(task="classification", n_features=1, n_classes=3, trees=[tb.build()],
                        vote="counts")
    np.testing.assert_allclose(model.values_of(np.zeros((1, 1))), [[1 / 3, 1 / 3, 1 / 3]])


def test_the_model_file_keeps_the_vote_and_old_files_average_proportions() -> None:
    counts = _two_stumps(True)
    d = json.loads(counts.to_json())
    assert d["vote"] == "counts"
    again = ForestModel.from_json(counts.to_json())
    X = np.array([[0.0], [1.0]])
    np.testing.assert_array_equal(again.values_of(X), counts.values_of(X))
    props = _two_stumps(False)
    old = json.loads(props.to_json())
    assert "vote" not in old  # the file of a proportions vote as before
    assert ForestModel.from_dict(old).vote == "proportions"
    # counts came with the vote field: without it, noisy counts are no proportions
    d.pop("vote")
    with pytest.raises(ValueError, match="is not class proportions"):
        ForestModel.from_dict(d)
    d["vote"] = "median"
    with pytest.raises(ValueError, match="vote"):
        ForestModel.from_dict(d)


def _workers(cfg: JobConfig, n: int, seed: int) -> list[Worker]:
    rng = np.random.default_rng(seed)
    X = rng.random((n, 4))
    y = (X[:, 0] + 0.3 * rng.random(n) > 0.65).astype(np.int64)
    h = np.arange(n) % 4
    return [Worker(cfg, X[h == k], y[h == k], client_index=k, seed=client_seed(cfg, k))
            for k in range(4)]


@pytest.mark.parametrize(("above", "epsilon", "vote"), [
    (4.0, 0.5, "counts"), (4.0, 8.0, "proportions"), (np.inf, 0.5, "counts"),
    (np.inf, 4.0, "proportions")])
def test_a_deployed_job_without_forest_settings_gets_the_rule(
        monkeypatch: pytest.MonkeyPatch, above: float, epsilon: float, vote: str) -> None:
    """The coordinator of a job file's forest applies the rule with the rows per tree of the
    released leaf totals, and stores the vote in the model (as shipped: summed counts with the
    class totals at epsilon <= 2, ``CLASS_TOTALS_COUNT_VOTES``; proportions above; the
    leaf weights of large epsilon, tests/test_leaf_weights.py, are off here)."""
    monkeypatch.setattr(allocation, "LEAF_VOTE_COUNTS_ABOVE", above)
    monkeypatch.setattr(allocation, "LEAF_WEIGHT_NOISE", 0.0)
    cfg = _job_config(epsilon, 700)
    coord = Coordinator(cfg)
    ws = _workers(cfg, 700, 3)
    released_tasks(coord, ws)
    model = coord.result()
    assert model.vote == vote
    leaves = [t.value[t.kind == 0] for t in model.trees]
    sums = np.concatenate(leaves).sum(axis=1)
    if vote == "counts":  # leaf values are scaled counts: not normalised
        assert not np.allclose(sums, 1.0)
    else:
        np.testing.assert_allclose(sums, 1.0)


@pytest.mark.usefixtures("votes4")
def test_onnx_export_of_a_count_vote_forest_predicts_its_probabilities() -> None:
    pytest.importorskip("onnx")
    rt = pytest.importorskip("onnxruntime")
    from fedforest_secure import FedForestClassifier

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    y = (X[:, 0] > 0).astype(np.int64)
    est = FedForestClassifier(profile=load_profile("secure-dp", epsilon=0.5),
                              random_state=0).fit(X, y, client=np.arange(300) % 4)
    assert est.model_.vote == "counts"
    Xt = rng.normal(size=(200, 4))
    sess = rt.InferenceSession(est.to_onnx().SerializeToString(),
                               providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    out = dict(zip(names, sess.run(None, {"X": Xt}), strict=True))
    np.testing.assert_allclose(out["probabilities"], est.predict_proba(Xt), rtol=0, atol=1e-12)
    assert_labels_match(out["label"], est.predict_proba(Xt), est.classes_, est.predict(Xt))


def test_balanced_count_votes_divide_each_class_by_its_own_rows_per_leaf() -> None:
    """Leaves (9, 1) and (3, 3): class 0 has 12 / 2 = 6 rows per leaf, class 1 has 2 (not
    below 1); with ``balanced`` the second leaf votes class 1 (3 / 2 > 3 / 6)."""
    tb = stump()
    totals = np.array([[9.0, 1.0], [3.0, 3.0]])
    _random_splits.values_from_leaves([tb], np.array([0, 0]), np.array([1, 2]), totals,
                                      "classification", 1.0, count_votes=True, balanced=True)
    np.testing.assert_allclose(tb.value[1], [9.0 / 6.0, 1.0 / 2.0])
    np.testing.assert_allclose(tb.value[2], [3.0 / 6.0, 3.0 / 2.0])
    plain = stump()
    _random_splits.values_from_leaves([plain], np.array([0, 0]), np.array([1, 2]), totals,
                                      "classification", 1.0, count_votes=True)
    np.testing.assert_allclose(plain.value[2], [3.0 / 8.0, 3.0 / 8.0])


def test_balanced_count_votes_are_off_as_shipped() -> None:
    assert allocation.LEAF_VOTE_BALANCED is False
