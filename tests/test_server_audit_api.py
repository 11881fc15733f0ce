"""Members read their own job's audit log over HTTPS; nobody else does."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from fedforest_secure.audit import AuditLog, verify_entries
from fedforest_secure.audit.entry import decode_array
from fedforest_secure.audit.export import read_jsonl
from fedforest_secure.config import JobConfig
from fedforest_secure.federation import client_seed
from fedforest_secure.protocol import Task, make_upload
from fedforest_secure.worker import Worker
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
    audit.close()  # type: ignore[attr-defined]
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


def _open_round_closed(tmp_path: Path, tiny_parts, job_dir, *, arrays_for_sites: bool
                       ) -> tuple[str, str]:
    """An open job of 3 sites whose first round (node totals, each site's quantile sketch
    disclosed) closed: a member's GET /audit text, and the audit log's URL."""
    parts, feat = tiny_parts
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    tokens = [add_client(db, f"client-{k}") for k in range(3)]
    audit_url = f"sqlite:///{tmp_path / 'audit.db'}"
    state = ServerState(db, open_audit(audit_url, arrays_for_sites=arrays_for_sites))
    state.create_job(load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=3)))
    app = create_app(db, state=state, tick_seconds=60)
    with TestClient(app) as http:
        auth = [{"Authorization": f"Bearer {t}"} for t in tokens]
        infos = [http.post("/v1/jobs/job-a/join", headers=a).json() for a in auth]
        config = JobConfig.from_json(json.dumps(infos[0]["config"]))
        task = Task.from_bytes(http.get("/v1/jobs/job-a/task", headers=auth[0]).content)
        for k in range(3):
            X, y = parts[k]
            rep = Worker(config, X, y, client_index=k, seed=client_seed(config, k)).handle(task)
            r = http.post(f"/v1/jobs/job-a/rounds/{task.round_id}/upload",
                          content=make_upload(task, rep.summable, rep.disclosed),
                          headers={**auth[k], "Content-Type": "application/octet-stream"})
            assert r.status_code == 200, r.text
        got = http.get("/v1/jobs/job-a/audit", headers=auth[2])
        assert got.status_code == 200
    db.dispose()
    return got.text, audit_url


def test_a_member_reads_its_jobs_log_without_the_arrays_and_its_chain_verifies(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """By default a member's copy of the log holds no array bytes: neither the round's
    aggregate (n-1 colluding sites would subtract their own vectors from it) nor the other
    sites' disclosures; every entry keeps its arrays' digests, so the copy's hashes are the
    log's and its chain verifies."""
    text, audit_url = _open_round_closed(tmp_path, tiny_parts, job_dir, arrays_for_sites=False)
    served = read_jsonl(text.splitlines())
    assert all(blobs is None for _, blobs in served)
    assert all("data" not in json.loads(line) for line in text.splitlines())
    entries = [entry for entry, _ in served]
    kinds = [e.kind for e in entries]
    assert "round" in kinds and kinds.count("disclosure") >= 3  # each site's sketch
    with AuditLog(audit_url, create=False) as log:
        whole = log.entries(job_id="job-a")
        round_entry = next(e for e in whole if e.kind == "round")
        assert "aggregate" in log.stored_arrays("job-a", round_entry.seq)  # the operator's
    assert [(e.hash, e.arrays_json) for e in entries] == [(e.hash, e.arrays_json)
                                                          for e in whole]
    assert verify_entries(entries).ok


def test_a_server_that_serves_the_arrays_to_sites_sends_every_aggregate(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """With audit_arrays_for_sites the member's copy is the whole log: the round's aggregate
    decodes to the operator's."""
    text, audit_url = _open_round_closed(tmp_path, tiny_parts, job_dir, arrays_for_sites=True)
    served = read_jsonl(text.splitlines())
    assert all(blobs is not None for _, blobs in served)
    entry, blobs = next((e, b) for e, b in served if e.kind == "round")
    assert blobs is not None
    with AuditLog(audit_url, create=False) as log:
        want = log.array(entry, "aggregate")
    assert np.array_equal(decode_array(entry.arrays["aggregate"], blobs["aggregate"]), want)


@pytest.mark.parametrize("value", ["true", "1", '"yes"'])
def test_audit_arrays_for_sites_takes_a_toml_boolean_only(tmp_path: Path, value: str) -> None:
    from server_app.settings import ConfigError, load_settings

    (tmp_path / "server.toml").write_text(f"audit_arrays_for_sites = {value}\n")
    if value == "true":
        assert load_settings(tmp_path / "server.toml").audit_arrays_for_sites is True
        return
    with pytest.raises(ConfigError, match="audit_arrays_for_sites: Input should be a valid "
                                          "boolean"):
        load_settings(tmp_path / "server.toml")
    (tmp_path / "server.toml").write_text("")
    assert load_settings(tmp_path / "server.toml").audit_arrays_for_sites is False
