"""One record near a client's abstention threshold, against the DP noise plan's sensitivity.

Abstention (``abstain_below = m``) is a threshold on a client's rows at a node: the record that
takes a client from ``m - 1`` rows to ``m`` brings all ``m`` rows into the node's statistics.
The noise plan must therefore cover ``m`` rows per record wherever abstention is on.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedforest_secure import secure_sum
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.federation import client_seed
from fedforest_secure.privacy import load_profile
from fedforest_secure.privacy.allocation import job_noise
from fedforest_secure.protocol import Task
from fedforest_secure.worker import Worker

K, D = 4, 3


def _data(extra: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """120 rows over 4 clients; client 0 holds 4 rows at one point (5 with ``extra``)."""
    rng = np.random.default_rng(11)
    X = rng.normal(size=(120, D))
    y = (X[:, 0] > 0).astype(np.int64)
    h = 1 + np.arange(120) % (K - 1)
    lone = np.full((5 if extra else 4, D), 0.25)
    X = np.vstack([X, lone])
    y = np.concatenate([y, np.ones(lone.shape[0], dtype=np.int64)])
    h = np.concatenate([h, np.zeros(lone.shape[0], dtype=np.int64)])
    return X, y, h


def _config(profile: dict[str, object], method: str) -> JobConfig:
    X, _, _ = _data(False)
    bounds = tuple((-4.0, 4.0) for _ in range(D))
    return JobConfig(job_id="job-a", task="classification", n_features=D, n_classes=2,
                     n_clients=K, feature_bounds=bounds, n_estimators=4, max_depth=3,
                     max_features=1 if method == "random" else D, n_bins=8, method=method,
                     row_sampling="all", criterion="gini", profile=profile)


def _workers(cfg: JobConfig, extra: bool) -> list[Worker]:
    X, y, h = _data(extra)
    return [Worker(cfg, X[h == k], y[h == k], client_index=k, seed=client_seed(cfg, k))
            for k in range(K)]


def _releases(cfg: JobConfig) -> list[tuple[Task, float, float]]:
    """Every noisy release of a job on the data without the extra record, with client 0's
    noise-free contribution changed by adding it (L2, in integer count units) and the noise
    plan's L2 sensitivity of that release's counts."""
    ws, ws_extra = _workers(cfg, False), _workers(cfg, True)
    coord = Coordinator(cfg)
    plan = job_noise(cfg, secure_sum.noise_units(cfg))
    out = []
    task = coord.next_task()
    while task is not None:
        rep = [w.handle(task) for w in ws]
        mine = ws_extra[0].handle(task).summable
        if task.layout:
            diff = float(np.linalg.norm(mine - rep[0].summable))
            i = plan.levels.index(task.level)
            sens = plan.releases[i].blocks[0].sensitivity.l2
            out.append((task, diff, sens))
        coord.submit(task.round_id, np.sum([r.summable for r in rep], axis=0),
                     participants=range(K))
        task = coord.next_task()
    return out


@pytest.mark.parametrize("method", ["random", "histogram"])
@pytest.mark.parametrize("abstain", [0, 5])
def test_one_record_moves_a_dp_release_by_at_most_its_planned_sensitivity(
        method: str, abstain: int) -> None:
    """Client 0's fifth row crosses ``abstain_below = 5`` at the root: its contribution to
    every release grows by five rows. The plan's sensitivity must cover that."""
    prof = load_profile("secure-dp", epsilon=2.0, abstain_below=abstain).to_dict()
    released = _releases(_config(prof, method))
    assert released
    assert max(d for _, d, _ in released) > 0
    for task, diff, sens in released:
        assert diff <= sens + 1e-9, (task.level, diff, sens)


def test_abstention_under_dp_is_paid_for_in_noise() -> None:
    """The same job with ``abstain_below = 5`` carries five times the noise of one without."""
    base = _config(load_profile("secure-dp", epsilon=2.0, abstain_below=0).to_dict(), "random")
    five = _config(load_profile("secure-dp", epsilon=2.0, abstain_below=5).to_dict(), "random")
    units = secure_sum.noise_units(base)
    s0 = job_noise(base, units).sigmas
    s5 = job_noise(five, units).sigmas
    for a, b in zip(s0, s5, strict=True):
        assert np.allclose(np.asarray(b), 5.0 * np.asarray(a), rtol=1e-6)


def test_one_record_moves_a_dp_evaluation_by_at_most_its_planned_sensitivity() -> None:
    """A site with 4 held-out rows sends zeros under ``abstain_below = 5``; a fifth record
    brings all five rows' statistics. The evaluation's noise covers it."""
    from sklearn.datasets import make_classification

    from fedforest_secure import FedForestClassifier
    from fedforest_secure.evaluation import EvalSpec
    from fedforest_secure.evaluation.encoding import encode_statistics
    from fedforest_secure.evaluation.inprocess import eval_config
    from fedforest_secure.evaluation.noise import config_layout, eval_noise
    from fedforest_secure.evaluation.worker import EvalWorker

    X, y = make_classification(n_samples=80, n_features=4, random_state=0)
    model = FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(X, y)
    spec = EvalSpec(models=(model.model_.to_json(),))
    prof = load_profile("secure-dp", epsilon=1.0, abstain_below=5).to_dict()
    config = eval_config("ev", spec, task="classification", n_features=4, n_clients=4,
                         n_classes=2, profile=prof)
    layout = config_layout(config)
    five = EvalWorker(config, X[:5], y[:5])
    assert EvalWorker(config, X[:4], y[:4]).abstains and not five.abstains
    full = encode_statistics(layout, five.statistics(), 5, True)
    planned = {b.name: b.sensitivity.l2 for b in eval_noise(config).release.blocks}
    start = 0
    for b in layout.blocks:  # the abstaining site's vector is all zeros
        size = layout.n_models * b.size
        diff = float(np.linalg.norm(full[start:start + size]))
        start += size
        assert diff <= planned[b.name] + 1e-9, (b.name, diff, planned[b.name])
