"""The compiled loops (``_ckernels``) give the bits of the numpy code they stand for: the
pooled-CDF candidates (``_sketch._pooled_numpy``) on rows of every shape the coordinator meets
(long and short sketches, ties within and across clients, single-point and empty clients, flat
gaps), a worker's grid statistics (``_grid_stats.bin_statistics``), and whole forests grown
with and without them (the worker's quantile points and sorted histograms)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedforest_secure import (
    FedForestClassifier,
    FedForestRegressor,
    _candidates,
    _grid_stats,
    _kernels,
    _level_pairs,
    _order,
    _secure_cdf,
    _sketch,
    load_profile,
)
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import InvalidMessage, OverflowRisk, ProtocolError, SchemaError
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind
from fedforest_secure.secagg import RingCodec
from fedforest_secure.worker import Worker

#: tests that call the compiled loops themselves (the refusals checked in Python, and the
#: numpy half of the ``kernels`` fixture, run without them too)
compiled_only = pytest.mark.skipif(_kernels.compiled() is None,
                                   reason="the compiled kernels are not built")


def _rows(rng: np.random.Generator, R: int, K: int, P: int, kind: str
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted, NaN-padded client sketches (R, K, P), mixing weights summing to 1, counts."""
    npts = rng.integers(0, P + 1, size=(R, K))
    npts[:, 0] = np.maximum(npts[:, 0], 1)  # every row has a point
    if kind == "ties":
        vals = rng.integers(-3, 4, size=(R, K, P)).astype(np.float64)
    elif kind == "zeros":
        vals = rng.choice([-0.0, 0.0, 1.0, -1.0], size=(R, K, P))
    elif kind == "scales":  # one client's segments 1e-14 wide: the others' slopes are dropped
        vals = rng.normal(size=(R, K, P)) * 1e3
        vals[:, 0, :] = 1.0 + 1e-14 * np.arange(P)
    elif kind == "gaps":  # each client on its own stretch of the line
        vals = rng.normal(size=(R, K, P)) * 0.1 + 10.0 * np.arange(K)[None, :, None]
    else:
        vals = rng.normal(size=(R, K, P)) * rng.choice([1e-6, 1.0, 1e6], size=(R, 1, 1))
    vals.sort(axis=2)
    vals[np.arange(P)[None, None, :] >= npts[:, :, None]] = np.nan
    counts = rng.integers(1, 50, size=(R, K)).astype(np.float64) * (npts > 0)
    weights = counts / counts.sum(axis=1, keepdims=True)
    return vals, weights, npts


@compiled_only
@pytest.mark.parametrize("kind", ["normal", "ties", "zeros", "gaps", "scales"])
@pytest.mark.parametrize("K,P,B", [(10, 33, 32), (10, 17, 16), (3, 5, 32), (1, 9, 8),
                                   (4, 2, 4), (7, 1, 3)])
def test_compiled_candidates_equal_numpy_bit_for_bit(kind: str, K: int, P: int, B: int) -> None:
    rng = np.random.default_rng(K * 1000 + P * 10 + B)
    pts, w, npts = _rows(rng, 400, K, P, kind)
    ref = _sketch._pooled_numpy(pts, w, npts, B, np.full((400, B - 1), np.inf))
    got = np.full((400, B - 1), np.inf)
    _kernels.compiled().pooled_rows(pts, w, got, 400, K, P, B)  # type: ignore[union-attr]
    np.testing.assert_array_equal(got, ref)
    assert np.signbit(got).sum() == np.signbit(ref).sum()
    assert np.isfinite(ref).any()


@pytest.mark.parametrize("kind", ["normal", "ties", "scales"])
def test_a_rows_candidates_do_not_depend_on_the_padding_of_the_array(kind: str) -> None:
    rng = np.random.default_rng(3)
    pts, w, npts = _rows(rng, 300, 6, 9, kind)
    wide = np.concatenate([pts, np.full((300, 6, 8), np.nan)], axis=2)
    narrow = _sketch._pooled_numpy(pts, w, npts, 16, np.full((300, 15), np.inf))
    padded = _sketch._pooled_numpy(wide, w, npts, 16, np.full((300, 15), np.inf))
    np.testing.assert_array_equal(narrow, padded)


