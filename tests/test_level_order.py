"""The worker's level order: packed and unpacked keys, compaction, chunking, the inverse table.

Every variant must give the same sketch points and histograms as a direct computation from the
rows (numpy sorting and counting per node, no shared code with the worker's fast path).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedforest_secure import _kernels, _level_stats, _order
from fedforest_secure.config import JobConfig
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind
from fedforest_secure.worker import Worker

REG = (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)


def _cfg(**kw: Any) -> JobConfig:
    base: dict[str, Any] = dict(job_id="job", task="regression", n_features=4, n_clients=3,
                                n_estimators=6, max_features=2, n_bins=8, bootstrap=True,
                                profile={"name": "open", "rows_per_sketch_point": 1})
    base.update(kw)
    return JobConfig(**base)


def _tasks(cfg: JobConfig, X: np.ndarray, seed: int) -> tuple[Task, Task]:
    """A level-0 sketch task (random slot features, one unused slot) and a histogram task
    with sorted thresholds drawn from the data, plus infinite padding."""
    rng = np.random.default_rng(seed)
    T, d = cfg.n_estimators, cfg.n_features
    feats = np.stack([rng.choice(d, 2, replace=False) for _ in range(T)]).astype(np.int64)
    feats[0, 1] = -1  # an unused slot
    sketch = Task(job_id="job", round_id=1, kind=TaskKind.SKETCH, level=0,
                  params={"n_nodes": T, "n_points": cfg.n_bins},
                  arrays={"features": feats}, layout=(Block("totals", (T, 3), REG),),
                  disclose=("sketch_points",))
    thr = np.sort(rng.choice(X.ravel(), size=(T, 2, 5)), axis=2)
    thr[:, :, -1] = np.inf
    hist = Task(job_id="job", round_id=2, kind=TaskKind.HISTOGRAM, level=0,
                params={"stats": "full"},
                arrays={"nodes": np.arange(T), "features": feats, "thresholds": thr},
                layout=(Block("h", (T, 2, 6, 3), REG),))
    return sketch, hist


def _run(cfg: JobConfig, X: np.ndarray, y: np.ndarray, **kw: Any) -> tuple[np.ndarray, ...]:
    w = Worker(cfg, X, y, client_index=0, seed=7, **kw)
    sk, hi = _tasks(cfg, X, 3)
    r1 = w.handle(sk)
    r2 = w.handle(hi)
    return r1.summable, r1.disclosed["sketch_points"], r2.summable


def _reference_hist(cfg: JobConfig, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Histogram straight from the rows: multiplicities recovered from a worker's own
    bootstrap seed are not needed, because with sampling 'all' every row counts once."""
    _, hi = _tasks(cfg, X, 3)
    feats, thr = hi.arrays["features"], hi.arrays["thresholds"]
    T = cfg.n_estimators
    out = np.zeros((T, 2, 6, 3))
    for t in range(T):
        for s in range(2):
            j = feats[t, s]
            if j < 0:
                continue
            b = np.searchsorted(thr[t, s], X[:, j], side="left")  # bin: t_{b-1} < x <= t_b
            for k in range(6):
                sel = b == k
                out[t, s, k] = [sel.sum(), y[sel].sum(), (y[sel] ** 2).sum()]
    return out.ravel()


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = np.round(rng.normal(size=(300, 4)), 1)  # ties on purpose
    y = rng.normal(size=300)
    return X, y


