"""Seeded statistical tests of the vectorised discrete Gaussian sampler.

Every test uses fixed seeds, so it is deterministic; the thresholds (p > 1e-4) are what a correct
sampler passes with probability 1 - 1e-4 over the choice of seed, and the power checks show the
same tests reject a sampler whose scale is off by 10 %.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from diffprivlib.mechanisms import GaussianDiscrete
from numpy.typing import NDArray
from scipy import stats

from fedforest_secure.privacy import ChaChaRandom, sample_discrete_gaussian

P_MIN = 1e-4


def _pmf(sigma: float, support: NDArray[np.int64]) -> NDArray[np.float64]:
    ks = np.arange(-int(60 * sigma) - 60, int(60 * sigma) + 61)
    norm = np.exp(-(ks.astype(float) ** 2) / (2 * sigma**2)).sum()
    return np.exp(-(support.astype(float) ** 2) / (2 * sigma**2)) / norm


def _binned(samples: NDArray[np.int64], edges: list[int]) -> NDArray[np.int64]:
    """Counts in bins (-inf, e0], (e0, e1], ..., (e_last, inf)."""
    idx = np.searchsorted(np.asarray(edges), samples, side="left")
    return np.bincount(idx, minlength=len(edges) + 1)


def _gof_pvalue(samples: NDArray[np.int64], sigma: float) -> float:
    """Chi-square goodness of fit against the exact pmf, cells with expectation >= 20."""
    n = samples.size
    lim = int(math.ceil(4 * sigma))
    support = np.arange(-lim, lim + 1)
    probs = _pmf(sigma, support)
    keep = probs * n >= 20
    edges = support[keep]
    inner = _pmf(sigma, edges)
    tail = (1 - inner.sum()) / 2
    expected = np.concatenate([[tail * n], inner * n, [tail * n]])
    observed = np.concatenate(
        [
            [np.sum(samples < edges[0])],
            [np.sum(samples == k) for k in edges],
            [np.sum(samples > edges[-1])],
        ]
    )
    ok = expected >= 5
    expected, observed = expected[ok], observed[ok]
    expected = expected * observed.sum() / expected.sum()
    return float(stats.chisquare(observed, expected).pvalue)


def _diffprivlib_samples(sigma_eps: float, n: int, seed: int) -> tuple[float, NDArray[np.int64]]:
    mech = GaussianDiscrete(epsilon=sigma_eps, delta=1e-6, sensitivity=1, random_state=seed)
    return float(mech._scale), np.array([mech.randomise(0) for _ in range(n)], dtype=np.int64)


@pytest.mark.parametrize(("epsilon", "seed"), [(1.0, 11), (4.0, 12)])
def test_matches_diffprivlib(epsilon: float, seed: int) -> None:
    """Two-sample chi-square: 20k of ours vs 20k of diffprivlib's GaussianDiscrete."""
    sigma, ref = _diffprivlib_samples(epsilon, 20_000, seed)
    ours = sample_discrete_gaussian(sigma, 20_000, np.random.default_rng(seed))
    lim = int(math.ceil(2.5 * sigma))
    edges = list(range(-lim, lim + 1))
    table = np.vstack([_binned(ours, edges), _binned(ref, edges)])
    table = table[:, table.min(axis=0) >= 5]
    p = stats.chi2_contingency(table).pvalue
    assert p > P_MIN, (sigma, p)
    ks = stats.ks_2samp(ours, ref)
    assert ks.pvalue > P_MIN
    # and the same test notices a 10 % scale error
    wrong = sample_discrete_gaussian(sigma * 1.1, 20_000, np.random.default_rng(seed))
    table_w = np.vstack([_binned(wrong, edges), _binned(ref, edges)])
    table_w = table_w[:, table_w.min(axis=0) >= 5]
    assert stats.chi2_contingency(table_w).pvalue < P_MIN


@pytest.mark.parametrize("sigma", [0.4, 1.0, 3.7, 25.0])
def test_goodness_of_fit_exact_pmf(sigma: float) -> None:
    x = sample_discrete_gaussian(sigma, 200_000, np.random.default_rng(int(sigma * 100)))
    assert x.dtype == np.int64 and x.shape == (200_000,)
    assert _gof_pvalue(x, sigma) > P_MIN
    assert _gof_pvalue(x, sigma * 1.1) < P_MIN  # power: a 10 % scale error is caught


def test_large_sigma_moments() -> None:
    sigma = 2.0**24 * 3.3  # fixed-point scale
    x = sample_discrete_gaussian(sigma, 100_000, np.random.default_rng(5)).astype(float)
    assert abs(x.mean()) < 5 * sigma / math.sqrt(x.size)
    assert x.var() / sigma**2 == pytest.approx(1.0, abs=0.025)
    assert stats.kstest(x / sigma, "norm").pvalue > P_MIN


def test_chacha_source() -> None:
    key = bytes(range(32))
    a = sample_discrete_gaussian(4.2, 10_000, ChaChaRandom(key))
    b = sample_discrete_gaussian(4.2, 10_000, ChaChaRandom(key))
    np.testing.assert_array_equal(a, b)  # a fixed key is reproducible (tests only)
    c = sample_discrete_gaussian(4.2, 10_000, ChaChaRandom())
    d = sample_discrete_gaussian(4.2, 10_000)  # default: fresh key from secrets
    assert not np.array_equal(c, d)
    assert _gof_pvalue(np.concatenate([a, c, d]), 4.2) > P_MIN
    u = ChaChaRandom(key).random(100_000)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > P_MIN
    with pytest.raises(ValueError, match="32-byte key"):
        ChaChaRandom(b"short")


def test_edge_cases() -> None:
    assert sample_discrete_gaussian(0.0, 5).tolist() == [0] * 5
    assert sample_discrete_gaussian(3.0, 0).size == 0
    for bad in (-1.0, float("nan"), float("inf"), 2.0**50):
        with pytest.raises(ValueError):
            sample_discrete_gaussian(bad, 3)


class _Extreme:
    """A randomness source whose first geometric draws the largest uniform double below 1,
    the second 0, and whose acceptance test always passes: the largest draw the sampler can
    make."""

    def __init__(self) -> None:
        self.calls = 0

    def random(self, size: int) -> NDArray[np.float64]:
        self.calls += 1
        return np.full(size, 1.0 - 2.0**-53 if self.calls % 3 == 1 else 0.0)


@pytest.mark.parametrize("sigma", [1000.0, 3.7e6])
def test_the_discrete_gaussian_bound_holds_for_the_sampler_s_largest_draw(sigma: float) -> None:
    """A site's noise can move a secure sum at most this far (secure_sum's range check of
    sums relies on it): the largest draw, from the largest double below 1, stays within it."""
    from fedforest_secure.privacy._sampling import discrete_gaussian_bound

    largest = int(sample_discrete_gaussian(sigma, 4, _Extreme()).max())
    bound = discrete_gaussian_bound(sigma)
    assert largest <= bound <= 1.01 * largest
    assert int(np.abs(sample_discrete_gaussian(sigma, 10_000, ChaChaRandom(bytes(32)))).max()) \
        < bound / 5  # draws sit far inside it (within ~4 sigma)
    assert discrete_gaussian_bound(0.0) == 0
