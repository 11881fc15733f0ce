"""Tests for fedforest_secure.privacy.profile and the shipped profiles."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedforest_secure.errors import ProfileError
from fedforest_secure.privacy import DPConfig, PrivacyProfile, available_profiles, load_profile

SECURE = load_profile("secure").to_dict()


def test_shipped_profiles() -> None:
    assert available_profiles() == ["open", "secure", "secure-dp"]
    o = load_profile("open")
    assert (o.secure_aggregation, o.fixed_point, o.sketch, o.h_splits) == (
        False,
        False,
        "quantiles",
        "clear",
    )
    assert (o.abstain_below, o.min_clients, o.dp, o.rows_per_sketch_point) == (0, 1, None, 1)
    s = load_profile("secure")
    assert s.secure_aggregation and s.fixed_point and s.dp is None
    assert (s.threshold, s.sketch, s.rows_per_sketch_point) == (0.67, "secure_cdf", 2)
    assert (s.abstain_below, s.h_splits, s.min_clients) == (0, "off", 3)
    d = load_profile("secure-dp")
    assert d.dp is not None and (d.dp.epsilon, d.dp.delta) == (1.0, 1e-6)
    assert d.dp.mechanism == "gaussian_discrete"
    assert d.dropout_tolerance == pytest.approx(0.33)
    # secure-dp is secure plus [dp] (and its name/description); abstention off, as in secure
    # (under DP it would multiply every sensitivity, tests/test_dp_abstention.py)
    assert d.abstain_below == 0
    strip = {"name", "description", "dp"}
    assert {k: v for k, v in d.to_dict().items() if k not in strip} == {
        k: v for k, v in s.to_dict().items() if k not in strip
    }


def test_disclosures() -> None:
    assert load_profile("secure").disclosures == []
    assert load_profile("secure-dp").disclosures == []
    o = load_profile("open").disclosures
    assert "per-client quantile sketches" in o
    assert "per-client node summaries" in o
    assert any("no secure aggregation" in x for x in o)
    q = load_profile("secure", sketch="quantiles").disclosures
    assert q == ["per-client quantile sketches"]
    n = load_profile("secure-dp", h_splits="noisy").disclosures
    assert n == ["noisy per-client node summaries"]
    assert load_profile("secure", h_splits="clear").disclosures == ["per-client node summaries"]


def test_overrides() -> None:
    p = load_profile("secure-dp", epsilon=2.0)
    assert p.dp is not None and p.dp.epsilon == 2.0 and p.dp.delta == 1e-6
    q = load_profile("secure", secure_aggregation=False)
    assert not q.secure_aggregation and q.fixed_point and q.min_clients == 3
    r = load_profile("secure-dp", dp=None)
    assert r.dp is None
    s = load_profile("secure", dp={"epsilon": 0.5, "delta": 1e-8})
    assert s.dp == DPConfig(epsilon=0.5, delta=1e-8)
    t = load_profile(p, delta=1e-7, threshold=0.8)  # from a profile object
    assert t.dp is not None and (t.dp.epsilon, t.dp.delta, t.threshold) == (2.0, 1e-7, 0.8)
    assert load_profile(p) == p


def test_numpy_scalars_are_taken_as_the_python_values_they_hold() -> None:
    """A sweep over np.arange(...) gives numpy scalars: an integer setting takes np.int64 as
    it takes an int, a number np.float32 as a float, a switch np.bool_ as a bool (overrides,
    the [dp] section, a profile given as a mapping); the values kept are Python's."""
    p = load_profile("secure-dp", abstain_below=np.int64(2), epsilon=np.float32(0.5),
                     max_multiplicity=np.int32(3), fixed_point=np.True_)
    assert p.dp is not None
    assert (p.abstain_below, p.dp.epsilon, p.dp.max_multiplicity) == (2, 0.5, 3)
    assert type(p.abstain_below) is int and type(p.dp.max_multiplicity) is int
    assert type(p.dp.epsilon) is float and p.fixed_point is True
    q = load_profile("secure", dp={"epsilon": np.float64(2.0), "delta": 1e-7,
                                   "max_multiplicity": np.uint8(2)})
    assert q.dp == DPConfig(epsilon=2.0, delta=1e-7, max_multiplicity=2)
    as_map = PrivacyProfile.from_dict({**SECURE, "secure_aggregation": np.True_,
                                       "min_clients": np.int16(4)})
    assert as_map.secure_aggregation is True and as_map.min_clients == 4
    for k in range(3):  # the loop of the sweep
        assert load_profile("secure", abstain_below=np.arange(3)[k]).abstain_below == k


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"abstain_below": np.True_}, "abstain_below: Input should be a valid integer"),
        ({"abstain_below": np.float64(2.0)}, "abstain_below: Input should be a valid integer"),
        ({"abstain_below": np.array([2])}, "abstain_below: Input should be a valid integer"),
        ({"fixed_point": np.int64(1)}, "fixed_point: Input should be a valid boolean"),
        ({"epsilon": np.True_}, "dp.epsilon: Input should be a valid number"),
    ],
)
def test_numpy_scalars_of_another_kind_are_refused_as_python_values_are(
        overrides: dict[str, Any], needle: str) -> None:
    """A numpy bool is no integer, 2.0 no integer setting, 1 no switch, and an array no
    number: refused as True, 2.0, 1 and a list are."""
    with pytest.raises(ProfileError) as exc:
        load_profile("secure-dp", **overrides)
    assert needle in str(exc.value)


