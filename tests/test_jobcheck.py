"""create-job refuses what would fail mid-job, and completes a DP job's forest; a job that
cannot start fails with its reason, never with a 500 on every request."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import warnings
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_secure.errors import FedForestError
from server_app.app import create_app
from server_app.audit_hook import NullAudit
from server_app.auth import add_client
from server_app.db import Database
from server_app.jobcheck import check_job
from server_app.jobspec import build_config, load_job_spec
from server_app.runtime import ServerState
from server_app.settings import ConfigError

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

BOUNDED = ('[target]\nname = "y"\nkind = "classification"\nclasses = ["0", "1"]\n'
           '[[features]]\nname = "a"\nkind = "continuous"\nbounds = [0.0, 10.0]\n'
           '[[features]]\nname = "b"\nkind = "continuous"\nbounds = [-1.0, 1.0]\n')
UNBOUNDED = BOUNDED.replace("bounds = [-1.0, 1.0]\n", "")


def job(tmp_path: Path, text: str, schema: str = BOUNDED) -> Path:
    (tmp_path / "schema.toml").write_text(schema)
    path = tmp_path / "job.toml"
    path.write_text('id = "j"\nschema = "schema.toml"\n' + text)
    return path


def test_a_secure_job_with_two_sites_is_refused(tmp_path: Path) -> None:
    spec = load_job_spec(job(tmp_path, 'clients = ["a", "b"]\nprofile = "secure"\n'))
    with pytest.raises(ConfigError, match=r"profile 'secure' uses secure aggregation, which "
                                          r"needs at least 3 sites .* names 2: a, b"):
        check_job(spec)
    open_spec = load_job_spec(job(tmp_path, 'clients = ["a", "b"]\nprofile = "open"\n'))
    assert check_job(open_spec).spec == open_spec


def test_missing_bounds_under_a_secure_profile_are_refused_naming_the_features(
        tmp_path: Path) -> None:
    for profile in ("secure", "secure-dp"):
        spec = load_job_spec(job(tmp_path, f'clients = ["a", "b", "c"]\nprofile = "{profile}"'
                                           "\n[forest]\nn_estimators = 2\nmax_depth = 2\n",
                                 UNBOUNDED))
        with pytest.raises(ConfigError, match=r"needs public bounds for every continuous "
                                              r"feature .*the job's schema has none for b\."):
            check_job(spec)
    regression = BOUNDED.replace('kind = "classification"\nclasses = ["0", "1"]',
                                 'kind = "regression"')
    spec = load_job_spec(job(tmp_path, 'clients = ["a", "b", "c"]\nprofile = "secure"\n',
                             regression))
    with pytest.raises(ConfigError, match=r"\[target\] 'y' has none"):
        check_job(spec)


@pytest.mark.parametrize("profile", ["secure", "secure-dp"])
def test_a_json_schema_is_checked_for_bounds_as_a_toml_one_is(tmp_path: Path,
                                                              profile: str) -> None:
    """Without the target's bounds, the fixed-point scale would be 1: secure-dp would clip
    every target to [-1, 1]."""
    (tmp_path / "schema.json").write_text(json.dumps({
        "target": {"name": "y", "kind": "regression"},
        "features": [{"name": "a", "kind": "continuous", "bounds": [0, 10]}]}))
    path = tmp_path / "job.toml"
    path.write_text(f'id = "j"\nclients = ["a", "b", "c"]\nprofile = "{profile}"\n'
                    'schema = "schema.json"\n')
    with pytest.raises(ConfigError, match=rf"^profile '{profile}' encodes sums in fixed point, "
                                          r"scaled by the target's public bounds; the job's "
                                          r"schema's \"target\" 'y' has none. Add "
                                          r"`\"bounds\": \[lo, hi\]` to \"target\"$"):
        check_job(load_job_spec(path))
    unbounded = json.dumps({"target": {"name": "y", "kind": "classification",
                                       "classes": ["0", "1"]},
                            "features": [{"name": "a", "kind": "continuous"}]})
    (tmp_path / "schema.json").write_text(unbounded)
    with pytest.raises(ConfigError, match=r"needs public bounds for every continuous feature "
                                          r".*the job's schema has none for a\..* and add "
                                          r"`\"bounds\": \[lo, hi\]` to each "):
        check_job(load_job_spec(path))


def test_a_dp_job_without_forest_settings_is_told_what_the_dp_rule_chose(
        tmp_path: Path) -> None:
    spec = load_job_spec(job(tmp_path, 'clients = ["a", "b", "c"]\nprofile = "secure-dp"\n'
                                       "public_rows = 700\n"))
    checked = check_job(spec)
    config = build_config(checked.spec)
    assert (config.n_estimators, config.max_depth) != (50, 8) and config.method == "random"
    (note,) = checked.notes
    assert "leaves n_estimators, max_depth, n_bins, max_features, bootstrap, method" in note
    assert f"n_estimators = {config.n_estimators}" in note and "public_rows = 700" in note
    assert f"max_depth = {config.max_depth}" in note
    # the fields the job file sets are kept, and not listed
    explicit = load_job_spec(job(tmp_path, 'clients = ["a", "b", "c"]\nprofile = "secure-dp"\n'
                                           "[forest]\nn_estimators = 3\nmax_depth = 2\n"
                                           'n_bins = 4\nmax_features = 1\nbootstrap = false\n'
                                           'method = "histogram"\n'))
    assert check_job(explicit).notes == []
    assert build_config(explicit).n_estimators == 3


def test_create_job_prints_the_dp_defaults_it_applied(tmp_path: Path) -> None:
    (tmp_path / "server.toml").write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    runner = CliRunner()
    for name in "abc":
        assert runner.invoke(app, ["server", "add-client", name, "--config",
                                   str(tmp_path / "server.toml")]).exit_code == 0
    path = job(tmp_path, 'clients = ["a", "b", "c"]\nprofile = "secure-dp"\n')
    res = runner.invoke(app, ["server", "create-job", "--config", str(tmp_path / "server.toml"),
                              "--job", str(path)])
    assert res.exit_code == 0, res.output
    printed = " ".join(res.output.split())
    assert "DP job: [forest] leaves n_estimators" in printed
    assert "public_rows absent: 100 per site = 300" in printed
    assert "job j created" in res.output
    two = job(tmp_path, 'id = "k"\nclients = ["a", "b"]\nprofile = "secure"\n'.replace(
        'id = "k"\n', ""))
    two.write_text(two.read_text().replace('id = "j"', 'id = "k"'))
    res = runner.invoke(app, ["server", "create-job", "--config", str(tmp_path / "server.toml"),
                              "--job", str(two)])
    assert res.exit_code == 2 and "needs at least 3 sites" in res.output


def test_a_job_that_cannot_start_fails_with_its_reason_not_a_500(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job stored before create-job checked it (here: the check is skipped): the join that
    would start it gets its answer, the job fails with the coordinator's reason, and the
    sites read it in the status instead of retrying HTTP 500s."""
    import server_app.runtime as runtime

    spec = load_job_spec(job(tmp_path, 'clients = ["a", "b", "c"]\nprofile = "secure-dp"\n'
                                       "[forest]\nn_estimators = 2\nmax_depth = 2\n",
                             UNBOUNDED))
    with pytest.raises(ConfigError):
        check_job(spec)
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    tokens = [add_client(db, n) for n in "abc"]
    state = ServerState(db, NullAudit())
    monkeypatch.setattr(runtime, "check_job", lambda s: type("C", (), {"spec": s})())
    state.create_job(spec)
    with TestClient(create_app(db, state=state, tick_seconds=60)) as http:
        codes = [http.post("/v1/jobs/j/join", headers={"Authorization": f"Bearer {t}"},
                           json={"identity_key": f"{k:02d}" * 32}).status_code
                 for k, t in enumerate(tokens)]
        st = http.get("/v1/jobs/j", headers={"Authorization": f"Bearer {tokens[0]}"}).json()
        step = http.get("/v1/jobs/j/secagg",
                        headers={"Authorization": f"Bearer {tokens[1]}"}).json()
    db.dispose()
    assert codes == [200, 200, 200]
    assert st["status"] == "failed" and "the job cannot start" in st["reason"]
    assert "public feature bounds" in st["reason"]
    assert step["status"] == "failed" and "cannot start" in step["detail"]


