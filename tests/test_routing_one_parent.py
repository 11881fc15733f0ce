"""Every new node of a level has one parent: a site refuses a routing that gives two children
the same node id.

A malicious server that sends both children of every tree's root to node 0 puts a record's T
tree copies in one node: under ``secure-dp`` one record then moves one bin of each slot by T,
where the noise every site adds is calibrated for T bins moved by 1 (``privacy/sensitivity``:
a record sits in one node of each tree), so the released histogram carries sqrt(T) times too
little noise; the noisy per-site node summaries (``h_splits = "noisy"``) likewise. Both
children of one split given one id are refused too.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_adversarial_server import _secure_config, _workers

from fedforest_secure._layouts import hist_block
from fedforest_secure._tree import NodeKind
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import RefusedRequest
from fedforest_secure.privacy import load_profile
from fedforest_secure.privacy.sensitivity import histogram_sensitivity
from fedforest_secure.protocol import Task, TaskKind
from fedforest_secure.worker import Worker

T = 16
_REFUSED = "refusing a task whose routing sends the rows of two nodes .* to one new node"


def _routing(n: int, left: list[int], right: list[int]) -> dict[str, np.ndarray]:
    i32 = np.int32
    return {"route_kind": np.full(n, NodeKind.NUMERIC, dtype=i32),
            "route_feature": np.zeros(n, dtype=i32), "route_threshold": np.zeros(n),
            "route_left": np.array(left, dtype=i32), "route_right": np.array(right, dtype=i32),
            "route_set_ptr": np.zeros(n + 1, dtype=np.int64),
            "route_set_vals": np.zeros(0, dtype=i32)}


def test_a_dp_site_refuses_a_routing_that_merges_every_tree_into_one_node() -> None:
    cfg, clients = _secure_config("secure-dp")
    cfg = dataclasses.replace(cfg, n_estimators=T, row_sampling="all")
    X, y = clients[0]
    # the site with and without its record 0 (neighbouring tables)
    pair = [Worker(cfg, X, y, client_index=0, seed=1),
            Worker(cfg, X[1:], y[1:], client_index=0, seed=1)]
    ws = _workers(cfg, clients)
    coord = Coordinator(cfg)
    t0 = coord.next_task()
    assert t0 is not None
    for w in pair + ws:
        w.handle(t0)
    coord.submit(t0.round_id, np.zeros(0), participants=[0, 1, 2, 3])
    h0 = coord.next_task()
    assert h0 is not None and h0.kind is TaskKind.HISTOGRAM and h0.level == 0
    for w in pair:
        w.handle(h0)  # the planned level-0 release
    feats, thr = h0.arrays["features"][:1].copy(), h0.arrays["thresholds"][:1].copy()
    merge = Task(job_id=cfg.job_id, round_id=h0.round_id + 1, kind=TaskKind.SKETCH, level=1,
                 params={"n_nodes": 1, "totals": False},
                 arrays={**_routing(T, [0] * T, [0] * T), "features": feats}, layout=())
    m, W = thr.shape[1], thr.shape[2]
    hist = Task(job_id=cfg.job_id, round_id=h0.round_id + 2, kind=TaskKind.HISTOGRAM, level=1,
                params={"stats": "full"},
                arrays={"nodes": np.zeros(1, dtype=np.int64), "features": feats,
                        "thresholds": thr},
                layout=(hist_block(cfg, 1, m, W + 1),))
    for w in pair:
        with pytest.raises(RefusedRequest, match=_REFUSED) as caught:
            w.handle(merge)
        assert caught.value.code == "disclosure"
    # what following it would release: the record's T copies in one bin of each slot
    merged = [Worker(cfg, X, y, client_index=0, seed=1),
              Worker(cfg, X[1:], y[1:], client_index=0, seed=1)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("fedforest_secure._routing.check_one_parent", lambda *a: None)
        replies = []
        for w in merged:
            w.handle(t0)
            w.handle(h0)
            w.handle(merge)
            replies.append(w.handle(hist).summable)
    change = (replies[0] - replies[1]).reshape(1, m, W + 1, cfg.n_stats)[..., 0]
    calibrated = histogram_sensitivity("count", n_features=cfg.max_features, n_trees=T,
                                       max_multiplicity=1).l2
    assert np.linalg.norm(change) > 3 * calibrated  # sqrt(T) = 4 times, with the DP noise


def test_a_site_with_noisy_h_splits_refuses_to_summarise_a_node_merged_from_every_tree(
        ) -> None:
    cfg, clients = _secure_config("secure-dp")
    dp = {**cfg.profile["dp"], "h_epsilon": 1.0}
    cfg = dataclasses.replace(cfg, n_estimators=T, row_sampling="all",
                              profile=load_profile("secure-dp", h_splits="noisy",
                                                   dp=dp).to_dict())
    X, y = clients[0]
    w = Worker(cfg, X, y, client_index=0, seed=1)
    assert "node_stats" in w.allowed_disclosures()
    w.handle(Task(job_id=cfg.job_id, round_id=1, kind=TaskKind.SKETCH, level=0,
                  params={"n_nodes": T, "totals": False}, arrays={}, layout=()))
    merged = Task(job_id=cfg.job_id, round_id=2, kind=TaskKind.SKETCH, level=1,
                  params={"n_nodes": 1, "totals": False},
                  arrays=_routing(T, [0] * T, [0] * T), layout=(), disclose=("node_stats",))
    with pytest.raises(RefusedRequest, match=_REFUSED):
        w.handle(merged)


def test_a_site_refuses_a_routing_that_gives_both_sides_of_a_split_one_node() -> None:
    cfg, clients = _secure_config("secure")
    cfg = dataclasses.replace(cfg, n_estimators=2)
    X, y = clients[0]
    w = Worker(cfg, X, y, client_index=0, seed=1)
    w.handle(Task(job_id=cfg.job_id, round_id=1, kind=TaskKind.SKETCH, level=0,
                  params={"n_nodes": 2, "totals": False}, arrays={}, layout=()))
    # tree 0's root: both sides node 0 (its rows again); tree 1's root split honestly
    again = Task(job_id=cfg.job_id, round_id=2, kind=TaskKind.SKETCH, level=1,
                 params={"n_nodes": 3, "totals": True},
                 arrays=_routing(2, [0, 1], [0, 2]), layout=())
    with pytest.raises(RefusedRequest, match=_REFUSED):
        w.handle(again)


def test_a_sketch_of_another_number_of_points_is_refused_before_its_routing_is_followed(
        ) -> None:
    """The site stays at its level: the honest task of the next level is answered as if the
    refused one had never come."""
    cfg, clients = _secure_config("secure", sketch="quantiles")
    ws = _workers(cfg, clients)

    def level_1(workers: list[Worker]) -> Task:
        coord = Coordinator(cfg)
        task = coord.next_task()
        while task is not None and task.level == 0:
            rep = [w.handle(task) for w in workers]
            coord.submit(task.round_id, sum(r.summable for r in rep),
                         disclosed={k: r.disclosed for k, r in enumerate(rep)},
                         participants=list(range(len(workers))))
            task = coord.next_task()
        assert task is not None and task.level == 1 and "route_kind" in task.arrays
        return task

    honest = level_1(ws)
    assert "sketch_points" in honest.disclose
    # another number of points, and its own routing (thresholds moved)
    odd = dataclasses.replace(honest, round_id=honest.round_id + 100,
                              params={**honest.params, "n_points": cfg.n_bins + 1},
                              arrays={**honest.arrays, "route_threshold":
                                      honest.arrays["route_threshold"] + 0.5})
    with pytest.raises(RefusedRequest, match="a sketch of 9 intervals was asked") as caught:
        ws[0].handle(odd)
    assert caught.value.code == "disclosure"
    fresh = _workers(cfg, clients)  # never sent the refused task
    assert level_1(fresh).digest() == honest.digest()
    mine, theirs = ws[0].handle(honest), fresh[0].handle(honest)
    assert np.array_equal(mine.summable, theirs.summable)
    assert np.array_equal(mine.disclosed["sketch_points"], theirs.disclosed["sketch_points"],
                          equal_nan=True)
