"""Class priors of a random-split DP classifier: node values as class proportions under
uniform class priors, as far as the leaves' noisy release shows the classes' frequencies
(``_random_splits.class_weights``, ``allocation.LEAF_CLASS_BALANCED``); post-processing of the
same two releases."""

from __future__ import annotations

import numpy as np
import pytest
from engine_driver import released_tasks, stump

from fedforest_secure import _random_splits
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.federation import client_seed
from fedforest_secure.privacy import allocation, load_profile
from fedforest_secure.protocol import TaskKind
from fedforest_secure.worker import Worker

# two trees of two leaves each: class totals (18, 6) over 2 trees, i.e. (9, 3) rows per tree
_TOTALS = np.array([[6.0, 2.0], [3.0, 1.0], [5.0, 1.0], [4.0, 2.0]])


def test_exact_totals_give_the_inverse_class_frequencies() -> None:
    w = _random_splits.class_weights(_TOTALS, 2, 0.0)
    np.testing.assert_allclose(w, [0.5 / 0.75, 0.5 / 0.25])


def test_noise_that_hides_the_imbalance_gives_uniform_weights() -> None:
    """One tree, leaves (6, 4) and (5, 5): p = (0.55, 0.45), ||p - u||**2 = 0.005; noise 1.2
    on each leaf count gives s**2 = 2.88 and v = 2.88 / 400 > 0.005: no correction (the total,
    20, is well above 3 standard deviations of its noise, 3 * 1.7 * sqrt(2))."""
    totals = np.array([[6.0, 4.0], [5.0, 5.0]])
    np.testing.assert_array_equal(_random_splits.class_weights(totals, 1, 1.2), [1.0, 1.0])
    assert _random_splits.class_weights(totals, 1, 0.5)[1] > 1.0


def test_a_total_within_its_noise_gives_uniform_weights() -> None:
    """Noise 10: s = 10 * sqrt(4) / 2 = 10; the total 12 is below 3 s sqrt(2)."""
    np.testing.assert_array_equal(_random_splits.class_weights(_TOTALS, 2, 10.0), [1.0, 1.0])


def test_some_noise_shrinks_the_frequencies_towards_uniform() -> None:
    """noise 2: s**2 = 4, v = 4 / 144, f = 1 - v / 0.125; q = u + f (p - u)."""
    f = 1.0 - (4.0 / 144.0) / 0.125
    q = 0.5 + f * np.array([0.25, -0.25])
    np.testing.assert_allclose(_random_splits.class_weights(_TOTALS, 2, 2.0), 0.5 / q)
    assert 0 < f < 1


def test_no_class_weight_exceeds_four() -> None:
    totals = np.array([[10.0, -3.0], [9.0, -1.0]])
    w = _random_splits.class_weights(totals, 1, 0.0)
    np.testing.assert_allclose(w, [0.5 / (19.0 / 15.0), 4.0])


def test_node_values_are_proportions_under_uniform_priors() -> None:
    """Leaves (9, 1) and (3, 3): class totals (12, 4), weights (2/3, 2): the leaves become
    (6, 2) and (2, 6), the root (8, 8)."""
    tb = stump()
    totals = np.array([[9.0, 1.0], [3.0, 3.0]])
    _random_splits.values_from_leaves([tb], np.array([0, 0]), np.array([1, 2]), totals,
                                      "classification", 1.0, class_prior_noise=0.0)
    np.testing.assert_allclose(tb.value[0], [0.5, 0.5])
    np.testing.assert_allclose(tb.value[1], [0.75, 0.25])
    np.testing.assert_allclose(tb.value[2], [0.25, 0.75])
    plain = stump()
    _random_splits.values_from_leaves([plain], np.array([0, 0]), np.array([1, 2]), totals,
                                      "classification", 1.0)
    np.testing.assert_allclose(plain.value[0], [0.75, 0.25])


def _imbalanced_job(profile: str, epsilon: float = 8.0, **dp: object
                    ) -> tuple[JobConfig, list[Worker]]:
    rng = np.random.default_rng(3)
    K, n, d = 4, 400, 3
    X = rng.normal(size=(n, d))
    y = (X[:, 0] > 0.85).astype(np.int64)  # about 80 / 20
    h = np.arange(n) % K
    bounds = tuple((float(X[:, j].min()), float(X[:, j].max())) for j in range(d))
    prof = load_profile(profile, **({"epsilon": epsilon, **dp} if profile == "secure-dp" else {}))
    cfg = JobConfig(job_id="job-p", task="classification", n_features=d, n_classes=2,
                    n_clients=K, feature_bounds=bounds, n_estimators=32, max_depth=4,
                    max_features=1, n_bins=16, method="random", row_sampling="all",
                    criterion="gini", profile=prof.to_dict())
    ws = [Worker(cfg, X[h == k], y[h == k], client_index=k, seed=client_seed(cfg, k))
          for k in range(K)]
    return cfg, ws


def _fit(cfg: JobConfig, ws: list[Worker]) -> tuple[np.ndarray, list[TaskKind]]:
    coord = Coordinator(cfg)
    kinds = [t.kind for t in released_tasks(coord, ws)]
    model = coord.result()
    return np.array([t.value[0] for t in model.trees]), kinds