def test_frac_bits_more_than_the_sites_ring_sums_hold_are_refused_at_creation(
        tmp_path: Path) -> None:
    """Three sites' fixed-point sums fit the 64-bit ring up to frac_bits = 33: create-job
    refuses 34 with that limit (the profile alone allows up to 40)."""
    text = 'clients = ["a", "b", "c"]\nprofile = "secure"\n[privacy]\nfrac_bits = {}\n'
    assert check_job(load_job_spec(job(tmp_path, text.format(33)))).spec.id == "j"
    with pytest.raises(ConfigError, match=r"job 'j' cannot start: frac_bits = 34 is more than "
                                          r"3 sites' fixed-point sums hold: at most 33"):
        check_job(load_job_spec(job(tmp_path, text.format(34))))


def test_a_job_whose_first_round_cannot_be_issued_fails_with_its_reason_not_a_500(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job stored before create-job checked it, whose coordinator starts but whose first
    round cannot be issued (frac_bits the sites' sums cannot hold): the join that starts it
    gets its answer and the job fails with the reason, instead of a 500 that leaves it
    waiting for ever."""
    import server_app.engine as engine
    import server_app.runtime as runtime

    spec = load_job_spec(job(tmp_path, 'clients = ["a", "b", "c"]\nprofile = "secure"\n'
                                       "[privacy]\nfrac_bits = 36\n"))
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    tokens = [add_client(db, n) for n in "abc"]
    state = ServerState(db, NullAudit())
    monkeypatch.setattr(runtime, "check_job", lambda s: type("C", (), {"spec": s})())
    # the coordinator starts (as a server without that check would): the first round's codec
    # is what refuses the job
    monkeypatch.setattr(engine, "check_frac_bits", lambda config: None)
    state.create_job(spec)
    with TestClient(create_app(db, state=state, tick_seconds=60),
                    raise_server_exceptions=False) as http:
        codes = [http.post("/v1/jobs/j/join", headers={"Authorization": f"Bearer {t}"},
                           json={"identity_key": f"{k + 1:02d}" * 32}).status_code
                 for k, t in enumerate(tokens)]
        st = http.get("/v1/jobs/j", headers={"Authorization": f"Bearer {tokens[0]}"}).json()
    db.dispose()
    assert codes == [200, 200, 200]
    assert st["status"] == "failed" and "the job cannot start" in st["reason"]
    assert "frac_bits = 36 is more than 3 sites' fixed-point sums hold" in st["reason"]


def test_an_unexpected_server_error_is_json_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    token = add_client(db, "a")
    state = ServerState(db, NullAudit())

    def broken(*_: object) -> None:
        raise FedForestError("disk full")

    monkeypatch.setattr(state, "jobs_of", broken)
    with TestClient(create_app(db, state=state, tick_seconds=60),
                    raise_server_exceptions=False) as http:
        r = http.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    db.dispose()
    assert r.status_code == 500
    assert r.json() == {"error": "server_error", "detail": "the server failed: FedForestError: "
                        "disk full (its log has the traceback)"}


def test_a_job_with_fewer_sites_than_its_profiles_min_clients_is_refused(
        tmp_path: Path) -> None:
    """The profile's min_clients holds without secure aggregation too: no sum over fewer
    sites is released, whatever job.toml's own min_clients says."""
    plain = 'profile = "secure"\n[privacy]\nsecure_aggregation = false\n'
    spec = load_job_spec(job(tmp_path, 'clients = ["a", "b"]\n' + plain))
    with pytest.raises(ConfigError, match=r"refuses sums over fewer than 3 sites "
                                          r"\(min_clients\); the job file names 2: a, b"):
        check_job(spec)
    low = load_job_spec(job(tmp_path, 'clients = ["a", "b", "c", "d"]\nmin_clients = 2\n'
                                      + plain))
    with pytest.raises(ConfigError, match="min_clients = 2 is below the profile's "
                                          "min_clients = 3"):
        check_job(low)
    ok = load_job_spec(job(tmp_path, 'clients = ["a", "b", "c"]\n' + plain))
    assert check_job(ok).spec == ok


def test_a_secure_jobs_min_clients_below_its_threshold_is_refused(tmp_path: Path) -> None:
    """A round of secure aggregation needs t sites whatever min_clients says: a job stating
    fewer would show "training needs at least 3" and fail at 3 (t = 4 of 5)."""
    five = 'clients = ["a", "b", "c", "d", "e"]\nprofile = "secure"\n'
    spec = load_job_spec(job(tmp_path, five + "min_clients = 3\n"))
    with pytest.raises(ConfigError, match=r"min_clients = 3 is below the secure aggregation "
                                          r"threshold t = 4 \(0.67 of 5 sites\)"):
        check_job(spec)
    assert check_job(load_job_spec(job(tmp_path, five + "min_clients = 5\n"))).spec


@pytest.mark.parametrize("error, said", [
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/srv/fedforest/server.db.spool/j/1"),
     "OSError: /srv/fedforest/server.db.spool/j/1: the disk is full (No space left on device)"),
    (OperationalError("INSERT", None, sqlite3.OperationalError("database or disk is full")),
     "the server's database cannot be written: its disk is full"),
    (OperationalError("INSERT", None, sqlite3.OperationalError("disk I/O error")),
     "an I/O error writing the server's database (disk I/O error: a full disk, a file size "
     "limit or a failing disk)"),
], ids=["file", "sqlite", "sqlite-ioerr"])
def test_an_unexpected_error_on_a_full_disk_says_so_and_names_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, said: str) -> None:
    if isinstance(error, OperationalError):  # SQLite's own code, as its driver sets it
        error.orig.sqlite_errorcode = (  # type: ignore[union-attr]
            sqlite3.SQLITE_FULL if "full" in str(error.orig) else sqlite3.SQLITE_IOERR_WRITE)
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    token = add_client(db, "a")
    state = ServerState(db, NullAudit())

    def broken(*_: object) -> None:
        raise error

    monkeypatch.setattr(state, "jobs_of", broken)
    with TestClient(create_app(db, state=state, tick_seconds=60),
                    raise_server_exceptions=False) as http:
        r = http.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    db.dispose()
    assert r.status_code == 500
    assert r.json() == {"error": "server_error",
                        "detail": f"the server failed: {said} (its log has the traceback)"}
