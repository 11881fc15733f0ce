"""``fedforest server model``: the operator writes a finished job's model from the server's
database (for ``fedforest evaluate --models``), byte for byte what a site downloads; and an
operator token given to the sites' commands is named as such."""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import pytest
from ports import free_port
from state_driver import answer_until_done, join_sites
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_secure.audit import AuditLog
from server_app.app import create_app
from server_app.audit_hook import open_audit
from server_app.auth import add_client, add_operator
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

WIDE = {"COLUMNS": "400"}  # one line per message, however long its paths


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory, tiny_parts, job_dir) -> dict:
    """A server database whose job ``job-a`` is done, another job ``job-w`` waiting and a
    third ``job-c`` cancelled; the model ``job-a``'s site downloads over the API, and the
    operator's token."""
    root = tmp_path_factory.mktemp("model")
    parts, feat = tiny_parts
    db = Database(f"sqlite:///{root / 'server.db'}")
    tokens = [add_client(db, f"client-{k}") for k in range(3)]
    operator = add_operator(db, "ops")
    audit = open_audit(f"sqlite:///{root / 'audit.db'}")
    state = ServerState(db, audit)
    state.create_job(load_job_spec(job_dir(root / "job", parts, feat, n_clients=3)))
    for other in ("job-w", "job-c"):
        state.create_job(load_job_spec(job_dir(root / other, parts, feat, n_clients=3,
                                               job_id=other)))
    state.cancel("job-c")
    rows, workers = join_sites(db, state, "job-a", parts[:3])
    assert answer_until_done(state, "job-a", rows, workers)
    with TestClient(create_app(db, audit, state=state, tick_seconds=60)) as http:
        site = http.get("/v1/jobs/job-a/model", headers={"Authorization": f"Bearer {tokens[0]}"})
        assert site.status_code == 200, site.text
        refused = http.get("/v1/jobs/job-a/model",
                           headers={"Authorization": f"Bearer {operator}"})
    audit.close()  # type: ignore[attr-defined]
    db.dispose()
    (root / "server.toml").write_text(f'database = "sqlite:///{root / "server.db"}"\n'
                                      f'audit_database = "sqlite:///{root / "audit.db"}"\n')
    return {"root": root, "config": root / "server.toml", "downloaded": site.content,
            "operator": operator, "refused": refused}


def _model(config: Path, job: str, out: Path, *extra: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["server", "model", "--config", str(config), "--job", job,
                                   "--out", str(out), *extra], env=WIDE)
    return res.exit_code, " ".join(res.output.split())


def test_the_operator_writes_the_model_a_site_downloads_with_the_logs_digest(
        done: dict, tmp_path: Path) -> None:
    out = tmp_path / "model.json"
    code, text = _model(done["config"], "job-a", out)
    assert code == 0, text
    written = out.read_bytes()
    assert written == done["downloaded"]
    digest = hashlib.sha256(written).hexdigest()
    with AuditLog(f"sqlite:///{done['root'] / 'audit.db'}", create=False) as log:
        (entry,) = [e for e in log.entries(job_id="job-a") if e.kind == "model"]
    assert entry.payload["digest"] == digest
    assert text == f"model of job job-a written to {out} (sha256 {digest})"


def test_the_operator_is_told_why_a_job_has_no_model_and_nothing_is_written(
        done: dict, tmp_path: Path) -> None:
    out = tmp_path / "model.json"
    for job, why in [
            ("job-x", "error: no job 'job-x' on this server (`fedforest server status` lists "
                      "its jobs)"),
            ("job-w", "error: job 'job-w' is waiting: it has no model yet (`fedforest server "
                      "status` shows how far it is)"),
            ("job-c", "error: job 'job-c' failed (cancelled by the operator): it has no "
                      "model")]:
        assert _model(done["config"], job, out) == (2, why)
        assert not out.exists()


def test_the_operator_does_not_replace_an_existing_file_unless_forced(
        done: dict, tmp_path: Path) -> None:
    out = tmp_path / "model.json"
    out.write_text("the operator's other model")
    assert _model(done["config"], "job-a", out) == (
        2, f"error: {out} exists: nothing was written (--force replaces it)")
    assert out.read_text() == "the operator's other model"
    code, text = _model(done["config"], "job-a", out, "--force")
    assert code == 0, text
    assert out.read_bytes() == done["downloaded"]


