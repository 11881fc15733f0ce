"""The secure pooled-CDF sketch's arrays are as wide as adaptive B allows, not as n_bins.

With ``rows_per_sketch_point`` r, a node of n rows has at most ``B_nu = n / r`` bins. An
``n_bins`` above every node's ``B_nu`` must grow the same forest as one just above it, and the
candidates, their histograms and the histogram tasks the sites answer must not widen with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fedforest_secure._secure_cdf as secure_cdf_mod
from fedforest_secure import _kernels
from fedforest_secure._secure_cdf import SecureCdfPlanner
from fedforest_secure.config import JobConfig
from fedforest_secure.federation import RoundRecord, run_in_process
from fedforest_secure.privacy import load_profile
from fedforest_secure.protocol import TaskKind

SECURE = load_profile("secure", secure_aggregation=False).to_dict()


def _planner(n_bins: int, rng: np.random.Generator) -> SecureCdfPlanner:
    """Nodes of 100, 60 and 7 rows (B_nu 50, 30 and 3 with r = 2), one round of counts."""
    E, m = 3, 2
    plan = SecureCdfPlanner(np.zeros((E, m)), np.ones((E, m)), np.array([[0, 1]] * E),
                            np.zeros(2, dtype=bool), np.array([100.0, 60.0, 7.0]), n_bins, 2,
                            max_rounds=1)
    grid = plan.next_grid()
    assert grid is not None
    W = grid.shape[2]
    counts = rng.integers(0, 4, size=(E, m, W + 1)).astype(float)
    stats = np.stack([counts, counts * rng.random(counts.shape)], axis=-1)
    plan.receive(counts, stats)
    return plan


@pytest.mark.parametrize("kernels", ["compiled", "numpy"])
def test_the_planners_arrays_end_at_the_largest_adaptive_b(monkeypatch: pytest.MonkeyPatch,
                                                           kernels: str) -> None:
    if kernels == "numpy":
        monkeypatch.setattr(_kernels, "KERNELS", None)
    small, large = (_planner(B, np.random.default_rng(1)) for B in (64, 4096))
    thr, hist = large.candidates(), large.histogram()
    assert thr.shape == (3, 2, 49) and hist.shape == (3, 2, 50, 2)
    assert small.width == large.width == 50
    np.testing.assert_array_equal(thr, small.candidates())
    np.testing.assert_array_equal(hist, small.histogram())
    assert np.isfinite(thr[0]).sum(axis=1).max() > 30  # the largest node's candidates
    assert np.isfinite(thr[2]).sum(axis=1).max() <= 2  # B_nu = 3


def test_no_row_with_a_grid_leaves_one_candidate_column() -> None:
    plan = SecureCdfPlanner(np.zeros((1, 1)), np.ones((1, 1)), np.array([[-1]]),
                            np.zeros(1, dtype=bool), np.array([100.0]), 512, 2)
    assert plan.candidates().shape == (1, 1, 1)
    assert plan.width == 2


def _data(n: int = 600, K: int = 3, missing: bool = False
          ) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(n, 4))
    X[:, 1] = np.round(X[:, 1], 1)
    y = (np.digitize(X[:, 0] + 0.5 * X[:, 3], [-1.0, 0.0, 1.0]) + rng.integers(0, 2, n)) % 4
    if missing:
        X[(rng.random(X.shape) < 0.1) & np.array([True, False, True, True])] = np.nan
    return [(X[k::K], y[k::K]) for k in range(K)]


def _fit(n_bins: int, monkeypatch: pytest.MonkeyPatch, **kw: Any
         ) -> tuple[str, list[int], list[int]]:
    """The forest, the widths of the planners' histograms and of the histogram tasks'
    thresholds."""
    widths: list[int] = []

    class Recording(SecureCdfPlanner):
        def histogram(self) -> np.ndarray:
            out = super().histogram()
            widths.append(out.shape[2])
            return out

        def candidates(self) -> np.ndarray:
            out = super().candidates()
            widths.append(out.shape[2] + 1)
            return out

    monkeypatch.setattr(secure_cdf_mod, "SecureCdfPlanner", Recording)
    missing = kw.pop("missing", False)
    cfg = JobConfig(job_id="j", task="classification", n_classes=4, criterion="gini",
                    n_features=4, n_clients=3, n_estimators=4, max_depth=5,
                    min_samples_leaf=3, max_features=2, n_bins=n_bins, profile=SECURE,
                    feature_bounds=((-6.0, 6.0),) * 4, random_state=1,
                    missing_allowed=(True, False, True, True) if missing else (), **kw)
    sent: list[int] = []

    def record(r: RoundRecord) -> None:
        if r.task.kind == TaskKind.HISTOGRAM and r.task.params.get("purpose") != "sketch":
            sent.append(r.task.arrays["thresholds"].shape[2])

    model = run_in_process(cfg, _data(missing=missing), on_round=record)
    doc = model.to_dict()
    doc.pop("meta")
    return str(doc), widths, sent


@pytest.mark.parametrize("kw", [dict(), dict(method="avgimp"), dict(missing=True)],
                         ids=["fused", "avgimp", "missing"])
def test_an_n_bins_beyond_adaptive_b_grows_the_same_forest_at_the_same_widths(
        monkeypatch: pytest.MonkeyPatch, kw: dict[str, Any]) -> None:
    """600 rows, r = 2: no node has more than 300 bins. n_bins 1024 and 4096 grow the same
    forest; neither the planner's candidates and histograms nor the thresholds a site gets
    are wider than that (nor than with n_bins 1024)."""
    forest, widths, sent = _fit(1024, monkeypatch, **dict(kw))
    forest4, widths4, sent4 = _fit(4096, monkeypatch, **dict(kw))
    assert forest4 == forest
    assert widths4 == widths and sent4 == sent
    assert widths and max(widths) <= 300
    assert (len(sent) > 0) == (kw != {})  # the fused levels send no thresholds
    assert max(sent, default=0) <= 299
