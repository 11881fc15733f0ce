"""Members read their own job's audit log over HTTPS; nobody else does."""

from __future__ import annotations

import warnings
from pathlib import Path

from fedforest_secure.audit import AuditLog, verify_entries
from fedforest_secure.audit.export import read_jsonl
from server_app.app import create_app
from server_app.audit_hook import open_audit
from server_app.auth import add_client
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

with warnings.catch_warnings():
    # starlette warns that its TestClient will move from httpx to httpx2; narrow and local.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


def test_members_read_their_jobs_audit_log_and_outsiders_do_not(
        tmp_path: Path, tiny_parts, job_dir, make_db_url) -> None:
    parts, feat = tiny_parts
    job_toml = job_dir(tmp_path / "job", parts, feat, n_clients=3)
    db = Database(make_db_url("server"))
    tokens = [add_client(db, f"client-{k}") for k in range(3)]
    outsider = add_client(db, "outsider")
    audit_url = make_db_url("audit")
    audit = open_audit(audit_url)
    state = ServerState(db, audit)
    state.create_job(load_job_spec(job_toml))
    app = create_app(db, state=state, tick_seconds=60)
    with TestClient(app) as http:
        for t in tokens:
            assert http.post("/v1/jobs/job-a/join",
                             headers={"Authorization": f"Bearer {t}"}).status_code == 200
        r = http.get("/v1/jobs/job-a/audit", headers={"Authorization": f"Bearer {tokens[1]}"})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        entries = [entry for entry, _blobs in read_jsonl(r.text.splitlines())]
        assert [e.kind for e in entries][:4] == ["job_created"] + ["client_joined"] * 3
        assert verify_entries(entries).ok  # the served copy verifies on its own
        with AuditLog(audit_url, create=False) as log:
            assert [e.hash for e in entries] == [e.hash for e in log.entries(job_id="job-a")]
        denied = http.get("/v1/jobs/job-a/audit", headers={"Authorization": f"Bearer {outsider}"})
        assert denied.status_code == 404 and denied.json()["error"] == "unknown_job"
        assert http.get("/v1/jobs/job-a/audit").status_code == 401
    db.dispose()


def test_a_join_whose_audit_append_fails_is_logged_once_before_any_tip_covers_it(
        tmp_path: Path, tiny_parts, job_dir, monkeypatch) -> None:
    """The audit log's database fails as a site's join entry is appended (it stopped
    answering): the join is saved with its entry in the server database and answers that the
    entry waits; no chain
    tip is announced while it waits (the status fails), and once the log answers the entry is
    appended once (the site's retry logs no second one) and the tip covers it."""
    import pytest

    from server_app.audit_outbox import AuditPending
    from server_app.auth import authenticate

    parts, feat = tiny_parts
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    tokens = [add_client(db, f"client-{k}") for k in range(3)]
    audit = open_audit(f"sqlite:///{tmp_path / 'audit.db'}")
    state = ServerState(db, audit)
    state.create_job(load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=3)))
    real_append = AuditLog.append

    def failing(*args: object, **kw: object) -> str:
        raise ConnectionError("the audit database stopped answering")

    monkeypatch.setattr(AuditLog, "append", failing)
    client = authenticate(db, tokens[0])
    assert client is not None
    with pytest.raises(AuditPending) as err:
        state.join(client, "job-a")
    assert str(err.value) == (
        "job 'job-a': audit entries of a step the server saved could not be appended to the "
        "audit log yet (ConnectionError: the audit database stopped answering): they wait in the "
        "server database and are appended when the log answers again (the server tries at "
        "every check and at its start)")
    with pytest.raises(AuditPending):
        state.status(client, "job-a")  # no tip without the waiting entry
    monkeypatch.setattr(AuditLog, "append", real_append)
    state.join(client, "job-a")  # the retry: the site joined already
    status = state.status(client, "job-a")
    with AuditLog(f"sqlite:///{tmp_path / 'audit.db'}", create=False) as log:
        entries = log.entries(job_id="job-a")
    joined = [e.payload["client"] for e in entries if e.kind == "client_joined"]
    assert joined == ["client-0"]
    assert (status["audit_seq"], status["audit_head"]) == (entries[-1].seq, entries[-1].hash)
    db.dispose()


def test_a_database_failure_is_answered_without_its_sql_or_address(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """The database goes away under a running server: a request that needs it gets a 500
    saying the server's database failed, not the SQL statement or the database's address
    (the log has both); /health says the database is unavailable (503)."""
    from fastapi.testclient import TestClient
    from sqlalchemy.exc import OperationalError

    parts, feat = tiny_parts
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    token = add_client(db, "client-0")
    for k in (1, 2):
        add_client(db, f"client-{k}")
    state = ServerState(db, open_audit(f"sqlite:///{tmp_path / 'audit.db'}"))
    state.create_job(load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=3)))
    gone = OperationalError("SELECT audit_entries.seq FROM audit_entries", {},
                            Exception('connection to server at "10.1.2.3", port 5432 failed'))

    def broken(*args: object, **kw: object) -> str:
        raise gone

    app = create_app(db, state=state, tick_seconds=60)
    with TestClient(app, raise_server_exceptions=False) as http:
        assert http.get("/health").status_code == 200
        state.audit_log = broken  # type: ignore[method-assign]
        r = http.get("/v1/jobs/job-a/audit", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 500 and "database" in r.json()["detail"]
        assert "SELECT" not in r.text and "10.1.2.3" not in r.text
        db.connect = broken  # type: ignore[method-assign]
        down = http.get("/health")
        assert down.status_code == 503 and down.json()["status"] == "database unavailable"
        assert "10.1.2.3" not in down.text
    db.dispose()
