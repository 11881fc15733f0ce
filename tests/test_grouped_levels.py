"""Levels evaluated in groups of nodes (bounded memory in process) grow the same forest.

The coordinator may split a level's nodes into groups, each with its own sketch and histogram
round (``max_nodes_per_round`` / ``max_round_bytes``; automatic in process). Feature sampling,
candidates and splits must not depend on the grouping: the forest is compared bit for bit
with the ungrouped protocol, and the grouped worker replies row for row with the whole level's.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedforest_secure import _sketch
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import ProtocolError
from fedforest_secure.federation import RoundRecord, client_seed, run_in_process
from fedforest_secure.privacy import load_profile
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind
from fedforest_secure.worker import Worker

OPEN = load_profile("open").to_dict()
REG = (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)


def _cfg(**kw: Any) -> JobConfig:
    base: dict[str, Any] = dict(job_id="job", task="regression", n_features=4, n_clients=3,
                                n_estimators=4, max_depth=5, min_samples_leaf=2,
                                max_features=2, n_bins=8, profile=OPEN, random_state=3)
    base.update(kw)
    return JobConfig(**base)


def _clients(cfg: JobConfig, n: int = 240, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    K, d = cfg.n_clients, cfg.n_features
    out = []
    for k in range(K):
        X = np.round(rng.normal(loc=0.3 * k, size=(n // K, d)), 1)  # ties on purpose
        for j, kind in enumerate(cfg.kinds):
            if kind == "categorical":
                X[:, j] = rng.integers(0, cfg.levels[j], n // K)
        if cfg.task == "regression":
            y = X[:, 0] + np.sin(2 * X[:, -1]) + 0.3 * rng.normal(size=n // K) + 0.2 * k
        else:
            y = ((X[:, 0] + X[:, -1] + 0.3 * rng.normal(size=n // K)) > 0.3 * k).astype(int)
            y += (X[:, 2 % d] > 1).astype(int) * (cfg.n_classes > 2)
        out.append((X, y))
    return out


def _forest(model: Any) -> str:
    doc = model.to_dict()
    doc.pop("meta")  # round counts differ by design
    return str(doc)


def _fit(cfg: JobConfig, clients: list[tuple[np.ndarray, np.ndarray]],
         **kw: Any) -> tuple[Any, list[str]]:
    kinds: list[str] = []
    model = run_in_process(cfg, clients, on_round=lambda r: kinds.append(r.task.kind.value),
                           **kw)
    return model, kinds


CASES = [
    dict(),
    dict(method="avgimp", top_l=1),
    dict(method="exact"),
    dict(method="histogram"),
    dict(method="histogram", feature_bounds=((-4.0, 5.0),) * 4),
    dict(feature_kinds=("categorical", "continuous", "continuous", "continuous"),
         n_levels=(5, 0, 0, 0)),
    dict(task="classification", n_classes=3, criterion="gini"),
    dict(task="classification", n_classes=2, criterion="entropy", method="avgimp", top_l=2),
    dict(split_on_client=True),
    dict(row_sampling="disjoint"),
    dict(max_features=4, bootstrap=False),
]


@pytest.mark.parametrize("kw", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("limit", [dict(max_nodes_per_round=1), dict(max_nodes_per_round=3),
                                   dict(max_round_bytes=4_000)])
def test_grouped_levels_grow_the_same_forest(kw: dict[str, Any], limit: dict[str, int]) -> None:
    cfg = _cfg(**kw)
    clients = _clients(cfg)
    ref, ref_kinds = _fit(cfg, clients, max_round_bytes=None)
    got, got_kinds = _fit(cfg, clients, **limit)
    assert sum(t.n_nodes for t in ref.trees) > 4 * 3  # the trees did grow
    assert _forest(got) == _forest(ref)
    assert ref_kinds == ["sketch", "histogram"] * (len(ref_kinds) // 2) + ["sketch"]
    assert len(got_kinds) > len(ref_kinds)  # the levels were grouped


def test_default_in_process_budget_keeps_small_jobs_ungrouped() -> None:
    cfg = _cfg()
    _, kinds = _fit(cfg, _clients(cfg))
    assert kinds == ["sketch", "histogram"] * cfg.max_depth + ["sketch"]


def test_dp_and_secure_cdf_are_never_grouped() -> None:
    for p in (load_profile("secure", secure_aggregation=False).to_dict(),
              load_profile("secure-dp").to_dict()):
        cfg = _cfg(profile=p, feature_bounds=((-4.0, 5.0),) * 4, target_bound=6.0,
                   n_estimators=2, max_depth=2)
        clients = _clients(cfg)
        recs: list[RoundRecord] = []
        got = run_in_process(cfg, clients, on_round=recs.append, max_nodes_per_round=1,
                             max_round_bytes=1)
        assert recs and not any("nodes" in r.task.arrays for r in recs
                                if r.task.kind == TaskKind.SKETCH)
        if p.get("dp") is None:  # DP noise is fresh every fit
            ref = run_in_process(cfg, clients, max_round_bytes=None)
            assert _forest(got) == _forest(ref)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), per_round=st.integers(1, 12), K=st.integers(1, 4),
       d=st.integers(1, 5), B=st.sampled_from([2, 3, 8, 32]))
def test_grouping_never_changes_the_forest(seed: int, per_round: int, K: int, d: int,
                                           B: int) -> None:
    cfg = _cfg(n_clients=K, n_features=d, max_features=max(1, d // 2), n_bins=B,
               n_estimators=3, max_depth=4, random_state=seed)
    clients = _clients(cfg, n=60 * K, seed=seed)
    ref, _ = _fit(cfg, clients, max_round_bytes=None)
    got, _ = _fit(cfg, clients, max_nodes_per_round=per_round)
    assert _forest(got) == _forest(ref)


def test_round_bytes_bound_the_groups() -> None:
    cfg = _cfg()
    clients = _clients(cfg)
    coord = Coordinator(cfg, max_round_bytes=12_000, total_rows=240)
    workers = [Worker(cfg, X, y, client_index=k, seed=client_seed(cfg, k))
               for k, (X, y) in enumerate(clients)]
    seen: list[int] = []
    while (task := coord.next_task()) is not None:
        replies = [w.handle(task) for w in workers]
        if "nodes" in task.arrays and task.kind == TaskKind.SKETCH:
            seen.append(task.arrays["nodes"].size)
            # the sketches the coordinator holds and the clients' sorted orders of one group
            # stay within the budget (a group has at least one node)
            held = sum(r.disclosed["sketch_points"].nbytes for r in replies)
            held += sum(8 * w._sorted.size for w in workers if w._sorted is not None)
            assert held <= 12_000 or task.arrays["nodes"].size == 1
        total = sum(r.summable for r in replies)
        coord.submit(task.round_id, np.asarray(total, dtype=np.float64),
                     {k: r.disclosed for k, r in enumerate(replies) if r.disclosed})
    assert len(seen) > cfg.max_depth  # some level had several groups


@pytest.mark.parametrize("kw", [dict(), dict(method="histogram"),
                                dict(feature_kinds=("categorical",) + ("continuous",) * 3,
                                     n_levels=(40, 0, 0, 0))])
def test_many_classes_histogram_rounds_stay_within_the_round_bytes(kw: dict[str, Any]) -> None:
    """A histogram reply holds every class's count per bin: with 40 classes a level's replies
    are far above the budget although its sorted orders are not. The groups keep a client's
    reply and the running sum within ``max_round_bytes``; the forest is the ungrouped one."""
    C, K, cap = 40, 3, 300_000
    cfg = _cfg(task="classification", n_classes=C, criterion="gini", n_clients=K,
               n_estimators=8, max_depth=6, n_bins=16, **kw)
    rng = np.random.default_rng(5)
    centers = rng.normal(size=(C, 4)) * 3
    clients = []
    for _ in range(K):
        y = rng.integers(0, C, 150)
        X = centers[y] + rng.normal(size=(150, 4))
        X[:, 0] = np.round(np.abs(X[:, 0]) * 4) % 40 if kw.get("n_levels") else X[:, 0]
        clients.append((X, y))
    # (summed vector bytes, nodes) of every histogram round, ungrouped and within the budget
    whole: list[tuple[int, int]] = []
    sizes: list[tuple[int, int]] = []

    def record(into: list[tuple[int, int]]) -> Any:
        return lambda r: into.append((r.total.nbytes, r.task.arrays["nodes"].size)) \
            if r.task.kind == TaskKind.HISTOGRAM else None

    ref = run_in_process(cfg, clients, on_round=record(whole), max_round_bytes=None)
    got = run_in_process(cfg, clients, on_round=record(sizes), max_round_bytes=cap)
    assert _forest(got) == _forest(ref)
    assert max(whole)[0] > 2 * cap  # a whole level's replies are over the budget
    assert len(sizes) > len(whole)  # so such levels were evaluated in groups
    # a reply and the running sum within the budget (a group has at least one node)
    assert all(2 * b <= cap or n == 1 for b, n in sizes), max(sizes)
    assert max(n for b, n in sizes) > 1


# ---------------------------------------------------------------------- worker, one group


def _level0(cfg: JobConfig, feats: np.ndarray, disclose: tuple[str, ...]) -> Task:
    T = cfg.n_estimators
    return Task(job_id="job", round_id=1, kind=TaskKind.SKETCH, level=0,
                params={"n_nodes": T, "n_points": cfg.n_bins},
                arrays={"features": feats}, layout=(Block("totals", (T, 3), REG),),
                disclose=disclose)


def _routing_only(cfg: JobConfig) -> Task:
    T = cfg.n_estimators
    return Task(job_id="job", round_id=1, kind=TaskKind.SKETCH, level=0,
                params={"n_nodes": T}, layout=(Block("totals", (T, 3), REG),))


def _group(cfg: JobConfig, nodes: np.ndarray, feats: np.ndarray, round_id: int,
           disclose: tuple[str, ...] = ("sketch_points",)) -> Task:
    return Task(job_id="job", round_id=round_id, kind=TaskKind.SKETCH, level=0,
                params={"n_nodes": cfg.n_estimators, "n_points": cfg.n_bins,
                        "totals": False},
                arrays={"nodes": nodes, "features": feats[nodes]}, disclose=disclose)


def _hist(nodes: np.ndarray, feats: np.ndarray, thr: np.ndarray, round_id: int) -> Task:
    m = feats.shape[1]
    return Task(job_id="job", round_id=round_id, kind=TaskKind.HISTOGRAM, level=0,
                params={"stats": "full"},
                arrays={"nodes": nodes, "features": feats[nodes], "thresholds": thr[nodes]},
                layout=(Block("h", (nodes.size, m, thr.shape[2] + 1, 3), REG),))


@pytest.mark.parametrize("keep", [True, "compact", False])
def test_group_replies_equal_the_whole_levels_rows(keep: Any) -> None:
    cfg = _cfg(n_estimators=7, method="exact")
    X, y = _clients(cfg, n=600)[1]
    rng = np.random.default_rng(5)
    feats = np.stack([rng.choice(4, 2, replace=False) for _ in range(7)]).astype(np.int64)
    feats[2, 1] = -1  # an unused slot
    thr = np.sort(rng.choice(X.ravel(), size=(7, 2, 5)), axis=2)
    thr[:, :, -1] = np.inf
    whole = Worker(cfg, X, y, client_index=1, seed=9, keep_level_order=keep)
    sk = whole.handle(_level0(cfg, feats, ("sketch_points", "unique"))).disclosed
    all_nodes = np.arange(7)
    hist = whole.handle(_hist(all_nodes, feats, thr, 2)).summable.reshape(7, 2, 6, 3)
    grouped = Worker(cfg, X, y, client_index=1, seed=9, keep_level_order=keep)
    grouped.handle(_routing_only(cfg))
    rid = 2
    for nodes in (np.array([0, 2, 3]), np.array([4]), np.array([5, 6]), np.array([1])):
        rep = grouped.handle(_group(cfg, nodes, feats, rid, ("sketch_points", "unique")))
        assert rep.summable.size == 0
        np.testing.assert_array_equal(rep.disclosed["sketch_points"], sk["sketch_points"][nodes])
        np.testing.assert_array_equal(rep.disclosed["sketch_counts"], sk["sketch_counts"][nodes])
        ptr, vals = sk["unique_ptr"], sk["unique_vals"]
        want = [vals[ptr[i * 2 + s]:ptr[i * 2 + s + 1]] for i in nodes for s in range(2)]
        got_ptr, got_vals = rep.disclosed["unique_ptr"], rep.disclosed["unique_vals"]
        got = [got_vals[got_ptr[b]:got_ptr[b + 1]] for b in range(nodes.size * 2)]
        for a, b in zip(want, got, strict=True):
            np.testing.assert_array_equal(a, b)
        h = grouped.handle(_hist(nodes, feats, thr, rid + 1)).summable
        np.testing.assert_array_equal(h.reshape(nodes.size, 2, 6, 3), hist[nodes])
        rid += 2


def test_group_sketch_protocol_checks() -> None:
    cfg = _cfg(n_estimators=5)
    X, y = _clients(cfg)[0]
    feats = np.tile(np.array([[0, 1]]), (5, 1))
    w = Worker(cfg, X, y, client_index=0, seed=1)
    with pytest.raises(ProtocolError, match="not answered"):  # before the level's routing
        w.handle(_group(cfg, np.array([0, 1]), feats, 1))
    w.handle(_routing_only(cfg))
    for bad in (np.array([1, 0]), np.array([0, 0]), np.array([5]), np.array([-1]),
                np.zeros(0, dtype=np.int64)):
        task = _group(cfg, np.array([0]), feats, 2)
        task.arrays["nodes"] = bad
        task.arrays["features"] = np.tile(np.array([[0, 1]]), (bad.size, 1))
        with pytest.raises(ProtocolError):
            w.handle(task)
    task = _group(cfg, np.array([0, 1]), feats, 2)
    task.arrays["features"] = feats[:1]
    with pytest.raises(ProtocolError, match="one row per listed node"):
        w.handle(task)
    task = _group(cfg, np.array([0, 1]), feats, 2, ("sketch_points", "minmax"))
    with pytest.raises(ProtocolError, match="sketches only"):
        w.handle(task)
    w.handle(_group(cfg, np.array([1, 3]), feats, 3))
    thr = np.full((5, 2, 3), np.inf)
    with pytest.raises(ProtocolError, match="outside the last sketched group"):
        w.handle(_hist(np.array([1, 2]), feats, thr, 4))
    rep = w.handle(_hist(np.array([3]), feats, thr, 4))  # a subset of the group is fine
    assert rep.summable.shape == (2 * 4 * 3,)


# ---------------------------------------------------------------------- candidates per row


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), R=st.integers(1, 12), K=st.integers(1, 4),
       B=st.sampled_from([2, 4, 8, 32]))
def test_pooled_candidates_of_a_row_do_not_depend_on_the_other_rows(seed: int, R: int, K: int,
                                                                      B: int) -> None:
    rng = np.random.default_rng(seed)
    pts = np.full((R, K, B + 1), np.nan)
    counts = np.zeros((R, K))
    for r in range(R):
        for k in range(K):
            n = int(rng.integers(0, 40))
            if n == 0:
                continue
            v = np.round(rng.normal(size=n) * rng.uniform(0.1, 3), int(rng.integers(0, 3)))
            bk = int(rng.integers(1, B + 1))
            pts[r, k, : bk + 1] = _sketch.client_quantiles(v, None, bk)
            counts[r, k] = n
    whole = _sketch.pooled_candidates(pts, counts, B)
    for r in range(R):
        one = _sketch.pooled_candidates(pts[r:r + 1], counts[r:r + 1], B)
        np.testing.assert_array_equal(one[0], whole[r])


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30), min_size=1,
                     max_size=8),
       targets=st.lists(st.floats(-0.1, 1.1), min_size=1, max_size=10))
def test_first_at_least_is_a_per_row_searchsorted(rows: list[list[float]],
                                                  targets: list[float]) -> None:
    E = max(len(r) for r in rows)
    F = np.array([sorted(r) + [max(r)] * (E - len(r)) for r in rows])
    t = np.array(targets)
    got = _sketch._first_at_least(F, t)
    want = np.stack([np.searchsorted(F[r], t, side="left") for r in range(F.shape[0])])
    np.testing.assert_array_equal(got, want)


def test_client_quantiles_use_exact_ranks() -> None:
    # (3 / 10) * 10 is 3.0000000000000004 in floating point; Q(0.3) of ten values is the third
    q = _sketch.client_quantiles(np.arange(1.0, 11.0), None, 10)
    np.testing.assert_array_equal(q, [1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    q = _sketch.client_quantiles(np.arange(1.0, 11.0), np.full(10, 3.0), 10)
    np.testing.assert_array_equal(q, [1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])


def test_worker_sketch_does_not_depend_on_its_neighbour_blocks() -> None:
    """A block's quantile points are the same whatever blocks share its chunk of the order."""
    cfg = _cfg(n_estimators=6, n_bins=32, profile={**OPEN, "rows_per_sketch_point": 1})
    # 29 rows: B_k = n_k = 29 < B, and (b / 29) * 29 is not b in floating point for some b
    X, y = _clients(cfg, n=87)[0]
    feats = np.tile(np.array([[0, 1]]), (6, 1))
    ref = Worker(cfg, X, y, client_index=0, seed=4).handle(
        _level0(cfg, feats, ("sketch_points",))).disclosed["sketch_points"]
    w = Worker(cfg, X, y, client_index=0, seed=4)
    w.handle(_routing_only(cfg))
    for i in range(6):  # every block alone, at the start of its own order
        got = w.handle(_group(cfg, np.array([i]), feats, 2 + i)).disclosed["sketch_points"]
        np.testing.assert_array_equal(got[0], ref[i])


