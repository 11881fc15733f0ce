"""Tests for fedforest_secure.config: JobConfig validation and resolve_max_features."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from fedforest_secure.config import METHODS, JobConfig, resolve_max_features


def _cfg(**kw: Any) -> JobConfig:
    base: dict[str, Any] = dict(job_id="j", task="regression", n_features=4, n_clients=3,
                                max_features=2)
    base.update(kw)
    return JobConfig(**base)


@pytest.mark.parametrize("d", [1, 2, 3, 4, 10, 17, 100])
def test_resolve_max_features_semantics(d: int) -> None:
    assert resolve_max_features(None, d) == d
    assert resolve_max_features("sqrt", d) == max(1, int(math.sqrt(d)))
    assert resolve_max_features("log2", d) == max(1, int(math.log2(d)))
    assert resolve_max_features(1.0, d) == d
    assert resolve_max_features(1 / 3, d) == max(1, int(d / 3))
    assert resolve_max_features(1e-9, d) == 1  # at least one feature
    assert resolve_max_features(1, d) == 1
    assert resolve_max_features(d, d) == d


def test_resolve_max_features_matches_sklearn() -> None:
    from sklearn.ensemble import RandomForestRegressor

    rng = np.random.default_rng(0)
    X, y = rng.random((30, 10)), rng.random(30)
    for mf in ("sqrt", "log2", 0.3, 0.5, 3, None, 1.0):
        rf = RandomForestRegressor(n_estimators=1, max_features=mf).fit(X, y)
        assert rf.estimators_[0].max_features_ == resolve_max_features(mf, 10), mf


@pytest.mark.parametrize("bad", [0, 5, -1, 0.0, 1.5, -0.2, "auto", "all", True, False, [2],
                                 float("nan")])
def test_resolve_max_features_rejects(bad: Any) -> None:
    with pytest.raises(ValueError):
        resolve_max_features(bad, 4)


def test_resolve_max_features_numpy_int() -> None:
    assert resolve_max_features(np.int64(2), 4) == 2


def test_numpy_float_max_features() -> None:
    assert resolve_max_features(np.float64(0.5), 4) == 2


def test_valid_config_defaults_and_derived() -> None:
    cfg = _cfg()
    assert cfg.kinds == ("continuous",) * 4
    assert cfg.levels == (0,) * 4
    assert cfg.n_stats == 3
    c2 = _cfg(task="classification", n_classes=5, criterion="entropy")
    assert c2.n_stats == 5
    assert set(METHODS) == {"quantiles", "avgimp", "exact", "histogram", "random"}


@pytest.mark.parametrize("kw", [
    dict(task="ranking"),
    dict(method="extra-trees"),
    dict(task="classification", n_classes=1, criterion="gini"),
    dict(task="classification", n_classes=2),  # criterion 'mse' is regression only
    dict(criterion="gini"),  # regression with gini
    dict(n_features=0, max_features=1),
    dict(n_clients=0),
    dict(n_estimators=0),
    dict(max_depth=-1),
    dict(max_depth=0, profile={"dp": {"epsilon": 1.0, "delta": 1e-6}}),  # DP needs a limit
    dict(max_depth=0, method="random"),  # random splits need a limit
    dict(max_depth=61),
    dict(min_samples_leaf=0),
    dict(min_samples_split=1),
    dict(n_bins=1),
    dict(max_features=0),
    dict(max_features=5),
    dict(top_l=0),
    dict(top_l=5),
    dict(feature_kinds=("continuous",)),
    dict(n_levels=(0, 0)),
])
def test_config_rejects(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _cfg(**kw)


def test_random_splits_without_a_depth_limit_are_refused_with_the_remedy() -> None:
    """Random splits split every node down to max_depth, DP or not: without a limit the trees
    grew until memory ran out."""
    with pytest.raises(ValueError, match=r"method='random' needs a finite max_depth"):
        _cfg(max_depth=0, method="random")
    assert _cfg(max_depth=6, method="random").max_depth == 6


def test_config_json_round_trip() -> None:
    cfg = _cfg(task="classification", n_classes=3, criterion="gini",
               feature_kinds=("continuous", "categorical", "continuous", "continuous"),
               n_levels=(0, 4, 0, 0), feature_bounds=((0.0, 1.0),) * 4, top_l=2,
               profile={"name": "open", "abstain_below": 0})
    back = JobConfig.from_json(cfg.to_json())
    assert back == cfg
    assert back.to_json() == cfg.to_json()
