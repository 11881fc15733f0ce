"""Distributed DP noise against the server plus colluding sites (``dp.colluders``).

Each site adds a share of the noise. A colluding site knows (or never adds) its own share and
the server may drop honest sites down to ``K_min``, so against ``c`` colluders a released sum
carries the noise of ``K_min - c`` honest sites. With ``dp.colluders = 0`` (the default) the
noise is calibrated for ``K_min`` sites and the job's epsilon degrades against colluders
(docs/privacy.md, "Colluding sites"; threat_model.md §2.2, §6); with ``dp.colluders = c`` each
site's noise is calibrated for ``K_min - c`` sites and the epsilon holds against ``c`` of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path

import numpy as np
import pytest

from fedforest_secure import secure_sum
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import BudgetError, ProfileError, RefusedRequest
from fedforest_secure.privacy import ChaChaRandom, load_profile, sample_discrete_gaussian
from fedforest_secure.privacy.accountant import epsilon_of
from fedforest_secure.privacy.allocation import JobNoise, PlannedRelease, job_noise, release_cost
from fedforest_secure.privacy.pinning import check_job_config
from fedforest_secure.secagg.driver import InProcessSecureSum
from server_app.jobcheck import check_job
from server_app.jobspec import build_config, load_job_spec
from server_app.settings import ConfigError

K = 10  # t = K_min = 7 at the secure-dp threshold 0.67
COLLUDERS, DROPPED, HONEST = [7, 8, 9], [4, 5, 6], [0, 1, 2, 3]


def _config(n: int = K, method: str = "random", **settings: object) -> JobConfig:
    prof = load_profile("secure-dp", epsilon=1.0, **settings)
    return JobConfig(job_id="j", task="classification", n_features=4, n_classes=2,
                     n_clients=n, feature_bounds=tuple((-1.0, 1.0) for _ in range(4)),
                     n_estimators=8, max_depth=3, min_samples_leaf=1, max_features=1,
                     n_bins=8, method=method, row_sampling="all", criterion="gini",
                     profile=prof.to_dict())


def _plan(cfg: JobConfig) -> JobNoise:
    return job_noise(cfg, secure_sum.noise_units(cfg))


def _coalition_noise(sigma: float, k_min: int, rounds: int = 3, length: int = 4000
                     ) -> np.ndarray:
    """The noise on the honest sites' sum that the server and sites 7, 8, 9 hold.

    Real SecAggClient/SecAggServer rounds of 10 sites, each adding ``N_Z(0, sigma**2)`` to
    its vector; the server drops honest sites 4, 5, 6 after their shares, so the survivor
    set is exactly ``K_min = 7`` (every client signs and unmasks as its rules say), and the
    colluders hand it their own noisy vectors, which it subtracts from the sum. The noise is
    drawn from fixed ChaCha20 keys, so the sample is the same every run."""
    ss = InProcessSecureSum(range(K), 0.67, min_survivors=k_min, record=False)
    rng = np.random.default_rng(1)
    errs = []
    for i in range(rounds):
        data = {u: rng.integers(0, 50, length).astype(np.int64) for u in range(K)}
        enc = {u: (data[u] + sample_discrete_gaussian(
            sigma, length, ChaChaRandom(hashlib.sha256(f"{i}/{u}".encode()).digest()))
                   ).view(np.uint64) for u in range(K)}
        q = f"q{i}"
        total = ss.sum(q, hashlib.sha256(q.encode()).digest(), enc, drop_after_sharing=DROPPED)
        est = total - sum(enc[u] for u in COLLUDERS)
        errs.append(est.view(np.int64) - sum(data[u] for u in HONEST))
    return np.concatenate(errs)


def test_without_colluders_set_the_coalitions_view_of_the_honest_sum_has_less_noise() -> None:
    """The documented degradation: at dp.colluders = 0 three colluders of ten leave the
    honest sites' sum with 4 sites' noise, not the K_min = 7 the calibration counts on, and
    the accountant puts the job's epsilon of 1 at 1.35 against them."""
    plan = _plan(_config())
    sigma = plan.level_sigmas(0)["count"]
    assert plan.k_min == 7
    calibrated = sigma * math.sqrt(plan.k_min)
    noise = _coalition_noise(sigma, plan.k_min)
    # 12,000 seeded draws: the sample std is within 2% (3.1 standard errors) of sqrt(4) sigma
    assert abs(noise.std() - 2 * sigma) < 0.02 * 2 * sigma
    assert noise.std() < 0.8 * calibrated  # sqrt(4/7) = 0.76 of the calibrated noise
    assert plan.epsilon_against(0) == pytest.approx(1.0, abs=1e-6)
    assert [round(plan.epsilon_against(c), 2) for c in (1, 2, 3)] == [1.09, 1.2, 1.35]


