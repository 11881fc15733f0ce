"""The DP job's noise plan against what the clients really upload and draw.

* Each site rounds its sums of y and y**2 to the fixed-point grid before they are summed, so
  one record moves an encoded sum by up to one unit more than its exact value, and the plan's
  sensitivities include that unit (at ``frac_bits = 0`` a record at the target bound can move
  a site's encoded sum by 2 units, twice its exact 1).
* A small epsilon with a large ``frac_bits`` asks for noise scales the discrete Gaussian
  sampler cannot draw: the job is refused before any round, naming epsilon and ``frac_bits``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from fedforest_secure import FedForestRegressor, secure_sum
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import BudgetError
from fedforest_secure.federation import client_seed
from fedforest_secure.privacy import Sensitivity, load_profile
from fedforest_secure.privacy._sampling import MAX_SIGMA
from fedforest_secure.privacy.allocation import job_noise
from fedforest_secure.protocol import StatKind, kind_code, kinds_vector
from fedforest_secure.worker import Worker
from server_app.engine import new_coordinator

K, D = 4, 3


def _data(extra: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """120 rows on clients 1-3; client 0 holds one row at a point with y = 0.5 (half the
    target bound: its sums sit on a rounding tie at frac_bits = 0), and with ``extra`` one
    more there with y = 1 (the bound)."""
    rng = np.random.default_rng(5)
    X = rng.uniform(-1.0, 1.0, size=(120, D))
    y = np.clip(X[:, 0] + 0.1 * rng.normal(size=120), -1.0, 1.0)
    h = 1 + np.arange(120) % (K - 1)
    lone_y = [0.5, 1.0] if extra else [0.5]
    X = np.vstack([X, np.full((len(lone_y), D), 0.25)])
    return X, np.concatenate([y, lone_y]), np.concatenate([h, np.zeros(len(lone_y), int)])


def _config(profile: dict[str, Any], method: str) -> JobConfig:
    return JobConfig(job_id="job-r", task="regression", n_features=D, n_clients=K,
                     feature_bounds=tuple((-1.0, 1.0) for _ in range(D)), target_bound=1.0,
                     n_estimators=4, max_depth=2, min_samples_leaf=1,
                     max_features=1 if method == "random" else D, n_bins=8, method=method,
                     row_sampling="all", profile=profile)


@pytest.mark.parametrize("method", ["random", "histogram"])
@pytest.mark.parametrize("frac_bits", [0, 24])
def test_one_record_moves_each_encoded_release_by_at_most_its_planned_sensitivity(
        method: str, frac_bits: int) -> None:
    """Client 0's encoded (noise-free) upload of every release, with and without the record
    at the bound, differs by at most the plan's L-inf and L2 sensitivity of each statistic
    kind, in ring units."""
    cfg = _config(load_profile("secure-dp", epsilon=2.0, frac_bits=frac_bits).to_dict(), method)
    shares = [_data(False), _data(True)]
    workers = [[Worker(cfg, X[h == k], y[h == k], client_index=k, seed=client_seed(cfg, k))
                for k in range(K)] for X, y, h in shares]
    plan = job_noise(cfg, secure_sum.noise_units(cfg))
    coord = Coordinator(cfg)
    checked: set[str] = set()
    task = coord.next_task()
    while task is not None:
        replies = [w.handle(task) for w in workers[0]]
        with_record = workers[1][0].handle(task)
        if task.layout:
            codec = secure_sum.make_codec(cfg, task)
            moved = (codec.encode_entries(with_record.summable).view(np.int64)
                     - codec.encode_entries(replies[0].summable).view(np.int64))
            kinds = kinds_vector(task.layout)
            release = plan.releases[plan.levels.index(task.level)]
            for block in release.blocks:
                d = moved[kinds == kind_code(StatKind(block.name))].astype(np.float64)
                assert np.abs(d).max() <= block.sensitivity.linf, (task.level, block.name)
                assert np.linalg.norm(d) <= block.sensitivity.l2 * (1 + 1e-12), block.name
                if np.abs(d).max() > 0:
                    checked.add(block.name)
                if frac_bits == 0 and block.name == "sum":
                    # the tie: 0.5 encodes to 0 and 1.5 to 2, so the record moves the sum by
                    # 2 units, one more than its y = 1 (the rounding unit of the plan)
                    assert np.abs(d).max() == 2 == block.sensitivity.linf
        coord.submit(task.round_id, np.sum([r.summable for r in replies], axis=0),
                     participants=range(K))
        task = coord.next_task()
    assert checked == {"count", "sum", "sumsq"}


def test_at_the_shipped_frac_bits_rounding_adds_2_to_the_minus_24_of_the_sums_noise() -> None:
    """frac_bits = 24: a sum's sensitivity is 2^24 (one record at the bound) plus one unit
    per bin for the rounding, in every bin the record touches (trees x feature slots), so
    the sums' noise is (2^24 + 1) times the counts' (equal budget shares) instead of 2^24."""
    cfg = _config(load_profile("secure-dp", epsilon=2.0).to_dict(), "histogram")
    plan = job_noise(cfg, secure_sum.noise_units(cfg))
    cells = cfg.n_estimators * cfg.max_features
    for level, release in zip(plan.levels, plan.releases, strict=True):
        sens = {b.name: b.sensitivity for b in release.blocks}
        assert sens["count"] == Sensitivity(cells, cells**0.5, 1.0)
        for kind in ("sum", "sumsq"):
            assert sens[kind] == Sensitivity(2.0**24 * cells + cells,
                                             2.0**24 * cells**0.5 + cells**0.5, 2.0**24 + 1)
            sigmas = plan.level_sigmas(level)
            assert sigmas[kind] / sigmas["count"] == pytest.approx(2.0**24 + 1, rel=1e-12)


def test_noise_the_sampler_cannot_draw_is_refused_before_any_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(400, 3))
    y = X[:, 0] * 10
    calls = {"handle": 0, "encode": 0}
    handle, encode = Worker.handle, secure_sum.encode_contribution

    def counted_handle(self: Worker, task: Any) -> Any:
        calls["handle"] += 1
        return handle(self, task)

    def counted_encode(*args: Any) -> Any:
        calls["encode"] += 1
        return encode(*args)

    def fit(frac_bits: int) -> FedForestRegressor:
        prof = load_profile("secure-dp", frac_bits=frac_bits, epsilon=0.002)
        return FedForestRegressor(profile=prof, random_state=0).fit(
            X, y, client=np.arange(400) % 4)

    with monkeypatch.context() as m:
        m.setattr(Worker, "handle", counted_handle)
        m.setattr(secure_sum, "encode_contribution", counted_encode)
        with pytest.raises(BudgetError) as err:
            fit(32)
    assert str(err.value) == (
        "epsilon = 0.002 with frac_bits = 32 needs each client's noise on the leaf totals "
        "(sumsq) at a scale of 2.19e+14 ring units, more than the discrete Gaussian sampler "
        "draws (below 2^45 = 3.52e+13): raise epsilon, or lower frac_bits to 29 or less (the "
        "noise on sums of y and y^2 scales with 2^frac_bits)")
    assert calls == {"handle": 0, "encode": 0}  # no round was asked, nothing was uploaded
    # the frac_bits it names trains, and the sampler draws every scale; one more does not
    with pytest.raises(BudgetError, match="with frac_bits = 30 .* lower frac_bits to 29 or"):
        fit(30)
    cfg = fit(29).config_
    plan = job_noise(cfg, secure_sum.noise_units(cfg))
    assert MAX_SIGMA / 2 < max(s for r in plan.sigmas for s in r) < MAX_SIGMA


def test_a_server_job_whose_noise_the_sampler_cannot_draw_does_not_start() -> None:
    prof = load_profile("secure-dp", frac_bits=32, epsilon=0.002).to_dict()
    cfg = _config(prof, "random")
    with pytest.raises(BudgetError, match=r"^epsilon = 0\.002 with frac_bits = 32 needs each "
                                          r"client's noise on the leaf totals \(sumsq\)"):
        new_coordinator(cfg)


def test_noisy_h_splits_the_sampler_cannot_draw_are_refused_before_any_round() -> None:
    def config(frac_bits: int) -> JobConfig:
        prof = load_profile("secure-dp", frac_bits=frac_bits, epsilon=1.0, h_splits="noisy",
                            h_epsilon=0.001).to_dict()
        return replace(_config(prof, "histogram"), split_on_client=True)

    with pytest.raises(BudgetError) as err:
        Coordinator(config(32))
    assert str(err.value) == (
        "h_epsilon = 0.001 with frac_bits = 32 needs each client's noise on the node "
        "summaries' sums of y at a scale of 5.81e+13 ring units, more than the discrete "
        "Gaussian sampler draws (below 2^45 = 3.52e+13): raise h_epsilon, or lower frac_bits "
        "to 31 or less (the noise on sums of y and y^2 scales with 2^frac_bits)")
    assert Coordinator(config(31)).next_task() is not None
