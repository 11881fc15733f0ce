"""The per-round codec of :mod:`fedforest_secure.secure_sum`: built from the layout's runs of
statistic kinds, it must equal the per-entry codec it replaces, entry for entry."""

from __future__ import annotations

import numpy as np
import pytest

from fedforest_secure import load_profile
from fedforest_secure.config import JobConfig
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind, kinds_vector, layout_size
from fedforest_secure.secagg import RingCodec
from fedforest_secure.secure_sum import _MAX_COUNT, _MAX_ROWS, _scales, make_codec
from server_app.engine import plain_bounds

C, S, Q = StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ


def _config(task: str = "regression") -> JobConfig:
    return JobConfig(job_id="codec", task=task, n_features=3, n_clients=5,
                     feature_bounds=((-5.0, 5.0),) * 3, target_bound=7.5, n_classes=3,
                     n_estimators=2, max_depth=3, min_samples_leaf=3, max_features=2, n_bins=8,
                     criterion="gini" if task == "classification" else "mse",
                     profile=load_profile("secure").to_dict())


def _task(layout: tuple[Block, ...], round_id: int) -> Task:
    return Task(job_id="codec", round_id=round_id, kind=TaskKind.HISTOGRAM, level=0,
                layout=layout)


def _reference(config: JobConfig, task: Task) -> tuple[RingCodec, np.ndarray]:
    """The per-entry construction (one value per entry, checked entry by entry)."""
    kinds = kinds_vector(task.layout).astype(np.intp)
    frac = int(config.profile.get("frac_bits", 24))
    scales = _scales(config)
    scale = np.array([scales[k.value] for k in StatKind])[kinds]
    bits = np.array([0 if k is C else frac for k in StatKind], dtype=np.int64)[kinds]
    bound = np.array([_MAX_COUNT if k is C else _MAX_ROWS for k in StatKind])[kinds]
    return RingCodec(bits, bound, config.n_clients), scale


@pytest.mark.parametrize(("layout", "task_kind"), [
    ((Block("counts", (4, 3, 5, 1), (C,)),), "regression"),
    ((Block("hist", (2, 3, 4, 3), (C, S, Q)),), "regression"),
    ((Block("totals", (3, 3), (C, S, Q)), Block("hist", (2, 2, 3, 3), (C, S, Q)),
      Block("empty", (0, 2), (C, S))), "regression"),
    ((Block("hist", (2, 3, 4, 3), (C, C, C)),), "classification"),
    ((), "regression"),
])
def test_codec_equals_the_per_entry_codec(layout: tuple[Block, ...], task_kind: str) -> None:
    config = _config(task_kind)
    task = _task(layout, round_id=len(layout) + 100 * (task_kind == "classification"))
    codec = make_codec(config, task)
    ring, scale = _reference(config, task)
    n = layout_size(layout)
    assert codec.ring.size == ring.size == n
    assert np.array_equal(codec.ring.frac_bits, ring.frac_bits)
    assert np.array_equal(codec.ring.max_abs, ring.max_abs)
    assert np.array_equal(np.broadcast_to(codec.scale, (n,)), scale)
    x = np.random.default_rng(1).uniform(-7.5, 7.5, n)
    want = ring.encode(x / scale)
    assert np.array_equal(codec.encode(x), want)
    assert np.array_equal(codec.decode(want * np.uint64(3)), ring.decode(want * np.uint64(3))
                          * scale)
    assert np.array_equal(codec.quantum(), scale * np.ldexp(1.0, -ring.frac_bits))
    bounds = plain_bounds(config, task)  # the server's range check reads the same codec
    assert np.array_equal(bounds.value, np.minimum(ring.max_abs * scale,
                                                   np.finfo(np.float64).max / 10))


def test_the_codec_cache_is_safe_for_the_sites_threads_of_one_process() -> None:
    """Several sites' clients run as threads of one process (``client_group``), each asking
    for its round's codec: the cache's eviction raced (two threads popped the same oldest
    entry, and one site stopped on a KeyError mid-round)."""
    import sys
    import threading

    layout = (Block("hist", (3, 2), (StatKind.COUNT, StatKind.SUM)),)
    configs = [_config() for _ in range(6)]  # distinct objects: distinct cache keys
    errors: list[BaseException] = []

    def ask(k: int) -> None:
        try:
            for r in range(300):
                make_codec(configs[(k + r) % len(configs)], _task(layout, r % 3))
        except BaseException as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the race shows within a few calls
    try:
        threads = [threading.Thread(target=ask, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
