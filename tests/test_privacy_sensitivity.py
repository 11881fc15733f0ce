"""Tests for fedforest_secure.privacy.sensitivity, including a brute-force check."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray

from fedforest_secure.errors import BudgetError
from fedforest_secure.privacy import Sensitivity, histogram_sensitivity


def test_formulas() -> None:
    s = histogram_sensitivity("count", n_features=4, n_trees=9, max_multiplicity=3)
    assert (s.l1, s.l2, s.linf) == (108.0, 18.0, 3.0)
    y = histogram_sensitivity("sum", n_features=1, target_bounds=(-5.0, 2.0))
    assert (y.l1, y.l2, y.linf) == (5.0, 5.0, 5.0)
    y2 = histogram_sensitivity("sum_sq", n_features=4, target_bounds=(-5.0, 2.0))
    assert (y2.l1, y2.l2, y2.linf) == (100.0, 50.0, 25.0)
    c = histogram_sensitivity("class_count", n_features=1, max_multiplicity=2)
    assert (c.l1, c.l2, c.linf) == (2.0, 2.0, 2.0)


def test_combine_and_scale() -> None:
    a = Sensitivity(3.0, 3.0, 1.0)
    b = Sensitivity(4.0, 4.0, 2.0)
    c = a.combine(b)
    assert (c.l1, c.l2, c.linf) == (7.0, 5.0, 2.0)
    d = c.scaled(2.0**24)
    assert d.l2 == 5.0 * 2**24
    with pytest.raises(BudgetError):
        c.scaled(0.0)


@pytest.mark.parametrize(
    ("stat", "kw"),
    [
        ("sum", {}),
        ("sum_sq", {"target_bounds": None}),
        ("sum", {"target_bounds": (0.0, math.inf)}),
        ("count", {"n_features": 0}),
        ("count", {"max_multiplicity": 0}),
        ("median", {}),
    ],
)
def test_rejects(stat: str, kw: dict[str, object]) -> None:
    with pytest.raises(BudgetError):
        histogram_sensitivity(stat, **kw)  # type: ignore[arg-type]


def _level_histograms(
    bins: NDArray[np.int64],
    node: NDArray[np.int64],
    mult: NDArray[np.int64],
    y: NDArray[np.float64],
    n_nodes: int,
    n_bins: int,
) -> NDArray[np.float64]:
    """Per (tree, node, feature, bin) counts and sums of y; bins: (T, n, F), node/mult: (T, n)."""
    T, n, F = bins.shape
    out = np.zeros((2, T, n_nodes, F, n_bins))
    for t in range(T):
        for i in range(n):
            for f in range(F):
                out[0, t, node[t, i], f, bins[t, i, f]] += mult[t, i]
                out[1, t, node[t, i], f, bins[t, i, f]] += mult[t, i] * y[i]
    return out


def test_brute_force_removal_stays_within_bounds() -> None:
    """Remove each record in turn from random forests' level statistics; the change of the
    histogram vector never exceeds the bounds, and the worst case attains them."""
    rng = np.random.default_rng(7)
    T, n, F, n_nodes, B, m_max = 3, 25, 4, 4, 5, 3
    bins = rng.integers(0, B, size=(T, n, F))
    node = rng.integers(0, n_nodes, size=(T, n))
    mult = rng.integers(0, m_max + 1, size=(T, n))
    mult[:, 0] = m_max  # record 0: maximal multiplicity in every tree
    y = rng.uniform(-2.0, 3.0, size=n)
    y[0] = 3.0
    full = _level_histograms(bins, node, mult, y, n_nodes, B)
    cnt = histogram_sensitivity("count", n_features=F, n_trees=T, max_multiplicity=m_max)
    sm = histogram_sensitivity(
        "sum", n_features=F, n_trees=T, max_multiplicity=m_max, target_bounds=(-2.0, 3.0)
    )
    worst = [0.0, 0.0]
    for i in range(n):
        keep = np.arange(n) != i
        d = full - _level_histograms(
            bins[:, keep], node[:, keep], mult[:, keep], y[keep], n_nodes, B
        )
        for k, s in enumerate((cnt, sm)):
            l1 = np.abs(d[k]).sum()
            l2 = math.sqrt((d[k] ** 2).sum())
            assert l1 <= s.l1 + 1e-9 and l2 <= s.l2 + 1e-9 and np.abs(d[k]).max() <= s.linf + 1e-9
            worst[k] = max(worst[k], l2)
    assert worst[0] == pytest.approx(cnt.l2)
    assert worst[1] == pytest.approx(sm.l2)
    # cumulative (left-child) sums instead of histograms would break the bound (invariant 3)
    cum = np.cumsum(full[0], axis=-1)
    keep = np.arange(n) != 0
    cum_minus = np.cumsum(
        _level_histograms(bins[:, keep], node[:, keep], mult[:, keep], y[keep], n_nodes, B)[0],
        axis=-1,
    )
    assert np.abs(cum - cum_minus).sum() > cnt.l1


@pytest.mark.parametrize("bootstrap", [True, False])
def test_a_dp_jobs_first_release_moves_within_the_bound_when_a_row_is_added(
        bootstrap: bool) -> None:
    """The sums a DP job's level-0 release adds noise to (here taken without noise), on a
    table and on the same table with one row added at site 0: they differ by at most the
    sensitivity the noise is calibrated for, sqrt(T F) m_max in L2 (m_max = 1 without
    resampling). A bootstrap drawn over the whole table would redraw every other row's copies
    when a row is added, and move the sums by 4x that bound at 2,000 rows."""
    from fedforest_secure import FedForestClassifier
    from fedforest_secure.federation import PlainSum, run_in_process
    from fedforest_secure.privacy import load_profile

    rng = np.random.default_rng(5)
    n = 2000
    X = rng.uniform(0, 1, size=(n, 3))
    X[0], X[1] = 0.0, 1.0  # the public bounds do not move with the new row
    y = (X[:, 0] > 0.5).astype(int)
    h = np.arange(n) % 4
    prof = load_profile("secure-dp")
    cfg = FedForestClassifier(profile=prof, method="histogram", bootstrap=bootstrap,
                              n_estimators=8, max_depth=1, max_features=3,
                              random_state=0).fit(X, y, client=h).config_

    def first_release(Xs: NDArray[np.float64], ys: NDArray[np.int_], hs: NDArray[np.int_]
                      ) -> NDArray[np.float64]:
        recs: list = []
        run_in_process(cfg, [(Xs[hs == k], ys[hs == k]) for k in range(4)],
                       aggregator=PlainSum(), on_round=recs.append)
        out: NDArray[np.float64] = next(r for r in recs if r.task.params.get("dp")).total
        return out

    before = first_release(X, y, h)
    after = first_release(np.vstack([[[0.3, 0.6, 0.9]], X]), np.append(1, y), np.append(0, h))
    m_max = prof.dp.max_multiplicity if bootstrap else 1
    bound = histogram_sensitivity("class_count", n_features=cfg.max_features,
                                  n_trees=cfg.n_estimators, max_multiplicity=m_max)
    diff = after - before
    assert np.linalg.norm(diff) <= bound.l2 + 1e-9
    assert np.abs(diff).sum() <= bound.l1 + 1e-9 and np.abs(diff).max() <= bound.linf
