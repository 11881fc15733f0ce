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
