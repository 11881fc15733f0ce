"""A histogram slot is released once, whatever form the task asks it in (secure, no DP).

Each attack re-asks statistics every client released in an earlier round, in a form whose
question key differs, of clients 0-2 only: the sum over the 4 clients minus the sum over 0-2
would be client 3's exact statistics. The clients refuse it: a worker records what each
histogram slot releases (level, node, feature, cuts), not the task's form.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_adversarial_server import _advance, _secure_config, _workers

from fedforest_secure._layouts import hist_block
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import ProtocolError, RefusedRequest
from fedforest_secure.federation import PlainSum, run_in_process
from fedforest_secure.privacy import load_profile
from fedforest_secure.protocol import Block, Task, TaskKind, question_key
from fedforest_secure.worker import Worker

_REFUSED = r"was already released in an earlier round \(the task asks it again in another form"


def _refused_by_0_to_2(ws: list[Worker], task: Task, match: str = _REFUSED) -> None:
    for k in (0, 1, 2):
        with pytest.raises(RefusedRequest, match=match) as caught:
            ws[k].handle(task)
        assert caught.value.code == "question_reused"


def _answered_by_all(ws: list[Worker], task: Task) -> None:
    for wk in ws:
        wk.handle(task)


def test_a_sketch_round_s_histogram_reasked_as_a_histogram_round_is_refused() -> None:
    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    first = _advance(Coordinator(cfg), ws,
                     lambda t: t.kind is TaskKind.SKETCH and "grid_thresholds" in t.arrays)
    _answered_by_all(ws, first)
    a = first.arrays
    again = Task(job_id=first.job_id, round_id=first.round_id + 1, kind=TaskKind.HISTOGRAM,
                 level=first.level, params={"stats": first.params["stats"]},
                 arrays={"nodes": a["grid_nodes"], "features": a["grid_features"],
                         "thresholds": a["grid_thresholds"]},
                 layout=(first.layout[1],))
    assert question_key(again) != question_key(first)
    _refused_by_0_to_2(ws, again, "the histogram of node 0, feature .* at level 1, with the "
                                  "same cuts, was already released")


def test_a_histogram_reasked_with_each_node_s_feature_slots_permuted_is_refused() -> None:
    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    first = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    _answered_by_all(ws, first)
    a = first.arrays
    again = dataclasses.replace(first, round_id=first.round_id + 1, arrays={
        "nodes": a["nodes"], "features": a["features"][:, ::-1].copy(),
        "thresholds": a["thresholds"][:, ::-1, :].copy()})
    assert question_key(again) != question_key(first)
    _refused_by_0_to_2(ws, again)


@pytest.mark.parametrize("second", ["full", "count"])
def test_a_histogram_reasked_in_another_statistics_mode_is_refused(second: str) -> None:
    """The level-0 histogram (``moments``: count and sum of y per bin) re-asked as ``full``
    (the same plus the sum of y^2) or as ``count`` (inside it)."""
    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    first = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    assert first.params["stats"] == "moments"
    _answered_by_all(ws, first)
    n, m, b = first.layout[0].shape[:3]
    layout = (Block("hist", (n, m, b, 1), (first.layout[0].kinds[0],)),) if second == "count" \
        else (hist_block(cfg, n, m, b),)
    again = dataclasses.replace(first, round_id=first.round_id + 1, params={"stats": second},
                                layout=layout)
    _refused_by_0_to_2(ws, again)


def test_a_histogram_task_that_asks_a_disclosure_is_refused() -> None:
    """A histogram discloses nothing; the question key hashes ``disclose``, so a disclosure
    the histogram ignores would make the same histogram a new question."""
    cfg, clients = _secure_config("secure", sketch="quantiles")
    ws = _workers(cfg, clients)
    assert "sketch_points" in ws[0].allowed_disclosures()
    first = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    _answered_by_all(ws, first)
    again = dataclasses.replace(first, round_id=first.round_id + 1,
                                disclose=("sketch_points",))
    for k in (0, 1, 2):
        with pytest.raises(ProtocolError, match=r"a histogram task discloses nothing; this "
                                                r"one asks to disclose \['sketch_points'\]"):
            ws[k].handle(again)


def test_a_slot_whose_counts_were_released_is_answered_once_more_with_its_statistics() -> None:
    """The coordinator's one re-ask: a grid round's counts, then the histogram round on the
    same edges with statistics. A third ask of the slot, in any mode, is refused."""
    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    first = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    counts = dataclasses.replace(first, params={"stats": "count"},
                                 layout=(Block("hist", first.layout[0].shape[:3] + (1,),
                                               (first.layout[0].kinds[0],)),))
    _answered_by_all(ws, counts)
    stats = dataclasses.replace(first, round_id=first.round_id + 1)
    _answered_by_all(ws, stats)
    a = counts.arrays
    again = dataclasses.replace(counts, round_id=first.round_id + 2, arrays={  # not the same task
        "nodes": a["nodes"], "features": a["features"][:, ::-1].copy(),
        "thresholds": a["thresholds"][:, ::-1, :].copy()})
    _refused_by_0_to_2(ws, again)
    n, m, b = first.layout[0].shape[:3]  # the third ask with statistics, in another mode
    full = dataclasses.replace(first, round_id=first.round_id + 2, params={"stats": "full"},
                               layout=(hist_block(cfg, n, m, b),))
    assert question_key(full) != question_key(stats)
    _refused_by_0_to_2(ws, full)


def test_a_categorical_slot_reasked_with_its_cuts_moved_inside_the_level_gaps_is_refused(
        ) -> None:
    """A categorical feature's values are its level codes, so the cuts 0.25, 1.25, 2.25 make
    the bins 0.5, 1.5, 2.5 make, on every client: the same slot."""
    rng = np.random.default_rng(3)
    K, n = 4, 200
    X = rng.uniform(-2, 2, size=(n, 3))
    X[:, 1] = rng.integers(0, 4, size=n)
    X[:, 2] = rng.integers(0, 3, size=n)
    y = X[:, 0] + X[:, 1] + 0.3 * rng.normal(size=n)
    h = np.arange(n) % K
    cfg = JobConfig(job_id="job-c", task="regression", n_features=3, n_clients=K,
                    feature_kinds=("continuous", "categorical", "categorical"),
                    n_levels=(0, 4, 3),
                    feature_bounds=((-2.0, 2.0), (0.0, 3.0), (0.0, 2.0)),
                    target_bound=float(np.abs(y).max()),
                    n_estimators=2, max_depth=3, min_samples_leaf=3, max_features=2, n_bins=8,
                    profile=load_profile("secure").to_dict())
    ws = _workers(cfg, [(X[h == k], y[h == k]) for k in range(K)])
    first = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    _answered_by_all(ws, first)
    feats, thr = first.arrays["features"], first.arrays["thresholds"].copy()
    cat = np.isin(feats, [1, 2])
    assert cat.any()
    moved = cat[:, :, None] & np.isfinite(thr)
    assert moved.any()
    thr[moved] -= 0.25
    again = dataclasses.replace(first, round_id=first.round_id + 1, arrays={
        **first.arrays, "features": np.where(cat, feats, -1), "thresholds": thr})
    assert question_key(again) != question_key(first)
    _refused_by_0_to_2(ws, again, "the histogram of node .*, feature [12] at level .*, with "
                                  "the same cuts, was already released")


def test_a_node_s_totals_asked_through_slots_without_a_cut_are_answered_once() -> None:
    """A slot whose thresholds cut nothing (all +inf, or outside the public bounds) releases
    its node's totals, whatever its feature: the second such ask at the level is refused."""
    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    sketch = Coordinator(cfg).next_task()
    assert sketch is not None
    _answered_by_all(ws, sketch)
    T = cfg.n_estimators

    def uncut(round_id: int, feature: int, threshold: float) -> Task:
        return dataclasses.replace(
            sketch, round_id=round_id, kind=TaskKind.HISTOGRAM, params={"stats": "full"},
            arrays={"nodes": np.arange(T, dtype=np.int64),
                    "features": np.full((T, 1), feature, dtype=np.int64),
                    "thresholds": np.full((T, 1, 1), threshold)},
            layout=(hist_block(cfg, T, 1, 2),))

    _answered_by_all(ws, uncut(sketch.round_id + 1, 0, np.inf))
    _refused_by_0_to_2(ws, uncut(sketch.round_id + 2, 1, 1e300),
                       r"the totals of node 0 at level 0, with the same cuts, was already "
                       "released")
    # beside a slot that has a cut (another feature, never asked), the same totals again
    beside = uncut(sketch.round_id + 2, 1, np.inf)
    feats = np.concatenate([beside.arrays["features"], np.full((T, 1), 2)], axis=1)
    thr = np.concatenate([beside.arrays["thresholds"], np.full((T, 1, 1), 0.123)], axis=1)
    beside = dataclasses.replace(beside, arrays={**beside.arrays, "features": feats,
                                                 "thresholds": thr},
                                 layout=(hist_block(cfg, T, 2, 2),))
    _refused_by_0_to_2(ws, beside, r"the totals of node 0 at level 0, with the same cuts, was "
                                   "already released")