@compiled_only
def test_candidates_are_the_same_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the public entry (bucketing of short rows, absent clients, chunks)."""
    rng = np.random.default_rng(7)
    pts, _, npts = _rows(rng, 3000, 10, 33, "normal")
    counts = rng.integers(0, 30, size=(3000, 10)).astype(np.float64)
    compiled = _sketch.pooled_candidates(pts, counts, 32)
    monkeypatch.setattr(_kernels, "KERNELS", None)
    np.testing.assert_array_equal(compiled, _sketch.pooled_candidates(pts, counts, 32))


@compiled_only
@pytest.mark.parametrize("B", [512, 1000])
def test_wide_sketches_give_the_same_candidates_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch, B: int) -> None:
    """Sketches wider than twice the widest row bucket, beside short ones: the numpy code
    buckets the short rows and does the wide ones at full width (it used to recurse on them
    forever)."""
    rng = np.random.default_rng(B)
    P = B + 1
    pts, _, npts = _rows(rng, 60, 4, P, "normal")
    npts[:20] = np.minimum(npts[:20], 40)  # short rows: the numpy code buckets these
    npts[20:40] = np.maximum(npts[20:40], P // 2 + 1)
    for r in range(60):
        for k in range(4):
            pts[r, k] = np.sort(rng.normal(size=P))
            pts[r, k, npts[r, k]:] = np.nan
    counts = rng.integers(1, 30, size=(60, 4)).astype(np.float64)
    compiled = _sketch.pooled_candidates(pts, counts, B)
    monkeypatch.setattr(_kernels, "KERNELS", None)
    plain = _sketch.pooled_candidates(pts, counts, B)
    assert np.isfinite(plain).sum() > 60 * B // 2
    np.testing.assert_array_equal(compiled, plain)


@compiled_only
@pytest.mark.parametrize("B", [512, 1000])
def test_a_forest_with_many_bins_is_the_same_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch, B: int) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(800, 5))
    y = (X[:, 0] > 0).astype(int)
    kw = dict(n_estimators=3, n_bins=B, random_state=1)
    compiled = FedForestClassifier(**kw).fit(X, y, client=np.arange(800) % 4)
    monkeypatch.setattr(_kernels, "KERNELS", None)
    plain = FedForestClassifier(**kw).fit(X, y, client=np.arange(800) % 4)
    assert plain.score(X, y) > 0.9
    assert compiled.model_.to_json() == plain.model_.to_json()


@compiled_only
@pytest.mark.parametrize("kind", ["normal", "ties", "gaps"])
def test_candidates_at_tens_of_thousands_of_bins_equal_numpy(
        monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The compiled loop sorts a row's B - 1 cuts (and again once duplicates became +inf)
    with a merge sort: at n_bins 30000 it gives numpy's bits, for cuts mostly distinct, mostly
    duplicates (integer points) and in clients' separate stretches."""
    B = 30000
    rng = np.random.default_rng(B + len(kind))
    pts, _, npts = _rows(rng, 6, 4, 100, kind)
    counts = rng.integers(1, 30, size=(6, 4)).astype(np.float64) * (npts > 0)
    compiled = _sketch.pooled_candidates(pts, counts, B)
    monkeypatch.setattr(_kernels, "KERNELS", None)
    plain = _sketch.pooled_candidates(pts, counts, B)
    assert np.isfinite(plain).sum() > 6 * 3
    np.testing.assert_array_equal(compiled, plain)


@compiled_only
def test_bad_arrays_are_refused_with_a_clear_error() -> None:
    kernels = _kernels.compiled()
    assert kernels is not None
    pts = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="sizes do not match"):
        kernels.pooled_rows(pts, np.zeros((2, 3)), np.zeros((2, 7)), 2, 3, 5, 8)
    with pytest.raises(TypeError, match="format d"):
        kernels.pooled_rows(pts.astype(np.float32), np.zeros((2, 3)), np.zeros((2, 7)),
                            2, 3, 4, 8)
    with pytest.raises(ValueError, match="bad shape"):
        kernels.pooled_rows(pts, np.zeros((2, 3)), np.zeros((2, 0)), 2, 3, 4, 1)


@compiled_only
@pytest.mark.parametrize("task", ["regression", "classification"])
@pytest.mark.parametrize("profile", ["open", "secure", "secure-quantiles"])
@pytest.mark.parametrize("missing", [False, True])
def test_a_forest_is_the_same_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch, task: str, profile: str, missing: bool) -> None:
    """Bootstrap weights, adaptive sketch sizes (per-client sketches with r = 2 under
    ``secure-quantiles``), missing values: the same trees."""
    rng = np.random.default_rng(11)
    n = 600
    X = rng.normal(size=(n, 5))
    X[:, 3] = np.round(X[:, 3])  # ties
    y = X[:, 0] + np.sin(X[:, 1]) + 0.3 * rng.normal(size=n)
    if missing:
        X[rng.random(X.shape) < 0.15] = np.nan
    h = np.arange(n) % 5
    cls = FedForestRegressor if task == "regression" else FedForestClassifier
    if task == "classification":
        y = (y > 0).astype(int)
    kw = dict(n_estimators=4, max_depth=5, min_samples_leaf=3, n_bins=16, random_state=2,
              profile=(load_profile("secure", sketch="quantiles")
                       if profile == "secure-quantiles" else profile))
    compiled = cls(**kw).fit(X, y, client=h)
    monkeypatch.setattr(_kernels, "KERNELS", None)
    plain = cls(**kw).fit(X, y, client=h)
    assert sum(t.n_nodes for t in plain.model_.trees) > 4 * 7  # the trees did grow
    assert compiled.model_.to_json() == plain.model_.to_json()


@compiled_only
@pytest.mark.parametrize("columns,classes", [("count", 0), ("moments", 0), ("full", 0),
                                             ("full", 3)])
