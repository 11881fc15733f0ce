"""docs/configuration.md matches the models that read the files, and its examples validate."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

from fedforest_cli.config_doc import DOC_PATH, SECTIONS, describe_fields, render
from fedforest_secure.errors import ProfileError, SchemaError
from fedforest_secure.privacy import load_profile
from fedforest_secure.privacy.profile import DPConfig, PrivacyProfile
from fedforest_secure.schema import Feature, Schema, Target
from server_app.jobspec import DataFacts, ForestParams, JobSpec, build_config, load_job_spec
from server_app.settings import ConfigError, ServerSettings, TLSSettings, load_settings

MODELS: list[type[BaseModel]] = [Schema, Target, Feature, JobSpec, ForestParams, DataFacts,
                                 PrivacyProfile, DPConfig, ServerSettings, TLSSettings]


def doc_files() -> dict[str, str]:
    """The worked example's files: ``<!-- file: NAME -->`` followed by a fenced block."""
    text = DOC_PATH.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(
        r"<!-- file: (\S+) -->\n```toml\n(.*?)```", text, re.S)}


def test_the_page_equals_its_rendering_from_the_models() -> None:
    text = DOC_PATH.read_text()
    assert render(text) == text, "run: python -m fedforest_cli.config_doc"


def test_rendering_fills_every_section_and_refuses_unknown_ones() -> None:
    empty = "".join(f"<!-- BEGIN GENERATED {n} -->\n<!-- END GENERATED {n} -->\n"
                    for n in SECTIONS)
    out = render(empty)
    assert "`n_estimators`" in out and "`client_ca`" in out and "`levels`" in out
    with pytest.raises(ValueError, match="no generated block"):
        render("nothing here")
    with pytest.raises(ValueError, match="unknown generated section"):
        render(empty + "<!-- BEGIN GENERATED nope -->\n<!-- END GENERATED nope -->\n")


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_key_has_a_description(model: type[BaseModel]) -> None:
    missing = [k for k, v in describe_fields(model).items() if not v]
    assert not missing, f"{model.__name__}: describe {missing}"