def test_a_mistyped_database_is_named_not_created(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text('database = "sqlite:///serevr.db"\n')
    code, text = _model(config, "job-a", tmp_path / "model.json")
    assert code == 2 and f"no database at {tmp_path / 'serevr.db'}" in text, text
    assert not (tmp_path / "serevr.db").exists() and not (tmp_path / "model.json").exists()


def test_the_sites_api_names_an_operator_token_as_one(done: dict) -> None:
    refused = done["refused"]
    assert refused.status_code == 401
    assert refused.json()["detail"] == (
        "an operator token (ffo_...) opens the operator page /ui only; the sites' requests "
        "take a site's token (ffs_...)")


def test_model_download_with_an_operator_token_says_what_the_operator_runs(
        tmp_path: Path) -> None:
    """Refused before connecting (no server listens on the port), nothing written."""
    out = tmp_path / "model.json"
    res = CliRunner().invoke(app, ["model", "download", "--job", "job-a", "--out", str(out),
                                   "--server", f"https://127.0.0.1:{free_port()}"],
                             env={**WIDE, "FEDFOREST_TOKEN": "ffo_" + "A" * 16 + "_" + "b" * 43})
    assert res.exit_code == 2
    assert " ".join(res.output.split()) == (
        "error: the token (--token or FEDFOREST_TOKEN) is an operator token (ffo_...): it "
        "opens the operator page /ui only, not the sites' requests; the operator writes a "
        "job's model from the server's database with `fedforest server model --config "
        f"server.toml --job job-a --out {out}`")
    assert not out.exists()


@pytest.mark.parametrize(("command", "instead"), [
    (["jobs"], "the operator reads every job with `fedforest server status --config "
               "server.toml`"),
    (["status", "--job", "job-a"], "the operator reads every job with `fedforest server "
                                   "status --config server.toml`"),
    (["audit", "download", "--job", "job-a", "--out", "a.jsonl"],
     "the operator exports a job's log from the audit database with `fedforest audit export "
     "--db AUDIT_DATABASE --format jsonl --job job-a --out a.jsonl`")])
def test_the_sites_other_commands_name_an_operator_token_and_what_the_operator_runs(
        command: list[str], instead: str) -> None:
    res = CliRunner().invoke(app, [*command, "--server", f"https://127.0.0.1:{free_port()}"],
                             env={**WIDE, "FEDFOREST_TOKEN": "ffo_" + "A" * 16 + "_" + "b" * 43})
    assert res.exit_code == 2
    assert " ".join(res.output.split()) == (
        "error: the token (--token or FEDFOREST_TOKEN) is an operator token (ffo_...): it "
        f"opens the operator page /ui only, not the sites' requests; {instead}")


@pytest.mark.parametrize(("named", "kept", "which"), [
    ("server.db", "server.db", "the server's database (`database` in {config})"),
    ("audit.db", "audit.db", "the server's audit log (`audit_database` in {config})"),
    ("link-to-server.db", "server.db", "the server's database (`database` in {config})"),
    ("relative", "audit.db", "the server's audit log (`audit_database` in {config})"),
    ("server.db-wal", "server.db-wal", "{root}/server.db-wal, a file SQLite keeps beside the "
                                       "server's database (`database` in {config})")])
def test_the_model_never_replaces_the_servers_database_or_audit_log_even_forced(
        done: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: str, kept: str,
        which: str) -> None:
    root = done["root"]
    if named == "link-to-server.db":
        out = tmp_path / named
        out.symlink_to(root / "server.db")
    elif named == "relative":
        monkeypatch.chdir(tmp_path)
        out = Path(os.path.relpath(root / "audit.db", tmp_path))  # ../../model0/audit.db
    else:
        out = root / named
    before = (root / kept).read_bytes() if (root / kept).exists() else None
    for extra in ([], ["--force"]):
        assert _model(done["config"], "job-a", out, *extra) == (
            2, f"error: {out} is {which.format(config=done['config'], root=root)}: nothing "
               "was written; write the model elsewhere")
    assert ((root / kept).read_bytes() if (root / kept).exists() else None) == before


def test_a_model_changed_in_the_database_is_refused_against_its_row_and_the_audit_log(
        done: dict, tmp_path: Path) -> None:
    """A copy of the server's database whose stored model is edited: alone, it is refused as
    not the model the job's row records; edited with the row's digest too, as not the model
    the audit log's model entry records. Nothing is written."""
    import shutil
    import sqlite3

    root = done["root"]
    for name in ("server.db", "audit.db"):
        shutil.copy(root / name, tmp_path / name)
    config = tmp_path / "server.toml"
    config.write_text('database = "sqlite:///server.db"\naudit_database = "audit.db"\n')
    good = hashlib.sha256(done["downloaded"]).hexdigest()
    forged = done["downloaded"].decode().replace('"classes"', '"classes" ', 1)
    digest = hashlib.sha256(forged.encode()).hexdigest()
    with AuditLog(f"sqlite:///{root / 'audit.db'}", create=False) as log:
        (entry,) = log.entries(job_id="job-a", kind="model")
    out = tmp_path / "model.json"
    with sqlite3.connect(tmp_path / "server.db") as con:
        con.execute("UPDATE jobs SET model_json = ? WHERE id = 'job-a'", (forged,))
    assert _model(config, "job-a", out) == (
        2, f"error: the stored model of job 'job-a' has the SHA-256 {digest}, not the one the "
           f"job records ({good}): the database was changed")
    with sqlite3.connect(tmp_path / "server.db") as con:
        con.execute("UPDATE jobs SET model_digest = ? WHERE id = 'job-a'", (digest,))
    assert _model(config, "job-a", out) == (
        2, f"error: the stored model of job 'job-a' has the SHA-256 {digest}, not the one the "
           f"audit log's model entry (seq {entry.seq}) holds ({good}): the database was "
           "changed")
    assert not out.exists()


def test_a_config_naming_another_audit_log_is_told_to_name_the_jobs(
        done: dict, tmp_path: Path) -> None:
    AuditLog(f"sqlite:///{tmp_path / 'other.db'}").close()  # a log without the job's chain
    config = tmp_path / "server.toml"
    config.write_text(f'database = "sqlite:///{done["root"] / "server.db"}"\n'
                      'audit_database = "other.db"\n')
    out = tmp_path / "model.json"
    assert _model(config, "job-a", out) == (
        2, f"error: the audit log at sqlite:///{tmp_path / 'other.db'} holds no model entry of "
           "job 'job-a': give the server config that names the audit_database the job began "
           "with")
    assert not out.exists()