def test_with_colluders_set_the_honest_sum_carries_at_least_the_calibrated_noise() -> None:
    """dp.colluders = 3: each site's noise is calibrated for K_min - 3 = 4 honest sites, so
    the coalition's view of the honest sum carries at least the noise a sum of 7 sites has
    at dp.colluders = 0, and the accountant certifies the job's epsilon against 3 colluders;
    a sum still needs K_min = 7 survivors."""
    base, plan = _plan(_config()), _plan(_config(colluders=3))
    assert plan.k_min == 7 and [r.k_min for r in plan.releases] == [4, 4]
    assert plan.epsilon_against(3) <= 1.0 + 1e-9
    assert plan.epsilon_against(3) == pytest.approx(1.0, abs=1e-6)  # the whole budget
    assert plan.epsilon_against(4) > 1.0
    for level in plan.levels:
        for kind, s in plan.level_sigmas(level).items():  # exactly sqrt(7 / 4) times the noise
            assert s == pytest.approx(base.level_sigmas(level)[kind] * math.sqrt(7 / 4),
                                      rel=1e-6)
    sigma = plan.level_sigmas(0)["count"]
    target = base.level_sigmas(0)["count"] * math.sqrt(base.k_min)
    noise = _coalition_noise(sigma, plan.k_min)
    # expected std is the target; 12,000 seeded draws: at least 97% of it (3% is 4.6
    # standard errors)
    assert noise.std() >= 0.97 * target


def test_greedy_and_evaluation_plans_calibrate_for_the_honest_sites_too() -> None:
    plan = _plan(_config(method="histogram", colluders=2))
    assert plan.k_min == 7 and {r.k_min for r in plan.releases} == {5}
    assert plan.epsilon_against(2) == pytest.approx(1.0, abs=1e-6)

    from sklearn.datasets import make_classification

    from fedforest_secure import FedForestClassifier
    from fedforest_secure.evaluation import EvalSpec
    from fedforest_secure.evaluation.inprocess import eval_config
    from fedforest_secure.evaluation.noise import eval_noise

    X, y = make_classification(n_samples=80, n_features=4, random_state=0)
    model = FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(X, y)
    ev = eval_noise(eval_config(
        "ev", EvalSpec(models=(model.model_.to_json(),)), task="classification", n_features=4,
        n_clients=K, n_classes=2,
        profile=load_profile("secure-dp", epsilon=1.0, colluders=2).to_dict()))
    assert ev.k_min == 7 and ev.release.k_min == 5


@pytest.mark.parametrize(("value", "message"), [
    (-1, "dp: colluders must be >= 0 (the sites that may collude with the server), "
         "got -1"),
    (True, "dp.colluders: Input should be a valid integer"),
    (1.5, "dp.colluders: Input should be a valid integer"),
])
def test_a_profile_refuses_colluders_that_are_not_a_count(value: object, message: str) -> None:
    with pytest.raises(ProfileError) as err:
        load_profile("secure-dp", colluders=value)
    assert message in str(err.value)


def _one_site_epsilon(plan: JobNoise) -> float:
    """The plan's epsilon for a release that carries one site's noise: one site's vector."""
    return epsilon_of([release_cost(PlannedRelease(r.label, 1, r.blocks), s)
                       for r, s in zip(plan.releases, plan.sigmas, strict=True)], plan.delta)


def test_colluders_at_the_single_vector_bound_are_refused_naming_the_largest_allowed() -> None:
    """4 colluders of 10 at t = 7 (2t - n, S15) can get the server one site's vector, which
    carries that site's noise alone: no calibration for K_min - 4 sites holds against them.
    3, the largest c below min(2t - n, t - 1), is accepted."""
    for c in (4, 6):
        with pytest.raises(BudgetError) as err:
            _plan(_config(colluders=c))
        assert str(err.value) == (
            f"dp.colluders = {c} is not below min(2t - n, t - 1) = 4 for this job's n = 10 "
            "sites at threshold t = 7: that many colluders can get the server one site's "
            "vector, which carries that site's noise alone, so no calibration for K_min - "
            "colluders sites holds against them; set colluders to at most 3, or add sites")
    plan = _plan(_config(colluders=3))
    assert plan.vector_bound == 4 and [r.k_min for r in plan.releases] == [4, 4]
    assert plan.epsilon_against(3) == pytest.approx(1.0, abs=1e-6)


def test_epsilon_against_colluders_past_the_bound_is_one_sites_vectors() -> None:
    """From min(2t - n, t - 1) = 4 colluders of 10 on, the server may hold one site's vector:
    epsilon_against says what that vector's noise alone gives, whatever the number."""
    for colluders in (0, 3):
        plan = _plan(_config(colluders=colluders))
        one_site = _one_site_epsilon(plan)
        assert one_site > plan.epsilon_against(3) >= 1.0 - 1e-6
        assert [plan.epsilon_against(c) for c in (4, 5, 7, 9)] == [one_site] * 4
    with pytest.raises(BudgetError, match=r"^colluders must be >= 0, got -1$"):
        plan.epsilon_against(-1)
    # the docs' figures: the benchmark's job (64 random trees of depth 6) at epsilon = 1
    for colluders, one_site in ((0, 2.87), (3, 2.11)):
        plan = _plan(dataclasses.replace(_config(colluders=colluders), n_estimators=64,
                                         max_depth=6, n_bins=32))
        assert round(plan.epsilon_against(4), 2) == one_site


