"""Tests for fedforest_secure._sketch: per-client quantiles, the mixture CDF (Theorem 1) and
the pooled candidate thresholds; and the worker's vectorised sketch against the reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedforest_secure import load_profile
from fedforest_secure._sketch import client_quantiles, mixture_cdf, pooled_candidates
from fedforest_secure.config import JobConfig
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind
from fedforest_secure.worker import Worker

EPS = 1e-9


# ---------------------------------------------------------------------------- data strategies
@st.composite
def federations(draw: Any) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """K clients, each with 1..200 values and positive integer weights, in varied regimes."""
    K = draw(st.integers(1, 6))
    B = draw(st.integers(2, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    values, weights = [], []
    for k in range(K):
        n = draw(st.integers(1, 200))
        regime = draw(st.sampled_from(["normal", "discrete", "constant", "disjoint", "heavy"]))
        if regime == "normal":
            v = rng.normal(loc=k, size=n)
        elif regime == "discrete":
            v = rng.integers(0, draw(st.integers(1, 5)), n).astype(float)
        elif regime == "constant":
            v = np.full(n, float(draw(st.integers(-3, 3))))
        elif regime == "disjoint":
            v = 100.0 * k + rng.random(n)  # supports of the clients do not overlap
        else:
            v = np.where(rng.random(n) < 0.7, 0.0, rng.exponential(size=n) * 1000)
        if draw(st.booleans()):
            w = rng.integers(1, 6, n).astype(float)  # bootstrap-like multiplicities
        else:
            w = np.ones(n)
        values.append(v)
        weights.append(w)
    return values, weights, B


def _pooled_cdf(values: list[np.ndarray], weights: list[np.ndarray], x: np.ndarray,
                strict: bool = False) -> np.ndarray:
    v = np.concatenate(values)
    w = np.concatenate(weights)
    order = np.argsort(v)
    v, cw = v[order], np.cumsum(w[order])
    idx = np.searchsorted(v, x, side="left" if strict else "right")
    return np.where(idx > 0, cw[np.maximum(idx - 1, 0)], 0.0) / cw[-1]


def _sketch(values: list[np.ndarray], weights: list[np.ndarray], bks: list[int]
            ) -> tuple[np.ndarray, np.ndarray]:
    P = max(bks) + 1
    pts = np.full((1, len(values), P), np.nan)
    for k, (v, w, b) in enumerate(zip(values, weights, bks, strict=True)):
        pts[0, k, : b + 1] = client_quantiles(v, w, b)
    counts = np.array([[w.sum() for w in weights]])
    return pts, counts


def _eval_points(values: list[np.ndarray]) -> np.ndarray:
    u = np.unique(np.concatenate(values))
    mids = (u[:-1] + u[1:]) / 2
    span = max(u[-1] - u[0], 1.0)
    return np.concatenate([u, mids, [u[0] - span, u[-1] + span]])


# ---------------------------------------------------------------------------- reference quantiles
def test_client_quantiles_definition() -> None:
    # Q(p) = inf{x : F(x) >= p}, Q(0) = min
    v = np.array([5.0, 1.0, 3.0, 3.0, 2.0])
    q = client_quantiles(v, None, 5)
    np.testing.assert_array_equal(q, [1.0, 1.0, 2.0, 3.0, 3.0, 5.0])
    q = client_quantiles(np.array([1.0, 2.0]), np.array([3.0, 1.0]), 4)
    np.testing.assert_array_equal(q, [1.0, 1.0, 1.0, 1.0, 2.0])
    assert np.isnan(client_quantiles(np.zeros(0), None, 3)).all()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fed=federations())
def test_theorem1_sup_error_at_most_one_over_B(fed: Any) -> None:
    """sup_x |F~(x) - F(x)| <= 1/B for any client mixture (Theorem 1)."""
    values, weights, B = fed
    pts, counts = _sketch(values, weights, [B] * len(values))
    x = _eval_points(values)
    mix = counts / counts.sum()
    Ft = mixture_cdf(pts, mix, x[None, :])[0]
    F = _pooled_cdf(values, weights, x)
    assert np.max(np.abs(Ft - F)) <= 1.0 / B + EPS


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fed=federations(), data=st.data())
def test_theorem1_with_per_client_sketch_sizes(fed: Any, data: Any) -> None:
    """With adaptive B each client has its own B_k; the bound is max_k 1/B_k."""
    values, weights, B = fed
    bks = [data.draw(st.integers(1, B)) for _ in values]
    pts, counts = _sketch(values, weights, bks)
    x = _eval_points(values)
    Ft = mixture_cdf(pts, counts / counts.sum(), x[None, :])[0]
    F = _pooled_cdf(values, weights, x)
    assert np.max(np.abs(Ft - F)) <= 1.0 / min(bks) + EPS


def test_theorem1_bound_is_attained_order() -> None:
    """The bound is not loose by construction: a coarse sketch does err by ~1/B somewhere."""
    rng = np.random.default_rng(3)
    values = [rng.normal(size=200), rng.normal(loc=3, size=150)]
    weights = [np.ones(200), np.ones(150)]
    pts, counts = _sketch(values, weights, [4, 4])
    x = _eval_points(values)
    err = np.abs(mixture_cdf(pts, counts / counts.sum(), x[None, :])[0]
                 - _pooled_cdf(values, weights, x))
    assert 0.02 < err.max() <= 0.25 + EPS


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fed=federations())
def test_pooled_candidates_rank_error(fed: Any) -> None:
    """Corollary of Theorem 1 for t_b = (F~)^{-1}(b/B).

    F~(t_b^-) <= b/B <= F~(t_b) by the definition of the inverse; Theorem 1 holds for left
    limits too, so  F(t_b^-) - 1/B <= b/B <= F(t_b) + 1/B.  Where F has no atom at t_b (no
    ties there) this is |F(t_b) - b/B| <= 1/B; at an atom (heavy ties) no threshold can do
    better than the atom, so the two-sided form is the exact statement tested.
    Thresholds are deduplicated, so every b must be served by some returned threshold and
    every returned threshold must serve some b.
    """
    values, weights, B = fed
    pts, counts = _sketch(values, weights, [B] * len(values))
    thr = pooled_candidates(pts, counts, B)[0]
    assert thr.shape == (B - 1,)
    fin = thr[np.isfinite(thr)]
    assert fin.size >= 1
    assert np.all(np.diff(fin) > 0)  # sorted, distinct, +inf padded at the end
    assert np.isinf(thr[fin.size:]).all()
    # a threshold acts through the partition it induces, i.e. through the largest data value
    # at or below it (a cut moved to the middle of an empty gap splits the rows the same way)
    allv = np.sort(np.concatenate(values))
    eff = allv[np.maximum(np.searchsorted(allv, fin, side="right") - 1, 0)]
    lo = _pooled_cdf(values, weights, eff, strict=True) - 1.0 / B - EPS  # F(t^-) - 1/B
    hi = _pooled_cdf(values, weights, fin) + 1.0 / B + EPS  # F(t) + 1/B
    levels = np.arange(1, B) / B
    ok = (lo[:, None] <= levels[None, :]) & (levels[None, :] <= hi[:, None])
    assert ok.any(axis=0).all(), "some b/B has no candidate within the rank bound"
    assert ok.any(axis=1).all(), "a candidate serves no b/B"
    # candidates stay inside the data range
    allv = np.concatenate(values)
    assert fin.min() >= allv.min() and fin.max() <= allv.max()


def test_pooled_candidates_continuous_data_exact_rank() -> None:
    """Without ties, the b-th candidate has |F(t_b) - b/B| <= 1/B, with B - 1 candidates."""
    rng = np.random.default_rng(5)
    values = [rng.normal(size=300), rng.exponential(size=120) + 2, rng.random(50) - 4]
    weights = [np.ones(300), rng.integers(1, 4, 120).astype(float), np.ones(50)]
    B = 16
    pts, counts = _sketch(values, weights, [B] * 3)
    thr = pooled_candidates(pts, counts, B)[0]
    assert np.isfinite(thr).all()
    F = _pooled_cdf(values, weights, thr)
    assert np.max(np.abs(F - np.arange(1, B) / B)) <= 1.0 / B + EPS


def test_pooled_candidates_batches_and_absent_clients() -> None:
    """Rows are independent: batching, NaN-padded short sketches and absent clients agree
    with row-by-row computation; a row with no data yields only +inf."""
    rng = np.random.default_rng(11)
    B = 12
    rows, cnts = [], []
    for r in range(30):
        K = 3
        pts = np.full((K, B + 1), np.nan)
        cnt = np.zeros(K)
        for k in range(K):
            if r % 7 == 0 or rng.random() < 0.2:
                continue  # client absent from this node
            n = int(rng.integers(1, 60))
            bk = int(rng.integers(1, B + 1))
            v = rng.normal(size=n) if r % 2 else rng.integers(0, 3, n).astype(float)
            pts[k, : bk + 1] = client_quantiles(v, None, bk)
            cnt[k] = n
        rows.append(pts)
        cnts.append(cnt)
    P, C = np.stack(rows), np.stack(cnts)
    batch = pooled_candidates(P, C, B)
    for r in range(len(rows)):
        single = pooled_candidates(P[r:r + 1], C[r:r + 1], B)[0]
        np.testing.assert_array_equal(batch[r], single)
        if C[r].sum() == 0:
            assert np.isinf(batch[r]).all()


# ---------------------------------------------------------------------------- worker sketch
def _worker_points(X: np.ndarray, y: np.ndarray, B: int, T: int, bootstrap: bool,
                   profile: dict[str, Any]) -> tuple[Worker, np.ndarray, np.ndarray]:
    d = X.shape[1]
    cfg = JobConfig(job_id="j", task="regression", n_features=d, n_clients=1, n_estimators=T,
                    max_features=d, n_bins=B, bootstrap=bootstrap, profile=profile)
    w = Worker(cfg, X, y, client_index=0, seed=123)
    feats = np.tile(np.arange(d), (T, 1))
    task = Task(job_id="j", round_id=1, kind=TaskKind.SKETCH, level=0,
                params={"n_nodes": T, "n_points": B}, arrays={"features": feats},
                layout=(Block("totals", (T, 3), (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)),),
                disclose=("sketch_points",))
    rep = w.handle(task)
    # recover each tree's multiplicity per distinct value through the public histogram round:
    # cutting at every distinct value puts exactly one distinct value in each bin
    uniq = [np.unique(X[:, j]) for j in range(d)]
    width = max(u.size for u in uniq)
    thr = np.full((T, d, width), np.inf)
    for j, u in enumerate(uniq):
        thr[:, j, : u.size] = u
    htask = Task(job_id="j", round_id=2, kind=TaskKind.HISTOGRAM, level=0,
                 params={"stats": "count"},
                 arrays={"nodes": np.arange(T), "features": feats, "thresholds": thr},
                 layout=(Block("c", (T, d, width + 1, 1), (StatKind.COUNT,)),))
    counts = w.handle(htask).summable.reshape(T, d, width + 1)
    return w, rep.disclosed["sketch_points"], counts


@pytest.mark.parametrize("bootstrap", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_worker_quantile_points_equal_reference(bootstrap: bool, ties: bool) -> None:
    rng = np.random.default_rng(21)
    n, d, T, B = 57, 3, 4, 10
    X = rng.integers(0, 6, (n, d)).astype(float) if ties else rng.normal(size=(n, d))
    y = rng.normal(size=n)
    _, pts, counts = _worker_points(X, y, B, T, bootstrap, {})
    assert pts.shape == (T, d, B + 1)
    for t in range(T):
        for j in range(d):
            u = np.unique(X[:, j])
            mult = counts[t, j, : u.size]
            assert mult.sum() == n  # stratified bootstrap keeps n_k draws
            if not bootstrap:
                assert (mult == np.bincount(np.searchsorted(u, X[:, j]), minlength=u.size)).all()
            keep = mult > 0
            ref = client_quantiles(u[keep], mult[keep], B)
            np.testing.assert_array_equal(pts[t, j], ref)


@pytest.mark.parametrize("r", [1, 2, 3, 7])
def test_worker_adaptive_sketch_size(r: int, kernels: str) -> None:
    """Adaptive B: B_k = min(B, floor(c_k / r)) intervals, i.e. B_k + 1 quantile points, with
    c_k the node's distinct rows for r >= 2 (a row the bootstrap drew several times counts
    once) and its weighted rows for r = 1 (the paper's rule), so a sketch interval summarises
    at least r rows (none at all below r); the points are the reference Q(b / B_k) of the
    weighted rows."""
    rng = np.random.default_rng(8)
    B = 16
    for n in (1, 2, 5, 9, 20, 40, 200):
        X = rng.normal(size=(n, 2))
        _, pts, counts = _worker_points(X, rng.normal(size=n), B, 2, True,
                                        {"rows_per_sketch_point": r})
        for t in range(2):
            for j in range(2):
                u = np.unique(X[:, j])
                mult = counts[t, j, : u.size]
                distinct = int((mult > 0).sum())  # the values are distinct: one per row
                rows = distinct if r >= 2 else n  # the bootstrap draws n_k times
                bk = int(min(rows // r, B))
                valid = ~np.isnan(pts[t, j])
                if bk == 0:  # fewer than r distinct rows: no point (a lone min/max is a record)
                    assert valid.sum() == 0
                    continue
                assert valid.sum() == bk + 1
                assert valid[: bk + 1].all()  # NaN padding at the end only
                assert bk <= rows / r
                ref = client_quantiles(u[mult > 0], mult[mult > 0], bk)
                np.testing.assert_array_equal(pts[t, j, : bk + 1], ref)


def test_a_lone_record_drawn_twice_discloses_no_sketch_point(kernels: str) -> None:
    """With r = 2 (the secure profiles' rule, here under ``sketch = "quantiles"``) a node whose
    only record the bootstrap drew twice or more sends no point: its weighted count passes r,
    but its min and max would be that record's raw value."""
    X = np.array([[1.2345], [7.5]])
    T = 16
    prof = load_profile("secure", sketch="quantiles").to_dict()
    assert prof["rows_per_sketch_point"] == 2
    w, pts, counts = _worker_points(X, np.array([0.5, -0.5]), 8, T, True, prof)
    lone = (counts[:, 0, :2] > 0).sum(axis=1) == 1  # trees whose root holds one record
    assert (counts[lone, 0, :2].sum(axis=1) == 2).all() and lone.sum() > 0  # drawn twice
    assert np.isnan(pts[lone]).all()
    assert np.isfinite(pts[~lone, 0, :2]).all()  # both records: min and max


def test_cut_between_disjoint_clients_goes_to_the_middle_of_the_gap() -> None:
    """Where the pooled sketch CDF is flat (no client has data in between), the cut is the
    midpoint of the gap, as CART's midpoints are, not the last observed value of one client."""
    rng = np.random.default_rng(3)
    a, b = rng.normal(-5, 1, 150), rng.normal(5, 1, 150)
    B = 32
    pts = np.stack([client_quantiles(a, None, B), client_quantiles(b, None, B)])[None]
    thr = pooled_candidates(pts, np.array([[150.0, 150.0]]), B)[0]
    inside = thr[(thr > a.max()) & (thr < b.min())]
    assert inside.size == 1
    assert inside[0] == pytest.approx((a.max() + b.min()) / 2)
