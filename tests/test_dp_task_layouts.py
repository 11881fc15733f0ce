"""A malicious server against a secure-dp client's noise: tasks whose feature slots or statistic
kinds differ from what the job's plan releases.

The noise of a release is calibrated for the plan's layout (``max_features`` feature slots per
node, ``d`` slots in the random-split marginal counts; sums of y noised at the target bound's
scale). A server that repeats one feature in many slots gets a fresh noise draw per slot and
averages them away; one that labels sums as counts gets count noise on them. The client refuses
both before it reads a row; honest jobs of every method still train.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from fedforest_secure import load_profile
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import ProtocolError
from fedforest_secure.federation import client_seed, run_in_process
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind
from fedforest_secure.worker import Worker

JOB = "job-slots"
K, N, D = 4, 400, 4


def _data(task: str, n: int = N, seed: int = 3) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, D))
    if task == "classification":
        y = (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(np.int64)
    else:
        y = np.clip(40 + 20 * X[:, 0] + 3 * rng.normal(size=n), 0, 100)
    h = np.arange(n) % K
    return [(X[h == k], y[h == k]) for k in range(K)]


def _config(task: str = "classification", profile: str = "secure-dp", **kw: Any) -> JobConfig:
    prof = kw.pop("prof", {})
    base: dict[str, Any] = dict(job_id=JOB, task=task, n_features=D, n_clients=K,
                                feature_bounds=((-2.0, 2.0),) * D, n_estimators=2, max_depth=3,
                                min_samples_leaf=3, max_features=2, n_bins=4,
                                profile=load_profile(profile, **prof).to_dict())
    if task == "classification":
        base.update(n_classes=2, criterion="gini")
    else:
        base["target_bound"] = 50.0
    base.update(kw)
    return JobConfig(**base)


def _workers(cfg: JobConfig, task: str) -> list[Worker]:
    return [Worker(cfg, X, y, client_index=k, seed=client_seed(cfg, k))
            for k, (X, y) in enumerate(_data(task))]


def _advance(coord: Coordinator, ws: list[Worker], stop: Any) -> Task:
    """Run honest rounds (plain sums) until the coordinator issues a task with ``stop(task)``."""
    task = coord.next_task()
    while task is not None and not stop(task):
        rep = {k: wk.handle(task) for k, wk in enumerate(ws)}
        coord.submit(task.round_id, np.sum([r.summable for r in rep.values()], axis=0),
                     participants=sorted(rep))
        task = coord.next_task()
    assert task is not None
    return task


def _histogram(round_id: int, n_nodes: int, feats: np.ndarray, n_bins: int,
               stats: str = "full", n_stats: int = 2) -> Task:
    """A level-0 histogram task of ``feats`` (one row per node) at fixed cuts."""
    m = feats.shape[1]
    thr = np.tile(np.linspace(-2, 2, n_bins + 1)[1:-1], (n_nodes, m, 1))
    kinds = (StatKind.COUNT,) * n_stats
    return Task(job_id=JOB, round_id=round_id, kind=TaskKind.HISTOGRAM, level=0,
                params={"stats": stats},
                arrays={"nodes": np.arange(n_nodes, dtype=np.int64), "features": feats,
                        "thresholds": thr},
                layout=(Block("hist" if stats == "full" else "counts",
                              (n_nodes, m, n_bins, n_stats), kinds),))


# -- feature slots ----------------------------------------------------------------------------
def _ask_slots(w: Worker, sketch: Task, feats: np.ndarray, n_bins: int, stats: str = "full",
               n_stats: int = 2) -> None:
    """The server's sketch sorting ``feats`` (a histogram must match its sketch's features),
    then the histogram of ``feats``, asked of one client."""
    arrays = {**sketch.arrays, "features": feats}
    w.handle(dataclasses.replace(sketch, arrays=arrays))
    w.handle(_histogram(sketch.round_id + 1, feats.shape[0], feats, n_bins, stats, n_stats))


def test_a_dp_client_refuses_a_histogram_with_more_feature_slots_than_its_plan() -> None:
    """Greedy histogram job (max_features = 2): feature 0 in 5000 slots of one histogram would
    carry 5000 fresh noise draws of the calibrated sigma; their average is the exact class
    histogram (one release of the budget, epsilon ~52 by the library's accountant)."""
    cfg = _config(method="histogram")
    ws = _workers(cfg, "classification")
    sketch = Coordinator(cfg).next_task()
    assert sketch is not None and sketch.kind is TaskKind.SKETCH
    assert sketch.arrays["features"].shape == (2, 2)
    with pytest.raises(ProtocolError, match=r"5000 feature slots per node; the job's plan "
                                            r"evaluates at most 2"):
        _ask_slots(ws[0], sketch, np.zeros((2, 5000), dtype=np.int64), 4)


def test_a_client_refuses_a_histogram_that_repeats_a_feature_in_a_node() -> None:
    """Within the plan's number of slots, one feature twice in a node is still two noise
    draws on one statistic."""
    cfg = _config(method="histogram")
    ws = _workers(cfg, "classification")
    sketch = Coordinator(cfg).next_task()
    assert sketch is not None
    feats = np.array([[1, 1], [2, 3]], dtype=np.int64)
    with pytest.raises(ProtocolError, match=r"node 0 repeats feature 1"):
        _ask_slots(ws[0], sketch, feats, 4)


def test_a_client_refuses_feature_indices_below_the_empty_slots_minus_one() -> None:
    cfg = _config(method="histogram")
    ws = _workers(cfg, "classification")
    sketch = Coordinator(cfg).next_task()
    assert sketch is not None
    feats = np.array([[-2, 1], [2, 3]], dtype=np.int64)
    with pytest.raises(ProtocolError, match=r"-1 \(an empty slot\)"):
        _ask_slots(ws[0], sketch, feats, 4)


@pytest.mark.parametrize("feats", ["2000_slots", "repeated"])
def test_a_random_dp_client_refuses_marginal_counts_beyond_the_d_features(feats: str) -> None:
    """Random splits: the level-0 marginal counts release d slots per root. Feature 0 in 2000
    slots would average its count noise away (the exact marginal); feature 0 in all d slots
    would release it d times."""
    cfg = _config(method="random", n_bins=8, row_sampling="all", max_features=1,
                  prof={"epsilon": 4.0})  # epsilon > 2: no class totals block
    ws = _workers(cfg, "classification")
    # the honest group sketch of root 0 before the marginal counts: features (1, d)
    group = _advance(Coordinator(cfg), ws, lambda t: "nodes" in t.arrays)
    assert group.arrays["features"].shape == (1, D)
    R = 2000 if feats == "2000_slots" else D
    match = ("2000 feature slots per node; the job's plan evaluates at most 4"
             if feats == "2000_slots" else "node 0 repeats feature 0")
    with pytest.raises(ProtocolError, match=match):
        _ask_slots(ws[0], group, np.zeros((1, R), dtype=np.int64), cfg.n_bins, "count", 1)


# -- statistic kinds --------------------------------------------------------------------------
def _relabelled(variant: str, block: Block) -> tuple[Block, ...]:
    if variant == "sums_as_counts":
        return (Block(block.name, block.shape, (StatKind.COUNT,) * 3),)
    # the right kinds, shifted by one entry: every sum of y lands on a count column
    rows = block.size // 3
    return (Block("pad", (1,), (StatKind.COUNT,)),
            Block(block.name, (rows - 1, 3), block.kinds),
            Block("tail", (2,), (StatKind.COUNT, StatKind.COUNT)))


@pytest.mark.parametrize("variant", ["sums_as_counts", "shifted_blocks"])
def test_a_dp_client_refuses_a_regression_histogram_whose_layout_relabels_its_sums(
        variant: str) -> None:
    """A regression histogram whose layout calls the sums of y (and y^2) counts: the client
    would encode them at scale 1 and add the count noise (std on a bin's sum of y ~130
    instead of ~6500)."""
    cfg = _config("regression", method="histogram")
    ws = _workers(cfg, "regression")
    task = _advance(Coordinator(cfg), ws, lambda t: bool(t.layout))
    assert task.kind is TaskKind.HISTOGRAM
    (block,) = task.layout
    assert block.kinds == (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)
    evil = dataclasses.replace(task, layout=_relabelled(variant, block))
    with pytest.raises(ProtocolError, match="statistic kinds"):
        ws[0].handle(evil)


def test_a_client_refuses_a_classification_count_block_labelled_as_sums() -> None:
    cfg = _config(method="histogram")
    ws = _workers(cfg, "classification")
    task = _advance(Coordinator(cfg), ws, lambda t: bool(t.layout))
    (block,) = task.layout
    evil = dataclasses.replace(task, layout=(Block(block.name, block.shape,
                                                   (StatKind.COUNT, StatKind.SUM)),))
    with pytest.raises(ProtocolError, match="statistic kinds"):
        ws[0].handle(evil)


# -- honest jobs ------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.parametrize("method", ["histogram", "quantiles", "random"])
def test_an_honest_secure_dp_job_still_trains(task: str, method: str) -> None:
    """Every client answers every round of an honest secure-dp job (secure sum in process):
    the forest has its trees, and they split."""
    cfg = _config(task, method=method, n_estimators=3, max_depth=3, n_bins=8,
                  prof={"epsilon": 8.0})
    model = run_in_process(cfg, _data(task, n=2000))
    assert len(model.trees) == 3
    assert sum(int((t.left >= 0).sum()) for t in model.trees) > 0
    X, y = _data(task, n=400, seed=9)[0]
    pred = model.predict(X)
    assert pred.shape == y.shape and np.isfinite(pred).all()