def test_grouped_round_record_shapes() -> None:
    """What the server sees in a group's rounds: sketches of the listed nodes only."""
    cfg = _cfg(n_estimators=3, max_depth=2)
    recs: list[RoundRecord] = []
    run_in_process(cfg, _clients(cfg), on_round=recs.append, max_nodes_per_round=1)
    groups = [r for r in recs if "nodes" in r.task.arrays and r.task.kind == TaskKind.SKETCH]
    assert groups
    for r in groups:
        assert r.total.size == 0  # node totals come from the level's routing round only
        for items in r.disclosed.values():
            assert items["sketch_points"].shape[0] == r.task.arrays["nodes"].size


@pytest.mark.parametrize(("limit", "said"), [
    (dict(max_nodes_per_round=2.5), "max_nodes_per_round must be a whole number >= 1, not 2.5"),
    (dict(max_nodes_per_round="3"), "max_nodes_per_round must be a whole number >= 1, not '3'"),
    (dict(max_nodes_per_round=True), "max_nodes_per_round must be a whole number >= 1, not True"),
    (dict(max_nodes_per_round=0), "max_nodes_per_round must be a whole number >= 1, not 0"),
    (dict(max_round_bytes=float("nan")), "max_round_bytes must be a number > 0, not nan"),
    (dict(max_round_bytes=-5), "max_round_bytes must be a number > 0, not -5"),
])
def test_a_group_limit_that_is_no_limit_is_refused_naming_it(limit: dict[str, Any],
                                                             said: str) -> None:
    """A limit of nodes per round that is not a whole number, or of bytes that is not a
    positive number (NaN turned grouping off without a word): refused up front."""
    from fedforest_secure.coordinator import Coordinator

    cfg = _cfg()
    with pytest.raises(ValueError, match=re.escape(said)):
        Coordinator(cfg, **limit)
