"""Tests for fedforest_secure.federation and secure_sum: invariants 1 and 2 in process."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from fedforest_secure import FedForestClassifier, FedForestRegressor, load_profile
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import SchemaError
from fedforest_secure.federation import (
    PlainSum,
    RoundRecord,
    _in_order,
    _Threads,
    effective_n_jobs,
    make_aggregator,
    run_in_process,
)
from fedforest_secure.protocol import Reply, Task, TaskKind
from fedforest_secure.secagg import Upload
from fedforest_secure.secure_sum import RingAggregator, make_codec


def _data(task: str, seed: int = 0, n: int = 160, K: int = 4) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    h = np.arange(n) % K
    if task == "regression":
        y = X[:, 0] + np.sin(2 * X[:, 1]) + 0.2 * rng.normal(size=n) + 0.3 * h
    else:
        y = (X[:, 0] + 0.5 * X[:, 2] + 0.3 * rng.normal(size=n) > 0).astype(int)
    return X, y, h


_SMALL = dict(n_estimators=3, max_depth=3, min_samples_leaf=3, n_bins=8, random_state=4)


@pytest.mark.parametrize("cls,task", [(FedForestRegressor, "regression"),
                                      (FedForestClassifier, "classification")])
def test_invariant2_secure_aggregation_is_exact(cls: Any, task: str) -> None:
    X, y, h = _data(task)
    secure = cls(profile="secure", **_SMALL).fit(X, y, client=h)
    plain = cls(profile=load_profile("secure", secure_aggregation=False), **_SMALL).fit(
        X, y, client=h)
    assert secure.model_.to_json() == plain.model_.to_json()
    assert secure.model_.digest() == plain.model_.digest()


@pytest.mark.parametrize("cls,task", [(FedForestRegressor, "regression"),
                                      (FedForestClassifier, "classification")])
def test_invariant2_holds_with_missing_values(cls: Any, task: str) -> None:
    """The missing rows' statistics travel in the same masked vectors: secure and plain
    sums grow the same forest."""
    X, y, h = _data(task)
    X = X.copy()
    X[np.random.default_rng(0).random(X.shape) < 0.2] = np.nan
    secure = cls(profile="secure", **_SMALL).fit(X, y, client=h)
    plain = cls(profile=load_profile("secure", secure_aggregation=False), **_SMALL).fit(
        X, y, client=h)
    assert secure.config_.has_missing
    assert secure.model_.digest() == plain.model_.digest()
    assert sum(t.n_nodes for t in secure.model_.trees) > 3 * 3  # the trees did grow
    if task == "regression":
        assert secure.predict(X).tobytes() == plain.predict(X).tobytes()
    else:
        assert secure.predict_proba(X).tobytes() == plain.predict_proba(X).tobytes()


class _Recorder:
    """Wraps an aggregator and records what it was given."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[Task, dict[int, Reply]]] = []

    def aggregate(self, task: Task, replies: Mapping[int, Reply]) -> np.ndarray:
        self.calls.append((task, dict(replies)))
        return self.inner.aggregate(task, replies)


def _config(profile: str, K: int = 4, **kw: Any) -> tuple[JobConfig, list]:
    X, y, h = _data("regression", K=K)
    cfg = JobConfig(job_id="fed", task="regression", n_features=3, n_clients=K,
                    feature_bounds=((-5.0, 5.0),) * 3, target_bound=float(np.abs(y).max()),
                    n_estimators=2, max_depth=3, min_samples_leaf=3, max_features=2, n_bins=8,
                    profile=load_profile(profile, **kw).to_dict())
    return cfg, [(X[h == k], y[h == k]) for k in range(K)]


