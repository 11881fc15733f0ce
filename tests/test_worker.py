"""Tests for fedforest_secure.worker: routing, histograms, abstention, adaptive B, bad tasks."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pytest

import fedforest_secure.worker as worker_mod
from fedforest_secure import _kernels, _level_stats
from fedforest_secure._bootstrap import canonical_order, row_keys, tree_pairs
from fedforest_secure._tree import NodeKind
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import ProtocolError, SchemaError
from fedforest_secure.federation import client_seed
from fedforest_secure.privacy import load_profile
from fedforest_secure.protocol import Block, Reply, StatKind, Task, TaskKind
from fedforest_secure.worker import Worker

REG = (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)


def _cfg(**kw: Any) -> JobConfig:
    base: dict[str, Any] = dict(job_id="job", task="regression", n_features=3, n_clients=3,
                                n_estimators=4, max_features=3, n_bins=8, bootstrap=True)
    base.update(kw)
    return JobConfig(**base)


def _sketch_task(rid: int, level: int, n_nodes: int, S: int = 3, *, feats: Any = None,
                 routing: dict[str, np.ndarray] | None = None, job: str = "job",
                 disclose: tuple[str, ...] = (), n_points: int = 8,
                 regression: bool = True) -> Task:
    arrays = dict(routing or {})
    if feats is not None:
        arrays["features"] = np.asarray(feats, dtype=np.int64)
    return Task(job_id=job, round_id=rid, kind=TaskKind.SKETCH, level=level,
                params={"n_nodes": n_nodes, **(
                    {"n_points": n_points} if {"sketch_points", "top_l"} & set(disclose)
                    else {})}, arrays=arrays,
                layout=(Block("totals", (n_nodes, S),
                              REG if regression and S == 3 else (StatKind.COUNT,) * S),),
                disclose=disclose)


def _hist_task(rid: int, level: int, nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray,
               S: int = 3, mode: str = "full", regression: bool = True) -> Task:
    E, m, bt = thr.shape
    width = {"full": S, "moments": S, "count": 1, "gain": 2}[mode]
    # the kinds the worker computes: (n, sum y, sum y^2) or (n, sum y) for regression (S = 3,
    # or 2 in moments mode), class counts otherwise (the worker refuses other kinds)
    kinds = {"count": (StatKind.COUNT,), "gain": (StatKind.GAIN, StatKind.COUNT)}.get(
        mode, REG[:width] if regression and (width, mode) in ((3, "full"), (2, "moments")) else
        (StatKind.COUNT,) * width)
    return Task(job_id="job", round_id=rid, kind=TaskKind.HISTOGRAM, level=level,
                params={"stats": mode},
                arrays={"nodes": np.asarray(nodes, dtype=np.int64),
                        "features": np.asarray(feats, dtype=np.int64), "thresholds": thr},
                layout=(Block("h", (E, m, bt + (mode != "gain"), width), kinds),))


def _multiplicities(cfg: JobConfig, X: np.ndarray, y: np.ndarray, seed: int) -> np.ndarray:
    """Bootstrap multiplicities (T, n) of a worker built on ``(X, y)`` with ``seed``: the draws
    go to the rows in their canonical (content) order."""
    rows, trees, w = tree_pairs(cfg, X.shape[0], np.random.default_rng(seed),
                                order=canonical_order(X, y))
    out = np.zeros((cfg.n_estimators, X.shape[0]))
    out[trees, rows] = w
    return out


def _random_routing(rng: np.random.Generator, T: int, cfg: JobConfig, X: np.ndarray
                    ) -> tuple[dict[str, np.ndarray], int, list[tuple]]:
    nk = NodeKind
    kinds = np.array([nk.NUMERIC, nk.CATEGORICAL, nk.CLIENT, nk.LEAF] * T)[:T]
    rng.shuffle(kinds)
    feat = np.full(T, -1, dtype=np.int32)
    thr = np.zeros(T)
    left = np.full(T, -1, dtype=np.int32)
    right = np.full(T, -1, dtype=np.int32)
    sets: list[list[int]] = []
    desc: list[tuple] = []
    nxt = 0
    for t, k in enumerate(kinds):
        s: list[int] = []
        if k == NodeKind.NUMERIC:
            feat[t] = rng.choice([0, 2])
            thr[t] = float(rng.choice(X[:, feat[t]]))  # on a data value: tests x <= t exactly
        elif k == NodeKind.CATEGORICAL:
            feat[t] = 1
            s = sorted(rng.choice(4, size=2, replace=False).tolist())
        elif k == NodeKind.CLIENT:
            s = [0, 2] if t % 2 else [1]
        if k != NodeKind.LEAF:
            left[t], right[t] = nxt, nxt + 1
            nxt += 2
        sets.append(s)
        desc.append((int(k), int(feat[t]), float(thr[t]), int(left[t]), int(right[t]), set(s)))
    ptr = np.concatenate([[0], np.cumsum([len(s) for s in sets])]).astype(np.int64)
    vals = np.array([v for s in sets for v in s], dtype=np.int32)
    routing = {"route_kind": kinds.astype(np.int32), "route_feature": feat,
               "route_threshold": thr, "route_left": left, "route_right": right,
               "route_set_ptr": ptr, "route_set_vals": vals}
    return routing, nxt, desc


@pytest.mark.parametrize("client_index", [0, 1, 2])
def test_routing_matches_per_row_reference(client_index: int) -> None:
    rng = np.random.default_rng(client_index)
    T, n = 12, 80
    # the routing splits on the client too: a job with H-splits, which the profile allows
    cfg = _cfg(n_estimators=T, feature_kinds=("continuous", "categorical", "continuous"),
               n_levels=(0, 4, 0), split_on_client=True, profile=load_profile("open").to_dict())
    X = np.column_stack([rng.normal(size=n).round(1), rng.integers(0, 4, n), rng.random(n)])
    y = rng.normal(size=n)
    w = Worker(cfg, X, y, client_index=client_index, seed=99)
    w.handle(_sketch_task(1, 0, T))
    routing, n_children, desc = _random_routing(rng, T, cfg, X)
    rep = w.handle(_sketch_task(2, 1, n_children, routing=routing))
    got = rep.summable.reshape(n_children, 3)
    mult = _multiplicities(cfg, X, y, 99)
    ref = np.zeros((n_children, 3))
    for t, (k, f, th, lc, rc, s) in enumerate(desc):
        for i in range(n):
            if k == NodeKind.LEAF or mult[t, i] == 0:
                continue
            if k == NodeKind.NUMERIC:
                go_left = X[i, f] <= th
            elif k == NodeKind.CATEGORICAL:
                go_left = int(X[i, f]) in s
            else:
                go_left = client_index in s
            c = lc if go_left else rc
            ref[c] += mult[t, i] * np.array([1.0, y[i], y[i] ** 2])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    assert got[:, 0].sum() > 0


def test_histogram_matches_brute_force() -> None:
    rng = np.random.default_rng(4)
    n, T, d = 90, 3, 3
    cfg = _cfg(n_estimators=T)
    X = rng.normal(size=(n, d)).round(1)  # ties and thresholds that hit data values
    y = rng.normal(size=n)
    w = Worker(cfg, X, y, client_index=0, seed=5)
    feats = np.array([[0, 1, 2], [2, 0, 1], [1, 2, 0]])
    w.handle(_sketch_task(1, 0, T, feats=feats))
    mult = _multiplicities(cfg, X, y, 5)
    nodes = np.array([0, 2])
    bt = 7
    thr = np.full((2, d, bt), np.inf)
    for e in range(2):
        for s in range(d):
            k = int(rng.integers(1, bt + 1))
            cand = np.concatenate([rng.choice(X[:, feats[nodes[e], s]], 2), rng.normal(size=k)])
            thr[e, s, :k] = np.sort(cand)[:k]
    thr[1, 1, 2] = thr[1, 1, 1]  # a repeated threshold: an empty bin between them
    rep = w.handle(_hist_task(2, 0, nodes, feats[nodes], thr))
    got = rep.summable.reshape(2, d, bt + 1, 3)
    ref = np.zeros_like(got)
    for e, nd in enumerate(nodes):
        for s in range(d):
            f = feats[nd, s]
            for i in range(n):
                b = int(np.searchsorted(thr[e, s], X[i, f], side="left"))  # t_{b-1} < x <= t_b
                ref[e, s, b] += mult[nd, i] * np.array([1.0, y[i], y[i] ** 2])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-10)
    # count mode gives the same bins (a second worker of the same rows and seed: a worker
    # releases a histogram slot once, in one statistics mode)
    w = Worker(cfg, X, y, client_index=0, seed=5)
    w.handle(_sketch_task(1, 0, T, feats=feats))
    rep_c = w.handle(_hist_task(3, 0, nodes, feats[nodes], thr, mode="count"))
    np.testing.assert_allclose(rep_c.summable.reshape(2, d, bt + 1), ref[..., 0])


def test_histogram_classification_counts() -> None:
    rng = np.random.default_rng(6)
    n, C = 50, 3
    cfg = _cfg(task="classification", n_classes=C, criterion="gini", n_estimators=1,
               bootstrap=False)
    X = rng.normal(size=(n, 3))
    y = rng.integers(0, C, n)
    w = Worker(cfg, X, y, client_index=1, seed=0)
    feats = np.array([[0, 1, 2]])
    w.handle(_sketch_task(1, 0, 1, S=C, feats=feats, regression=False))
    thr = np.sort(rng.normal(size=(1, 3, 4)), axis=2)
    got = w.handle(_hist_task(2, 0, np.array([0]), feats, thr, S=C,
                              regression=False)).summable.reshape(1, 3, 5, C)
    for s in range(3):
        b = np.searchsorted(thr[0, s], X[:, s], side="left")
        ref = np.zeros((5, C))
        np.add.at(ref, (b, y), 1.0)
        np.testing.assert_array_equal(got[0, s], ref)


def test_abstention_counts_distinct_rows_not_bootstrap_repeats() -> None:
    """A record drawn many times by the bootstrap is still one row: 3 distinct rows with
    multiplicities 5, 1, 1 abstain under abstain_below=4 (their weighted count is 7)."""
    prof = load_profile("open", abstain_below=4).to_dict()
    cfg = _cfg(n_estimators=1, bootstrap=False, profile=prof)
    X = np.column_stack([np.arange(3.0), np.zeros(3), np.zeros(3)])
    w = Worker(cfg, X, np.arange(3.0), client_index=0, seed=0)
    w._p_w = np.array([5, 1, 1], dtype=w._p_w.dtype)  # as if the bootstrap drew row 0 five times
    rep = w.handle(_sketch_task(1, 0, 1))
    np.testing.assert_array_equal(rep.summable, np.zeros(3))
    assert w.abstained[0] == 1
    cfg3 = dataclasses.replace(cfg, profile=load_profile("open", abstain_below=3).to_dict())
    w2 = Worker(cfg3, X, np.arange(3.0), client_index=0, seed=0)
    w2._p_w = np.array([5, 1, 1], dtype=w2._p_w.dtype)
    rep2 = w2.handle(_sketch_task(1, 0, 1))
    np.testing.assert_array_equal(rep2.summable, [7.0, 5 * 0 + 1 + 2, 1 + 4])
    assert w2.abstained[0] == 0


def test_abstention_zeroes_small_nodes_and_counts_them() -> None:
    prof = load_profile("open", abstain_below=5).to_dict()
    T = 3
    cfg = _cfg(n_estimators=T, bootstrap=False, profile=prof)
    X = np.column_stack([np.arange(10.0), np.zeros(10), np.zeros(10)])
    y = np.arange(10.0)
    w = Worker(cfg, X, y, client_index=0, seed=0)
    rep0 = w.handle(_sketch_task(1, 0, T))
    np.testing.assert_array_equal(rep0.summable.reshape(T, 3)[:, 0], [10, 10, 10])
    assert w.abstained[0] == 0
    # tree 0: 3 rows left (abstain), 7 right; tree 1: 5 / 5 (both kept); tree 2: leaf
    num, leaf = NodeKind.NUMERIC, NodeKind.LEAF
    routing = {"route_kind": np.array([num, num, leaf], dtype=np.int32),
               "route_feature": np.array([0, 0, -1], dtype=np.int32),
               "route_threshold": np.array([2.0, 4.0, 0.0]),
               "route_left": np.array([0, 2, -1], dtype=np.int32),
               "route_right": np.array([1, 3, -1], dtype=np.int32),
               "route_set_ptr": np.zeros(4, dtype=np.int64),
               "route_set_vals": np.zeros(0, dtype=np.int32)}
    feats = np.tile(np.arange(3), (4, 1))  # feature 0 in slot 0
    rep = w.handle(_sketch_task(2, 1, 4, routing=routing, feats=feats))
    tot = rep.summable.reshape(4, 3)
    np.testing.assert_array_equal(tot[:, 0], [0, 7, 5, 5])
    np.testing.assert_allclose(tot[1], [7, sum(range(3, 10)), sum(v * v for v in range(3, 10))])
    assert w.abstained[1] == 1
    # abstained rows are gone from later statistics of the level too
    thr = np.full((4, 3, 1), 100.0)
    h = w.handle(_hist_task(3, 1, np.arange(4), feats, thr))
    np.testing.assert_array_equal(h.summable.reshape(4, 3, 2, 3)[:, 0, 0, 0], [0, 7, 5, 5])
    # without the rule the small node is reported
    w2 = Worker(_cfg(n_estimators=T, bootstrap=False), X, y, client_index=0, seed=0)
    w2.handle(_sketch_task(1, 0, T))
    tot2 = w2.handle(_sketch_task(2, 1, 4, routing=routing)).summable.reshape(4, 3)
    np.testing.assert_array_equal(tot2[:, 0], [3, 7, 5, 5])
    assert w2.abstained == {}


def test_sketch_disclosures_are_only_what_was_asked() -> None:
    rng = np.random.default_rng(0)
    # an open profile that discloses node summaries (left out, h_splits is "off")
    cfg = _cfg(n_estimators=2, profile={"h_splits": "clear"})
    w = Worker(cfg, rng.normal(size=(30, 3)), rng.normal(size=30), client_index=0, seed=0)
    rep = w.handle(_sketch_task(1, 0, 2, feats=[[0, 1, 2], [2, 1, 0]]))
    assert rep.disclosed == {}
    w2 = Worker(cfg, rng.normal(size=(30, 3)), rng.normal(size=30), client_index=0, seed=0)
    rep2 = w2.handle(_sketch_task(1, 0, 2, feats=[[0, 1, 2], [2, 1, 0]],
                                  disclose=("sketch_points", "node_stats")))
    assert set(rep2.disclosed) == {"sketch_points", "sketch_counts", "node_stats"}
    np.testing.assert_array_equal(rep2.disclosed["node_stats"].ravel(), rep2.summable)


# ---------------------------------------------------------------------------- bad tasks
def _ready_worker() -> tuple[Worker, np.ndarray]:
    rng = np.random.default_rng(1)
    cfg = _cfg(n_estimators=2)
    w = Worker(cfg, rng.normal(size=(40, 3)), rng.normal(size=40), client_index=0, seed=0)
    feats = np.array([[0, 1, 2], [1, 2, 0]])
    w.handle(_sketch_task(5, 0, 2, feats=feats))
    return w, feats


def test_bad_tasks_raise_protocol_error() -> None:
    w, feats = _ready_worker()
    good_thr = np.sort(np.random.default_rng(0).normal(size=(2, 3, 4)), axis=2)
    with pytest.raises(ProtocolError):  # another job
        w.handle(_sketch_task(6, 0, 2, job="other"))
    with pytest.raises(ProtocolError):  # stale round
        w.handle(_hist_task(4, 0, np.arange(2), feats, good_thr))
    with pytest.raises(ProtocolError):  # level skipped
        w.handle(_sketch_task(6, 2, 2))
    with pytest.raises(ProtocolError):  # histogram for another level
        w.handle(_hist_task(6, 1, np.arange(2), feats, good_thr))
    with pytest.raises(ProtocolError):  # unsorted thresholds
        w.handle(_hist_task(6, 0, np.arange(2), feats, good_thr[:, :, ::-1].copy()))
    bad_nan = good_thr.copy()
    bad_nan[0, 0, 0] = np.nan
    with pytest.raises(ProtocolError):
        w.handle(_hist_task(6, 0, np.arange(2), feats, bad_nan))
    with pytest.raises(ProtocolError):  # thresholds for the wrong number of slots
        w.handle(_hist_task(6, 0, np.arange(2), feats, good_thr[:, :2]))
    with pytest.raises(ProtocolError):  # node out of range
        w.handle(_hist_task(6, 0, np.array([0, 2]), feats, good_thr))
    with pytest.raises(ProtocolError):  # nodes not increasing
        w.handle(_hist_task(6, 0, np.array([1, 0]), feats[::-1], good_thr))
    with pytest.raises(ProtocolError):  # features differ from the level's sketch
        w.handle(_hist_task(6, 0, np.arange(2), feats[::-1].copy(), good_thr))
    with pytest.raises(ProtocolError):  # feature index out of range
        w.handle(_hist_task(6, 0, np.arange(2), feats + 3, good_thr))
    with pytest.raises(ProtocolError):  # statistics mode unknown
        t = _hist_task(6, 0, np.arange(2), feats, good_thr)
        t.params["stats"] = "secret"
        w.handle(t)
    with pytest.raises(ProtocolError):  # level-0 task carrying routing
        w.handle(_sketch_task(6, 0, 2, routing={"route_kind": np.zeros(2, dtype=np.int32)}))
    with pytest.raises(ProtocolError):  # routing for the wrong number of nodes
        w.handle(_sketch_task(6, 1, 2, routing=_leaf_routing(3)))
    # after all that, the worker still answers the next round like a fresh one
    fresh, _ = _ready_worker()
    a = w.handle(_hist_task(6, 0, np.arange(2), feats, good_thr))
    b = fresh.handle(_hist_task(6, 0, np.arange(2), feats, good_thr))
    np.testing.assert_array_equal(a.summable, b.summable)


def _leaf_routing(n: int, split_first: bool = False) -> dict[str, np.ndarray]:
    kind = np.full(n, NodeKind.LEAF, dtype=np.int32)
    left = np.full(n, -1, dtype=np.int32)
    right = np.full(n, -1, dtype=np.int32)
    if split_first:
        kind[0], left[0], right[0] = NodeKind.NUMERIC, 0, 1
    return {"route_kind": kind, "route_feature": np.zeros(n, dtype=np.int32),
            "route_threshold": np.zeros(n), "route_left": left, "route_right": right,
            "route_set_ptr": np.zeros(n + 1, dtype=np.int64),
            "route_set_vals": np.zeros(0, dtype=np.int32)}


def test_a_sketch_task_of_more_nodes_than_its_level_can_have_is_refused_before_it_is_sized(
        ) -> None:
    """The client sizes its node totals (and its upload) by a sketch task's ``n_nodes``: at
    level 0 it is at most the job's trees, at a routed level two children per split node. A
    task asking more is refused, and the client stays at its level."""
    rng = np.random.default_rng(1)
    w = Worker(_cfg(n_estimators=2), rng.normal(size=(40, 3)), rng.normal(size=40),
               client_index=0, seed=0)
    with pytest.raises(ProtocolError) as err:
        w.handle(_sketch_task(5, 0, 1000))
    assert str(err.value) == ("the sketch task of level 0 gives n_nodes 1000; the level has at "
                              "most 2 nodes (the job's trees at level 0, else two children per "
                              "node its routing splits)")
    w.handle(_sketch_task(5, 0, 2))
    routing = _leaf_routing(2, split_first=True)  # root 0 splits, root 1 is a leaf
    with pytest.raises(ProtocolError, match=r"^the sketch task of level 1 gives n_nodes 3; the "
                       r"level has at most 2 nodes "):
        w.handle(_sketch_task(6, 1, 3, routing=routing))
    reply = w.handle(_sketch_task(6, 1, 2, routing=routing))
    assert reply.summable.shape == (2 * 3,)


def test_histogram_before_the_levels_sketch_round_is_refused() -> None:
    rng = np.random.default_rng(1)
    w = Worker(_cfg(n_estimators=1), rng.normal(size=(10, 3)), rng.normal(size=10),
               client_index=0, seed=0)
    with pytest.raises(ProtocolError):
        w.handle(_hist_task(2, 0, np.array([0]), np.array([[0, 1, 2]]), np.zeros((1, 3, 1))))


@pytest.mark.parametrize("task", ["regression", "classification"])
@pytest.mark.parametrize("mode", ["full", "count", "gain", "moments"])
@pytest.mark.parametrize("sort_ratio", [0.0, 1e9])  # sort for the round / search per entry
def test_histogram_without_a_sorted_level_matches_the_sorted_one(
        task: str, mode: str, sort_ratio: float, monkeypatch: pytest.MonkeyPatch,
        kernels: str) -> None:
    """A sketch round without features leaves the level unsorted: the histogram round is then
    answered by sorting for that round only or by one pass over the pairs, with the same bins
    (ties at a threshold included)."""
    monkeypatch.setattr(worker_mod, "SORT_RATIO", sort_ratio)
    rng = np.random.default_rng(3)
    kw: dict[str, Any] = {"n_estimators": 3}
    if task == "classification":
        kw.update(task="classification", n_classes=3, criterion="gini")
        y = rng.integers(0, 3, 60)
    else:
        y = rng.normal(size=60)
    cfg = _cfg(**kw)
    X = np.round(rng.normal(size=(60, 3)), 1)  # ties: thresholds fall on values
    feats = np.array([[0, 1, 2], [2, -1, 0], [1, 2, 0]])
    thr = np.sort(np.round(rng.normal(size=(3, 3, 5)), 1), axis=2)
    thr[1, 0, 3:] = np.inf
    S = cfg.n_stats
    sorted_w = Worker(cfg, X, y, client_index=0, seed=0)
    reg = task == "regression"
    sorted_w.handle(_sketch_task(1, 0, 3, S, feats=feats, regression=reg))
    one_pass = Worker(cfg, X, y, client_index=0, seed=0)
    one_pass.handle(_sketch_task(1, 0, 3, S, regression=reg))
    nodes = np.arange(3)
    width = S if mode != "moments" or task == "classification" else 2
    a = sorted_w.handle(_hist_task(2, 0, nodes, feats, thr, width, mode, reg)).summable
    b = one_pass.handle(_hist_task(2, 0, nodes, feats, thr, width, mode, reg)).summable
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert a.any()


def _grid_sketch_task(rid: int, n_nodes: int, nodes: np.ndarray, feats: np.ndarray,
                      thr: np.ndarray, S: int = 3) -> Task:
    """A whole-level sketch round that also asks the histogram of ``thr`` (``grid_*``)."""
    E, m, bt = thr.shape
    t = _sketch_task(rid, 0, n_nodes, S)
    return dataclasses.replace(
        t, params={"n_nodes": n_nodes, "totals": True, "stats": "full"},
        arrays={"grid_nodes": np.asarray(nodes, dtype=np.int64),
                "grid_features": np.asarray(feats, dtype=np.int64), "grid_thresholds": thr},
        layout=(*t.layout, Block("h", (E, m, bt + 1, S), REG)))


def test_sketch_round_with_a_grid_answers_totals_and_the_histogram_round() -> None:
    """The histogram asked in a sketch round (``grid_*``) is the one a histogram round after
    that sketch round answers, appended to the node totals."""
    rng = np.random.default_rng(5)
    cfg = _cfg(n_estimators=3)
    X, y = np.round(rng.normal(size=(50, 3)), 1), rng.normal(size=50)
    feats = np.array([[0, 1, 2], [2, -1, 0], [1, 2, 0]])
    thr = np.sort(np.round(rng.normal(size=(3, 3, 4)), 1), axis=2)
    nodes = np.array([0, 2])
    two = Worker(cfg, X, y, client_index=0, seed=0)
    totals = two.handle(_sketch_task(1, 0, 3)).summable
    hist = two.handle(_hist_task(2, 0, nodes, feats[nodes], thr[nodes])).summable
    one = Worker(cfg, X, y, client_index=0, seed=0)
    fused = one.handle(_grid_sketch_task(1, 3, nodes, feats[nodes], thr[nodes])).summable
    np.testing.assert_array_equal(fused, np.concatenate([totals, hist]))
    assert hist.any()


@pytest.mark.parametrize("drop", ["grid_nodes", "grid_thresholds", "stats", "all-but-stats"])
def test_sketch_round_with_part_of_a_grid_is_refused(drop: str) -> None:
    """A sketch task asks a histogram whole or not at all: a lone ``stats`` parameter or a
    grid array without the others would let a server dress a repeated question up as new."""
    rng = np.random.default_rng(6)
    w = Worker(_cfg(n_estimators=2), rng.normal(size=(20, 3)), rng.normal(size=20),
               client_index=0, seed=0)
    t = _grid_sketch_task(1, 2, np.arange(2), np.array([[0, 1, 2], [2, 1, 0]]),
                          np.sort(rng.normal(size=(2, 3, 3)), axis=2))
    if drop == "stats":
        t.params.pop("stats")
    elif drop == "all-but-stats":
        t = dataclasses.replace(t, arrays={}, layout=t.layout[:1])
    else:
        t.arrays.pop(drop)
    with pytest.raises(ProtocolError):
        w.handle(t)


def test_replay_returns_the_same_reply() -> None:
    w, feats = _ready_worker()
    thr = np.sort(np.random.default_rng(0).normal(size=(2, 3, 4)), axis=2)
    a = w.handle(_hist_task(6, 0, np.arange(2), feats, thr))
    b = w.handle(_hist_task(6, 0, np.arange(2), feats, thr))
    assert isinstance(b, Reply) and b.round_id == 6
    np.testing.assert_array_equal(a.summable, b.summable)
    # a replayed sketch of the next level does not route twice
    r1 = w.handle(_sketch_task(7, 1, 2, routing=_leaf_routing(2, split_first=True)))
    r2 = w.handle(_sketch_task(7, 1, 2, routing=_leaf_routing(2, split_first=True)))
    np.testing.assert_array_equal(r1.summable, r2.summable)
    assert r1.summable.reshape(2, 3)[:, 0].sum() == 40


def test_rejected_sketch_task_changes_nothing() -> None:
    w, _ = _ready_worker()
    fresh, _ = _ready_worker()
    bad = _sketch_task(6, 1, 2, routing=_leaf_routing(2, split_first=False),
                       feats=np.full((2, 3), 9))  # feature index out of range
    with pytest.raises(ProtocolError):
        w.handle(bad)
    good = _sketch_task(6, 1, 2, routing=_leaf_routing(2, split_first=True))
    np.testing.assert_array_equal(w.handle(good).summable, fresh.handle(good).summable)


def test_constructor_rejects_bad_tables() -> None:
    cfg = _cfg()
    with pytest.raises(SchemaError):
        Worker(cfg, np.zeros((4, 2)), np.zeros(4), client_index=0)
    with pytest.raises(SchemaError):
        Worker(cfg, np.zeros((0, 3)), np.zeros(0), client_index=0)
    with pytest.raises(SchemaError):
        Worker(cfg, np.zeros((4, 3)), np.zeros(3), client_index=0)
    X = np.zeros((4, 3))
    X[1, 2] = np.inf
    with pytest.raises(SchemaError):
        Worker(cfg, X, np.zeros(4), client_index=0)
    with pytest.raises(SchemaError):
        Worker(cfg, np.zeros((4, 3)), np.array([0, 1, np.nan, 2]), client_index=0)
    with pytest.raises(ValueError):
        Worker(cfg, np.zeros((4, 3)), np.zeros(4), client_index=3)
    ccfg = _cfg(task="classification", n_classes=2, criterion="gini")
    with pytest.raises(SchemaError):
        Worker(ccfg, np.zeros((3, 3)), np.array([0, 1, 2]), client_index=0)
    with pytest.raises(SchemaError):
        Worker(ccfg, np.zeros((3, 3)), np.array([0, 0.5, 1]), client_index=0)
    cat = _cfg(feature_kinds=("categorical", "continuous", "continuous"), n_levels=(3, 0, 0))
    with pytest.raises(SchemaError):
        Worker(cat, np.array([[0, 0, 0], [3, 0, 0]], dtype=float), np.zeros(2), client_index=0)
    with pytest.raises(SchemaError):
        Worker(cat, np.array([[0.5, 0, 0]]), np.zeros(1), client_index=0)


# ---------------------------------------------------------------------------- missing values
def _missing_cfg(**kw: Any) -> JobConfig:
    return _cfg(missing_allowed=(True, False, True), **kw)


def _nan_table(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    X = rng.normal(size=(n, 3)).round(1)
    X[rng.random(n) < 0.3, 0] = np.nan
    X[rng.random(n) < 0.5, 2] = np.nan
    return X, rng.normal(size=n)


@pytest.mark.parametrize("all_missing", [False, True])
@pytest.mark.parametrize("path", ["sorted-by-entries", "sorted-by-cuts", "unsorted-sort",
                                  "unsorted-search"])
def test_missing_values_fill_one_last_bin_per_slot(path: str, all_missing: bool,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   kernels: str) -> None:
    """With missing values every full histogram has one more bin, the rows missing the
    slot's feature; each row counts in exactly one bin per slot (the DP sensitivity of a
    histogram stays one row per feature), and the secure sketch's counts leave them out.
    The same on every path to the bins: a level sorted by its sketch round (entries placed
    among the thresholds, or thresholds among the entries), a level the sketch round did not
    sort (sorted for the round, or a search per entry), also for a feature this client never
    has."""
    sorted_level = path.startswith("sorted")
    monkeypatch.setattr(_level_stats, "ENTRY_SEARCH_RATIO",
                        0.0 if path == "sorted-by-entries" else 1e9)
    monkeypatch.setattr(worker_mod, "SORT_RATIO", 1e9 if path == "unsorted-search" else 0.0)
    rng = np.random.default_rng(8)
    n, T, d = 80, 3, 3
    cfg = _missing_cfg(n_estimators=T)
    X, y = _nan_table(n, rng)
    if all_missing:
        X[:, 2] = np.nan
    w = Worker(cfg, X, y, client_index=0, seed=5)
    feats = np.array([[0, 1, 2], [2, 0, 1], [1, 2, 0]])
    w.handle(_sketch_task(1, 0, T, feats=feats if sorted_level else None))
    mult = _multiplicities(cfg, X, y, 5)
    nodes = np.arange(T)
    bt = 4
    thr = np.sort(rng.normal(size=(T, d, bt)), axis=2)
    thr[:, :, -1] = np.inf  # padding
    task = _hist_task(2, 0, nodes, feats, thr)
    task = Task(job_id="job", round_id=2, kind=TaskKind.HISTOGRAM, level=0,
                params={"stats": "full"}, arrays=task.arrays,
                layout=(Block("h", (T, d, bt + 2, 3), REG),))
    got = w.handle(task).summable.reshape(T, d, bt + 2, 3)
    ref = np.zeros_like(got)
    for t in range(T):
        for s in range(d):
            f = feats[t, s]
            for i in range(n):
                b = bt + 1 if np.isnan(X[i, f]) else int(
                    np.searchsorted(thr[t, s], X[i, f], side="left"))
                ref[t, s, b] += mult[t, i] * np.array([1.0, y[i], y[i] ** 2])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(got[..., 0].sum(axis=2), np.repeat(mult.sum(axis=1)[:, None],
                                                                   d, axis=1))
    # counts (a second worker of the same rows and seed: a worker releases a histogram slot
    # once, in one statistics mode) leave the rows missing the feature out
    w = Worker(cfg, X, y, client_index=0, seed=5)
    w.handle(_sketch_task(1, 0, T, feats=feats if sorted_level else None))
    counts = w.handle(_hist_task(3, 0, nodes, feats, thr, mode="count"))
    np.testing.assert_allclose(counts.summable.reshape(T, d, bt + 1), ref[:, :, :-1, 0])


def test_missing_values_are_no_sketch_points_nor_distinct_values() -> None:
    rng = np.random.default_rng(9)
    cfg = _missing_cfg(n_estimators=1, bootstrap=False, n_bins=4)
    X, y = _nan_table(60, rng)
    w = Worker(cfg, X, y, client_index=0, seed=1)
    feats = np.array([[0, 1, 2]])
    rep = w.handle(_sketch_task(1, 0, 1, feats=feats, disclose=("sketch_points", "unique"),
                                n_points=4))
    pts = rep.disclosed["sketch_points"][0]
    for s in range(3):
        present = X[:, s][~np.isnan(X[:, s])]
        got = pts[s][~np.isnan(pts[s])]
        assert got.min() == present.min() and got.max() == present.max()
        ptr = rep.disclosed["unique_ptr"]
        np.testing.assert_array_equal(rep.disclosed["unique_vals"][ptr[s]:ptr[s + 1]],
                                      np.unique(present))


def test_routing_sends_missing_values_where_the_split_says() -> None:
    rng = np.random.default_rng(10)
    n = 40
    cfg = _missing_cfg(n_estimators=2, bootstrap=False,
                       feature_kinds=("continuous", "continuous", "categorical"),
                       n_levels=(0, 0, 3))
    X, y = _nan_table(n, rng)
    X[:, 2] = np.where(np.isnan(X[:, 2]), np.nan, rng.integers(0, 3, n))
    w = Worker(cfg, X, y, client_index=0, seed=1)
    w.handle(_sketch_task(1, 0, 2, feats=np.array([[0, 1, 2], [0, 1, 2]])))
    routing = {"route_kind": np.array([NodeKind.NUMERIC, NodeKind.CATEGORICAL], dtype=np.int32),
               "route_feature": np.array([0, 2], dtype=np.int32),
               "route_threshold": np.array([0.0, 0.0]),
               "route_left": np.array([0, 2], dtype=np.int32),
               "route_right": np.array([1, 3], dtype=np.int32),
               "route_set_ptr": np.array([0, 0, 1]), "route_set_vals": np.array([1], np.int32),
               "route_missing_left": np.array([True, False])}
    got = w.handle(_sketch_task(2, 1, 4, routing=routing)).summable.reshape(4, 3)[:, 0]
    x0, x2 = X[:, 0], X[:, 2]
    want = [((x0 <= 0) | np.isnan(x0)).sum(), (x0 > 0).sum(), (x2 == 1).sum(),
            ((x2 != 1) | np.isnan(x2)).sum()]
    np.testing.assert_array_equal(got, want)


def test_missing_values_only_where_the_job_allows_them() -> None:
    X, y = _nan_table(30, np.random.default_rng(11))
    X[0, 1] = np.nan
    with pytest.raises(SchemaError, match="missing value in row 1, column 1"):
        Worker(_missing_cfg(), X, y, client_index=0)
    X[0, 1], X[1, 0] = 0.0, np.inf
    with pytest.raises(SchemaError, match="non-finite"):
        Worker(_missing_cfg(), X, y, client_index=0)


def test_a_value_outside_the_public_bounds_is_refused_never_clipped() -> None:
    """A continuous cell outside ``config.feature_bounds`` is refused naming its row, column
    and the bounds; missing cells (NaN) and rows of weight 0 (left out) are no values outside
    them."""
    X, y = _nan_table(30, np.random.default_rng(12))
    assert np.isnan(X).any() and np.nanmax(np.abs(X)) < 5
    cfg = _missing_cfg(feature_bounds=((-5.0, 5.0),) * 3)
    Worker(cfg, X, y, client_index=0)  # every present value within its bounds
    X[3, 1] = 5.25
    with pytest.raises(SchemaError, match=re.escape(
            "value 5.25 in row 4, column 1 is outside the job's public bounds [-5.0, 5.0] of "
            "that feature: values are never clipped; correct them, drop the rows, or agree on "
            "wider bounds (the schema's) with every site")):
        Worker(cfg, X, y, client_index=0)
    weights = np.ones(30)
    weights[3] = 0
    Worker(cfg, X, y, client_index=0, sample_weight=weights)  # the row is left out
    X[3, 1] = 0.0
    X[7, 0] = -1e20
    with pytest.raises(SchemaError, match=r"value -1e\+20 in row 8, column 0 is outside"):
        Worker(cfg, X, y, client_index=0)
    # rows of weight 0 before it are left out, and the row keeps its number as given
    with pytest.raises(SchemaError, match=r"value -1e\+20 in row 8, column 0 is outside"):
        Worker(cfg, X, y, client_index=0, sample_weight=weights)
    X[7, 0] = np.inf
    with pytest.raises(SchemaError, match=r"non-finite value in row 8, column 0"):
        Worker(cfg, X, y, client_index=0, sample_weight=weights)


@pytest.mark.parametrize("sampling", ["bootstrap", "disjoint"])
def test_huge_weights_are_drawn_per_row_with_the_law_of_per_copy_draws(sampling: str) -> None:
    """Past ``MAX_COPY_DRAWS`` copies the draws are per row: bootstrap counts are
    Multinomial(total, w / total) per tree, and under "disjoint" each row's copies are spread
    over the trees, every copy in exactly one."""
    from fedforest_secure._bootstrap import MAX_COPY_DRAWS

    n, T = 40, 5
    weights = np.full(n, 10**9, dtype=np.int64)
    weights[:10] = 3 * 10**9
    assert weights.sum() > MAX_COPY_DRAWS
    cfg = _cfg(n_estimators=T, row_sampling=sampling, bootstrap=sampling == "bootstrap")
    rows, trees, w = tree_pairs(cfg, n, np.random.default_rng(0), weights=weights)
    out = np.zeros((T, n))
    out[trees, rows] = w
    total = int(weights.sum())
    if sampling == "bootstrap":
        np.testing.assert_array_equal(out.sum(axis=1), np.full(T, total))
        share = out / total  # each row near its weight's share, in every tree
        np.testing.assert_allclose(share, np.broadcast_to(weights / total, share.shape),
                                   rtol=1e-3)
    else:
        np.testing.assert_array_equal(out.sum(axis=0), weights)
        np.testing.assert_allclose(out, np.broadcast_to(weights / T, out.shape), rtol=1e-3)


def _worker_multiplicities(cfg: JobConfig, X: np.ndarray, y: np.ndarray) -> dict[bytes, list]:
    """Per distinct row (by its bytes): its multiplicity in each tree, as a worker built on
    ``(X, y)`` draws them."""
    w = Worker(cfg, X, y, client_index=0, seed=7)
    out = np.zeros((cfg.n_estimators, X.shape[0]), dtype=np.int64)
    out[w._p_node, w._p_row] = w._p_w
    return {np.append(X[i], y[i]).tobytes(): out[:, i].tolist() for i in range(X.shape[0])}


@pytest.mark.parametrize("sampling", ["bootstrap", "disjoint"])
def test_under_dp_a_row_added_anywhere_changes_no_other_rows_draws(sampling: str) -> None:
    """The sensitivity DP noise is calibrated for (one record moves at most max_multiplicity
    copies per tree) holds for neighbouring tables: adding a row, at the front or anywhere,
    leaves every other row's multiplicity in every tree as it was; the new row's own is
    capped (disjoint: one tree)."""
    prof = load_profile("secure-dp", epsilon=1.0).to_dict()
    cap = int(prof["dp"].get("max_multiplicity", 4))
    cfg = _cfg(task="classification", n_classes=2, criterion="gini", n_estimators=8,
               row_sampling=sampling, profile=prof, target_bound=1.0)
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 3))
    y = (X[:, 0] > 0).astype(float)
    before = _worker_multiplicities(cfg, X, y)
    new_row, new_y = np.array([[0.3, -0.6, 0.9]]), np.array([1.0])
    for at in (0, 150, 300):
        after = _worker_multiplicities(cfg, np.insert(X, at, new_row, axis=0),
                                       np.insert(y, at, new_y))
        added = after.pop(np.append(new_row[0], new_y).tobytes())
        assert after == before, at
        assert max(added) <= cap
        if sampling == "disjoint":
            assert sorted(added) == [0] * 7 + [1]


def _copies(cfg: JobConfig, X: np.ndarray, y: np.ndarray) -> dict[bytes, list[list[int]]]:
    """Per distinct row (by its bytes), per tree: the multiplicities of its copies, sorted."""
    w = Worker(cfg, X, y, client_index=0, seed=7)
    out = np.zeros((cfg.n_estimators, X.shape[0]), dtype=np.int64)
    out[w._p_node, w._p_row] = w._p_w
    keys = [np.append(X[i], y[i]).tobytes() for i in range(X.shape[0])]
    return {k: [sorted(out[t, [i for i, q in enumerate(keys) if q == k]].tolist())
                for t in range(cfg.n_estimators)] for k in set(keys)}


@pytest.mark.parametrize("sampling", ["bootstrap", "disjoint"])
def test_under_dp_equal_rows_are_records_of_their_own(sampling: str) -> None:
    """Four distinct rows, 250 copies each (categorical data): every copy draws on its own, so
    the trees get rows (drawn by content alone, every copy of a row would go to one tree, and
    4 of 50 disjoint trees get any); a copy added moves that row's draws by one draw and no
    other row's."""
    from collections import Counter

    prof = load_profile("secure-dp", epsilon=1.0).to_dict()
    cfg = _cfg(task="classification", n_classes=2, criterion="gini", n_estimators=50,
               row_sampling=sampling, profile=prof, target_bound=1.0)
    base = np.array([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    X = np.repeat(base, 250, axis=0)
    y = X[:, 0].copy()
    before = _copies(cfg, X, y)
    per_tree = np.array([sum(sum(c[t]) for c in before.values()) for t in range(50)])
    if sampling == "disjoint":
        assert (per_tree > 0).sum() >= 45 and per_tree.sum() == 1000
    else:  # copies of one row differ within a tree; every tree has about n rows
        assert all(len(set(c[t])) > 1 for c in before.values() for t in range(50))
        assert per_tree.min() > 800
    after = _copies(cfg, np.vstack([X[:1], X]), np.append(y[:1], y))
    copied = np.append(X[0], y[0]).tobytes()
    for key, per in before.items():
        if key != copied:
            assert after[key] == per  # another row's copies draw as they did
            continue
        for t in range(50):  # per tree: the same draws, and one more (the new copy's)
            assert (Counter(per[t]) - Counter(after[key][t])).total() == 0
            assert (Counter(after[key][t]) - Counter(per[t])).total() == 1


def test_a_client_whose_rows_all_weigh_zero_is_told_what_to_do() -> None:
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(12, 3)), rng.normal(size=12)
    with pytest.raises(SchemaError, match=r"all 12 rows of this client have sample_weight 0"
                       r".*give some of them a positive weight, or leave this site out"):
        Worker(_cfg(), X, y, client_index=0, sample_weight=np.zeros(12))


def test_a_dp_bootstrap_caps_every_rows_multiplicity_in_every_tree() -> None:
    """dp.max_multiplicity bounds each (tree, row) multiplicity of the DP bootstrap: the
    noise is calibrated to it (a row drawn 5 times under a cap of 4 gets too little)."""
    prof = load_profile("secure-dp", epsilon=1.0).to_dict()
    cap = int(prof["dp"]["max_multiplicity"])
    cfg = _cfg(n_estimators=8, profile=prof,
               feature_bounds=((-5.0, 5.0),) * 3, target_bound=1.0)
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 3))
    y = (X[:, 0] > 0).astype(float)
    _, _, w = tree_pairs(cfg, 300, np.random.default_rng(7), keys=row_keys(X, y))
    assert int(w.max()) == cap  # 2,400 Poisson(1) draws: some reach the cap, none pass it