def test_the_worked_example_files_validate(tmp_path: Path) -> None:
    files = doc_files()
    assert set(files) == {"schema.toml", "server.toml", "job.toml"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    schema = Schema.from_dict(tomllib.loads(files["schema.toml"]))
    assert schema.missing_bounds() == []  # the example's profile is secure
    spec = load_job_spec(tmp_path / "job.toml")
    assert len(spec.clients) == 4
    config = build_config(spec)
    assert config.n_features == schema.n_features and config.n_classes == 5
    settings = load_settings(tmp_path / "server.toml")
    assert settings.tls is not None and settings.tls.client_ca is not None


def test_an_unknown_job_key_lists_the_allowed_ones(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(
        'id = "j"\nclients = ["a"]\n[forest]\nn_estimator = 3\n')
    with pytest.raises(ConfigError) as err:
        load_job_spec(tmp_path / "job.toml")
    msg = str(err.value)
    assert "[forest] n_estimator: unknown key" in msg
    assert "allowed: bootstrap, criterion, max_depth" in msg
    assert "did you mean 'n_estimators'?" in msg
    assert "Extra inputs are not permitted" not in msg
    (tmp_path / "job.toml").write_text('id = "j"\nclients = ["a"]\nschema_file = "s.toml"\n')
    with pytest.raises(ConfigError, match=r"schema_file: unknown key; allowed: clients, data, "
                                          r"evaluation, forest, id, kind, min_clients, "
                                          r"privacy, profile, public_rows, "
                                          r"round_deadline, schema \(did you mean 'schema'"):
        load_job_spec(tmp_path / "job.toml")


def test_an_unknown_server_key_lists_the_allowed_ones(tmp_path: Path) -> None:
    (tmp_path / "server.toml").write_text('prot = 1\n[tls]\ncert = "a"\nkey = "b"\nca = "c"\n')
    with pytest.raises(ConfigError) as err:
        load_settings(tmp_path / "server.toml")
    msg = str(err.value)
    assert ("prot: unknown key; allowed: audit_arrays_for_sites, audit_database, "
            "body_timeout_s, database, host") in msg
    assert "(did you mean 'port'?)" in msg
    assert "[tls] ca: unknown key; allowed: cert, client_ca, key" in msg


def test_unknown_schema_and_profile_keys_list_the_allowed_ones() -> None:
    with pytest.raises(SchemaError, match=r"features\[0\] \('age'\)\.bound: unknown key; "
                                          r"allowed: bounds, kind, levels, missing, name"):
        Schema.from_dict({"features": [{"name": "age", "kind": "continuous", "bound": [0, 1]}],
                          "target": {"name": "y", "kind": "classification",
                                     "classes": ["0", "1"]}})
    with pytest.raises(ProfileError, match=r"dp\.sigma: unknown field \(allowed: "
                                           r"class_priors, colluders, delta, dropout_tolerance, "
                                           r"epsilon"):
        PrivacyProfile.from_dict({**load_profile("secure-dp").to_dict(),
                                  "dp": {"epsilon": 1.0, "delta": 1e-6, "sigma": 2}})


def test_the_privacy_table_takes_overrides_from_the_job_file(tmp_path: Path) -> None:
    files = doc_files()
    (tmp_path / "schema.toml").write_text(files["schema.toml"])
    (tmp_path / "job.toml").write_text(
        'id = "j"\nclients = ["a", "b", "c"]\nschema = "schema.toml"\nprofile = "secure-dp"\n'
        "[privacy]\nepsilon = 2.5\nabstain_below = 7\n")
    config = build_config(load_job_spec(tmp_path / "job.toml"))
    assert config.profile["dp"]["epsilon"] == 2.5 and config.profile["abstain_below"] == 7


@pytest.mark.parametrize("case", ["a directory", "not UTF-8", "empty audit_database",
                                  "port 0"])
def test_a_server_config_that_cannot_be_read_or_means_nothing_is_a_config_error(
        tmp_path: Path, case: str) -> None:
    """Each is a message naming the file, not a traceback, nor a server that starts without
    an audit log, or on a port no message names."""
    path = tmp_path / "server.toml"
    if case == "a directory":
        path.mkdir()
        said = "cannot read the server config"
    elif case == "not UTF-8":
        path.write_bytes('# Zürich\nport = 8443\n'.encode("latin-1"))
        said = "invalid server config"
    elif case == "empty audit_database":
        path.write_text('audit_database = ""\n')
        said = "audit_database"
    else:
        path.write_text("port = 0\n")
        said = "port"
    with pytest.raises(ConfigError, match=said) as err:
        load_settings(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("what", ["job file", "schema file"])
def test_a_job_or_schema_file_that_is_a_directory_is_a_config_error(tmp_path: Path,
                                                                    what: str) -> None:
    job = tmp_path / "job.toml"
    if what == "job file":
        job.mkdir()
    else:
        (tmp_path / "schema").mkdir()
        job.write_text('id = "j"\nschema = "schema"\n')
    with pytest.raises(ConfigError, match=f"cannot read the {what}"):
        load_job_spec(job)


def test_server_and_profile_files_saved_with_a_byte_order_mark_load(tmp_path: Path) -> None:
    """Windows Notepad saves UTF-8 with a byte-order mark; the files read as without it."""
    text = 'port = 8443\n[tls]\ncert = "a.pem"\nkey = "b.pem"\n'
    (tmp_path / "plain.toml").write_text(text, encoding="utf-8")
    (tmp_path / "bom.toml").write_text(text, encoding="utf-8-sig")
    assert load_settings(tmp_path / "bom.toml") == load_settings(tmp_path / "plain.toml")
    profile = load_profile("secure").to_toml()
    (tmp_path / "p.toml").write_text(profile, encoding="utf-8-sig")
    assert load_profile(tmp_path / "p.toml") == load_profile("secure")