def test_colluders_at_k_min_or_more_leave_no_honest_noise_and_are_refused() -> None:
    """dropout_tolerance = 0.7: K_min = 3, below the single-vector bound 4 of 10 sites."""
    with pytest.raises(BudgetError) as err:
        _plan(_config(colluders=3, dropout_tolerance=0.7))
    assert str(err.value) == (
        "dp.colluders = 3 is not below K_min = 3, the survivors a sum of this job's 10 sites "
        "may be released with: no honest site's noise would remain against that many "
        "colluders; set colluders to at most 2, or add sites")
    plan = _plan(_config(colluders=2, dropout_tolerance=0.7))
    assert plan.k_min == 3 and plan.releases[0].k_min == 1  # each site's own noise suffices


def test_colluders_on_the_secagg_plus_graph_are_refused() -> None:
    """With neighbours (SecAgg+) colluders around one site can unmask its vector on a graph the
    server may redraw (S19): no colluders are accepted; neighbours = n - 1 is the complete
    graph."""
    for method in ("random", "histogram"):
        with pytest.raises(BudgetError) as err:
            _plan(_config(n=30, method=method, neighbours=14, colluders=1))
        assert str(err.value) == (
            "dp.colluders = 1 needs the complete graph: with neighbours = 14 (SecAgg+) a few "
            "colluders around one site can get the server that site's vector, on a graph the "
            "server may redraw each round, and that vector carries the site's own noise alone; "
            "remove neighbours from the profile, or set colluders to 0")
    sparse = _plan(_config(n=30, neighbours=14))
    assert sparse.vector_bound == 1
    assert sparse.epsilon_against(1) == _one_site_epsilon(sparse)
    complete = _plan(_config(n=30, neighbours=29, colluders=11))
    assert complete.vector_bound == 12 and complete.releases[0].k_min == 10


def _job_file(tmp_path: Path, privacy: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text('id = "j"\nclients = ["a", "b", "c", "d"]\nprofile = "secure-dp"\n'
                    "public_rows = 400\n" + privacy +
                    '[data]\ntask = "classification"\nn_features = 3\nn_classes = 2\n'
                    "feature_bounds = [[-3.0, 3.0], [-3.0, 3.0], [-3.0, 3.0]]\n")
    return path


def test_a_job_file_sets_colluders_and_the_job_carries_them(tmp_path: Path) -> None:
    """[privacy] colluders or [privacy.dp] colluders: the job's profile (what its config and
    its job_created audit entry hold) carries them and is named after them; left out, the
    profile holds no colluders key (jobs and model files as before) and means 0."""
    for privacy in ("[privacy]\ncolluders = 1\n", "[privacy.dp]\ncolluders = 1\n"):
        cfg = build_config(load_job_spec(_job_file(tmp_path, privacy)))
        assert cfg.dp is not None and cfg.dp["colluders"] == 1
        assert cfg.profile["name"] == "secure-dp (colluders = 1)"
    plain = build_config(load_job_spec(_job_file(tmp_path, "")))
    assert plain.dp is not None and "colluders" not in plain.dp
    assert _plan(plain).releases[0].k_min == _plan(plain).k_min == 3


def test_create_job_refuses_colluders_the_job_has_no_honest_noise_for(tmp_path: Path) -> None:
    """4 sites at t = 3: min(2t - n, t - 1) = 2 colluders can get one site's vector."""
    check_job(load_job_spec(_job_file(tmp_path, "[privacy]\ncolluders = 1\n")))
    for c in (2, 3):
        with pytest.raises(ConfigError) as err:
            check_job(load_job_spec(_job_file(tmp_path, f"[privacy]\ncolluders = {c}\n")))
        assert str(err.value) == (
            f"job 'j' cannot start: dp.colluders = {c} is not below min(2t - n, t - 1) = 2 for "
            "this job's n = 4 sites at threshold t = 3: that many colluders can get the server "
            "one site's vector, which carries that site's noise alone, so no calibration for "
            "K_min - colluders sites holds against them; set colluders to at most 1, or add "
            "sites")


def test_a_site_pinning_colluders_refuses_a_job_calibrated_for_fewer() -> None:
    pinned = load_profile("secure-dp", epsilon=1.0, colluders=2)
    with pytest.raises(RefusedRequest, match=r"profile\.dp: job .* this site .*'colluders': 2"):
        check_job_config(_config(), profile=pinned)
    check_job_config(_config(colluders=2), profile=pinned)