@pytest.mark.parametrize("missing_bin", [False, True])
def test_grid_statistics_are_the_same_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch, columns: str, classes: int, missing_bin: bool) -> None:
    """One pass over the pairs (``_grid_stats.bin_statistics``): ties with the thresholds,
    +inf padding, unevaluated nodes, slots left out, missing values."""
    rng = np.random.default_rng(5)
    n_rows, d, n_nodes, P, m, W = 300, 4, 12, 900, 3, 9
    uniq = [np.unique(np.round(rng.normal(size=40), 1)) for _ in range(d)]
    uniq_off = np.concatenate([[0], np.cumsum([u.size for u in uniq])]).astype(np.int64)
    uniq_all = np.concatenate(uniq)
    # codes: a value's rank, or one past the last (missing) for about 10 % of them
    codes = np.concatenate([rng.integers(0, u.size + 1, size=n_rows) for u in uniq])
    node = np.sort(rng.integers(0, n_nodes, size=P))
    row = rng.integers(0, n_rows, size=P)
    weight = rng.integers(1, 4, size=P)
    nodes = np.array([0, 2, 3, 5, 8, 11])
    feats = rng.integers(0, d, size=(nodes.size, m))
    feats[1, 2] = -1
    thr = np.sort(rng.choice(uniq_all, size=(nodes.size, m, W)), axis=2)
    thr[:, :, 6:] = np.inf
    y = rng.integers(0, 3, size=n_rows).astype(float) if classes else rng.normal(size=n_rows)

    def run() -> np.ndarray:
        return _grid_stats.bin_statistics(node, row, weight, n_nodes, nodes, feats, thr, codes,
                                          n_rows, uniq_all, uniq_off, y, columns, classes,
                                          has_missing=True, missing_bin=missing_bin)

    compiled = run()
    monkeypatch.setattr(_kernels, "KERNELS", None)
    plain = run()
    assert plain.sum() > 0 and (plain[1, 2] == 0).all()
    np.testing.assert_array_equal(compiled, plain)


@pytest.mark.parametrize("columns,classes", [("moments", 0), ("full", 3)])
def test_grid_statistics_are_written_into_a_view_of_a_reply(kernels: str, columns: str,
                                                            classes: int) -> None:
    """With ``out`` (zeros: a view into the reply after its totals), the statistics are
    written there, the same as a new array's, and the totals before it are left as they are;
    an ``out`` of another shape is refused."""
    rng = np.random.default_rng(6)
    n_rows, d, n_nodes, P, m, W = 200, 3, 6, 600, 2, 7
    uniq_all = np.arange(50.0)
    uniq_off = np.array([0, 20, 35, 50])
    codes = np.concatenate([rng.integers(0, 20, n_rows), rng.integers(0, 15, n_rows),
                            rng.integers(0, 15, n_rows)])
    node, row = np.sort(rng.integers(0, n_nodes, P)), rng.integers(0, n_rows, P)
    weight = rng.integers(1, 4, size=P)
    nodes = np.array([1, 2, 4])
    feats = rng.integers(0, d, size=(nodes.size, m))
    thr = np.sort(rng.choice(uniq_all[:15], size=(nodes.size, m, W)), axis=2)
    y = rng.integers(0, 3, size=n_rows).astype(float) if classes else rng.normal(size=n_rows)

    def run(out: np.ndarray | None = None) -> np.ndarray:
        return _grid_stats.bin_statistics(node, row, weight, n_nodes, nodes, feats, thr, codes,
                                          n_rows, uniq_all, uniq_off, y, columns, classes,
                                          out=out)

    shape = _grid_stats.bin_statistics_shape(feats, thr, columns, classes)
    reply = np.zeros(5 + int(np.prod(shape)))
    reply[:5] = 7.0
    written = run(reply[5:].reshape(shape))
    assert np.shares_memory(written, reply) and (reply[:5] == 7.0).all()
    assert reply[5:].sum() > 0
    np.testing.assert_array_equal(reply[5:], run().ravel())
    with pytest.raises(ValueError, match="out must be"):
        run(np.zeros((1,) + shape))


