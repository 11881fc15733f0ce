"""Packed grid cells (fedforest_secure._packing): one word per (count, sum y) cell under secure
aggregation, unpacked by the server into the very ring sums an unpacked upload gives."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from fedforest_secure import FedForestRegressor, load_profile
from fedforest_secure._packing import Packing, count_lane_bits, packs, root_lane_bits
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
    N = K * max(n_rows, 1)
    bits = count_lane_bits(N, 2.0 * N * 2.0**F + K)
    assert bits is not None
    packing = Packing.of((TOTALS, HIST), bits)
    assert packing is not None
    assert (packing.entries, packing.words) == (9 + 48, 9 + 24)
    entries = [_client_entries(rng, n_rows, (TOTALS.size, HIST.size)) for _ in range(K)]
    want = np.zeros(packing.entries, dtype=np.uint64)
    got = np.zeros(packing.words, dtype=np.uint64)
    for e in entries:
        want += e  # wraps modulo 2^64, as the masked sum does
        got += packing.pack(e)
    assert np.array_equal(packing.unpack(got), want)


@pytest.mark.parametrize("bits", [2, 9, 20, 40])
def test_packing_is_linear_so_the_sum_shows_only_a_function_of_the_pooled_entries(
        bits: int, kernels: str) -> None:
    """Whatever count lane a server names, the sum of the packed uploads is the packing of
    the summed entries: the server learns a function of the pooled sums, and every client
    packs (no client's data decides whether it can answer)."""
    rng = np.random.default_rng(bits)
    packing = Packing.of((TOTALS, HIST), bits)
    assert packing is not None
    entries = [rng.integers(0, 2**64, packing.entries, dtype=np.uint64) for _ in range(5)]
    total = np.zeros(packing.words, dtype=np.uint64)
    pooled = np.zeros(packing.entries, dtype=np.uint64)
    for e in entries:
        total += packing.pack(e)
        pooled += e
    assert np.array_equal(total, packing.pack(pooled))


def test_lanes_hold_the_pooled_extremes_the_coordinator_allows(kernels: str) -> None:
    K, N = 10, 100_000
    max_sum = 2.0 * N * 2.0**F + K
    bits = count_lane_bits(N, max_sum)
    assert bits == N.bit_length() + 1
    packing = Packing.of((HIST,), bits)
    assert packing is not None
    # one client holds every row of every cell at sums of +-max_sum; another holds nothing
    full = np.empty(HIST.size, dtype=np.int64)
    full[0::2] = N
    full[1::2] = np.where(np.arange(HIST.size // 2) % 2 == 0, int(max_sum), -int(max_sum))
    empty = np.zeros(HIST.size, dtype=np.uint64)
    total = packing.pack(full.view(np.uint64)) + packing.pack(empty)
    assert np.array_equal(packing.unpack(total), full.view(np.uint64))


def test_counts_and_sums_that_do_not_fit_are_not_packed() -> None:
    assert count_lane_bits(10_000, 2.0**40) == 15
    assert count_lane_bits(0, 0) == 2
    assert count_lane_bits(10_000, 2.0**48) is None  # the sum lane has 49 bits, sign included
    assert count_lane_bits(2.0**40, 1.0) is None  # a count lane of 42 bits
    for bad in ((float("nan"), 1.0), (-1.0, 1.0), (1.0, float("inf")), (1.0, -1.0)):
        assert count_lane_bits(*bad) is None
    assert Packing.of((TOTALS,), 15) is None  # no (count, sum) block: nothing to pack
    for wrong in (1, 41, 15.0, True, "15"):
        with pytest.raises(ValueError, match="count lane"):
            Packing.of((HIST,), wrong)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="uint64 entries"):
        Packing.of((HIST,), 15).pack(np.zeros(HIST.size, dtype=np.int64))  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="uint64 words"):
        Packing.of((HIST,), 15).unpack(np.zeros(3, dtype=np.uint64))  # type: ignore[union-attr]


def test_the_lanes_come_from_the_roots_totals_whatever_the_target_bound() -> None:
    n = np.array([900.0, 1100.0])
    ss = n * 150.0**2  # y about 150 on average, far above a target bound of 1
    bits = root_lane_bits(n, ss, 2.0**F, 10)
    assert bits == (1100).bit_length() + 1
    # every cell's |sum| is at most sqrt(n ss) = 1100 * 150 of its root: it fits the sum lane
    assert 2.0 * 1100 * 150 * 2.0**F + 10 < 2.0 ** (64 - bits - 1)
    assert root_lane_bits(n, ss, 2.0**F / 1e-9, 10) is None  # a tiny scale: sums too wide
    assert root_lane_bits(np.array([0.0, 5.0]), np.array([0.0, 1.0]), 2.0**F, 10) is None
    assert root_lane_bits(np.zeros(0), np.zeros(0), 2.0**F, 10) is None


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


@pytest.fixture()
def packed_uploads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The entries of every upload packed during the test (:meth:`Packing.pack` counted)."""
    seen: list[int] = []
    pack = Packing.pack

    def counted(self: Packing, entries: np.ndarray) -> np.ndarray:
        seen.append(entries.size)
        return pack(self, entries)

    monkeypatch.setattr(Packing, "pack", counted)
    return seen


def test_a_packed_secure_fit_grows_the_forest_of_the_unpacked_plain_sums(
        packed_uploads: list[int]) -> None:
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


def test_the_compiled_packer_gives_numpys_words(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedforest_secure import _kernels, _packing

    if _kernels.KERNELS is None:
        pytest.skip("the compiled loops are not built")
    rng = np.random.default_rng(1)
    entries = rng.integers(0, 2**64, 2 * 1000, dtype=np.uint64)
    for bits in (2, 17, 40):
        compiled = np.zeros(1000, dtype=np.uint64)
        _packing._pack_cells(entries, compiled, bits)
        monkeypatch.setattr(_kernels, "KERNELS", None)
        plain = np.zeros(1000, dtype=np.uint64)
        _packing._pack_cells(entries, plain, bits)
        monkeypatch.undo()
        assert np.array_equal(compiled, plain)
    with pytest.raises(ValueError, match="pack_cells"):
        _kernels.KERNELS.pack_cells(entries, np.zeros(999, dtype=np.uint64), 20)


def test_no_count_lane_a_server_names_makes_a_client_refuse_for_its_data() -> None:
    """A malicious server re-sends an honest grid task with count lanes of its choosing: every
    client still packs and uploads (a refusal that depended on a client's own cell counts
    would tell the server something about that client alone)."""
    from test_adversarial_server import _advance, _secure_config, _workers

    from fedforest_secure.coordinator import Coordinator
    from fedforest_secure.protocol import Task, TaskKind
    from fedforest_secure.secure_sum import encode_contribution, make_codec

    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    task = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    assert "pack" in task.params
    replies = [w.handle(task) for w in ws]
    for bits in range(2, 41):
        evil = Task(job_id=task.job_id, round_id=task.round_id, kind=task.kind,
                    level=task.level, params={**task.params, "pack": bits}, arrays=task.arrays,
                    layout=task.layout, disclose=task.disclose)
        codec = make_codec(cfg, evil)
        assert codec.packing is not None and codec.packing.count_bits == bits
        uploads = [encode_contribution(cfg, evil, r) for r in replies]
        assert all(u.shape == (codec.words,) for u in uploads)


@pytest.mark.parametrize("target_bound", [0.0, 50.0])
def test_targets_beyond_the_jobs_bound_are_packed_and_summed_exactly(
        target_bound: float, packed_uploads: list[int]) -> None:
    """y in [100, 200] with a target bound of 0 (unknown: scale 1) or 50: the lanes come from
    the roots' sums of y^2, so the grids are packed and the forest is the unpacked one."""
    from fedforest_secure.federation import run_in_process

    rng = np.random.default_rng(0)
    clients = []
    for _ in range(3):
        X = rng.normal(size=(150, 3)).clip(-4, 4)
        clients.append((X, 150 + 50 * np.tanh(X[:, 0])))

    def config(**kw: object) -> JobConfig:
        return JobConfig(job_id="j", task="regression", n_features=3, n_clients=3,
                         feature_bounds=((-4.0, 4.0),) * 3, target_bound=target_bound,
                         n_estimators=2, max_depth=3,
                         profile=load_profile("secure", **kw).to_dict())

    packed = run_in_process(config(), clients)
    assert packed_uploads
    plain = run_in_process(config(secure_aggregation=False), clients)
    X = clients[0][0]
    assert np.array_equal(packed.predict(X), plain.predict(X))


def test_a_count_lane_that_wrapped_is_an_error_not_a_sum(kernels: str) -> None:
    bits = 10
    packing = Packing.of((HIST,), bits)
    assert packing is not None
    fine = np.zeros(HIST.size, dtype=np.int64)
    fine[0::2], fine[1::2] = 2**(bits - 1) - 1, -5  # the largest count the lane holds
    assert np.array_equal(packing.unpack(packing.pack(fine.view(np.uint64))),
                          fine.view(np.uint64))
    over = fine.copy()
    over[6] = 2**(bits - 1)  # a pooled count beyond the lane
    with pytest.raises(OverflowRisk, match="entry 6: .*10-bit lane wrapped"):
        packing.unpack(packing.pack(over.view(np.uint64)))
    empty = np.zeros(HIST.size, dtype=np.int64)
    empty[3] = -(2**(64 - bits - 1)) - 5  # a cell with no rows whose sum leaves its lane
    with pytest.raises(OverflowRisk, match="entry 2: "):
        packing.unpack(packing.pack(empty.view(np.uint64)))