def test_secure_profile_sums_everything_through_secagg() -> None:
    cfg, clients = _config("secure")
    assert isinstance(make_aggregator(cfg), RingAggregator)
    ring = RingAggregator(cfg, record=True)
    rec = _Recorder(ring)
    rounds: list[RoundRecord] = []
    run_in_process(cfg, clients, aggregator=rec, on_round=rounds.append)
    K = cfg.n_clients
    # the first level in two rounds (totals, then its grid), every later level in one (the
    # grid rides on the routing round), the leaves' totals in one
    assert len(rounds) == len(rec.calls) >= cfg.max_depth + 2
    # nothing is disclosed in the clear, nothing is even asked for
    for r in rounds:
        assert r.disclosed == {}
        assert r.task.disclose == ()
    for _, replies in rec.calls:
        assert sorted(replies) == list(range(K))
        assert all(rep.disclosed == {} for rep in replies.values())
    # one masked upload per client per round, each as long as that round's vector (a grid's
    # cells packed one word each)
    uploads = [m for m in ring.transcript if isinstance(m, Upload)]
    assert len(uploads) == K * len(rounds)
    codecs = [make_codec(cfg, t) for t, _ in rec.calls]
    assert any(c.packing is not None for c in codecs)
    assert all(c.words < c.ring.size for c in codecs if c.packing is not None)
    sizes = [c.words for c in codecs]
    assert sorted(u.vector.size for u in uploads) == sorted(s for s in sizes for _ in range(K))
    assert ring._secagg is not None and ring._secagg.round_id == len(rounds)
    # what the server holds per round is the sum, and the uploads are not the encodings
    last_task, last_replies = rec.calls[-1]
    np.testing.assert_allclose(rounds[-1].total, sum(r.summable for r in last_replies.values()),
                               rtol=0, atol=1e-5)
    last_uploads = uploads[-K:]
    for up in last_uploads:
        assert not any(np.array_equal(up.vector, enc) for enc in ring.last_encoded.values())
    # the secure sketch asks statistics on grids (one round per level), no quantiles
    assert any(r.task.params.get("purpose") == "sketch" for r in rounds)
    assert any("grid_thresholds" in r.task.arrays for r in rounds)


def test_open_profile_discloses_sketches() -> None:
    cfg, clients = _config("open")
    assert isinstance(make_aggregator(cfg), PlainSum)
    rounds: list[RoundRecord] = []
    run_in_process(cfg, clients, on_round=rounds.append)
    sketch_rounds = [r for r in rounds if r.task.kind == TaskKind.SKETCH
                     and r.task.level < cfg.max_depth]
    assert sketch_rounds
    for r in sketch_rounds:
        assert "sketch_points" in r.task.disclose
        assert sorted(r.disclosed) == list(range(cfg.n_clients))
        for items in r.disclosed.values():
            assert {"sketch_points", "sketch_counts"} <= set(items)


def test_fixed_point_without_masking_matches_masked_round_by_round() -> None:
    cfg_s, clients = _config("secure")
    cfg_p, _ = _config("secure", secure_aggregation=False)
    totals: dict[str, list[np.ndarray]] = {"s": [], "p": []}
    run_in_process(cfg_s, clients, on_round=lambda r: totals["s"].append(r.total))
    run_in_process(cfg_p, clients, on_round=lambda r: totals["p"].append(r.total))
    assert len(totals["s"]) == len(totals["p"])
    for a, b in zip(totals["s"], totals["p"], strict=True):
        assert a.tobytes() == b.tobytes()



