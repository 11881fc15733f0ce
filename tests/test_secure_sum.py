"""The per-round codec of :mod:`fedforest_secure.secure_sum`: built from the layout's runs of
statistic kinds, it must equal the per-entry codec it replaces, entry for entry."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedforest_secure import load_profile
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import OverflowRisk, SumOutOfRange
from fedforest_secure.protocol import (
    Block,
    StatKind,
    Task,
    TaskKind,
    kind_code,
    kinds_vector,
    layout_size,
)
from fedforest_secure.secagg import RingCodec
from fedforest_secure.secure_sum import (
    _MAX_COUNT,
    _MAX_ROWS,
    RingAggregator,
    StatCodec,
    _scales,
    make_codec,
)
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


# ---------------------------------------------------------------- sums no honest sites can make
_SITES = 5


def _ring_sum(uploads: list[np.ndarray]) -> np.ndarray:
    total = np.zeros_like(uploads[0])
    for u in uploads:
        total += u  # uint64: wraps modulo 2^64 like the masked sum
    return total


def _honest_sum(codec: StatCodec, task: Task, sites: int = _SITES, seed: int = 3
                ) -> tuple[np.ndarray, list[np.ndarray]]:
    """``sites`` honest uploads of in-range statistics (counts >= 0, sums of squares >= 0)
    and their ring sum."""
    rng = np.random.default_rng(seed)
    kinds = kinds_vector(task.layout)
    uploads = []
    for _ in range(sites):
        values = rng.uniform(-7.5, 7.5, kinds.size) * 50
        values[kinds == kind_code(C)] = rng.integers(0, 50, int((kinds == kind_code(C)).sum()))
        values[kinds == kind_code(Q)] = np.abs(values[kinds == kind_code(Q)]) * 7.5
        uploads.append(codec.encode(values))
    return _ring_sum(uploads), uploads


@pytest.mark.parametrize(("layout", "task_kind"), [
    ((Block("hist", (2, 3, 4, 3), (C, C, C)),), "classification"),
    ((Block("totals", (3, 3), (C, S, Q)), Block("hist", (2, 2, 3, 3), (C, S, Q))),
     "regression"),
])
def test_a_ring_sum_with_2_63_added_to_one_sites_upload_is_refused_naming_the_entry(
        layout: tuple[Block, ...], task_kind: str) -> None:
    """A malicious site adds 2^63 to every word of its encoded upload (masking does not hide
    this from the sum: the masks cancel). No 5 honest encodings can sum to that (each is
    range-checked before it is encoded), so the sum is refused, naming its first entry."""
    config = _config(task_kind)
    task = _task(layout, round_id=200 + len(layout))
    codec = make_codec(config, task)
    total, uploads = _honest_sum(codec, task)
    assert np.array_equal(codec.decode_sum(total, _SITES), codec.decode(total))  # honest: fine
    poisoned = total + np.uint64(2**63)  # == the sum with site 2's upload + 2^63
    assert np.array_equal(poisoned, _ring_sum([u + np.uint64(2**63) if k == 2 else u
                                               for k, u in enumerate(uploads)]))
    with pytest.raises(SumOutOfRange) as err:
        codec.decode_sum(poisoned, _SITES)
    assert err.value.entry == 0
    assert "outside what 5 sites' encodings can sum to (entry 0: value -9.22" in str(err.value)
    assert "a site sent values outside the codec's range" in str(err.value)


def test_a_sum_poisoned_in_one_entry_names_that_entry_and_its_bound() -> None:
    config = _config("regression")
    layout = (Block("hist", (2, 3, 4, 3), (C, S, Q)),)
    task = _task(layout, round_id=210)
    codec = make_codec(config, task)
    total, _ = _honest_sum(codec, task)
    sum_entry = 3 * 5 + 1  # a sum of y: |sum| <= 5 x 2^28 x 7.5 (the target bound)
    bad = total.copy()
    bad[sum_entry] = (int(bad[sum_entry]) + 6 * 2**52) % 2**64  # six sites' largest sums
    with pytest.raises(SumOutOfRange) as err:
        codec.decode_sum(bad, _SITES)
    assert err.value.entry == sum_entry
    assert err.value.bound == 5 * 2.0**28 * 7.5
    assert f"entry {sum_entry}: value " in str(err.value)
    assert "bound 1.00663e+10" in str(err.value)
    # the same sum is within what six sites can make
    assert codec.decode_sum(bad, 6).shape == (layout_size(layout),)


def test_the_largest_sums_honest_sites_can_make_are_accepted() -> None:
    config = _config("regression")
    layout = (Block("hist", (2, 3, 4, 3), (C, S, Q)),)
    task = _task(layout, round_id=220)
    codec = make_codec(config, task)
    kinds = kinds_vector(layout)
    top = np.where(kinds == kind_code(C), _MAX_COUNT, _MAX_ROWS * np.where(
        kinds == kind_code(Q), 7.5**2, 7.5))
    low = np.where(kinds == kind_code(S), -top, 0.0)
    for values in (top, low):
        total = codec.encode(values) * np.uint64(_SITES)
        assert np.array_equal(codec.decode_sum(total, _SITES), values * _SITES)


@pytest.mark.parametrize("kind", [C, Q])
def test_a_negative_count_or_sum_of_squares_in_a_sum_without_noise_is_refused(
        kind: StatKind) -> None:
    """Honest encodings of counts and sums of squares are never negative (no DP noise in this
    job): a sum below zero was made by a site that sent a negative value."""
    config = _config("regression")
    layout = (Block("hist", (2, 3, 4, 3), (C, S, Q)),)
    task = _task(layout, round_id=230 + kind_code(kind))
    codec = make_codec(config, task)
    entry = 6 + [C, S, Q].index(kind)
    total = np.zeros(layout_size(layout), dtype=np.uint64)
    total[entry] = np.uint64(2**64 - 1)  # -1 ring unit
    with pytest.raises(SumOutOfRange, match=rf"entry {entry}: value -.*, bound \[0, "):
        codec.decode_sum(total, _SITES)


def test_under_dp_noise_a_slightly_negative_count_is_accepted_and_2_63_is_not() -> None:
    """DP sites add discrete-Gaussian noise to their encodings in the ring: a noisy count may
    come out below zero, and up to the sampler's largest draw beyond the codec's range, per
    site; 2^63 is still far outside."""
    base = _config("classification")
    config = dataclasses.replace(base, profile=load_profile("secure-dp", epsilon=4.0).to_dict())
    layout = (Block("hist", (2, 3, 4, 3), (C, C, C)),)
    task = _task(layout, round_id=240)
    codec = make_codec(config, task)
    total = np.zeros(layout_size(layout), dtype=np.uint64)
    total[4] = np.uint64(2**64 - 3)  # -3: noise
    assert codec.decode_sum(total, _SITES)[4] == -3.0
    with pytest.raises(SumOutOfRange, match=r"entry 0: "):
        codec.decode_sum(total + np.uint64(2**63), _SITES)


def test_a_packed_sum_with_2_63_added_to_one_upload_is_refused_naming_the_entry() -> None:
    """Packed grid cells (count and sum of y in one word): 2^63 lands in the count lane's top
    bit, which the pooled counts of a lane the coordinator sized never reach."""
    config = _config("regression")
    layout = (Block("totals", (3, 3), (C, S, Q)), Block("grid", (2, 4, 2), (C, S)))
    task = Task(job_id="codec", round_id=250, kind=TaskKind.HISTOGRAM, level=0,
                layout=layout, params={"pack": 20})
    codec = make_codec(config, task)
    assert codec.packing is not None
    rng = np.random.default_rng(4)
    values = np.abs(rng.uniform(0, 7.5, layout_size(layout))).round()
    total = codec.encode(values) * np.uint64(_SITES)
    assert np.allclose(codec.decode_sum(total, _SITES), values * _SITES)
    with pytest.raises(OverflowRisk, match=r"entry 9: .* lane wrapped"):
        codec.decode_sum(total + np.uint64(2**63), _SITES)


def test_the_in_process_secure_sum_refuses_a_sum_no_honest_sites_can_make() -> None:
    """:class:`RingAggregator` (the in-process run's masked sum) checks the unmasked sum too."""
    config = _config("classification")
    layout = (Block("hist", (2, 3, 4, 3), (C, C, C)),)
    task = _task(layout, round_id=260)
    codec = make_codec(config, task)
    _, uploads = _honest_sum(codec, task)
    agg = RingAggregator(config)
    encoded = dict(enumerate(uploads))
    assert np.array_equal(agg.sum_encoded(task, encoded),
                          codec.decode(_ring_sum(uploads)))
    encoded[2] = encoded[2] + np.uint64(2**63)
    with pytest.raises(SumOutOfRange, match=r"outside what 5 sites' encodings can sum to "
                                            r"\(entry 0"):
        agg.sum_encoded(task, encoded)


@pytest.mark.parametrize(("sites", "most"), [(3, 33), (4, 32), (5, 32), (9, 31), (17, 30)])
def test_frac_bits_above_what_the_sites_ring_sums_hold_are_refused_naming_the_most(
        sites: int, most: int) -> None:
    """A site's sum of y (up to 2^28 rows' worth) scaled by 2^frac_bits, summed over the sites,
    must fit the signed 64-bit ring: the largest frac_bits the sites allow is accepted, one
    more is refused up front, by the aggregator and by the codec, with that largest value."""
    def config(frac_bits: int, task: str) -> JobConfig:
        return dataclasses.replace(_config(task), n_clients=sites, profile=load_profile(
            "secure", frac_bits=frac_bits).to_dict())

    layout = (Block("totals", (3, 3), (C, S, Q)),)
    for task in ("regression", "classification"):
        make_codec(config(most, task), _task(layout, round_id=270 + sites))
        RingAggregator(config(most, task))
        too_many = config(most + 1, task)
        expected = (rf"frac_bits = {most + 1} is more than {sites} sites' fixed-point sums "
                    rf"hold: at most {most}")
        with pytest.raises(OverflowRisk, match=expected):
            RingAggregator(too_many)
        with pytest.raises(OverflowRisk, match=expected):
            make_codec(too_many, _task(layout, round_id=280 + sites))
