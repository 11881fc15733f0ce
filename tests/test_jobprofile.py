"""A job file's profile with its [privacy] table, as create-job reads it (load_job_spec ->
check_job -> build_config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedforest_secure.privacy import load_profile
from server_app.jobcheck import check_job
from server_app.jobspec import build_config, load_job_spec
from server_app.settings import ConfigError

OPEN = (Path(__file__).parents[1] / "fedforest_secure" / "privacy" / "profiles" /
        "open.toml").read_text()
SCHEMA = ('[target]\nname = "y"\nkind = "classification"\nclasses = ["0", "1"]\n'
          '[[features]]\nname = "a"\nkind = "continuous"\nbounds = [0.0, 10.0]\n')


def profile_of(tmp_path: Path, text: str) -> dict[str, Any]:
    """The profile create-job gives the job of ``text`` (below a job file's first lines)."""
    (tmp_path / "schema.toml").write_text(SCHEMA)
    path = tmp_path / "job.toml"
    path.write_text('id = "j"\nclients = ["a", "b", "c"]\nschema = "schema.toml"\n' + text)
    return dict(build_config(check_job(load_job_spec(path)).spec).profile)


def test_a_dp_key_set_both_flat_and_in_the_dp_table_is_refused_naming_both(
        tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^\[privacy\] sets epsilon twice, as \[privacy\] "
                                          r"epsilon = 8.0 and \[privacy.dp\] epsilon = 1.0: "
                                          r"keep one of them$"):
        profile_of(tmp_path, 'profile = "secure-dp"\n[privacy]\nepsilon = 8.0\n'
                             "[privacy.dp]\nepsilon = 1.0\ndelta = 1e-6\n")


def test_the_dp_table_overrides_only_the_keys_it_gives(tmp_path: Path) -> None:
    dp = profile_of(tmp_path, 'profile = "secure-dp"\n[privacy.dp]\nepsilon = 2.0\n')["dp"]
    assert (dp["epsilon"], dp["delta"]) == (2.0, load_profile("secure-dp").to_dict()["dp"]["delta"])


def test_dp_keys_for_a_profile_without_dp_ask_for_the_whole_table(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^\[privacy\] epsilon: profile 'secure' has no \[dp\] "
                                          r"section for these to override; give the section "
                                          r"whole in a \[privacy.dp\] table \(with epsilon and "
                                          r"delta\), or start from profile = \"secure-dp\"$"):
        profile_of(tmp_path, 'profile = "secure"\n[privacy]\nepsilon = 1.0\n')
    with pytest.raises(ConfigError, match=r"^\[privacy\] epsilon: profile 'secure' has no"):
        profile_of(tmp_path, 'profile = "secure"\n[privacy.dp]\nepsilon = 1.0\n')
    whole = profile_of(tmp_path, 'profile = "secure"\n[privacy.dp]\nepsilon = 1.0\n'
                                 "delta = 1e-6\n")
    assert whole["dp"]["epsilon"] == 1.0
    assert whole["name"] == "secure (epsilon = 1.0, delta = 1e-06)"


def test_the_open_profile_named_secure_is_refused_naming_what_differs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        profile_of(tmp_path, 'profile = "open"\n[privacy]\nname = "secure"\n')
    said = str(err.value)
    assert said.startswith('[privacy] name = "secure", a shipped profile\'s name, but its '
                           "settings differ from that profile's: secure_aggregation = false "
                           "('secure': true); threshold = 1.0 ('secure': 0.67); sketch = "
                           "\"quantiles\" ('secure': \"secure_cdf\");")
    assert said.endswith('give it a name of its own ([privacy] name = "..."), or leave name '
                         "out (the server then names the profile 'open')")
    # the name of the profile's own settings is fine, and so is a name of its own
    assert profile_of(tmp_path, 'profile = "secure"\n[privacy]\nname = "secure"\n')[
        "name"] == "secure"
    assert profile_of(tmp_path, 'profile = "open"\n[privacy]\nname = "plain"\n')[
        "name"] == "plain"


def test_a_profile_file_named_like_a_shipped_one_with_other_settings_is_refused(
        tmp_path: Path) -> None:
    (tmp_path / "mine.toml").write_text(OPEN.replace('name = "open"', 'name = "secure"'))
    with pytest.raises(ConfigError, match=r"^the profile file .*mine.toml names itself "
                                          r"\"secure\", a shipped profile's name, but its "
                                          r"settings differ.*: give it a name of its own: "
                                          r"name = \"...\" in .*mine.toml$"):
        profile_of(tmp_path, 'profile = "mine.toml"\n')


@pytest.mark.parametrize("name", ["secure-dp (epsilon = 2.0)", "secure ", "Secure-DP",
                                  "secure\u200b", "secure(min_clients = 3)", " open  (x)"])
def test_a_name_in_the_form_of_a_shipped_ones_is_refused_on_other_settings(
        tmp_path: Path, name: str) -> None:
    """White space, case and invisible characters make no name of its own; neither does the
    form the server gives a changed shipped profile."""
    with pytest.raises(ConfigError, match=r"^\[privacy\] name = .*, (a shipped profile's "
                                          r"name|in the form of the name of profile)"):
        profile_of(tmp_path, f'profile = "open"\n[privacy]\nname = "{name}"\n')
    (tmp_path / "mine.toml").write_text(OPEN.replace('name = "open"', f'name = "{name}"'))
    with pytest.raises(ConfigError, match=r"^the profile file .*mine.toml names itself"):
        profile_of(tmp_path, 'profile = "mine.toml"\n')


def test_the_name_the_server_derives_is_taken_for_its_own_settings(tmp_path: Path) -> None:
    said = profile_of(tmp_path, 'profile = "secure-dp"\n[privacy]\nepsilon = 2.0\n'
                                'name = "secure-dp  (epsilon = 2.0) "\n')
    assert (said["name"], said["dp"]["epsilon"]) == ("secure-dp (epsilon = 2.0)", 2.0)
    with pytest.raises(ConfigError, match=r"^\[privacy\] name = \"secure-dp \(epsilon = 2.0\)\", "
                                          r"in the form of the name of profile 'secure-dp' "
                                          r"with changes, but these settings are named "
                                          r"'secure-dp \(epsilon = 3.0\)'\."):
        profile_of(tmp_path, 'profile = "secure-dp"\n[privacy]\nepsilon = 3.0\n'
                             'name = "secure-dp (epsilon = 2.0)"\n')
    # a profile file (a site's pin written by load_profile) under the derived name
    (tmp_path / "pin.toml").write_text(load_profile("secure-dp", epsilon=2.0).to_toml())
    assert profile_of(tmp_path, 'profile = "pin.toml"\n')["name"] == "secure-dp (epsilon = 2.0)"
    # changed again by [privacy]: named after the shipped profile and every change
    assert profile_of(tmp_path, 'profile = "pin.toml"\n[privacy]\ndelta = 1e-9\n')[
        "name"] == "secure-dp (epsilon = 2.0, delta = 1e-09)"
    # a name that only starts like a shipped one is a name of its own
    assert profile_of(tmp_path, 'profile = "open"\n[privacy]\nname = "secure-plus"\n')[
        "name"] == "secure-plus"


def test_a_shipped_profile_changed_by_privacy_is_named_by_its_changes(tmp_path: Path) -> None:
    """Its name still starts with the base, and says what differs, so that status and the
    sites' logs never read "secure" for a job without masking."""
    plain = profile_of(tmp_path, 'profile = "secure"\n[privacy]\nsecure_aggregation = false\n')
    assert plain["name"] == "secure (secure_aggregation = false)"
    eps = profile_of(tmp_path, 'profile = "secure-dp"\n[privacy]\nepsilon = 2.5\n')
    assert eps["name"] == "secure-dp (epsilon = 2.5)"
    # an override that changes nothing changes no name
    same = profile_of(tmp_path, 'profile = "secure-dp"\n[privacy]\nepsilon = 1.0\n')
    assert same["name"] == "secure-dp"
