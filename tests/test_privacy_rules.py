"""Tests for fedforest_secure.privacy.rules and the package's exported names."""

from __future__ import annotations

from typing import Any

import pytest

import fedforest_secure.privacy as privacy
from fedforest_secure.errors import BudgetError, ProfileError
from fedforest_secure.privacy import abstains, adaptive_n_bins, check_profile_schema, load_profile
from fedforest_secure.schema import Schema


def test_exported_names() -> None:
    assert sorted(privacy.__all__) == [
        "ChaChaRandom",
        "Cost",
        "DPConfig",
        "NoisePlan",
        "PrivacyAccountant",
        "PrivacyProfile",
        "Sensitivity",
        "Spend",
        "ZCdp",
        "abstains",
        "adaptive_n_bins",
        "add_distributed_noise",
        "available_profiles",
        "calibrate",
        "central_sigma",
        "check_profile_schema",
        "ddg_cost",
        "dp_forest_settings",
        "epsilon_of",
        "histogram_sensitivity",
        "job_noise",
        "load_profile",
        "min_survivors",
        "plan_distributed_noise",
        "require_dp_ready",
        "rho_for",
        "sample_discrete_gaussian",
        "zcdp_delta",
    ]
    for name in privacy.__all__:
        assert hasattr(privacy, name)


def test_abstention() -> None:
    assert load_profile("secure").abstain_below == 0  # off by default (docs/privacy.md §2.2)
    assert load_profile("secure-dp").abstain_below == 0  # the noise guards small nodes
    lone = load_profile("secure", abstain_below=2)  # a lone record never contributes
    assert abstains(1, lone) and not abstains(2, lone)
    secure = load_profile("secure", abstain_below=5)
    assert abstains(4, secure) and not abstains(5, secure)
    assert not abstains(0, load_profile("open"))
    with pytest.raises(ValueError):
        abstains(-1, secure)


def test_adaptive_bins() -> None:
    secure, open_ = load_profile("secure"), load_profile("open")
    assert adaptive_n_bins(32, 1000, secure) == 32
    assert adaptive_n_bins(32, 21, secure) == 10
    assert adaptive_n_bins(32, 21, open_) == 21
    assert adaptive_n_bins(32, 1, secure) == 0
    with pytest.raises(ProfileError, match="n_bins"):
        adaptive_n_bins(1, 100, secure)


def _schema(feature_bounds: Any, target: dict[str, Any]) -> Schema:
    feat: dict[str, Any] = {"name": "a", "kind": "continuous"}
    if feature_bounds is not None:
        feat["bounds"] = feature_bounds
    return Schema.from_dict({"features": [feat], "target": target})


def test_profile_schema_compatibility() -> None:
    reg = {"name": "y", "kind": "regression", "bounds": [0, 1]}
    reg_nb = {"name": "y", "kind": "regression"}
    full = _schema([0, 1], reg)
    for name in ("open", "secure", "secure-dp"):
        check_profile_schema(load_profile(name), full)
    check_profile_schema(load_profile("open"), _schema(None, reg_nb))  # open needs no bounds
    with pytest.raises(ProfileError, match="secure_cdf"):
        check_profile_schema(load_profile("secure"), _schema(None, reg))
    with pytest.raises(ProfileError, match="fixed_point"):
        check_profile_schema(load_profile("secure"), _schema([0, 1], reg_nb))
    with pytest.raises(BudgetError, match="public bounds"):
        check_profile_schema(load_profile("secure-dp"), _schema([0, 1], reg_nb))
