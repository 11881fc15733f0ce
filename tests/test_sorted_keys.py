"""The one-sort set operations on key arrays give what numpy's set functions give."""

from __future__ import annotations

import numpy as np
import pytest

from fedforest_secure._sorted import distinct, has_repeats


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_distinct_is_numpy_unique(dtype: type) -> None:
    rng = np.random.default_rng(3)
    for size in (0, 1, 2, 7, 5_000):
        a: np.ndarray = rng.integers(0, max(2, size // 3), size).astype(dtype)
        got = distinct(a)
        want = np.unique(a)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_has_repeats_finds_one_repeated_value() -> None:
    a = np.arange(1_000, dtype=np.int64)[::-1].copy()
    assert not has_repeats(a)
    assert not has_repeats(a[:1]) and not has_repeats(a[:0])
    a[500] = a[17]
    assert has_repeats(a)