def _job(method: str, sketch: str, missing: bool, binary: bool) -> tuple[JobConfig, list]:
    rng = np.random.default_rng(0)
    K, n, d = 4, 400, 4
    X = rng.uniform(-2, 2, size=(n, d))
    if binary:
        X[:, 1:] = (X[:, 1:] > 0).astype(float)
    y = (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(int)
    if missing:
        X[rng.random((n, d)) < 0.1] = np.nan
    lo, hi = (0.0, 1.0) if binary else (-2.0, 2.0)
    cfg = JobConfig(job_id="job-r", task="classification", n_classes=2, criterion="gini",
                    n_features=d, n_clients=K,
                    feature_bounds=((-2.0, 2.0),) + ((lo, hi),) * (d - 1),
                    missing_allowed=(missing,) * d, n_estimators=3, max_depth=5,
                    min_samples_leaf=3, max_features=2, n_bins=8, method=method,
                    profile=load_profile("secure", sketch=sketch).to_dict())
    h = np.arange(n) % K
    return cfg, [(X[h == k], y[h == k]) for k in range(K)]


@pytest.mark.parametrize(("method", "sketch", "missing", "binary"), [
    ("avgimp", "secure_cdf", False, False),   # grid counts, then gains on the same edges
    ("quantiles", "secure_cdf", True, True),  # grid counts, then statistics; uncut slots
    ("quantiles", "quantiles", False, True),  # nodes whose every slot has no cut
])
def test_an_honest_secure_job_re_asks_nothing_the_clients_refuse(
        method: str, sketch: str, missing: bool, binary: bool) -> None:
    """Honest secure jobs whose rounds ask a slot's counts and then its statistics, and slots
    without a cut, train to the end, to the forest the same rounds give summed in the clear."""
    cfg, clients = _job(method, sketch, missing, binary)
    secure = run_in_process(cfg, clients)
    clear = run_in_process(cfg, clients, aggregator=PlainSum())
    assert len(secure.trees) == cfg.n_estimators
    for a, b in zip(secure.trees, clear.trees, strict=True):
        np.testing.assert_array_equal(a.feature, b.feature)
        np.testing.assert_array_equal(a.kind, b.kind)


def test_a_node_s_sketch_is_disclosed_once_per_level_and_at_the_job_s_number_of_points(
        ) -> None:
    """secure with per-client sketches (r = 2): each sketch shows at most floor(d / r) + 1 of a
    node's d values, but sketches of one node's rows at other numbers of points would show
    quantiles at other ranks, nearly every value in the end (the same rows sit at every root
    without bootstrap). A sketch has the job's n_bins intervals, and a node group's sketch of a
    (node, feature) sketched before at the level is refused."""
    cfg, clients = _secure_config("secure", sketch="quantiles")
    ws = _workers(cfg, clients)
    T = cfg.n_estimators
    routing = Task(job_id=cfg.job_id, round_id=1, kind=TaskKind.SKETCH, level=0,
                   params={"n_nodes": T, "totals": False}, arrays={}, layout=())
    _answered_by_all(ws, routing)  # the level's sketch round, no sketch of a node

    def group(round_id: int, node: int, n_points: int, feats: tuple[int, int] = (0, 1)
              ) -> Task:
        return Task(job_id=cfg.job_id, round_id=round_id, kind=TaskKind.SKETCH, level=0,
                    params={"n_nodes": T, "totals": False, "n_points": n_points},
                    arrays={"nodes": np.array([node], dtype=np.int64),
                            "features": np.array([feats], dtype=np.int64)},
                    layout=(), disclose=("sketch_points",))

    assert cfg.n_bins == 8
    _answered_by_all(ws, group(2, 0, 8))
    # feature 0 of node 0 again, beside a feature not sketched yet (a new question)
    _refused_by_0_to_2(ws, group(3, 0, 8, (2, 0)), "the sketch of node 0, feature 0 at level 0 "
                                                   "was already disclosed")
    for k in (0, 1, 2):  # another node (another root: the same rows without bootstrap)
        with pytest.raises(RefusedRequest, match="a sketch of 5 intervals was asked; this "
                                                 "job's sketches have n_bins = 8") as caught:
            ws[k].handle(group(3, 1, 5))
        assert caught.value.code == "disclosure"
    _answered_by_all(ws, group(4, 1, 8))  # another node: its first sketch


def test_a_node_sketched_in_its_level_s_sketch_round_is_not_sketched_again_in_a_group() -> None:
    cfg, clients = _secure_config("secure", sketch="quantiles")
    ws = _workers(cfg, clients)
    first = Coordinator(cfg).next_task()
    assert first is not None and "sketch_points" in first.disclose
    _answered_by_all(ws, first)
    again = Task(job_id=cfg.job_id, round_id=first.round_id + 1, kind=TaskKind.SKETCH, level=0,
                 params={"n_nodes": cfg.n_estimators, "totals": False, "n_points": 3},
                 arrays={"nodes": np.array([0], dtype=np.int64),
                         "features": first.arrays["features"][:1]},
                 layout=(), disclose=("sketch_points",))
    _refused_by_0_to_2(ws, again, "the sketch of node 0, feature .* at level 0 was already "
                                  "disclosed")
