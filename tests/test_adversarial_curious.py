"""An honest-but-curious server recording a whole in-process training.

Everything the server side receives under a secure profile is in
:attr:`RingAggregator.transcript` (masked uploads, adverts, encrypted shares, unmask shares) and
in the :class:`~fedforest_secure.federation.RoundRecord` of each round (task, released total,
disclosures). These tests check that none of it is a per-client plaintext statistic, that every
per-client contribution to a released node total comes from at least ``abstain_below`` rows,
and that under ``secure-dp`` every released sum carries noise within the budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedforest_secure import load_profile
from fedforest_secure.config import JobConfig
from fedforest_secure.federation import RoundRecord, run_in_process
from fedforest_secure.protocol import Reply, Task, split_blocks
from fedforest_secure.secagg import (
    KeyAdvert,
    ShareBundle,
    SurvivorSignature,
    UnmaskResponse,
    Upload,
)
from fedforest_secure.secure_sum import RingAggregator, make_codec

K = 4


def _setup(profile: str, **kw: Any) -> tuple[JobConfig, list[tuple[np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(11)
    n = 200
    X = rng.uniform(-3, 3, size=(n, 3))
    h = np.arange(n) % K
    y = X[:, 0] + np.sin(X[:, 1]) + 0.2 * rng.normal(size=n) + 0.3 * h
    bound = float(np.ceil(np.abs(y).max()))
    cfg = JobConfig(job_id="curious", task="regression", n_features=3, n_clients=K,
                    feature_bounds=((-3.0, 3.0),) * 3, target_bound=bound,
                    n_estimators=2, max_depth=3, min_samples_leaf=3, max_features=2, n_bins=8,
                    profile=load_profile(profile, **kw).to_dict())
    return cfg, [(X[h == k], y[h == k]) for k in range(K)]


class Spy:
    """Wraps the aggregator; keeps each round's plaintext replies and their ring encodings."""

    def __init__(self, inner: RingAggregator) -> None:
        self.inner = inner
        self.rounds: list[tuple[Task, dict[int, Reply], dict[int, np.ndarray]]] = []

    def aggregate(self, task: Task, replies: Mapping[int, Reply]) -> np.ndarray:
        total = self.inner.aggregate(task, replies)
        self.rounds.append((task, dict(replies), {k: v.copy() for k, v in
                                                  self.inner.last_encoded.items()}))
        return total


def _train(profile: str, **kw: Any) -> tuple[JobConfig, Spy, list[RoundRecord]]:
    cfg, clients = _setup(profile, **kw)
    spy = Spy(RingAggregator(cfg, record=True))
    records: list[RoundRecord] = []
    run_in_process(cfg, clients, aggregator=spy, on_round=records.append)
    return cfg, spy, records


def test_curious_server_never_holds_a_per_client_plaintext_statistic() -> None:
    cfg, spy, records = _train("secure")
    assert load_profile("secure").disclosures == []
    assert len(records) == len(spy.rounds) >= cfg.max_depth + 2  # one round per level on
    for rec in records:  # nothing asked for in the clear, nothing disclosed
        assert rec.task.disclose == () and rec.disclosed == {}
    transcript = spy.inner.transcript
    uploads = [m for m in transcript if isinstance(m, Upload)]
    assert len(uploads) == K * len(records)
    assert {type(m) for m in transcript} <= {Upload, KeyAdvert, ShareBundle, SurvivorSignature,
                                             UnmaskResponse}
    checked = 0
    for (task, replies, encoded), rec in zip(spy.rounds, records, strict=True):
        ups = uploads[:K]
        uploads = uploads[K:]
        assert {u.header.sender for u in ups} == set(range(K))
        for up in ups:
            for k, enc in encoded.items():
                # no upload equals, or even agrees entry-wise with, any client's encoding
                assert np.count_nonzero(up.vector == enc) == 0, (task.round_id, k)
                plain = replies[k].summable
                assert not np.array_equal(up.vector.astype(np.float64), plain)
            checked += up.vector.size
        # what the server gets out of the round is the sum, to the codec's resolution
        size = make_codec(cfg, task).ring.size
        want = sum((r.summable for r in replies.values()), np.zeros(size))
        np.testing.assert_allclose(rec.total, want, rtol=0, atol=1e-5)
    assert checked > 1000


def test_every_client_share_of_a_released_node_total_comes_from_m_rows_or_more() -> None:
    cfg, spy, _ = _train("secure", abstain_below=5)
    m = int(cfg.profile["abstain_below"])
    assert m == 5
    seen_small = 0
    for task, replies, _ in spy.rounds:
        if not any(b.name == "totals" for b in task.layout):
            continue
        for rep in replies.values():
            counts = split_blocks(rep.summable, task.layout)["totals"][:, 0]
            assert ((counts == 0) | (counts >= m)).all(), (task.round_id, counts)
        seen_small += 1
    assert seen_small >= cfg.max_depth  # every level released node totals


def test_secure_dp_noises_every_released_sum_within_the_budget() -> None:
    cfg, spy, records = _train("secure-dp", epsilon=4.0)
    released = [(t, reps, enc) for t, reps, enc in spy.rounds if t.layout]
    assert released
    for task, replies, encoded in released:
        sigma = task.params["dp"]["sigma"]
        assert sigma and min(float(s) for s in sigma.values()) > 0
        codec = make_codec(cfg, task)
        for k, rep in replies.items():  # each client's encoding already carries its noise share
            assert not np.array_equal(encoded[k], codec.encode(rep.summable))
    for rec in records:
        assert rec.disclosed == {} and rec.task.disclose == ()
    from fedforest_secure.privacy import ZCdp, epsilon_of

    # the releases compose (Rényi DP, one conversion) to at most the budget
    costs = [ZCdp(float(t.params["dp"]["rho"]), float(t.params["dp"]["xi"]))
             for t, _, _ in released]
    assert epsilon_of(costs, 1e-6) <= 4.0 * (1 + 1e-9)
    assert float(released[-1][0].params["dp"]["total_epsilon"]) <= 4.0 * (1 + 1e-9)
