"""The engine's fast paths give the same numbers, bit for bit, as the straightforward ones."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedforest_secure import _order, _sketch
from fedforest_secure._order import LevelOrder


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=300),
       st.lists(st.floats(-1.0, 2.0), min_size=1, max_size=80),
       st.sampled_from([0, 10**9]))
def test_first_reaching_search_and_table_agree(w: list[int], fr: list[float],
                                                factor: int) -> None:
    """Both branches of first_reaching (binary search for few targets, the inverse table
    otherwise) answer every target, also out-of-range ones, the same way."""
    cw = np.cumsum(np.array(w, dtype=np.int64))
    target = np.array(fr) * cw[-1]
    saved = _order.SEARCH_FACTOR
    try:
        _order.SEARCH_FACTOR = factor  # 0: always the table; 10**9: always searched
        got = _order.first_reaching(cw, target)
        got_int = _order.first_reaching(cw, np.ceil(target).astype(np.int64))
    finally:
        _order.SEARCH_FACTOR = saved
    ref = np.searchsorted(cw, np.clip(np.ceil(target), 1, cw[-1]), side="left")
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got_int, ref)


def _events_reference(points: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, ...]:
    """The pooled sketch CDF as computed before (ranks scattered with bincount)."""
    R, K, P = points.shape
    W = K * P
    valid = ~np.isnan(points)
    npts = valid.sum(axis=2)
    nseg = np.maximum(npts - 1, 0)
    flat = np.where(valid, points, np.inf).reshape(R, W)
    order = np.argsort(flat, axis=1, kind="stable")
    xs = np.take_along_axis(flat, order, axis=1)
    last = np.max(np.where(np.isfinite(xs), xs, -np.inf), axis=1, keepdims=True)
    last = np.where(np.isfinite(last), last, 0.0)
    xs = np.where(np.isfinite(xs), xs, last)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(W), (R, W)), axis=1)
    rank = rank.reshape(R, K, P) + (np.arange(R) * W)[:, None, None]
    a, b = points[:, :, :-1], points[:, :, 1:]
    seg_valid = valid[:, :, 1:]
    mass = np.where(nseg > 0, weights / np.maximum(nseg, 1), 0.0)[:, :, None]
    with np.errstate(invalid="ignore"):
        length = np.where(seg_valid, b - a, 0.0)
    ramp = seg_valid & (length > 0)
    jump = seg_valid & ~ramp
    slope = np.where(ramp, mass / np.where(ramp, length, 1.0), 0.0)
    size = R * W
    ramp_slope = slope[ramp]
    ds = np.bincount(rank[:, :, :-1][ramp], weights=ramp_slope, minlength=size)
    ds -= np.bincount(rank[:, :, 1:][ramp], weights=ramp_slope, minlength=size)
    single = npts == 1
    dj = np.bincount(rank[:, :, :-1][jump], weights=np.broadcast_to(mass, jump.shape)[jump],
                     minlength=size)
    dj += np.bincount(rank[:, :, 0][single], weights=weights[single], minlength=size)
    ds = ds.reshape(R, W)
    dj = dj.reshape(R, W)
    s = np.cumsum(ds, axis=1)
    tiny = 1e-12 * np.maximum(np.abs(slope).reshape(R, -1).max(axis=1, initial=0.0), 1e-300)
    s = np.where(np.abs(s) <= tiny[:, None], 0.0, s)
    dx = np.diff(xs, axis=1)
    F = np.cumsum(dj, axis=1)
    F[:, 1:] += np.cumsum(s[:, :-1] * dx, axis=1)
    return xs, s, dj, F


@pytest.mark.parametrize("seed", range(6))
def test_events_equal_reference_bitwise(seed: int) -> None:
    rng = np.random.default_rng(seed)
    R, K, P = 40, 5, 9
    # few distinct values: many ties within and across clients, empty segments, lone points
    pts = np.sort(rng.integers(0, 6, (R, K, P)).astype(np.float64) / 3.0, axis=2)
    npts = rng.integers(0, P + 1, (R, K))
    pts[np.arange(P)[None, None, :] >= npts[:, :, None]] = np.nan
    counts = rng.integers(0, 50, (R, K)).astype(np.float64)
    counts[npts == 0] = 0.0
    tot = counts.sum(axis=1, keepdims=True)
    weights = np.divide(counts, tot, out=np.zeros_like(counts), where=tot > 0)
    got = _sketch._events(pts, weights)
    ref = _events_reference(pts, weights)
    for g, r in zip(got, ref, strict=True):
        assert g.tobytes() == r.tobytes()


def _order_reference(feats: np.ndarray, node: np.ndarray, row: np.ndarray, w: np.ndarray,
                     codes: np.ndarray, n_rows: int, cbits: int) -> np.ndarray:
    """Every (pair, used slot) as (block, code, row, weight), sorted: one Python tuple each."""
    out = []
    for p in range(node.size):
        for s in range(feats.shape[1]):
            f = feats[node[p], s]
            if f >= 0:
                out.append((node[p] * feats.shape[1] + s, codes[f * n_rows + row[p]], row[p],
                            w[p]))
    return np.array(sorted(out), dtype=np.int64).reshape(-1, 4)


@pytest.mark.parametrize("node_sorted", [True, False])
def test_level_order_keys_with_and_without_node_runs(node_sorted: bool) -> None:
    """Pairs in node order take the repeat path, others the gather path: same order."""
    rng = np.random.default_rng(3)
    n_rows, d, n_nodes, m, P = 50, 4, 7, 2, 120
    codes = rng.integers(0, 20, d * n_rows).astype(np.int32)
    feats = rng.integers(0, d, (n_nodes, m))
    feats[2, 1] = -1
    node = rng.integers(0, n_nodes, P).astype(np.int32)
    row = rng.integers(0, n_rows, P).astype(np.int32)
    w = rng.integers(1, 4, P).astype(np.uint8)
    if node_sorted:
        perm = np.argsort(node, kind="stable")
        node, row, w = node[perm], row[perm], w[perm]
    lo = LevelOrder(feats, node, row, w, codes, n_rows, 16)
    ref = _order_reference(feats, node, row, w, codes, n_rows, 16)
    assert lo.size == ref.shape[0]
    bc = lo.block_codes()
    np.testing.assert_array_equal(bc >> 16, ref[:, 0])
    np.testing.assert_array_equal(bc & 0xFFFF, ref[:, 1])
    np.testing.assert_array_equal(lo.rows(), ref[:, 2])
    np.testing.assert_array_equal(lo.weights(), ref[:, 3])
    wf = np.empty(lo.size)
    lo.weights_into(wf)
    np.testing.assert_array_equal(wf, ref[:, 3].astype(np.float64))
    lo.compact()  # the compact form's weights
    wf[:] = -1.0
    lo.weights_into(wf)
    np.testing.assert_array_equal(wf, ref[:, 3].astype(np.float64))


@pytest.mark.parametrize("packed", [True, False])
def test_level_order_block_edges_are_its_nodes_pair_counts(
        monkeypatch: pytest.MonkeyPatch, packed: bool) -> None:
    """Where each block (node, slot) starts in the level order is added up from its node's
    pairs (an unused slot: none, a node without pairs: none), without searching the keys:
    the positions a search of the sorted keys finds, in packed and unpacked keys."""
    rng = np.random.default_rng(5)
    n_rows, d, n_nodes, m, P = 60, 5, 9, 3, 150
    codes = rng.integers(0, 30, d * n_rows).astype(np.int32)
    feats = rng.integers(0, d, (n_nodes, m))
    feats[1, 2] = feats[4, 0] = -1
    feats[6] = -1  # a node evaluated in no slot
    node = rng.integers(0, n_nodes, P).astype(np.int32)
    node[node == 3] = 2  # a node without pairs
    row = rng.integers(0, n_rows, P).astype(np.int32)
    w = rng.integers(1, 4 if packed else 300, P).astype(np.int64)
    lo = LevelOrder(feats, node, row, w, codes, n_rows, 16)
    assert lo.packed is packed
    searched = lo.search(np.arange(n_nodes * m + 1, dtype=np.int64) << 16)

    def no_search(*args: object, **kwargs: object) -> np.ndarray:
        raise AssertionError("the block edges searched the keys")

    monkeypatch.setattr(LevelOrder, "search", no_search)
    edges = lo.all_edges()
    np.testing.assert_array_equal(edges, searched)
    assert edges[-1] == lo.size


@pytest.mark.parametrize("seed", range(4))
def test_row_order_is_a_stable_argsort(seed: int) -> None:
    """The packed-key sort of the pooled sketch orders every row as a stable argsort does,
    also for values that agree in all but the last bits (the rows sorted again), signed
    zeros (equal, so in position order) and NaN padding of either sign (last)."""
    rng = np.random.default_rng(seed)
    R, W = 60, 33
    base = rng.choice([0.0, -0.0, 1.0, -2.5, 1e-300, 3e10, -1e300, -np.inf, np.inf],
                      size=(R, W))
    near = np.nextafter(base, np.inf) if seed % 2 else np.nextafter(base, -np.inf)
    flat = np.where(rng.random((R, W)) < 0.3, near, base)
    flat[rng.random((R, W)) < 0.2] = np.nan
    flat[rng.random((R, W)) < 0.05] = -np.nan  # sign bit set: sorts first by its key
    order, xs = _sketch._row_order(flat)
    want = np.argsort(flat, axis=1, kind="stable")
    np.testing.assert_array_equal(order - (np.arange(R) * W)[:, None], want)
    assert xs.tobytes() == np.take_along_axis(flat, want, axis=1).tobytes()


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(st.lists(st.sampled_from([-1.0, 0.0, -0.0, 0.25, 0.5, 2.0]),
                              min_size=1, max_size=40), min_size=1, max_size=6),
       queries=st.lists(st.tuples(st.integers(0, 5), st.floats(-2.0, 3.0)), min_size=1,
                        max_size=30),
       strict=st.booleans())
def test_row_count_is_a_per_row_searchsorted(rows: list[list[float]],
                                             queries: list[tuple[int, float]],
                                             strict: bool) -> None:
    """The branch-free search of the pooled sketch stays within each query's own row."""
    W = max(len(r) for r in rows)
    A = np.array([sorted(r) + [max(r)] * (W - len(r)) for r in rows])
    qr = np.array([q[0] % len(rows) for q in queries])
    v = np.array([q[1] for q in queries])
    got = _sketch._row_count(A.ravel(), qr * W, W, v, strict)
    side = "left" if strict else "right"
    want = [np.searchsorted(A[r], x, side=side) for r, x in zip(qr, v, strict=True)]
    np.testing.assert_array_equal(got, want)
