"""A site follows a split on the client indicator H (``NodeKind.CLIENT``) only where its own
profile allows H-splits (``h_splits`` "clear" or "noisy") and the job splits on the client.

A malicious server that routes one site's rows to a node of their own (site 3 left, every other
site right) reads that site's exact node totals, and then its histograms, from the secure sum
over all sites: no colluder, no dropout, real masks. Every site refuses such a task
(``RefusedRequest``, code ``"disclosure"``); an honest job with H-splits allowed grows the same
forest as a site that followed every routing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from test_adversarial_server import JOB, _workers
from test_adversarial_server import _secure_config as _config

from fedforest_secure import FedForestRegressor, _routing, load_profile
from fedforest_secure._layouts import totals_block
from fedforest_secure._tree import NodeKind
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import RefusedRequest
from fedforest_secure.protocol import Task, TaskKind, question_key
from fedforest_secure.secagg import InProcessSecureSum
from fedforest_secure.secure_sum import encode_contribution, make_codec
from fedforest_secure.worker import Worker

K = 4
VICTIM = 3


def _h_split_task(cfg: JobConfig, round_id: int, totals: bool = True) -> Task:
    """Level 1 of a server that splits every root on H: the victim's rows left (node 2t),
    every other site's right (2t + 1), asking the new nodes' totals (or, as a DP plan's
    routing round, nothing: the level's histograms follow)."""
    T = cfg.n_estimators
    i32 = np.int32
    route = {
        "route_kind": np.full(T, NodeKind.CLIENT, dtype=i32),
        "route_feature": np.full(T, -1, dtype=i32),
        "route_threshold": np.zeros(T),
        "route_left": (2 * np.arange(T)).astype(i32),
        "route_right": (2 * np.arange(T) + 1).astype(i32),
        "route_set_ptr": np.arange(T + 1, dtype=np.int64),
        "route_set_vals": np.full(T, VICTIM, dtype=i32),
    }
    return Task(job_id=JOB, round_id=round_id, kind=TaskKind.SKETCH, level=1,
                params={"n_nodes": 2 * T, "totals": totals}, arrays=route,
                layout=(totals_block(cfg, 2 * T),) if totals else ())


@pytest.mark.parametrize(("profile", "kw"), [("secure", {}), ("secure", {"abstain_below": 2}),
                                             ("secure-dp", {})])
def test_a_secure_site_refuses_a_routing_on_the_site_indicator_so_no_sum_isolates_a_site(
        profile: str, kw: dict[str, Any]) -> None:
    cfg, clients = _config(profile, **kw)
    assert cfg.profile["h_splits"] == "off" and not cfg.split_on_client
    ws = _workers(cfg, clients)
    agg = InProcessSecureSum(range(K), threshold=0.67, job_id=JOB)
    first = Coordinator(cfg).next_task()  # the honest level-0 sketch
    assert first is not None and first.kind is TaskKind.SKETCH and first.level == 0
    replies = {k: w.handle(first) for k, w in enumerate(ws)}
    # a DP plan releases no level's totals in a sketch round (it would refuse that first)
    evil = _h_split_task(cfg, first.round_id + 1, totals=cfg.dp is None)
    answered = {}
    for k, w in enumerate(ws):
        try:
            answered[k] = w.handle(evil)
        except RefusedRequest as exc:
            assert exc.code == "disclosure"
            assert str(exc) == (
                "refusing a task that routes rows by the site indicator H (a split on the "
                "client): it can put one site's rows alone in a node, whose sum over all sites "
                "is then that site's own statistics. This site's privacy profile "
                f"{cfg.profile['name']!r} has h_splits='off', so this site follows no "
                "H-splits, and an honest server sends none in this job (nothing to change on "
                "this site)")
    if len(answered) == K and cfg.dp is None:  # the attack: every site's masked reply, summed
        enc = {k: encode_contribution(cfg, evil, r) for k, r in answered.items()}
        agg.round_id = evil.round_id
        total = make_codec(cfg, evil).decode(agg.sum(question_key(evil), evil.digest(), enc))
        left = total.reshape(2 * cfg.n_estimators, cfg.n_stats)[0::2]
        victim = replies[VICTIM].summable.reshape(cfg.n_estimators, cfg.n_stats)
        np.testing.assert_allclose(left, victim, atol=1e-5)  # what the server reads
    assert answered == {}, "the sites followed a routing on H: the sum of each left node " \
                           "over all sites is site 3's own node totals"


def _honest_rounds_until_level_1(cfg: JobConfig, ws: list[Worker]) -> Task:
    """Answer the honest rounds of level 0; the honest level-1 sketch (routing) task."""
    coord = Coordinator(cfg)
    task = coord.next_task()
    while task is not None and task.level == 0:
        rep = [w.handle(task) for w in ws]
        coord.submit(task.round_id, sum(r.summable for r in rep), participants=list(range(K)))
        task = coord.next_task()
    assert task is not None and task.kind is TaskKind.SKETCH and task.level == 1
    return task


def test_a_refused_routing_leaves_the_site_at_its_level_to_answer_the_honest_one() -> None:
    cfg, clients = _config("secure")
    ws = _workers(cfg, clients)
    honest = _honest_rounds_until_level_1(cfg, ws)
    with pytest.raises(RefusedRequest):
        ws[0].handle(_h_split_task(cfg, honest.round_id))
    fresh = _workers(cfg, clients)  # never sent the H routing
    assert _honest_rounds_until_level_1(cfg, fresh).digest() == honest.digest()
    np.testing.assert_array_equal(ws[0].handle(honest).summable,
                                  fresh[0].handle(honest).summable)


def test_a_site_whose_profile_allows_h_splits_refuses_them_in_a_job_without_them() -> None:
    cfg, clients = _config("open")
    assert cfg.profile["h_splits"] == "clear" and not cfg.split_on_client
    w = _workers(cfg, clients)[0]
    first = Coordinator(cfg).next_task()
    assert first is not None
    w.handle(first)
    with pytest.raises(RefusedRequest, match=r"\. The job was created with "
                                             r"split_on_client=false, so this site follows no "
                                             r"H-splits") as info:
        w.handle(_h_split_task(cfg, first.round_id + 1))
    assert info.value.code == "disclosure"


@pytest.mark.parametrize("profile", [load_profile("open"),
                                     load_profile("secure", h_splits="clear")])
def test_an_honest_job_with_h_splits_allowed_grows_the_forest_of_a_site_following_every_route(
        profile: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    n = 300
    h = np.repeat(np.arange(3), n // 3)
    X = rng.normal(size=(n, 2))
    y = 0.3 * X[:, 0] + 10.0 * h + 0.1 * rng.normal(size=n)  # the client shift dominates

    def fit() -> Any:
        return FedForestRegressor(n_estimators=3, max_depth=3, min_samples_leaf=5,
                                  max_features=None, split_on_client=True, n_bins=8,
                                  profile=profile, random_state=0).fit(X, y, client=h).model_

    checked = fit()
    assert checked.uses_client and all(int(t.kind[0]) == NodeKind.CLIENT for t in checked.trees)
    monkeypatch.setattr(_routing, "check_client_splits", lambda *a, **k: None)
    unchecked = fit()
    assert len(checked.trees) == len(unchecked.trees)
    for a, b in zip(checked.trees, unchecked.trees, strict=True):
        for f in dataclasses.fields(a):
            va, vb = getattr(a, f.name), getattr(b, f.name)
            if isinstance(va, np.ndarray):
                np.testing.assert_array_equal(va, vb)
            else:
                assert va == vb
