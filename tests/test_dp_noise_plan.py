"""The DP job's noise plan against what the clients really upload and draw.

* Each site rounds its sums of y and y**2 to the fixed-point grid before they are summed, so
  one record moves an encoded sum by up to one unit more than its exact value, and the plan's
  sensitivities include that unit (at ``frac_bits = 0`` a record at the target bound can move
  a site's encoded sum by 2 units, twice its exact 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedforest_secure import secure_sum
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.federation import client_seed
from fedforest_secure.privacy import Sensitivity, load_profile
from fedforest_secure.privacy.allocation import job_noise
from fedforest_secure.protocol import StatKind, kind_code, kinds_vector
from fedforest_secure.worker import Worker

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
