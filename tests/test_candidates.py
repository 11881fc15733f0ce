"""Tests for fedforest_secure._candidates: the registry of candidate methods."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from fedforest_secure import FedForestRegressor
from fedforest_secure._candidates import (
    CANDIDATE_METHODS,
    SketchRequest,
    fixed_width_grid,
    make_method,
)
from fedforest_secure._release import ReleasePolicy
from fedforest_secure.config import METHODS, JobConfig
from fedforest_secure.errors import ProfileError
from fedforest_secure.privacy import load_profile
from fedforest_secure.protocol import TaskKind


def _cfg(**kw: Any) -> JobConfig:
    base: dict[str, Any] = dict(job_id="c", task="regression", n_features=3, n_clients=2,
                                max_features=2, n_bins=8, feature_bounds=((0.0, 1.0),) * 3,
                                profile=load_profile("open").to_dict())
    base.update(kw)
    return JobConfig(**base)


def test_registry_names_its_classes_and_is_what_config_accepts() -> None:
    assert METHODS == tuple(CANDIDATE_METHODS) == ("quantiles", "avgimp", "exact", "histogram",
                                                   "random")
    for name, cls in CANDIDATE_METHODS.items():
        assert cls.name == name
        cfg = _cfg(method=name)
        assert type(make_method(cfg, ReleasePolicy(cfg))) is cls


def test_unknown_method_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="method must be one of"):
        _cfg(method="extra-trees")
    cfg = _cfg()
    object.__setattr__(cfg, "method", "extra-trees")  # a config that skipped validation
    with pytest.raises(ValueError, match=r"unknown candidate method .extra-trees.; one of \["):
        make_method(cfg, ReleasePolicy(_cfg()))


@pytest.mark.parametrize("method,profile,kw,want", [
    ("quantiles", "open", {}, SketchRequest({"n_points": 8}, ("sketch_points",))),
    ("quantiles", "secure", {}, SketchRequest()),  # secure CDF: counts in extra rounds
    ("avgimp", "open", {"top_l": 2},
     SketchRequest({"n_points": 8, "top_l": 2}, ("sketch_points", "top_l"))),
    ("exact", "open", {}, SketchRequest({}, ("unique",))),
    ("histogram", "open", {}, SketchRequest()),
    ("random", "open", {}, SketchRequest()),  # splits drawn from public bounds only
])
def test_sketch_round_asks_what_the_method_needs(method: str, profile: str, kw: dict[str, Any],
                                                 want: SketchRequest) -> None:
    cfg = _cfg(method=method, profile=load_profile(profile).to_dict(), **kw)
    got = make_method(cfg, ReleasePolicy(cfg)).sketch_request()
    assert got == want
    assert list(got.params) == list(want.params)  # the task's parameters keep this order


@pytest.mark.parametrize("profile", ["secure", "secure-dp"])
def test_avgimp_with_top_l_under_secure_aggregation_is_refused_before_training(
        profile: str) -> None:
    """AvgImp with ``top_l`` asks every site for its top-L features in the clear, which no
    site discloses under secure aggregation: the job is refused when it is set up, naming the
    method, not by every site in its first round. Without ``top_l`` nothing is asked in the
    clear, and the job is accepted."""
    cfg = _cfg(method="avgimp", profile=load_profile(profile).to_dict(), top_l=2)
    with pytest.raises(ProfileError, match="method='avgimp' with top_l discloses each site's "
                                           "top-L features"):
        ReleasePolicy(cfg)
    if profile == "secure":  # (secure-dp needs public bounds this config has not)
        ReleasePolicy(dataclasses.replace(cfg, top_l=None))  # no top-L list: accepted


def test_histogram_needs_the_clients_ranges_only_without_public_bounds() -> None:
    with_bounds = _cfg(method="histogram")
    without = dataclasses.replace(with_bounds, feature_bounds=None)
    assert not make_method(with_bounds, ReleasePolicy(with_bounds)).needs_range()
    assert make_method(without, ReleasePolicy(without)).needs_range()


def test_fixed_width_grid_cuts_each_range_and_pads_empty_ones() -> None:
    lohi = np.array([[0.0, 4.0], [2.0, 2.0]])
    np.testing.assert_array_equal(fixed_width_grid(lohi, 4), [[1.0, 2.0, 3.0], [np.inf] * 3])


def test_a_profile_leaving_h_splits_out_reads_it_as_off_on_the_coordinators_side_too() -> None:
    """A hand-written profile without ``h_splits``: the sites read it as PrivacyProfile's
    default "off" and refuse node summaries, so the coordinator reads it the same way and
    refuses H-splits when the job is set up, not in a round every site refuses."""
    cfg = _cfg(split_on_client=True,
               profile={"name": "mine", "secure_aggregation": False, "sketch": "quantiles"})
    with pytest.raises(ProfileError, match="split_on_client=True but the privacy profile has "
                                           "no h_splits, which means 'off'"):
        ReleasePolicy(cfg)
    assert ReleasePolicy(dataclasses.replace(cfg, split_on_client=False)).rows_per_point == 1


def test_pooled_quantiles_weigh_each_client_by_its_rows_that_have_the_feature() -> None:
    """Theorem 1 with missing values: each client's sketch covers its present values, so the
    pooled CDF mixes them by the rows that have the feature. Three clients miss the feature in
    98% of their rows: weighed by all their rows they took 12 of the 15 candidates (rank
    error 0.69); weighed by their 8 present rows each, every candidate is within 1/B."""
    rng = np.random.default_rng(0)
    B, nk = 16, 400
    cols = []
    for k in range(4):
        x = rng.normal(10 * k, 1, nk)
        if k > 0:
            x[: int(0.98 * nk)] = np.nan
        cols.append(x)
    x0 = np.concatenate(cols)
    X = np.column_stack([x0, rng.normal(size=x0.size)])
    y = np.nan_to_num(x0, nan=0.0) + rng.normal(size=x0.size)
    seen: list[tuple[np.ndarray, np.ndarray]] = []

    def hook(rec: Any) -> None:
        if rec.task.kind == TaskKind.HISTOGRAM and rec.task.level == 0 and not seen:
            seen.append((rec.task.arrays["features"], rec.task.arrays["thresholds"]))

    FedForestRegressor(n_estimators=1, bootstrap=False, max_features=None, n_bins=B,
                       max_depth=1, random_state=0).fit(
        X, y, client=np.repeat(np.arange(4), nk), on_round=hook)
    feats, thr = seen[0]
    c = thr[0, int(np.flatnonzero(feats[0] == 0)[0])]
    c = c[np.isfinite(c)]
    present = np.sort(x0[~np.isnan(x0)])
    rank = np.searchsorted(present, c, side="right") / present.size
    assert c.size == B - 1
    assert np.abs(np.arange(1, B) / B - rank).max() <= 1 / B