@compiled_only
def test_the_secure_sketch_prior_is_the_same_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``Marginal.cdf_at`` / ``quantile_at``: values on the table's points, between them,
    outside the range; levels 0, 1 and flat stretches of the CDF; rows padded with +inf."""
    rng = np.random.default_rng(9)
    F, L = 4, 12
    m = _secure_cdf.Marginal(F)
    xs = np.full((F, L), np.inf)
    cdf = np.ones((F, L))
    for f in range(F):
        k = 3 + 3 * f
        xs[f, :k] = np.sort(rng.choice(np.round(rng.normal(size=20), 1), size=k))
        cdf[f, :k] = np.maximum.accumulate(np.sort(np.round(rng.random(k), 1)))
    m.xs, m.cdf, m.known[:] = xs, cdf, True
    feats = rng.integers(0, F, size=300)
    x = np.concatenate([rng.normal(size=(300, 5)) * 2, xs[feats][:, :3]], axis=1)
    u = np.concatenate([rng.random((300, 5)), np.tile([0.0, 1.0, 0.5], (300, 1)),
                        cdf[feats][:, :2]], axis=1)
    got = (m.cdf_at(feats, x), m.quantile_at(feats, u), m.cdf_at(feats, x[:, 0]))
    monkeypatch.setattr(_kernels, "KERNELS", None)
    ref = (m.cdf_at(feats, x), m.quantile_at(feats, u), m.cdf_at(feats, x[:, 0]))
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@compiled_only
@pytest.mark.parametrize("B,r", [(16, 0), (32, 2), (4, 1)])
def test_the_secure_sketch_candidates_are_the_same_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch, B: int, r: int) -> None:
    """``SecureCdfPlanner`` picks: empty cells, one heavy cell, ties between two edges,
    small nodes (adaptive B), finished rows."""
    rng = np.random.default_rng(B + r)
    E, m, d = 40, 3, 5
    feats = rng.integers(-1, d, size=(E, m))
    lo = np.zeros((E, m))
    hi = np.ones((E, m))
    n = rng.integers(1, 400, size=E).astype(float)

    def picks() -> tuple[np.ndarray, ...]:
        plan = _secure_cdf.SecureCdfPlanner(lo, hi, feats, np.zeros(d, dtype=bool), n, B, r,
                                            max_rounds=1)
        W = plan.next_grid().shape[2]  # type: ignore[union-attr]
        counts = rng.integers(0, 5, size=(E, m, W + 1)).astype(float)
        counts[0, 0] = 0.0
        counts[1, 0, 2] = 500.0
        counts[2, 0] = 1.0
        sums = np.stack([counts, rng.normal(size=counts.shape)], axis=-1)  # (n, sum y)
        plan.receive(counts, sums)
        return plan.candidates(), plan.histogram()

    state = rng.bit_generator.state
    compiled = picks()
    monkeypatch.setattr(_kernels, "KERNELS", None)
    rng.bit_generator.state = state
    plain = picks()
    assert np.isfinite(plain[0]).sum() > E  # candidates were picked
    for a, b in zip(compiled, plain, strict=True):
        np.testing.assert_array_equal(a, b)


@compiled_only
@pytest.mark.parametrize("periodic", [False, True])
def test_ring_encoding_is_the_same_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch, periodic: bool) -> None:
    """``RingCodec.encode`` / ``encode_divided`` and the block encoder of masking: ties at
    half a quantum (round half to even), negative values, -0.0, per-entry and per-column
    scales and bounds over several blocks; an out-of-range value names the same entry."""
    rng = np.random.default_rng(4)
    n = (1 << 14) * 2 + 5
    if periodic:
        codec = RingCodec._from_runs([([0, 1], n // 2), ([2], n - 2 * (n // 2))],
                                     np.array([3, 20, 8]), np.array([1e3, 50.0, 1e4]), 7)
    else:
        codec = RingCodec(rng.integers(0, 24, size=n), np.full(n, 1e3), 7)
    fb = codec.frac_bits
    vals = np.round(rng.normal(size=n) * 40) / 8 + 0.5 * 2.0 ** -fb  # many exact ties
    vals[::7] *= -1.0
    vals[5] = -0.0
    vals = np.clip(vals, -codec.max_abs, codec.max_abs)
    divisor = rng.choice([1.0, 2.0, 3.0], size=n)

    def run() -> tuple[np.ndarray, ...]:
        block = np.empty(n, dtype=np.uint64)
        fill = codec.block_encoder(vals)
        for a in range(0, n, 1000):
            fill(a, min(a + 1000, n), block[a:a + 1000])
        return codec.encode(vals), codec.encode_divided(vals, divisor), block

    compiled = run()
    monkeypatch.setattr(_kernels, "KERNELS", None)
    plain = run()
    for a, b in zip(compiled, plain, strict=True):
        np.testing.assert_array_equal(a, b)
    bad = vals.copy()
    bad[n - 3] = 2 * codec.max_abs[n - 3] * divisor[n - 3]
    messages = []
    for kernels in (_kernels.compiled(), None):
        monkeypatch.setattr(_kernels, "KERNELS", kernels)
        with pytest.raises(OverflowRisk) as err:
            codec.encode_divided(bad, divisor)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and f"value[{n - 3}]" in messages[0]


def test_a_sketch_with_a_point_after_its_padding_is_refused(kernels: str) -> None:
    """A client's quantile list is padded with NaN at its end only: a value after a NaN (a
    crafted upload) is refused, not read one way by numpy and another by the compiled loop."""
    disc = {0: {"sketch_points": np.array([[[np.nan, 1.1, np.nan, np.nan, -1.1]]]),
                "sketch_counts": np.array([[2.0]])},
            1: {"sketch_points": np.array([[[0.0, 0.5, 1.0, np.nan, np.nan]]]),
                "sketch_counts": np.array([[3.0]])}}
    with pytest.raises(InvalidMessage, match="after its padding"):
        _candidates.pooled_sketch_candidates(disc, np.array([0]), np.zeros((1, 1), int), 5)


def test_pooled_cell_counts_beyond_any_table_are_refused(kernels: str) -> None:
    """Counts that no table can hold (a crafted plain-sum upload: 1e308 rows) are refused
    before the CDF's running sums overflow."""
    plan = _secure_cdf.SecureCdfPlanner(np.zeros((1, 1)), np.ones((1, 1)), np.zeros((1, 1), int),
                                        np.zeros(1, dtype=bool), np.array([100.0]), 8, 0)
    W = plan.next_grid().shape[2]  # type: ignore[union-attr]
    counts = np.ones((1, 1, W + 1))
    counts[0, 0, 1] = 1e308
    with pytest.raises(InvalidMessage, match="2\\^53"):
        plan.receive(counts)


