"""Tests for fedforest_secure._secure_cdf: the secure pooled-CDF sketch on outlier data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fedforest_secure._secure_cdf as secure_cdf_mod
from fedforest_secure._candidates import fixed_width_grid
from fedforest_secure._secure_cdf import SecureCdfPlanner
from fedforest_secure.config import JobConfig
from fedforest_secure.federation import RoundRecord, run_in_process
from fedforest_secure.privacy import load_profile
from fedforest_secure.protocol import TaskKind


def _outlier_data(seed: int, frac: float, n: int = 2000, d: int = 3) -> np.ndarray:
    """Homogeneous synthetic X; every feature x1000 on a fraction of the rows (paper's setup)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    out = rng.random(n) < frac
    X[out] *= 1000.0
    return X


def _ecdf(col: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.sort(col), t, side="right") / col.size


def _true_counts(cols: list[np.ndarray], grid: np.ndarray, feats: np.ndarray) -> np.ndarray:
    """Pooled counts per cell (t_{b-1}, t_b] for each (node, slot), as the clients would sum."""
    E, m, W = grid.shape
    out = np.zeros((E, m, W + 1))
    for e in range(E):
        for s in range(m):
            if feats[e, s] < 0:
                continue
            b = np.searchsorted(grid[e, s], cols[e][:, feats[e, s]], side="left")
            out[e, s] = np.bincount(b, minlength=W + 1)
    return out


def _plan(X: np.ndarray, B: int, lo: np.ndarray, hi: np.ndarray,
          **kw: Any) -> tuple[np.ndarray, int]:
    d = X.shape[1]
    feats = np.arange(d)[None, :]
    planner = SecureCdfPlanner(lo[None, :], hi[None, :], feats, np.zeros(d, dtype=bool),
                               np.array([X.shape[0]]), B, **kw)
    rounds = 0
    while (grid := planner.next_grid()) is not None:
        active = planner.active_features()
        planner.receive(_true_counts([X], grid, active))
        rounds += 1
    return planner.candidates()[0], rounds


def _rank_errors(X: np.ndarray, thr: np.ndarray, B: int) -> np.ndarray:
    """max_b min_t |F(t) - b/B| per feature: how far the best candidate is from each b/B."""
    levels = np.arange(1, B) / B
    errs = []
    for j in range(X.shape[1]):
        t = thr[j][np.isfinite(thr[j])]
        if t.size == 0:
            errs.append(1.0)
            continue
        F = _ecdf(X[:, j], t)
        errs.append(np.abs(F[:, None] - levels[None, :]).min(axis=0).max())
    return np.array(errs)


def _histogram_thresholds(X: np.ndarray, B: int) -> np.ndarray:
    lohi = np.stack([X.min(axis=0), X.max(axis=0)], axis=1)
    return fixed_width_grid(lohi, B)


@pytest.mark.parametrize("seed,frac", [(0, 0.05), (1, 0.1), (2, 0.2)])
@pytest.mark.parametrize("B", [8, 16, 32])
def test_secure_cdf_beats_fixed_width_histograms_on_outliers(seed: int, frac: float,
                                                            B: int) -> None:
    X = _outlier_data(seed, frac)
    lo, hi = X.min(axis=0), X.max(axis=0)  # public bounds covering the outliers
    lo, hi = lo - 0.01 * (hi - lo), hi + 0.01 * (hi - lo)
    thr, rounds = _plan(X, B, lo, hi)
    assert 1 <= rounds <= 4
    assert thr.shape == (X.shape[1], B - 1)
    err_secure = _rank_errors(X, thr, B)
    assert err_secure.max() <= 2.0 / B, err_secure
    err_hist = _rank_errors(X, _histogram_thresholds(X, B), B)
    assert err_hist.min() > 2.0 / B, err_hist  # the fixed grid misses the bulk of the data
    # candidates stay inside the box and are sorted, +inf padded
    fin = np.isfinite(thr)
    assert (thr[fin] >= lo.min()).all() and (thr[fin] <= hi.max()).all()
    for j in range(X.shape[1]):
        t = thr[j][fin[j]]
        assert np.all(np.diff(t) > 0)


@pytest.mark.parametrize("where", ["high", "low"])
@pytest.mark.parametrize("magnitude", [1e4, 1e6, 1e8, 1e10])
@pytest.mark.parametrize("B", [16, 32])
def test_one_far_value_does_not_hide_the_data_from_the_candidates(where: str, magnitude: float,
                                                                 B: int) -> None:
    """A sentinel such as 9999999 in one row puts every other row in the first grid's end
    cell, which keeps its whole mass through equal-width refinements: the geometric cuts
    from the cell's ends reach the data, and the candidates come within 2/B of every pooled
    rank, in at most four grid rounds, at any scale."""
    rng = np.random.default_rng(int(np.log10(magnitude)) + B)
    X = rng.normal(size=(1000, 2))
    X[0] = magnitude if where == "high" else -magnitude
    thr, rounds = _plan(X, B, X.min(axis=0), X.max(axis=0))
    assert rounds <= 4
    assert _rank_errors(X, thr, B).max() <= 2.0 / B


@pytest.mark.parametrize("at", [0.05, 0.37, 0.5, 0.83])
@pytest.mark.parametrize("magnitude", [1e4, 1e6])
@pytest.mark.parametrize("B", [16, 32])
def test_data_anywhere_inside_bounds_a_million_times_wider_gets_its_candidates(
        at: float, magnitude: float, B: int) -> None:
    """Public bounds up to 10^6 times wider than the data, the data at any place inside them
    (far values at both ends, or a schema's generous range): within 2/B in four rounds. The
    equal cuts zoom about 64 times a round; a cell that keeps its whole mass is not taken for
    a single value until it did so three times."""
    rng = np.random.default_rng(int(at * 100) + B)
    X = rng.normal(size=(1000, 1))
    lo = X.min(axis=0) - at * magnitude
    hi = X.max(axis=0) + (1 - at) * 2 * magnitude
    thr, rounds = _plan(X, B, lo, hi)
    assert rounds <= 4
    assert _rank_errors(X, thr, B).max() <= 2.0 / B


def test_a_single_value_stops_refining_before_the_round_limit() -> None:
    """An atom (a binary feature) beside continuous data: its cells stop being cut once
    their whole mass stayed in one sub-cell twice, and the continuous feature needs one
    round: the sketch ends within the four rounds, with the atoms as candidates."""
    rng = np.random.default_rng(1)
    X = np.stack([rng.integers(0, 2, 2000).astype(float), rng.normal(size=2000)], axis=1)
    thr, rounds = _plan(X, 16, X.min(axis=0), X.max(axis=0))
    assert rounds <= 4
    assert _rank_errors(X[:, 1:], thr[1:], 16).max() <= 2.0 / 16
    t = thr[0][np.isfinite(thr[0])]
    assert t.size >= 1 and ((t >= 0) & (t < 1)).all()  # a cut between the two values


def test_secure_cdf_exact_quantiles_without_outliers() -> None:
    """On clean data inside tight bounds the candidates are close to the pooled quantiles."""
    rng = np.random.default_rng(4)
    X = rng.random((1500, 2))
    B = 16
    thr, _ = _plan(X, B, np.zeros(2), np.ones(2))
    assert _rank_errors(X, thr, B).max() <= 1.0 / B


def test_adaptive_b_limits_candidates() -> None:
    rng = np.random.default_rng(5)
    X = rng.normal(size=(12, 2))
    lo, hi = np.full(2, -10.0), np.full(2, 10.0)
    thr, _ = _plan(X, 32, lo, hi, rows_per_point=2)  # B_nu = 12 / 2 = 6
    assert np.isfinite(thr).sum(axis=1).max() <= 5
    thr1, _ = _plan(X[:3], 32, lo, hi, rows_per_point=2)  # B_nu = 1: no candidate
    assert np.isinf(thr1).all()


def test_categorical_and_empty_slots_get_no_grid() -> None:
    feats = np.array([[0, 1, -1]])
    planner = SecureCdfPlanner(np.zeros((1, 3)), np.ones((1, 3)), feats,
                               np.array([False, True, False]), np.array([100.0]), 8)
    grid = planner.next_grid()
    assert grid is not None
    assert np.isfinite(grid[0, 0]).any()
    assert np.isinf(grid[0, 1]).all() and np.isinf(grid[0, 2]).all()
    np.testing.assert_array_equal(planner.active_features(), [[0, -1, -1]])


def test_engine_secure_cdf_on_outliers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the engine: the root's candidates, from securely summed statistics, are within
    2/B of the pooled quantiles; the grid rounds carry the evaluation (no histogram round of
    its own), and no round discloses anything."""
    made: list[SecureCdfPlanner] = []

    class Recording(SecureCdfPlanner):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(secure_cdf_mod, "SecureCdfPlanner", Recording)
    X = _outlier_data(7, 0.2, n=900)
    rng = np.random.default_rng(7)
    y = X[:, 0] + rng.normal(size=X.shape[0])
    K, B = 3, 16
    bounds = tuple((float(a) - 1.0, float(b) + 1.0)
                   for a, b in zip(X.min(0), X.max(0), strict=True))
    cfg = JobConfig(job_id="s", task="regression", n_features=3, n_clients=K,
                    feature_bounds=bounds, target_bound=float(np.abs(y).max()), n_estimators=1,
                    max_depth=1, min_samples_leaf=5, max_features=3, bootstrap=False, n_bins=B,
                    profile=load_profile("secure").to_dict())
    recs: list[RoundRecord] = []
    run_in_process(cfg, [(X[k::K], y[k::K]) for k in range(K)], on_round=recs.append)
    grids = [r for r in recs if r.task.kind == TaskKind.HISTOGRAM]
    assert all(r.task.params.get("purpose") == "sketch" for r in grids)
    assert 1 <= len(grids) <= 4 and all(not r.disclosed for r in recs)
    (planner,) = made
    thr = planner.candidates()[0]  # root, every feature
    feats = planner.feats[0]
    assert _rank_errors(X[:, feats], thr, B).max() <= 2.0 / B


@pytest.mark.parametrize("magnitude", [1e6, 1e8])
def test_a_sentinel_value_does_not_stop_the_secure_forest_splitting_on_its_feature(
        magnitude: float) -> None:
    """One row's informative feature set to a far value (a sentinel such as 9999999): the
    secure profile's roots still split on that feature, as the open profile's do, with
    about the same fit on the other rows."""
    from fedforest_secure import FedForestRegressor

    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 4))
    y = 2 * X[:, 0] + rng.normal(scale=0.3, size=600)
    h = np.arange(600) % 3
    Xo = X.copy()
    Xo[0, 0] = magnitude
    fits = {p: FedForestRegressor(n_estimators=5, max_depth=1, max_features=None, profile=p,
                                  random_state=0).fit(Xo, y, client=h)
            for p in ("open", "secure")}
    assert all(int(t.tree_.feature[0]) == 0 for t in fits["secure"].estimators_)
    r2 = {p: m.score(X[1:], y[1:]) for p, m in fits.items()}
    assert r2["secure"] > r2["open"] - 0.05, r2


def test_a_box_too_narrow_for_a_new_edge_is_not_asked_again() -> None:
    """A node's box of two adjacent floats (splits on both sides of one value) holding many
    rows is heavy, but no edge fits inside it: the sketch ends rather than ask the same grid
    again (a repeated question the clients refuse, since answering it twice could isolate a
    client by differencing)."""
    lo = np.array([-0.044641636506989144])
    hi = np.nextafter(lo, np.inf)
    X = np.full((200, 1), hi[0])
    planner = SecureCdfPlanner(lo[None, :], hi[None, :], np.array([[0]]), np.zeros(1, dtype=bool),
                               np.array([200.0]), 16)
    grids = []
    while (grid := planner.next_grid()) is not None:
        assert not any(np.array_equal(grid, g) for g in grids), "the same grid asked twice"
        grids.append(grid)
        planner.receive(_true_counts([X], grid, planner.active_features()))
    assert len(grids) == 1


def test_features_near_the_float_maximum_grow_the_same_trees_without_overflow() -> None:
    """A box from -1.5e308 to 1.5e308 is wider than the largest float: its grid and its atom
    tolerance are computed without overflowing (the grid was all infinite: single leaves,
    0.53 accuracy, and RuntimeWarnings from this module)."""
    import warnings

    from fedforest_secure import FedForestClassifier

    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(400, 3))
    y = (X[:, 0] > 0).astype(int)
    h = np.arange(400) % 4
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        huge = FedForestClassifier(n_estimators=3, max_depth=3, profile="secure",
                                   random_state=0).fit(X * 1.5e308, y, client=h)
        score = huge.score(X * 1.5e308, y)  # scikit-learn's input check sums X: its warning
    ours = [w for w in seen if "fedforest_secure" in w.filename]
    assert not ours, [(w.filename, w.lineno, str(w.message)) for w in ours]
    assert score > 0.95


def _wide_level_peak(E: int, m: int, n: int, B: int) -> tuple[int, list[tuple[int, ...]], int]:
    """One level of E nodes x m feature slots through the secure sketch's grid rounds (with
    the bins' statistics, as a fused level asks them), answered with the true sums of each
    node's ``n`` rows; three nodes' first feature sits deep inside a box a million times
    wider than its data, so their grids are refined in every round. Returns the most memory
    held during the rounds (tracemalloc), the shapes of the rounds' sums and the bytes of
    the first round's."""
    import tracemalloc

    from fedforest_secure._candidates import CandidateQuery, Quantiles
    from fedforest_secure._planner import LevelContext
    from fedforest_secure._release import ReleasePolicy

    rng = np.random.default_rng(0)
    X = rng.normal(size=(E, n, m))
    y = X[:, :, 0] + rng.normal(size=(E, n))
    cfg = JobConfig(job_id="w", task="regression", n_features=m, n_clients=1,
                    feature_bounds=((-1e6, 1e6),) * m, target_bound=float(np.abs(y).max()) + 1,
                    n_bins=B, profile=load_profile("secure").to_dict())
    method = Quantiles(cfg, ReleasePolicy(cfg))
    box_lo, box_hi = np.full((E, m), -6.0), np.full((E, m), 6.0)
    box_lo[:3, 0], box_hi[:3, 0] = -1e6, 1e6
    feats = np.tile(np.arange(m), (E, 1))
    ctx = LevelContext(level=1, feats=feats, totals=np.zeros((E, 2)), n=np.full(E, float(n)),
                       is_cat=np.zeros(m, dtype=bool), box_lo=box_lo, box_hi=box_hi, lohi=None)
    query = CandidateQuery(ctx, np.arange(E), np.arange(E), feats, {})

    def ask(kind: TaskKind, level: int, params: dict[str, Any], arrays: dict[str, np.ndarray],
            layout: tuple[Any, ...], disclose: tuple[str, ...] = ()) -> Any:
        return arrays, layout

    shapes: list[tuple[int, ...]] = []
    first = 0
    tracemalloc.start()
    try:
        rounds = method.grid_evaluation(query, ask)
        task = next(rounds)
        while True:
            arrays, (block,) = task
            nodes, fs, thr = arrays["nodes"], arrays["features"], arrays["thresholds"]
            sums = np.zeros(block.shape)
            for i, s in zip(*np.nonzero(fs >= 0), strict=True):
                b = np.searchsorted(thr[i, s], X[nodes[i], :, fs[i, s]], side="left")
                sums[i, s, :, 0] = np.bincount(b, minlength=sums.shape[2])
                sums[i, s, :, 1] = np.bincount(b, weights=y[nodes[i]], minlength=sums.shape[2])
            shapes.append(sums.shape)
            if len(shapes) == 1:
                first = sums.nbytes
            try:
                task = rounds.send(({"hist": sums}, {}))
            except StopIteration:
                break
            del sums
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, shapes, first


def test_a_wide_level_with_a_few_refined_grids_holds_about_its_first_round() -> None:
    """A level's memory follows its first round's sums, not (every node x feature slot) x the
    widest refined grid: the grid rounds of 1,000 nodes x 10 slots, three of whose grids are
    refined to four times the first grid's cells, hold under 6 x the first round's sums
    (the sums, the working counts, the grids, the candidates and bins' statistics, runs of
    temporaries: about 4 x). Every row padded to the widest grid would hold about 34 x (on
    a madelon level of 458 nodes x 166 slots, 1.9 GB)."""
    peak, shapes, first = _wide_level_peak(E=1000, m=10, n=150, B=16)
    assert shapes[0][:2] == (1000, 10)
    assert len(shapes) >= 3 and all(s[0] == 3 for s in shapes[1:])  # refined rows' nodes only
    assert shapes[-1][2] >= 3 * shapes[0][2]  # padding to it: >= 3 x per copy of the sums
    assert peak < 6 * first, (peak / first, shapes)


def test_small_row_chunks_grow_the_same_secure_forest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The secure sketch walks a level's (node, slot) rows a chunk at a time (its memory):
    chunks of a few entries, splitting levels and refined grids across many chunks, grow the
    same forest, round for round, as the default chunks."""
    X = _outlier_data(3, 0.2, n=900)
    rng = np.random.default_rng(3)
    y = X[:, 0] + rng.normal(size=X.shape[0])
    K = 3
    bounds = tuple((float(a) - 1.0, float(b) + 1.0)
                   for a, b in zip(X.min(0), X.max(0), strict=True))
    cfg = JobConfig(job_id="c", task="regression", n_features=3, n_clients=K,
                    feature_bounds=bounds, target_bound=float(np.abs(y).max()), n_estimators=3,
                    max_depth=4, min_samples_leaf=5, max_features=2, n_bins=16,
                    profile=load_profile("secure").to_dict())
    parts = [(X[k::K], y[k::K]) for k in range(K)]

    def fit() -> tuple[str, list[str]]:
        recs: list[RoundRecord] = []
        model = run_in_process(cfg, parts, on_round=recs.append)
        return model.to_json(), [r.task.digest() for r in recs]

    whole = fit()
    monkeypatch.setattr(secure_cdf_mod, "CHUNK_ENTRIES", 7)
    assert fit() == whole


def test_a_wide_levels_grid_round_needs_little_beyond_its_results() -> None:
    """The planner's row-by-row steps run a few hundred KB at a time: a level's round holds
    its results (bins' statistics, candidates), the round's counts and a few MB besides, not
    temporaries as large as the round's sums."""
    import tracemalloc

    E, m, B, S = 1000, 6, 32, 2
    W = 4 * B - 1  # the first grid without a prior: 4 B cells of equal width
    n = np.full(E, 4096.0)
    planner = SecureCdfPlanner(np.zeros((E, m)), np.ones((E, m)), np.tile(np.arange(m), (E, 1)),
                               np.zeros(m, dtype=bool), n, B,
                               keep_cells=np.zeros((E, m), dtype=bool))
    grid = planner.next_grid()
    assert grid is not None and grid.shape == (E, m, W)
    counts = np.full((E, m, W + 1), 32.0)  # every cell 1/128 of its node: none is heavy
    stats = np.stack([counts, np.linspace(-1.0, 1.0, counts.size).reshape(counts.shape)],
                     axis=-1)
    del grid
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        planner.receive(counts, stats)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    R = E * m
    results = 8 * R * (B * S + B - 1)  # bins' statistics and candidates, kept
    round_counts = 8 * R * (W + 1) + 2 * R * (W + 1)  # the counts, unsplit and heavy flags
    assert planner.next_round() is None and np.isfinite(planner.candidates()).all()
    np.testing.assert_allclose(planner.histogram().sum(axis=2), stats.sum(axis=2))
    assert peak < results + round_counts + 3 * 2**20, (peak - results - round_counts) / 2**20