@pytest.mark.parametrize(
    ("name", "overrides", "needle"),
    [
        ("secure-dp", {"epsilon": -1.0}, "epsilon must be finite"),
        ("secure-dp", {"epsilon": float("inf")}, "epsilon must be finite"),
        ("secure-dp", {"delta": 0.0}, "delta must be in (0, 1)"),
        ("secure-dp", {"delta": 1.0}, "delta must be in (0, 1)"),
        ("secure-dp", {"dropout_tolerance": 0.1}, "must be >= 1 - threshold"),
        ("secure-dp", {"dropout_tolerance": 1.0}, "dropout_tolerance must be in [0, 1)"),
        ("secure-dp", {"secure_aggregation": False}, "dp needs secure_aggregation"),
        ("secure-dp", {"sketch": "quantiles"}, 'dp is incompatible with sketch = "quantiles"'),
        ("secure-dp", {"h_splits": "clear"}, "dp is incompatible with h_splits"),
        ("secure-dp", {"mechanism": "laplace"}, "dp.mechanism"),
        ("secure", {"threshold": 0.0}, "threshold must be in (0, 1]"),
        ("secure", {"threshold": 1.5}, "threshold must be in (0, 1]"),
        ("secure", {"rows_per_sketch_point": 1}, "rows_per_sketch_point >= 2"),
        ("open", {"rows_per_sketch_point": 0}, "rows_per_sketch_point must be >= 1"),
        ("secure", {"abstain_below": -1}, "abstain_below must be >= 0"),
        ("secure", {"fixed_point": False}, "needs fixed_point = true"),
        ("secure", {"min_clients": 1}, "min_clients >= 3"),
        ("secure", {"min_clients": 2}, "min_clients >= 3"),
        ("secure", {"threshold": 0.5}, "needs threshold > 0.5 (a strict majority"),
        ("secure", {"threshold": 0.1}, "needs threshold > 0.5"),
        ("open", {"min_clients": 0}, "min_clients must be >= 1"),
        ("secure", {"frac_bits": 60}, "frac_bits must be in [0, 40]"),
        ("secure", {"h_splits": "noisy"}, "needs a [dp] section"),
        ("secure", {"sketch": "tdigest"}, "sketch"),
        ("secure", {"secure_aggregation": "yes"}, "secure_aggregation"),
        ("secure", {"threshold": "0.5"}, "threshold"),
        ("secure", {"epsilon": 1.0}, "has no [dp] section"),
        ("secure", {"epsilon_total": 1.0}, "unknown profile override(s) ['epsilon_total']"),
        ("secure", {"name": ""}, "name must not be empty"),
        ("open", {"neighbours": 4}, "neighbours (the SecAgg+ graph) needs secure_aggregation"),
        ("secure", {"neighbours": 1}, "neighbours must be >= 2"),
        ("secure", {"neighbours": True}, "neighbours"),
    ],
)
def test_rejects(name: str, overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(ProfileError) as exc:
        load_profile(name, **overrides)
    assert needle in str(exc.value)
    assert isinstance(exc.value, ValueError)
    assert not isinstance(exc.value, pydantic.ValidationError)


def test_unknown_fields_in_file_and_dict(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="colour: unknown field"):
        PrivacyProfile.from_dict({**SECURE, "colour": "red"})
    with pytest.raises(ProfileError, match="dp.sigma: unknown field"):
        PrivacyProfile.from_dict({**SECURE, "dp": {"epsilon": 1.0, "delta": 1e-6, "sigma": 3}})
    p = tmp_path / "x.toml"
    p.write_text(load_profile("secure").to_toml() + 'extra = "x"\n', encoding="utf-8")
    with pytest.raises(ProfileError, match="extra: unknown field"):
        load_profile(p)


def test_load_from_path_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "mine.toml"
    p.write_text(load_profile("secure-dp", epsilon=3.0).to_toml(), encoding="utf-8")
    assert load_profile(p) == load_profile("secure-dp", epsilon=3.0)
    assert load_profile(str(p)) == load_profile(p)
    with pytest.raises(ProfileError, match="unknown profile 'paranoid'"):
        load_profile("paranoid")
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = ", encoding="utf-8")
    with pytest.raises(ProfileError, match="cannot parse"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="expected a profile name"):
        load_profile(3)  # type: ignore[arg-type]


def test_default_min_clients_depends_on_secure_aggregation() -> None:
    base = {k: v for k, v in SECURE.items() if k != "min_clients"}
    assert PrivacyProfile.from_dict(base).min_clients == 3
    plain = {**base, "secure_aggregation": False}
    assert PrivacyProfile.from_dict(plain).min_clients == 1


def test_frozen() -> None:
    p = load_profile("secure")
    with pytest.raises(pydantic.ValidationError):
        p.threshold = 0.5  # type: ignore[misc]


def test_the_secagg_plus_graph_is_a_profile_setting_and_absent_from_complete_graph_dicts(
        tmp_path: Path) -> None:
    plus = load_profile("secure", neighbours=8)
    assert plus.neighbours == 8 and plus.to_dict()["neighbours"] == 8
    assert "neighbours" not in load_profile("secure").to_dict()
    p = tmp_path / "plus.toml"
    p.write_text(plus.to_toml(), encoding="utf-8")
    assert load_profile(p) == plus
    assert PrivacyProfile.from_dict(plus.to_dict()) == plus


def test_dict_roundtrip_is_json_safe() -> None:
    for name in available_profiles():
        p = load_profile(name)
        d = json.loads(json.dumps(p.to_dict()))
        assert PrivacyProfile.from_dict(d) == p


@settings(max_examples=60, deadline=None)
@given(
    secure=st.booleans(),
    threshold=st.floats(0.01, 1.0),
    rows=st.integers(2, 50),
    abstain=st.integers(0, 100),
    frac_bits=st.integers(0, 40),
    eps=st.one_of(st.none(), st.floats(1e-3, 50.0)),
)
def test_roundtrip_property(
    secure: bool,
    threshold: float,
    rows: int,
    abstain: int,
    frac_bits: int,
    eps: float | None,
) -> None:
    dp = None if eps is None or not secure else {"epsilon": eps, "delta": 1e-6}
    if secure:  # secure aggregation unmasks with a strict majority: threshold in (0.5, 1]
        threshold = 0.5 + threshold / 2
    p = PrivacyProfile.from_dict(
        {
            "name": "p",
            "secure_aggregation": secure,
            "fixed_point": True,
            "threshold": threshold,
            "sketch": "secure_cdf",
            "rows_per_sketch_point": rows,
            "abstain_below": abstain,
            "frac_bits": frac_bits,
            "dp": dp,
        }
    )
    assert PrivacyProfile.from_dict(p.to_dict()) == p
    assert load_profile(p) == p
    if dp is not None:
        assert p.dropout_tolerance == pytest.approx(1 - threshold)


def test_the_python_api_refuses_a_dp_key_given_flat_and_in_dp_too() -> None:
    with pytest.raises(ProfileError, match=r"epsilon is given twice, as epsilon= and in dp="):
        load_profile("secure-dp", epsilon=8.0, dp={"epsilon": 1.0, "delta": 1e-6})


def test_dp_given_as_a_mapping_overrides_only_its_keys_as_a_job_files_dp_table_does(
        tmp_path: Path) -> None:
    p = load_profile("secure-dp", dp={"epsilon": 2.0})
    assert p.dp is not None and (p.dp.epsilon, p.dp.delta) == (2.0, 1e-6)
    (tmp_path / "mine.toml").write_text(load_profile("secure-dp", name="mine",
                                                     max_multiplicity=8).to_toml())
    q = load_profile(tmp_path / "mine.toml", dp={"epsilon": 2.0, "delta": 1e-7})
    assert q.dp is not None and (q.dp.epsilon, q.dp.delta, q.dp.max_multiplicity) == (
        2.0, 1e-7, 8)
    assert load_profile("secure-dp", dp=None).dp is None  # None still removes the section


def test_a_shipped_profile_changed_by_overrides_is_named_by_its_changes() -> None:
    assert load_profile("secure-dp", epsilon=2.0).name == "secure-dp (epsilon = 2.0)"
    assert load_profile("secure", secure_aggregation=False).name == \
        "secure (secure_aggregation = false)"
    assert load_profile("secure-dp", epsilon=1.0).name == "secure-dp"  # nothing changed
    assert load_profile("secure", name="mine", abstain_below=4).name == "mine"
    # the derived name, given, is taken for the settings it describes
    assert load_profile("secure-dp", epsilon=2.0, name="secure-dp (epsilon = 2.0)").name == \
        "secure-dp (epsilon = 2.0)"


@pytest.mark.parametrize("name", ["secure", "secure ", "SECURE", "secure (epsilon = 2.0)",
                                  "secure-dp (epsilon = 2.0)"])
def test_a_name_claiming_a_shipped_profile_for_other_settings_is_refused(name: str) -> None:
    said = re.escape(repr(name))
    with pytest.raises(ProfileError, match=rf"^name={said}, (a shipped profile's name, but its "
                                           r"settings differ|in the form of the name of "
                                           r"profile).*: pass a name of its own "
                                           r"\(name=\"...\"\), or leave name= out \(the "
                                           r"profile is then named 'open'\)$"):
        load_profile("open", name=name)


def test_a_profile_file_is_read_as_it_is_whatever_its_name(tmp_path: Path) -> None:
    """A site's pin file written by an earlier version (named "secure-dp", with another
    epsilon) still loads: the sites' pin check ignores names."""
    text = load_profile("secure-dp").to_toml().replace("epsilon = 1.0", "epsilon = 2.0")
    (tmp_path / "pin.toml").write_text(text)
    pin = load_profile(tmp_path / "pin.toml")
    assert pin.name == "secure-dp" and pin.dp is not None and pin.dp.epsilon == 2.0