def test_frequency_weights_beyond_2_40_rows_are_refused() -> None:
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 3)), rng.normal(size=60)
    w = np.ones(60)
    w[:10] = 2.0**61
    with pytest.raises(SchemaError, match="2\\^40"):
        FedForestRegressor(n_estimators=2, max_depth=3, bootstrap=False, profile="open").fit(
            X, y, client=np.arange(60) % 3, sample_weight=w)


@compiled_only
def test_sizes_whose_byte_counts_overflow_are_refused() -> None:
    """Shapes whose byte counts wrap around 2^64 to the size of the arrays given are refused:
    multiplied unchecked, 2^61 rows of one point fit empty arrays, and a grid of 2^61 + 1
    edges arrays of one and two entries, and the loops would run far outside them."""
    K = _kernels.compiled()
    assert K is not None
    z0, z1 = np.zeros(0), np.zeros(1)
    i1 = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="pooled_rows: array sizes"):
        K.pooled_rows(z0, z0, z0, 2**61, 1, 1, 2)  # 8 * 2^61 rows = 2^64 bytes: 0
    with pytest.raises(ValueError, match="grid_picks: array sizes"):
        K.grid_picks(i1, np.zeros(2), z1, z1, i1 + 2, np.zeros(2, np.int64), 3, 2**61 + 1)


@compiled_only
def test_shapes_rows_and_widths_out_of_range_are_refused() -> None:
    """Widths beyond 2^24, arrays of the wrong size and a node's row past the grid."""
    K = _kernels.compiled()
    assert K is not None
    z0, z1 = np.zeros(0), np.zeros(1)
    i0, i1 = np.zeros(0, np.int64), np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="bad shape"):
        K.pooled_rows(z0, z0, z1, 1, 2**61, 1, 2)
    u8, u16 = np.ones(4, np.uint8), np.zeros(4, np.uint16)
    for n_points, out in ((2**61 - 1, z0), (8, np.zeros(8))):
        with pytest.raises(ValueError, match="sketch_values: array sizes"):
            K.sketch_values(u8, 0, 255, u16, 0, 2**16 - 1, np.array([0, 4]), i1 + 1, i1,
                            np.array([0, 1]), z1, i0, out, n_points, 0)
    with pytest.raises(ValueError, match="histogram_blocks: array sizes"):
        K.histogram_blocks(np.zeros(4, np.uint16), 0, 2**16 - 1, np.zeros(4, np.uint16), 0,
                           2**16 - 1, np.ones(4, np.uint8), 0, 255, np.array([0, 2, 4]),
                           np.array([0, 1]), np.zeros(2, np.int64), np.array([0, 1]), z1, i0,
                           np.zeros(0), z1, z0, 2**60, 0)
    with pytest.raises(ValueError, match="out of range"):  # a node's row past the grid
        K.grid_sums(i1, i1, i1, np.array([1 << 40]), i1, z0, np.array([0, 1]), z1, i1, z1,
                    np.zeros(1), 1, 1, 1, 0, 0, 0)


@pytest.mark.parametrize("n_points", [0, -3, 2**30])
def test_a_sketch_of_no_points_or_too_many_is_refused(kernels: str, n_points: int) -> None:
    """A coordinator's sketch round asks 1 .. 2^24 points per (node, slot); anything else is
    refused the same way whichever code would answer."""
    cfg = JobConfig(job_id="j", task="regression", n_features=2, n_clients=1, n_estimators=1,
                    max_features=2, n_bins=8, profile={"name": "open"})
    rng = np.random.default_rng(0)
    w = Worker(cfg, rng.normal(size=(30, 2)), rng.normal(size=30), client_index=0, seed=1)
    task = Task(job_id="j", round_id=1, kind=TaskKind.SKETCH, level=0,
                params={"n_nodes": 1, "n_points": n_points},
                arrays={"features": np.array([[0, 1]])},
                layout=(Block("totals", (1, 3), (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)),),
                disclose=("sketch_points",))
    with pytest.raises(ProtocolError, match="points was asked"):
        w.handle(task)


def test_pooled_candidates_refuse_a_list_with_a_point_after_its_padding(kernels: str) -> None:
    pts = np.array([[[np.nan, 1.1, np.nan, np.nan, -1.1]]])
    with pytest.raises(ValueError, match="after its NaN padding"):
        _sketch.pooled_candidates(pts, np.array([[2.0]]), 5)
    assert _sketch.pooled_candidates(np.zeros((0, 2, 3)), np.zeros((0, 2)), 4).shape == (0, 3)
    none = _sketch.pooled_candidates(np.zeros((2, 3, 0)), np.ones((2, 3)), 4)  # no points
    assert none.shape == (2, 3) and np.isinf(none).all()