def test_a_secure_in_process_run_refuses_a_sum_no_honest_sites_can_make(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One site adds 2^63 to every masked word (the attack of a malicious site): the run
    stops at the first round with the out-of-range error instead of growing one-leaf trees
    with negative counts."""
    from fedforest_secure.errors import SumOutOfRange
    from fedforest_secure.secagg import client as secagg_client

    cfg, clients = _config("secure")
    honest_mask = secagg_client.SecAggClient.mask

    def poisoned_mask(self: Any, delivery: Any, vector: np.ndarray, **kw: Any) -> Any:
        header, masked = honest_mask(self, delivery, vector, **kw)
        if self.client_id == 1:
            masked += np.uint64(2**63)
        return header, masked

    monkeypatch.setattr(secagg_client.SecAggClient, "mask", poisoned_mask)
    rounds: list[RoundRecord] = []
    with pytest.raises(SumOutOfRange, match=r"outside what 4 sites' encodings can sum to "
                                            r"\(entry 0: value -9\.22"):
        run_in_process(cfg, clients, on_round=rounds.append)
    assert rounds == []  # the first round's sum was never handed on

def test_run_in_process_checks_client_count() -> None:
    cfg, clients = _config("open")
    with pytest.raises(ValueError):
        run_in_process(cfg, clients[:-1])


def test_abstentions_are_recorded_in_the_model() -> None:
    cfg, clients = _config("secure", abstain_below=5)
    model = run_in_process(cfg, clients)
    ab = model.meta["abstained"]
    assert set(ab) == {str(k) for k in range(cfg.n_clients)}
    # with 40 rows per client, depth-3 nodes of under 5 rows exist in some client
    assert sum(v for per in ab.values() for v in per.values()) > 0


@pytest.mark.parametrize("cls,task,profile", [
    (FedForestRegressor, "regression", "open"),
    (FedForestClassifier, "classification", "open"),
    (FedForestRegressor, "regression", "secure")])
def test_n_jobs_never_changes_the_forest(cls: Any, task: str, profile: str) -> None:
    X, y, h = _data(task, n=400)
    kw = dict(_SMALL, max_depth=5, profile=profile)
    ref = cls(n_jobs=1, **kw).fit(X, y, client=h)
    for n_jobs in (2, 3, -1):
        got = cls(n_jobs=n_jobs, **kw).fit(X, y, client=h)
        assert got.model_.to_json() == ref.model_.to_json()
    assert sum(t.n_nodes for t in ref.model_.trees) > 3 * 7  # the trees did grow


def test_n_jobs_with_a_round_hook_gives_the_same_rounds() -> None:
    X, y, h = _data("regression", n=300)
    seen: dict[int, list[bytes]] = {1: [], 2: []}
    models = {}
    for n_jobs in (1, 2):
        models[n_jobs] = FedForestRegressor(n_jobs=n_jobs, **_SMALL).fit(
            X, y, client=h, on_round=lambda r, n=n_jobs: seen[n].append(r.total.tobytes()))
    assert seen[1] == seen[2] and len(seen[1]) > 2
    assert models[1].model_.to_json() == models[2].model_.to_json()


def test_in_order_runs_calls_concurrently_and_yields_them_in_order() -> None:
    second_ran = threading.Event()

    def first() -> int:  # finishes only once the second call has run: they overlap
        if not second_ran.wait(10):
            raise TimeoutError("the calls did not run concurrently")
        return 0

    def second() -> int:
        second_ran.set()
        return 1

    with ThreadPoolExecutor(max_workers=2) as pool:
        assert list(_in_order([first, second], _Threads(pool, 2))) == [0, 1]
    assert list(_in_order([first, second], None)) == [0, 1]  # serial: the event is set


@pytest.mark.parametrize("bad", [0, 1.5, True, "2"])
def test_n_jobs_must_be_a_non_zero_integer(bad: Any) -> None:
    with pytest.raises(ValueError, match="n_jobs"):
        effective_n_jobs(bad)
    X, y, h = _data("regression")
    with pytest.raises(ValueError, match="n_jobs"):
        FedForestRegressor(n_jobs=bad, **_SMALL).fit(X, y, client=h)


def test_n_jobs_counts_like_scikit_learn() -> None:
    cpus = os.cpu_count() or 1
    assert effective_n_jobs(None) == 1
    assert effective_n_jobs(3) == 3
    assert effective_n_jobs(-1) == cpus
    assert effective_n_jobs(-2) == max(1, cpus - 1)


def test_a_profiles_min_clients_holds_without_secure_aggregation() -> None:
    """`load_profile("secure", secure_aggregation=False)` keeps min_clients = 3: a job of
    fewer clients would release sums over fewer, so it is refused before any round."""
    from fedforest_secure import FedForestRegressor
    from fedforest_secure.errors import ProfileError

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    y = X[:, 0]
    plain = load_profile("secure", secure_aggregation=False)
    for sites in (np.zeros(60), np.arange(60) % 2):
        with pytest.raises(ProfileError, match="refuses sums over fewer than 3 clients"):
            FedForestRegressor(n_estimators=1, profile=plain).fit(X, y, client=sites)
    with pytest.raises(ProfileError, match="fewer than 3 clients"):
        FedForestRegressor(n_estimators=1, profile=load_profile("open", min_clients=3)).fit(
            X, y, client=np.arange(60) % 2)
    FedForestRegressor(n_estimators=1, profile=plain).fit(X, y, client=np.arange(60) % 3)


def test_run_in_process_refuses_a_sites_value_outside_the_public_bounds() -> None:
    """Bounds narrower than a site's data are an error at that site, not bins the values are
    silently put into."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, size=(60, 2))
    y = (X[:, 0] > 0).astype(int)
    cfg = JobConfig(job_id="bounds", task="classification", n_features=2, n_clients=2,
                    n_classes=2, criterion="gini", n_estimators=2, max_depth=2, max_features=2,
                    feature_bounds=((-1.0, 1.0), (-1.0, 1.0)))
    run_in_process(cfg, [(X[:30], y[:30]), (X[30:], y[30:])])
    X[40, 0] = 1.5
    with pytest.raises(SchemaError, match=r"value 1.5 in row 11, column 0 is outside the job's "
                                          r"public bounds \[-1.0, 1.0\]"):
        run_in_process(cfg, [(X[:30], y[:30]), (X[30:], y[30:])])