@pytest.mark.parametrize("balanced", [True, False])
def test_a_dp_forest_roots_are_balanced_only_with_the_class_priors(
        monkeypatch: pytest.MonkeyPatch, balanced: bool) -> None:
    """80 / 20 rows at epsilon = 8: with the class priors every tree's root value is near
    (0.5, 0.5) (its own noisy totals under the weights of all trees' totals); without, near
    the rows' (0.8, 0.2). The job makes the same two releases either way."""
    monkeypatch.setattr(allocation, "LEAF_CLASS_BALANCED", balanced)
    cfg, ws = _imbalanced_job("secure-dp")
    roots, kinds = _fit(cfg, ws)
    assert kinds == [TaskKind.HISTOGRAM, TaskKind.SKETCH]
    share = float(np.mean(roots[:, 0]))
    if balanced:
        assert abs(share - 0.5) < 0.05
    else:
        assert share > 0.7


def test_without_dp_the_random_forest_keeps_the_rows_class_frequencies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocation, "LEAF_CLASS_BALANCED", True)
    cfg, ws = _imbalanced_job("secure")
    roots, _ = _fit(cfg, ws)
    np.testing.assert_allclose(roots[:, 0], roots[0, 0])
    assert roots[0, 0] > 0.7


def test_class_priors_are_on_as_shipped_with_twice_the_count_noise() -> None:
    assert allocation.LEAF_CLASS_BALANCED is True
    assert allocation.CLASS_PRIOR_NOISE_MULT == 2.0


def test_a_deployed_job_without_forest_settings_applies_the_class_priors() -> None:
    """A job file (secure-dp, epsilon = 8, no forest settings: the allocation rule's random
    splits) over 80 / 20 rows: its coordinator balances the trees' roots as the estimators'
    does, with the same two releases."""
    from server_app.jobspec import JobSpec, build_config

    rng = np.random.default_rng(3)
    K, n, d = 4, 400, 3
    X = rng.normal(size=(n, d))
    y = (X[:, 0] > 0.85).astype(np.int64)
    h = np.arange(n) % K
    bounds = [(float(X[:, j].min()), float(X[:, j].max())) for j in range(d)]
    cfg = build_config(JobSpec.model_validate({
        "id": "j", "clients": ["a", "b", "c", "d"], "profile": "secure-dp",
        "profile_overrides": {"epsilon": 8.0}, "public_rows": n,
        "data": {"task": "classification", "n_features": d, "n_classes": 2,
                 "feature_bounds": bounds}}))
    assert cfg.method == "random"
    ws = [Worker(cfg, X[h == k], y[h == k], client_index=k, seed=client_seed(cfg, k))
          for k in range(K)]
    roots, kinds = _fit(cfg, ws)
    assert kinds == [TaskKind.HISTOGRAM, TaskKind.SKETCH]
    assert abs(float(np.mean(roots[:, 0])) - 0.5) < 0.05


def test_a_profile_with_class_priors_rows_keeps_the_rows_class_frequencies() -> None:
    """The same 80 / 20 job with ``dp.class_priors = "rows"``: the roots stay near the rows'
    (0.8, 0.2) although the class priors are on as shipped; the same two releases."""
    cfg, ws = _imbalanced_job("secure-dp", class_priors="rows")
    assert cfg.profile["dp"]["class_priors"] == "rows"
    roots, kinds = _fit(cfg, ws)
    assert kinds == [TaskKind.HISTOGRAM, TaskKind.SKETCH]
    assert float(np.mean(roots[:, 0])) > 0.7


def test_the_profile_mapping_names_class_priors_only_when_they_are_the_rows() -> None:
    from fedforest_secure.errors import ProfileError
    from fedforest_secure.privacy import PrivacyProfile

    uniform = load_profile("secure-dp", epsilon=2.0)
    assert uniform.dp is not None and uniform.dp.class_priors == "uniform"
    assert "class_priors" not in uniform.to_dict()["dp"]  # model files and jobs as before
    rows = load_profile("secure-dp", epsilon=2.0, class_priors="rows")
    assert rows.to_dict()["dp"]["class_priors"] == "rows"
    assert PrivacyProfile.from_dict(rows.to_dict()) == rows
    assert PrivacyProfile.from_dict(uniform.to_dict()) == uniform
    with pytest.raises(ProfileError, match="class_priors"):
        load_profile("secure-dp", epsilon=2.0, class_priors="balanced")


def test_a_job_file_privacy_table_can_keep_the_rows_class_frequencies() -> None:
    from server_app.jobspec import JobSpec, build_config

    spec = {"id": "j", "clients": ["a", "b", "c", "d"], "profile": "secure-dp",
            "profile_overrides": {"epsilon": 8.0, "class_priors": "rows"}, "public_rows": 400,
            "data": {"task": "classification", "n_features": 3, "n_classes": 2,
                     "feature_bounds": [(-3.0, 3.0)] * 3}}
    cfg = build_config(JobSpec.model_validate(spec))
    assert cfg.dp is not None and cfg.dp["class_priors"] == "rows"
    spec["profile_overrides"] = {"epsilon": 8.0}
    assert "class_priors" not in (build_config(JobSpec.model_validate(spec)).dp or {})