@compiled_only
@pytest.mark.parametrize("packed", [True, False])
def test_level_order_keys_are_the_same_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch, packed: bool) -> None:
    """Packed keys (code, row, weight) and block|code keys (weights of 256 and more), slots
    left unused by some nodes, pairs out of node order."""
    rng = np.random.default_rng(1)
    n_rows, d, n_nodes, m, P = 500, 4, 9, 3, 2000
    codes = rng.integers(0, 300, size=d * n_rows).astype(np.int32)
    feats = rng.integers(0, d, size=(n_nodes, m))
    feats[2, 1] = feats[5, 0] = -1
    node = rng.integers(0, n_nodes, size=P)
    row = rng.integers(0, n_rows, size=P)
    weight = rng.integers(1, 4 if packed else 400, size=P)

    def build() -> _order.LevelOrder:
        return _order.LevelOrder(feats, node, row, weight, codes, n_rows, 9)

    compiled = build()
    monkeypatch.setattr(_kernels, "KERNELS", None)
    plain = build()
    assert compiled.packed == plain.packed == packed
    np.testing.assert_array_equal(compiled.key, plain.key)
    if not packed:
        np.testing.assert_array_equal(compiled._rows, plain._rows)
        np.testing.assert_array_equal(compiled._w, plain._w)


@compiled_only
@pytest.mark.parametrize("n_rows,n_nodes,per_node,ties", [
    (3000, 400, 8, False),    # blocks of a few entries (sorted by insertion)
    (3000, 6, 900, False),    # dense blocks (a bitmap of their ranks)
    (3000, 6, 900, True),     # a node's row twice, with two weights (a rank repeats)
    (200_000, 4, 60, False),  # ranks far apart (no bitmap)
    (6000, 30, 700, False),   # blocks of rows split on the feature: ranks in a narrow range
])
def test_packed_level_order_keys_built_in_order_equal_the_sorted_keys(
        monkeypatch: pytest.MonkeyPatch, n_rows: int, n_nodes: int, per_node: int,
        ties: bool) -> None:
    """The compiled level order writes each block's keys in order (by insertion, a bitmap of
    the rows' ranks, or qsort); numpy builds every key and sorts them all: the same keys."""
    rng = np.random.default_rng(n_rows + per_node)
    d, m = 7, 3
    codes = rng.integers(0, n_rows // 3, size=(d, n_rows)).astype(np.int32)
    codes[1] = np.arange(n_rows)  # feature 1: one code per row
    feats = np.array([rng.permutation(d)[:m] for _ in range(n_nodes)])
    feats[1, 2] = feats[3, 0] = -1
    if n_nodes == 30:  # node i holds rows whose feature-1 code lies in its own stretch
        feats[:, 0] = 1
        row = np.concatenate([rng.permutation(np.arange(i * 150, i * 150 + 700))
                              for i in range(n_nodes)])
    else:
        row = np.concatenate([rng.choice(n_rows, per_node, replace=False)
                              for _ in range(n_nodes)])
    node = np.repeat(np.arange(n_nodes), per_node)
    if ties:
        row[1] = row[0]
    perm = rng.permutation(node.size)  # pairs out of node order
    node, row = node[perm], row[perm]
    weight = rng.integers(1, 256, size=node.size)
    cbits = max(int(codes.max() + 1).bit_length(), 16)

    def build() -> _order.LevelOrder:
        return _order.LevelOrder(feats, node, row, weight, codes.ravel(), n_rows, cbits)

    compiled = build()
    monkeypatch.setattr(_kernels, "KERNELS", None)
    plain = build()
    assert compiled.packed and plain.packed
    assert compiled.key is not None and compiled.key.size == int((feats[node] >= 0).sum())
    np.testing.assert_array_equal(compiled.key, plain.key)


@compiled_only
def test_packed_keys_with_a_code_pair_or_feature_out_of_range_are_refused() -> None:
    """A code at or past 2^(hi - shift), a pair's row past the table, a weight of 256, a
    feature past the table and an output too short for the keys."""
    K = _kernels.compiled()
    assert K is not None
    one = np.zeros(1, np.int64)
    codes = np.zeros(4, np.int32)  # 2 features x 2 rows
    feats = np.array([[0, 1]])
    two_keys = np.zeros(2, np.int64)

    def call(codes: np.ndarray = codes, row: np.ndarray = one, weight: np.ndarray = one + 1,
             feats: np.ndarray = feats, keys: np.ndarray = two_keys) -> int:
        return K.sorted_keys(one, row, weight, codes, feats, keys, 2, 2, 24, 40)

    assert call() == 2
    for bad in ({"codes": np.array([0, 1 << 16, 0, 0], np.int32)}, {"row": one + 2},
                {"weight": one + 256}, {"feats": np.array([[0, 2]])},
                {"keys": np.zeros(1, np.int64)}):
        with pytest.raises(ValueError, match="sorted_keys: .* out of range"):
            call(**bad)  # type: ignore[arg-type]


@compiled_only
def test_packed_keys_whose_block_index_or_rows_do_not_fit_their_fields_are_refused() -> None:
    """A block index at or past 2^(63 - hi) (node 1's blocks, though it has no pair) and a
    table of more than 2^(shift - 8) rows."""
    K = _kernels.compiled()
    assert K is not None
    one, codes, keys = np.zeros(1, np.int64), np.zeros(4, np.int32), np.zeros(2, np.int64)
    feats = np.zeros((2, 2), np.int64)  # blocks 0..3
    assert K.sorted_keys(one, one, one + 1, codes, feats, keys, 2, 2, 24, 61) == 2
    assert K.sorted_keys(one, one, one + 1, codes, feats, keys, 2, 2, 9, 30) == 2
    for shift, hi in ((24, 62), (8, 30)):
        with pytest.raises(ValueError, match="sorted_keys: the block index or the row"):
            K.sorted_keys(one, one, one + 1, codes, feats, keys, 2, 2, shift, hi)


@compiled_only
def test_a_level_order_whose_kernel_writes_too_few_keys_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    K = _kernels.compiled()
    assert K is not None

    class Short:
        def __getattr__(self, name: str) -> Any:
            if name == "sorted_keys":
                return lambda *a: K.sorted_keys(*a) - 1
            return getattr(K, name)

    monkeypatch.setattr(_kernels, "KERNELS", Short())
    codes = np.zeros(2 * 40, np.int32)
    with pytest.raises(RuntimeError, match="sorted_keys wrote 3 keys of 4"):
        _order.LevelOrder(np.array([[0, 1]]), np.zeros(2, np.int64), np.arange(2),
                          np.ones(2, np.int64), codes, 40, 4)


@compiled_only
@pytest.mark.parametrize("task", ["regression", "classification"])
def test_node_totals_are_the_same_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch, task: str) -> None:
    """Per-node sums of the row statistics over pairs out of node order, with weights of 256
    and more: the compiled pass adds each pair's terms in the pairs' order, as bincount."""
    rng = np.random.default_rng(7)
    n_rows, n_nodes, P = 300, 40, 5000
    config = JobConfig(job_id="totals", task=task, n_features=2, n_clients=1,
                       n_classes=3 if task == "classification" else 0,
                       criterion="gini" if task == "classification" else "mse",
                       feature_bounds=((-1.0, 1.0),) * 2, profile=load_profile("open").to_dict())
    S = config.n_stats
    stats_cm = rng.normal(size=(S, n_rows)) * rng.choice([1e-8, 1.0, 1e8], size=(S, 1))
    node, row = rng.integers(0, n_nodes, size=P), rng.integers(0, n_rows, size=P)
    w = rng.integers(1, 400, size=P)
    compiled = _level_pairs.node_totals(config, stats_cm, row, node, w, n_nodes)
    monkeypatch.setattr(_kernels, "KERNELS", None)
    plain = _level_pairs.node_totals(config, stats_cm, row, node, w, n_nodes)
    assert compiled.shape == (n_nodes, S)
    np.testing.assert_array_equal(compiled, plain)