def test_histogram_matches_rows_directly(data: tuple[np.ndarray, np.ndarray]) -> None:
    X, y = data
    cfg = _cfg(row_sampling="all", bootstrap=False)
    _, _, hist = _run(cfg, X, y)
    np.testing.assert_allclose(hist, _reference_hist(cfg, X, y), rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("keep", [True, "compact", False, None])
def test_keep_free_and_auto_give_identical_replies(data: tuple[np.ndarray, np.ndarray],
                                                  keep: bool | str | None) -> None:
    X, y = data
    cfg = _cfg()
    ref = _run(cfg, X, y, keep_level_order=True)
    got = _run(cfg, X, y, keep_level_order=keep)
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_compact_order_is_used_between_rounds(data: tuple[np.ndarray, np.ndarray]) -> None:
    X, y = data
    cfg = _cfg()
    w = Worker(cfg, X, y, client_index=0, seed=7, keep_level_order="compact")
    sk, _ = _tasks(cfg, X, 3)
    w.handle(sk)
    order = w._sorted
    assert order is not None and order.key is None  # compacted: 5 bytes per entry
    assert order._code is not None and order._code.dtype == np.uint16


def test_small_chunks_change_nothing(data: tuple[np.ndarray, np.ndarray],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy code's runs of blocks (the compiled loops take every block in one pass)."""
    monkeypatch.setattr(_kernels, "KERNELS", None)
    X, y = data
    cfg = _cfg()
    ref = _run(cfg, X, y)
    monkeypatch.setattr(_order, "CHUNK_ENTRIES", 37)  # many runs, blocks split across none
    got = _run(cfg, X, y)
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_unpacked_keys_give_the_same_answers(data: tuple[np.ndarray, np.ndarray]) -> None:
    """The fallback (block|code key, rows and weights beside it) for levels too wide to pack
    into 62 bits: forced here with a code field of 44 bits."""
    X, y = data
    cfg = _cfg()
    ref = _run(cfg, X, y)
    w = Worker(cfg, X, y, client_index=0, seed=7)
    w._cbits, w._ustride = 44, 1 << 44
    sk, hi = _tasks(cfg, X, 3)
    r1 = w.handle(sk)
    assert w._sorted is not None and not w._sorted.packed and w._sorted.key is not None
    r2 = w.handle(hi)
    got = (r1.summable, r1.disclosed["sketch_points"], r2.summable)
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=200),
       st.lists(st.floats(0.0, 1.0), min_size=1, max_size=50))
def test_inverse_table_equals_binary_search(w: list[int], fr: list[float]) -> None:
    wa = np.array(w, dtype=np.int64)
    cw = np.cumsum(wa)
    target = np.array(fr) * cw[-1]
    target = np.maximum(target, 0.5)
    got = _order.first_reaching(cw, target)
    np.testing.assert_array_equal(got, np.searchsorted(cw, target, side="left"))


@pytest.mark.parametrize("subset", [False, True])
def test_bins_by_entries_and_by_cuts_give_the_same_histogram(
        data: tuple[np.ndarray, np.ndarray], monkeypatch: pytest.MonkeyPatch,
        subset: bool) -> None:
    """Entries placed among the thresholds, or thresholds among the entries (the numpy
    code's two strategies; the compiled loop walks each block): the same bins and the same
    sums bit for bit, also when only some nodes are evaluated (the others' entries lie in
    between) and with a cut below every value (-inf: its bin is empty)."""
    monkeypatch.setattr(_kernels, "KERNELS", None)
    X, y = data
    cfg = _cfg()
    sk, hi = _tasks(cfg, X, 3)
    nodes = np.arange(cfg.n_estimators)[1::2] if subset else np.arange(cfg.n_estimators)
    thr = hi.arrays["thresholds"][nodes].copy()
    thr[0, 0, 0] = -np.inf
    hi = Task(job_id="job", round_id=2, kind=TaskKind.HISTOGRAM, level=0,
              params={"stats": "full"},
              arrays={"nodes": nodes, "features": hi.arrays["features"][nodes],
                      "thresholds": thr},
              layout=(Block("h", (nodes.size, 2, 6, 3), REG),))
    out = {}
    for ratio in (0.0, 1e9):  # 0: every run by entries; 1e9: every run by cuts
        monkeypatch.setattr(_level_stats, "ENTRY_SEARCH_RATIO", ratio)
        w = Worker(cfg, X, y, client_index=0, seed=7)
        w.handle(sk)
        out[ratio] = w.handle(hi).summable.reshape(nodes.size, 2, 6, 3)
    np.testing.assert_array_equal(out[0.0], out[1e9])
    assert out[0.0][0, 0, 0].tolist() == [0.0, 0.0, 0.0]  # nothing is <= -inf
    feats = hi.arrays["features"]
    counts = out[0.0][..., 0].sum(axis=2)  # every row of a used slot in one bin
    assert (counts[feats >= 0] == counts[feats >= 0][0]).all() and counts[0, 0] > 0
