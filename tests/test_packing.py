"""Packed grid cells (fedforest_secure._packing): one word per (count, sum y) cell under secure
aggregation, unpacked by the server into the very ring sums an unpacked upload gives."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from fedforest_secure import FedForestRegressor, load_profile
from fedforest_secure._packing import Packing, count_lane_bits, packs
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import OverflowRisk
from fedforest_secure.protocol import Block, StatKind

F = 24
TOTALS = Block("totals", (3, 3), (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ))
HIST = Block("hist", (3, 2, 4, 2), (StatKind.COUNT, StatKind.SUM))


def _client_entries(rng: np.random.Generator, n_rows: int, sizes: tuple[int, ...],
                    bound: float = 1.0) -> np.ndarray:
    """Ring encodings of a layout (totals, hist): random counts, sums with |mean| <= bound."""
    totals = rng.integers(-2**40, 2**40, sizes[0]).astype(np.int64).view(np.uint64)
    cells = sizes[1] // 2
    counts = rng.integers(0, n_rows + 1, cells)
    means = rng.uniform(-bound, bound, cells)
    sums = np.rint(counts * means * 2.0**F).astype(np.int64)
    hist = np.empty(sizes[1], dtype=np.int64)
    hist[0::2], hist[1::2] = counts, sums
    return np.concatenate([totals, hist.view(np.uint64)])


@pytest.mark.parametrize("n_rows", [0, 1, 1000, 30_000])
def test_the_sum_of_packed_uploads_unpacks_to_the_sum_of_the_entries(n_rows: int,
                                                                     kernels: str) -> None:
    rng = np.random.default_rng(n_rows)
    K = 7
    bits = count_lane_bits(K * max(n_rows, 1), F, K)
    assert bits is not None
    packing = Packing.of((TOTALS, HIST), bits, F)
    assert packing is not None
    assert (packing.entries, packing.words) == (9 + 48, 9 + 24)
    entries = [_client_entries(rng, n_rows, (TOTALS.size, HIST.size)) for _ in range(K)]
    want = np.zeros(packing.entries, dtype=np.uint64)
    got = np.zeros(packing.words, dtype=np.uint64)
    for e in entries:
        want += e  # wraps modulo 2^64, as the masked sum does
        got += packing.pack(e)
    assert np.array_equal(packing.unpack(got), want)


def test_lanes_hold_the_extremes_the_coordinator_allows(kernels: str) -> None:
    K, N = 10, 100_000
    bits = count_lane_bits(N, F, K)
    assert bits == N.bit_length() + 1
    packing = Packing.of((HIST,), bits, F)
    assert packing is not None
    # one client holds every row of every cell, at +2 and -2 times the bound (the check's
    # limit); another holds nothing
    full = np.empty(HIST.size, dtype=np.int64)
    full[0::2] = N
    full[1::2] = np.where(np.arange(HIST.size // 2) % 2 == 0, 2 * N * 2**F, -2 * N * 2**F)
    empty = np.zeros(HIST.size, dtype=np.uint64)
    total = packing.pack(full.view(np.uint64)) + packing.pack(empty)
    assert np.array_equal(packing.unpack(total), full.view(np.uint64))


def test_counts_and_forests_that_do_not_fit_are_not_packed() -> None:
    assert count_lane_bits(10_000, F, 10) == 15
    assert count_lane_bits(0, F, 10) == 2
    assert count_lane_bits(1e6, F, 10) is None  # 4 N 2^f no longer fits the sum lane
    assert count_lane_bits(float("nan"), F, 10) is None
    assert count_lane_bits(-1.0, F, 10) is None
    assert Packing.of((TOTALS,), 15, F) is None  # no (count, sum) block: nothing to pack
    # 20 bits with 24 fraction bits: a cell's largest sum would not fit its 44-bit sum lane
    for bad in (1, 41, 20, 15.0, True, "15"):
        with pytest.raises(ValueError, match="count lane"):
            Packing.of((HIST,), bad, F)  # type: ignore[arg-type]
    assert Packing.of((HIST,), 19, F) is not None


@pytest.mark.parametrize("cell", ["negative count", "count over the lane", "sum over 2 count",
                                  "sum under -2 count", "sum with no rows"])
def test_a_cell_outside_the_lanes_is_refused_before_it_is_packed(cell: str,
                                                                 kernels: str) -> None:
    bits = 15
    packing = Packing.of((HIST,), bits, F)
    assert packing is not None
    entries = np.zeros(HIST.size, dtype=np.int64)
    entries[0::2], entries[1::2] = 5, 3 * 2**F
    count, total = {"negative count": (-1, 0),
                    "count over the lane": (2**(bits - 1), 0),
                    "sum over 2 count": (5, 10 * 2**F + 1),
                    "sum under -2 count": (5, -10 * 2**F - 1),
                    "sum with no rows": (0, 1)}[cell]
    entries[6], entries[7] = count, total
    with pytest.raises(OverflowRisk, match="entry 6: .*does not fit the task's packing"):
        packing.pack(entries.view(np.uint64))
    with pytest.raises(ValueError, match="uint64 entries"):
        packing.pack(entries)
    with pytest.raises(ValueError, match="uint64 words"):
        packing.unpack(np.zeros(3, dtype=np.uint64))


def _config(profile: str, **kw: object) -> JobConfig:
    return JobConfig(job_id="p", task="regression", n_features=2, n_clients=3,
                     feature_bounds=((0.0, 1.0),) * 2, target_bound=1.0,
                     profile=load_profile(profile, **kw).to_dict())


def test_only_masked_regression_without_noise_packs() -> None:
    assert packs(_config("secure"))
    assert not packs(_config("secure", secure_aggregation=False))
    assert not packs(_config("open"))
    assert not packs(_config("secure-dp"))
    assert not packs(dataclasses.replace(_config("secure"), task="classification",
                                         n_classes=2, criterion="gini"))


def test_a_packed_secure_fit_grows_the_forest_of_the_unpacked_plain_sums(
        monkeypatch: pytest.MonkeyPatch) -> None:
    packed_uploads = []
    pack = Packing.pack

    def counted(self: Packing, entries: np.ndarray) -> np.ndarray:
        packed_uploads.append(entries.size)
        return pack(self, entries)

    monkeypatch.setattr(Packing, "pack", counted)
    rng = np.random.default_rng(5)
    X = rng.normal(size=(600, 4))
    y = X[:, 0] - 2 * X[:, 1] + rng.normal(scale=0.3, size=600)
    h = np.arange(600) % 4
    kw: dict[str, Any] = {"n_estimators": 4, "max_depth": 4, "random_state": 0}
    packed = FedForestRegressor(profile="secure", **kw).fit(X, y, client=h)
    assert len(packed_uploads) >= 4 * 3  # the grids of levels 0-2, one upload per client
    plain = FedForestRegressor(profile=load_profile("secure", secure_aggregation=False),
                               **kw).fit(X, y, client=h)
    assert np.array_equal(packed.predict(X), plain.predict(X))
    for a, b in zip(packed.model_.trees, plain.model_.trees, strict=True):
        assert a.to_dict() == b.to_dict()


def test_the_compiled_packer_gives_numpys_words_and_refusals(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fedforest_secure import _kernels, _packing

    if _kernels.KERNELS is None:
        pytest.skip("the compiled loops are not built")
    bits = 19
    packing = Packing.of((Block("hist", (12, 2), (StatKind.COUNT, StatKind.SUM)),), bits, F)
    assert packing is not None
    top = 2**(bits - 1)
    cells = [(0, 0), (1, 2 * 2**F), (1, -2 * 2**F), (top - 1, 2 * (top - 1) * 2**F),
             (top - 1, -2 * (top - 1) * 2**F), (7, 3), (7, -3), (0, 1), (0, -1),
             (1, 2 * 2**F + 1), (top, 0), (-1, 0), (5, -2**63), (5, 2**63 - 1)]
    for count, total in cells:
        entries = np.zeros(24, dtype=np.int64)
        entries[0::2], entries[1::2] = 3, 3 * 2**F  # every other cell in range
        entries[10], entries[11] = count, total
        raw = entries.view(np.uint64)
        results = []
        for compiled in (True, False):
            if not compiled:
                monkeypatch.setattr(_kernels, "KERNELS", None)
            out = np.zeros(12, dtype=np.uint64)
            results.append((_packing._pack_cells(raw, out, bits, F), out))
            monkeypatch.undo()
        (bad_c, out_c), (bad_n, out_n) = results
        assert bad_c == bad_n == (-1 if abs(total) <= 2 * count * 2**F and 0 <= count < top
                                  else 5), (count, total)
        if bad_c < 0:
            assert np.array_equal(out_c, out_n)
            assert np.array_equal(packing.unpack(out_c), raw)