def test_a_level_order_takes_its_features_in_any_memory_order(kernels: str) -> None:
    rng = np.random.default_rng(2)
    feats = np.asfortranarray(rng.integers(-1, 3, size=(5, 2)))
    node, row = rng.integers(0, 5, size=50), rng.integers(0, 40, size=50)
    codes = rng.integers(0, 9, size=3 * 40).astype(np.int32)
    order = _order.LevelOrder(feats, node, row, np.ones(50, np.int64), codes, 40, 4)
    assert order.size == int((np.ascontiguousarray(feats)[node] >= 0).sum())


@compiled_only
@pytest.mark.parametrize("max_weight", [3, 400])
@pytest.mark.parametrize("n_points,r", [(32, 0), (32, 1), (7, 1), (7, 2), (1, 3), (5, 0)])
def test_quantile_points_are_the_same_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch, max_weight: int, n_points: int, r: int) -> None:
    """Each point's target rank ceil(b W / B_k) (computed without a division per point in the
    compiled loop), over blocks of every size: empty, below and above n_points entries, with
    multiplicities that make W no multiple of B_k (max_weight 400: keys without the weight)."""
    from fedforest_secure._level_stats import LevelStatistics
    from fedforest_secure._site_table import encode_features

    rng = np.random.default_rng(n_points * 10 + r + max_weight)
    n_rows, d, n_nodes, m = 300, 4, 40, 3
    X = np.round(rng.normal(size=(n_rows, d)), 1)  # ties
    book, codes = encode_features(X)
    cfg = JobConfig(job_id="j", task="regression", n_features=d, n_clients=1, n_estimators=1,
                    max_features=m, n_bins=8, profile={"name": "open"})
    feats = np.stack([rng.choice(d, m, replace=False) for _ in range(n_nodes)])
    feats[3, 1] = -1
    P = 3000
    node = rng.integers(0, n_nodes - 2, size=P)  # the last two nodes: empty blocks
    node[: n_nodes // 2] = 5  # a large node
    row = rng.integers(0, n_rows, size=P)
    weight = rng.integers(1, max_weight, size=P)

    def points() -> np.ndarray:
        order = _order.LevelOrder(feats, node, row, weight, codes, n_rows, book.cbits)
        stats = LevelStatistics(order, cfg, rng.normal(size=n_rows), book)
        return stats.quantile_points(feats, n_points, r)

    compiled = points()
    monkeypatch.setattr(_kernels, "KERNELS", None)
    plain = points()
    np.testing.assert_array_equal(compiled, plain)
    assert np.isfinite(plain).sum() > n_nodes


@compiled_only
@pytest.mark.parametrize("in_node_order", [False, True])
def test_routing_through_numeric_splits_is_the_same_with_and_without_the_compiled_kernels(
        monkeypatch: pytest.MonkeyPatch, in_node_order: bool) -> None:
    """Every pair's next node (or -1 under a leaf) through thresholds between, at and beyond
    the client's values, and the refusal of a pair whose node is not in the routing."""
    from fedforest_secure._routing import route
    from fedforest_secure._site_table import encode_features
    from fedforest_secure._tree import NodeKind

    rng = np.random.default_rng(5)
    n_rows, d, n_nodes, P = 200, 3, 12, 4000
    X = np.round(rng.normal(size=(n_rows, d)), 1)
    book, codes = encode_features(X)
    cfg = JobConfig(job_id="j", task="regression", n_features=d, n_clients=1, n_estimators=1,
                    max_features=d, n_bins=8, profile={"name": "open"})
    kind = np.full(n_nodes, NodeKind.NUMERIC, dtype=np.int32)
    kind[[2, 7]] = NodeKind.LEAF
    inner = np.flatnonzero(kind != NodeKind.LEAF)
    left, right = np.full(n_nodes, -1, np.int32), np.full(n_nodes, -1, np.int32)
    left[inner], right[inner] = 2 * np.arange(inner.size), 2 * np.arange(inner.size) + 1
    thr = rng.choice(X.ravel(), n_nodes) + rng.choice([0.0, 0.05, -1e9, 1e9], n_nodes)
    arrays = {"route_kind": kind, "route_feature": rng.integers(0, d, n_nodes).astype(np.int32),
              "route_threshold": thr, "route_left": left, "route_right": right,
              "route_set_ptr": np.zeros(n_nodes + 1, np.int64),
              "route_set_vals": np.zeros(0, np.int32)}
    node = rng.integers(0, n_nodes, P).astype(np.int32)
    row = rng.integers(0, n_rows, P).astype(np.int32)
    ptr = None
    if in_node_order:
        node.sort()
        ptr = np.searchsorted(node, np.arange(n_nodes + 1))

    def routed(nodes: np.ndarray) -> np.ndarray:
        return route(arrays, n_nodes=n_nodes, node=nodes, row=row, node_ptr=ptr, codes=codes,
                     n_rows=n_rows, book=book, config=cfg, client_index=0)

    compiled = routed(node)
    with pytest.raises(ValueError, match="out of range"):
        routed(np.where(np.arange(P) == P - 1, n_nodes, node).astype(np.int32))
    monkeypatch.setattr(_kernels, "KERNELS", None)
    plain = routed(node)
    np.testing.assert_array_equal(compiled, plain)
    assert compiled.dtype == plain.dtype
    assert (plain == -1).any() and (plain % 2 == 0).any() and (plain % 2 == 1).any()


@compiled_only
@pytest.mark.parametrize("kind", ["normal", "ties", "gaps"])
def test_candidates_from_each_clients_own_array_equal_the_stacked_ones(kind: str) -> None:
    """The coordinator's pooled candidates read from one (R, P) array per client (no stacked
    copy) are those of the stacked (R, K, P) rows, rows without a point left at +inf."""
    rng = np.random.default_rng(11)
    R, K, P, B = 300, 6, 17, 16
    pts, _, npts = _rows(rng, R, K, P, kind)
    pts[:5] = np.nan  # rows without a point
    npts[:5] = 0
    counts = rng.integers(0, 40, size=(R, K)).astype(np.float64)
    counts[7, 2] = -1.0  # treated as 0, as _pooled does
    stacked = _sketch.pooled_candidates(pts, counts, B, npts)
    lists = [np.ascontiguousarray(pts[:, k, :]) for k in range(K)]
    np.testing.assert_array_equal(_sketch.pooled_candidates_lists(lists, counts, B, npts),
                                  stacked)
    assert np.isinf(stacked[:5]).all() and np.isfinite(stacked[5:, 0]).all()
    bad = [a.copy() for a in lists]
    bad[3][9] = [np.nan, 1.0] + [np.nan] * (P - 2)
    with pytest.raises(ValueError, match="after its NaN padding"):
        _sketch.pooled_candidates_lists(bad, counts + 1, B, npts + 1)
