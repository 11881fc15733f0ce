"""What create-job accepts in job.toml itself (load_job_spec, then check_job and build_config):
typed values, the schema's path, [data] beside a schema, profile paths, the keys it lists."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedforest_cli._common import MAX_SEED
from fedforest_cli.cli import app
from fedforest_secure.privacy import load_profile
from server_app.jobcheck import check_job
from server_app.jobspec import MAX_RANDOM_STATE, build_config, load_job_spec
from server_app.settings import ConfigError

SCHEMA = ('[target]\nname = "y"\nkind = "classification"\nclasses = ["0", "1"]\n'
          '[[features]]\nname = "a"\nkind = "continuous"\nbounds = [0.0, 10.0]\n')
HEAD = 'id = "j"\nclients = ["a", "b", "c"]\n'


def job(tmp_path: Path, text: str, *, schema: bool = True) -> Path:
    (tmp_path / "schema.toml").write_text(SCHEMA)
    path = tmp_path / "job.toml"
    path.write_text(HEAD + ('schema = "schema.toml"\n' if schema else "") + text)
    return path


def create(path: Path) -> None:
    build_config(check_job(load_job_spec(path)).spec)


@pytest.mark.parametrize("text, said", [
    ("round_deadline = true\n", "round_deadline: Input should be a valid number, not true"),
    ("min_clients = true\n", "min_clients: Input should be a valid integer, not true"),
    ("[forest]\nn_estimators = true\n",
     "[forest] n_estimators: Input should be a valid integer, not true"),
    ("[forest]\nmax_features = true\n",
     '[forest] max_features: an int, a fraction in (0, 1], "sqrt" or "log2", not true'),
    ('[forest]\nbootstrap = "no"\n', "[forest] bootstrap: Input should be a valid boolean"),
    ('[forest]\nn_bins = "16"\n', "[forest] n_bins: Input should be a valid integer"),
    ("[forest]\nn_estimators = 5.0\n", "[forest] n_estimators: Input should be a valid integer"),
])
def test_a_value_of_another_type_is_refused_naming_its_key(tmp_path: Path, text: str,
                                                           said: str) -> None:
    with pytest.raises(ConfigError, match="^invalid job file .*job.toml: "):
        create(job(tmp_path, text))
    with pytest.raises(ConfigError) as err:
        create(job(tmp_path, text))
    assert said in str(err.value)


@pytest.mark.parametrize("text, said", [
    ("per_site = \"yes\"\n", "[evaluation] per_site: Input should be a valid boolean"),
    ("score_bins = true\n", "[evaluation] score_bins: Input should be a valid integer, not true"),
])
def test_an_evaluation_value_of_another_type_is_refused_naming_its_key(
        tmp_path: Path, text: str, said: str) -> None:
    (tmp_path / "m.json").write_text("{}")
    path = job(tmp_path, 'kind = "evaluate"\n[evaluation]\nmodels = ["m.json"]\n' + text)
    with pytest.raises(ConfigError) as err:
        load_job_spec(path)
    assert said in str(err.value)


def test_data_facts_stay_typed_and_take_bounds_as_arrays(tmp_path: Path) -> None:
    data = ('profile = "open"\n[data]\ntask = "classification"\nn_features = 1\n'
            "n_classes = 2\nfeature_bounds = [[0, 10]]\n")
    assert build_config(load_job_spec(job(tmp_path, data, schema=False))).feature_bounds == (
        (0.0, 10.0),)
    with pytest.raises(ConfigError, match=r"\[data\] n_features: Input should be a valid "
                                          r"integer, not true"):
        load_job_spec(job(tmp_path, data.replace("n_features = 1", "n_features = true"),
                          schema=False))


def test_random_state_takes_the_seeds_of_seed(tmp_path: Path) -> None:
    assert MAX_RANDOM_STATE == MAX_SEED
    assert load_job_spec(job(tmp_path, f"[forest]\nrandom_state = {MAX_SEED}\n")
                         ).forest.random_state == MAX_SEED
    with pytest.raises(ConfigError, match=r"\[forest\] random_state: Input should be greater "
                                          r"than or equal to 0"):
        load_job_spec(job(tmp_path, "[forest]\nrandom_state = -1\n"))
    with pytest.raises(ConfigError, match=r"\[forest\] random_state: Input should be less "
                                          r"than or equal to 4294967295"):
        load_job_spec(job(tmp_path, f"[forest]\nrandom_state = {2**64}\n"))


@pytest.mark.parametrize("value", ["3", '["schema.toml"]', '{path = "schema.toml"}'])
def test_a_schema_that_is_no_path_is_a_clear_error_of_create_job(tmp_path: Path,
                                                                  value: str) -> None:
    (tmp_path / "server.toml").write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    path = tmp_path / "job.toml"
    path.write_text(HEAD + f"schema = {value}\n")
    res = CliRunner().invoke(app, ["server", "create-job", "--config",
                                   str(tmp_path / "server.toml"), "--job", str(path)])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert "write the path of the schema file as a string, e.g. schema = \"schema.toml\"" in \
        " ".join(res.output.split())


def test_a_data_table_beside_a_schema_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"job.toml: \[data\] is only for a job without a "
                                          r"schema file, and this one names schema = "
                                          r"'schema.toml'.*Remove the \[data\] table \(or the "
                                          r"schema\)$"):
        load_job_spec(job(tmp_path, '[data]\ntask = "classification"\nn_features = 1\n'
                                    "n_classes = 2\nfeature_bounds = [[0, 1000]]\n"))


@pytest.mark.parametrize("file", ["p.TOML", "p", "sub/p.profile"])
def test_a_profile_file_is_read_beside_job_toml_whatever_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file: str) -> None:
    jobdir = tmp_path / "jobs"
    (jobdir / "sub").mkdir(parents=True)
    (jobdir / file).write_text(load_profile("secure", name="beside").to_toml())
    elsewhere = tmp_path / "cwd"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / file).write_text(load_profile("secure", name="cwd").to_toml())
    monkeypatch.chdir(elsewhere)
    spec = load_job_spec(job(jobdir, f'profile = "{file}"\n'))
    assert spec.profile == str((jobdir / file).resolve())
    assert build_config(spec).profile["name"] == "beside"


def test_a_profile_that_is_neither_shipped_nor_a_file_names_both(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secrue").write_text("")  # in the current directory: not read
    jobdir = tmp_path / "jobs"
    jobdir.mkdir()
    with pytest.raises(ConfigError, match=r"profile = 'secrue' is neither a shipped profile "
                                          r"\(open, secure, secure-dp\) nor a file: no "
                                          rf".*jobs{os.sep}secrue \(a profile file's path is "
                                          r"relative to job.toml\)"):
        load_job_spec(job(jobdir, 'profile = "secrue"\n'))


@pytest.mark.parametrize("text, key", [
    ('profile = "secure-dp"\n[profile_overrides]\nepsilon = 8.0\n', "profile_overrides"),
    ('schema_text = "[target]"\n', "schema_text"),
])
def test_the_stored_specs_own_key_names_are_unknown_keys_of_a_job_file(
        tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"job.toml: {key}: unknown key; allowed: clients, "
                                          r"data, evaluation, forest, id, kind, min_clients, "
                                          r"privacy, profile, public_rows, round_deadline, "
                                          r"schema$"):
        load_job_spec(job(tmp_path, text, schema=key != "schema_text"))
