"""A DP job file without forest settings gets the allocation rule's forest."""

from __future__ import annotations

from fedforest_secure.privacy.allocation import dp_forest_settings
from server_app.jobspec import JobSpec, build_config

DATA = {"task": "classification", "n_features": 13, "n_classes": 3,
        "feature_bounds": [(0.0, 1.0)] * 13}


def _spec(**kw: object) -> JobSpec:
    base: dict[str, object] = {"id": "j", "clients": ["a", "b", "c", "d"],
                               "profile": "secure-dp", "profile_overrides": {"epsilon": 2.0},
                               "data": DATA}
    base.update(kw)
    return JobSpec.model_validate(base)


def test_unset_forest_fields_follow_the_rule() -> None:
    cfg = build_config(_spec(public_rows=124))
    want = dp_forest_settings(2.0, 124, 13, 3, "classification")
    assert (cfg.method, cfg.n_estimators, cfg.max_depth, cfg.max_features, cfg.sampling) == (
        "random", want.n_estimators, want.max_depth, want.max_features, "all")
    # without a public row count the rule assumes 100 rows per client
    assert build_config(_spec()).max_depth == dp_forest_settings(
        2.0, 400, 13, 3, "classification").max_depth


def test_fields_the_job_file_sets_are_kept() -> None:
    cfg = build_config(_spec(forest={"n_estimators": 7, "method": "histogram"}))
    want = dp_forest_settings(2.0, 400, 13, 3, "classification", method="histogram")
    assert (cfg.n_estimators, cfg.method, cfg.max_depth) == (7, "histogram", want.max_depth)


def test_without_dp_the_defaults_stay() -> None:
    cfg = build_config(_spec(profile="secure", profile_overrides={}))
    assert (cfg.method, cfg.n_estimators, cfg.max_depth) == ("quantiles", 50, 8)