def test_clients_of_equal_size_draw_their_bootstraps_independently() -> None:
    """Two clients of 100 rows each: each client's seed is its own, so their trees'
    multiplicity patterns (in each client's canonical row order) differ."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = X[:, 0] + rng.normal(size=200)
    cfg = _cfg(n_clients=2, n_estimators=5)
    patterns = []
    for k in (0, 1):
        Xk, yk = X[k * 100:(k + 1) * 100], y[k * 100:(k + 1) * 100]
        w = Worker(cfg, Xk, yk, client_index=k, seed=client_seed(cfg, k))
        m = np.zeros((cfg.n_estimators, 100), dtype=np.int64)
        m[w._p_node, w._p_row] = w._p_w
        patterns.append(m[:, canonical_order(Xk, yk)])
    assert (patterns[0] != patterns[1]).mean() > 0.2


@pytest.mark.parametrize("mode,S,task", [("full", 3, "regression"), ("moments", 2, "regression"),
                                         ("count", 1, "regression"), ("full", 3, "classification")])
def test_a_histogram_added_to_a_running_total_is_the_reply_added(mode: str, S: int,
                                                                  task: str) -> None:
    """A worker that keeps no reply, handed the round's running total (an in-process
    federation's plain sum), adds its histogram to it: the floats of ``total += summable``
    of its reply, bit for bit, and a reply without a vector of its own. A worker that keeps
    its reply (a retried round gets it again) leaves the total to its caller."""
    rng = np.random.default_rng(9)
    n, T, d = 80, 3, 3
    kw: dict[str, Any] = dict(n_estimators=T)
    if task == "classification":
        kw.update(task="classification", n_classes=S, criterion="gini")
    cfg = _cfg(**kw)
    X = rng.normal(size=(n, d)).round(1)
    y = rng.integers(0, S, n) if task == "classification" else rng.normal(size=n)
    feats = np.array([[0, 1, 2], [2, 0, 1], [1, 2, 0]])
    nodes = np.array([0, 2])
    thr = np.sort(rng.normal(size=(2, d, 5)), axis=2)
    thr[1, 2, 3:] = np.inf
    hist = _hist_task(2, 0, nodes, feats[nodes], thr, S=S, mode=mode,
                      regression=task == "regression")
    size = hist.layout[0].size

    def ready(keep: bool) -> Worker:
        w = Worker(cfg, X, y, client_index=0, seed=5, keep_last_reply=keep)
        w.handle(_sketch_task(1, 0, T, S=cfg.n_stats, feats=feats,
                              regression=task == "regression"))
        return w

    before = rng.normal(size=size)  # the clients before this one
    want = before.copy()
    want += ready(True).handle(hist).summable
    total = before.copy()
    reply = ready(False).handle(hist, into=total)
    if _kernels.KERNELS is None:  # the numpy code returns its vector, for its caller to add
        assert reply.summable.shape == (size,) and total.tobytes() == before.tobytes()
        total += reply.summable
    else:
        assert reply.summable.shape == (0,)
    assert total.tobytes() == want.tobytes()
    kept = before.copy()
    reply = ready(True).handle(hist, into=kept)
    assert kept.tobytes() == before.tobytes() and reply.summable.shape == (size,)
