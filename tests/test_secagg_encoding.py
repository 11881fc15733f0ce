"""Fixed-point ring encoding: round trips, the quantisation bound, overflow as an error."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedforest_secure.errors import OverflowRisk
from fedforest_secure.protocol import StatKind
from fedforest_secure.secagg import RingCodec, decode, encode

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.lists(finite, min_size=4, max_size=4), min_size=1, max_size=12),
    frac_bits=st.integers(min_value=0, max_value=32),
)
def test_sum_of_encodings_is_within_the_quantisation_bound(
        values: list[list[float]], frac_bits: int) -> None:
    k = len(values)
    total = np.zeros(4, dtype=np.uint64)
    for row in values:
        total += encode(np.array(row), frac_bits, 1e6, k)
    got = decode(total, frac_bits)
    exact = np.array([math.fsum(col) for col in zip(*values, strict=True)])
    bound = k * 2.0 ** -(frac_bits + 1)
    # float64 rounding of the decoded value (relative 2^-53) on top of the exact-arithmetic bound
    slack = np.abs(exact) * 2.0**-52
    assert (np.abs(got - exact) <= bound + slack).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=-(2**40), max_value=2**40), min_size=1, max_size=20))
def test_counts_are_exact(counts: list[int]) -> None:
    arr = np.array(counts, dtype=np.float64)
    enc = encode(arr, 0, 2.0**40, 1000)
    assert np.array_equal(decode(enc, 0), arr)
    # The sum of 1000 copies is still exact.
    total = np.zeros_like(enc)
    for _ in range(7):
        total += enc
    assert np.array_equal(decode(total, 0), 7 * arr)


def test_negative_values_use_twos_complement() -> None:
    enc = encode(np.array([-1.0, -0.5, 0.25]), 2, 10.0, 3)
    assert enc.dtype == np.uint64
    assert enc[0] == np.uint64(2**64 - 4)
    assert np.array_equal(decode(enc, 2), np.array([-1.0, -0.5, 0.25]))


def test_value_above_max_abs_names_index_and_value() -> None:
    with pytest.raises(OverflowRisk, match=r"value\[2\] = 11\.5"):
        encode(np.array([0.0, 1.0, 11.5]), 8, 10.0, 5)
    with pytest.raises(OverflowRisk, match=r"value\[1\] = nan"):
        encode(np.array([0.0, np.nan]), 8, 10.0, 5)
    with pytest.raises(OverflowRisk, match=r"value\[0\] = -inf"):
        encode(np.array([-np.inf]), 8, 10.0, 5)


def test_configuration_that_could_overflow_is_rejected() -> None:
    # 2 clients * 2^62 = 2^63 does not fit in int64, even though each value is in range.
    with pytest.raises(OverflowRisk, match="overflow"):
        encode(np.array([1.0]), 62, 1.0, 2)
    encode(np.array([1.0]), 61, 1.0, 3)  # 3 * 2^61 < 2^63: fine
    with pytest.raises(OverflowRisk):
        encode(np.array([1.0]), 61, 1.0, 4)  # 4 * 2^61 = 2^63
    # The largest safe sum really does not wrap.
    k = 3
    enc = encode(np.array([-1.0, 1.0]), 61, 1.0, k)
    total = enc * np.uint64(k)
    assert np.array_equal(decode(total, 61), np.array([-3.0, 3.0]))


def test_ring_codec_per_entry_from_kinds() -> None:
    kinds = [StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ, StatKind.COUNT]
    codec = RingCodec.from_kinds(
        kinds, frac_bits={StatKind.SUM: 20, StatKind.SUMSQ: 16},
        max_abs={StatKind.COUNT: 1e6, StatKind.SUM: 1e4, StatKind.SUMSQ: 1e8}, n_clients=10)
    assert codec.frac_bits.tolist() == [0, 20, 16, 0]
    x = np.array([3.0, 1.2345678, 5.5, 9.0])
    out = codec.decode(codec.encode(x) + codec.encode(x))
    assert out[0] == 6.0 and out[3] == 18.0
    assert (np.abs(out - 2 * x) <= codec.error_bound()).all()
    with pytest.raises(OverflowRisk, match=r"value\[2\]"):
        codec.encode(np.array([1.0, 1.0, 2e8, 1.0]))
    with pytest.raises(ValueError, match="gain"):
        RingCodec.from_kinds([StatKind.GAIN], frac_bits={}, max_abs={}, n_clients=2)
    with pytest.raises(ValueError):
        codec.encode(np.zeros(3))


def test_bad_codec_arguments() -> None:
    with pytest.raises(OverflowRisk):
        RingCodec(np.array([63]), np.array([1.0]), 2)
    with pytest.raises(OverflowRisk):
        RingCodec(np.array([0]), np.array([-1.0]), 2)
    with pytest.raises(ValueError):
        RingCodec(np.array([0, 1]), np.array([1.0]), 2)
    with pytest.raises(ValueError):
        decode(np.zeros(2, dtype=np.int64), 0)


# -- blocked encoder -------------------------------------------------------------------------
def _reference(values: np.ndarray, frac_bits: np.ndarray) -> np.ndarray:
    """round-half-even(values * 2^f) as two's complement uint64, one entry at a time in Python
    integers (independent of the vectorised encoder)."""
    out = []
    for v, f in zip(values.tolist(), frac_bits.tolist(), strict=True):
        out.append(round(v * 2**f) % 2**64)  # Python's round is half-to-even
    return np.array(out, dtype=np.uint64)


@pytest.mark.parametrize("n", [1, 5, (1 << 14) - 1, 1 << 14, 3 * (1 << 14) + 7])
def test_blocked_encoding_matches_exact_rounding(n: int) -> None:
    rng = np.random.default_rng(n)
    values = rng.uniform(-1e3, 1e3, n)
    values[:3] = [0.5 / 2**20, -2.5 / 2**20, 1.5 / 2**20][:min(3, n)]  # exact ties: half-even
    uniform = RingCodec(np.full(n, 20), np.full(n, 1e3), 10)
    got = uniform.encode(values)
    assert np.array_equal(got, _reference(values, np.full(n, 20)))
    # per-entry bits and bounds take the per-entry paths; out= is written, not reallocated
    fb = rng.integers(0, 30, n)
    per_entry = RingCodec(fb, np.where(fb % 2 == 0, 1e3, 2e3), 10)
    out = np.zeros(n, dtype=np.uint64)
    assert per_entry.encode(values, out=out) is out
    assert np.array_equal(out, _reference(values, fb))


def test_blocked_encoding_of_large_values_uses_exact_rounding() -> None:
    # |value * 2^f| >= 2^50: the magic-number shortcut does not apply; results stay exact
    values = np.array([2.0**55 + 2048.0, -(2.0**52) - 1.0, 3.0, 2.0**40 + 0.5])
    codec = RingCodec(np.array([0, 0, 10, 12]), np.array([2.0**56, 2.0**56, 10.0, 2.0**41]), 3)
    assert not codec._bounded
    assert np.array_equal(codec.encode(values), _reference(values, np.array([0, 0, 10, 12])))


def test_out_of_range_value_in_a_later_block_names_its_index() -> None:
    n = 3 * (1 << 14)
    for bound in (np.full(n, 10.0), np.r_[np.full(n - 1, 10.0), 20.0]):  # uniform, per entry
        codec = RingCodec(np.full(n, 8), bound, 5)
        for bad_value in (10.5, np.nan, -np.inf):
            x = np.zeros(n)
            x[(1 << 14) + 17] = bad_value
            with pytest.raises(OverflowRisk, match=rf"value\[{(1 << 14) + 17}\]"):
                codec.encode(x)
            with pytest.raises(OverflowRisk, match=rf"value\[{(1 << 14) + 17}\]"):
                codec.block_encoder(x)((1 << 14), 2 * (1 << 14), np.empty(1 << 14, np.uint64))


def test_block_encoder_fills_any_slice() -> None:
    n = 1000
    codec = RingCodec(np.full(n, 16), np.full(n, 50.0), 4)
    x = np.random.default_rng(3).uniform(-50, 50, n)
    out = np.empty(n, dtype=np.uint64)
    fill = codec.block_encoder(x)
    for a, b in ((0, 300), (300, 301), (301, n)):
        fill(a, b, out[a:b])
    assert np.array_equal(out, codec.encode(x))
    with pytest.raises(ValueError):
        codec.block_encoder(np.zeros(n + 1))


def _same_codec(fast: RingCodec, slow: RingCodec) -> None:
    assert np.array_equal(fast.frac_bits, slow.frac_bits)
    assert np.array_equal(fast.max_abs, slow.max_abs)
    assert fast.size == slow.size and fast.n_clients == slow.n_clients
    assert fast._bounded == slow._bounded
    for a, b in ((fast._scale, slow._scale), (fast._limit, slow._limit)):
        assert type(a) is type(b) or np.array_equal(np.broadcast_to(a, (fast.size,)), b)
        assert np.array_equal(np.broadcast_to(a, (fast.size,)), np.broadcast_to(b, (fast.size,)))


@pytest.mark.parametrize("runs", [
    [([0], 7)],                                  # counts only: every entry alike
    [([0, 1, 2], 5)],                            # count, sum, sum of squares per row
    [([0], 3), ([0, 1, 2], 4), ([3], 2)],        # several blocks, mixed
    [([1], 0), ([0, 1], 3)],                     # an empty block
    [],                                          # no entries at all
])
def test_codec_from_runs_equals_the_per_entry_codec(runs: list) -> None:
    bits = np.array([0, 20, 16, 20])
    bound = np.array([2.0**36, 2.0**28, 2.0**28, 2.0**28])
    codes = np.array([c for pattern, reps in runs for _ in range(reps) for c in pattern],
                     dtype=np.intp)
    fast = RingCodec._from_runs(runs, bits, bound, 10)
    slow = RingCodec(bits[codes], bound[codes], 10)
    _same_codec(fast, slow)
    x = np.random.default_rng(5).uniform(-1e3, 1e3, codes.size)
    assert np.array_equal(fast.encode(x), slow.encode(x))
    assert np.array_equal(fast.decode(fast.encode(x) * np.uint64(3)),
                          slow.decode(slow.encode(x) * np.uint64(3)))
    if codes.size:
        x[-1] = 2.0**40  # out of every bound: the same error, the same index
        with pytest.raises(OverflowRisk, match=rf"value\[{codes.size - 1}\]"):
            fast.encode(x)


def test_codec_from_runs_checks_its_table() -> None:
    with pytest.raises(OverflowRisk, match="overflow"):
        RingCodec._from_runs([([0], 2)], np.array([62]), np.array([1.0]), 2)
    with pytest.raises(ValueError, match="run"):
        RingCodec._from_runs([([3], 2)], np.array([0, 20]), np.array([1.0, 1.0]), 2)
    with pytest.raises(ValueError):
        RingCodec._from_runs([([0], 2)], np.array([0.5]), np.array([1.0]), 2)
