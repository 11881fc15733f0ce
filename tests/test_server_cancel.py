"""Cancelling a job (``server_app.cancel``, ``fedforest server cancel-job``): the server that
serves the database fails it with the operator's reason; with none, the command does."""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, event, select, update
from typer.testing import CliRunner

from fedforest_cli.cli import app as cli_app
from fedforest_secure.audit import AuditLog, verify_log
from server_app.admin import ServerAdmin
from server_app.app import create_app
from server_app.audit_hook import open_audit
from server_app.cancel import CANCELLED, CancelError
from server_app.db import CancelRow, Database, JobRow, LeaseRow
from server_app.jobspec import load_job_spec
from server_app.lease import ServerLease, holder
from server_app.runtime import ServerState

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

K = 3


def _config(root: Path, audit: str = "audit.db") -> Path:
    """A server.toml naming the SQLite files ``root/server.db`` and ``root/<audit>``."""
    path = root / "server.toml"
    path.write_text(f'database = "sqlite:///{root / "server.db"}"\n'
                    f'audit_database = "sqlite:///{root / audit}"\n')
    return path


@pytest.fixture()
def fed(tmp_path: Path, tiny_parts, job_dir) -> dict:
    """job-a (open) created for K registered sites on SQLite files, with an audit log."""
    parts, feat = tiny_parts
    job_toml = job_dir(tmp_path / "job", parts, feat, n_clients=K)
    config = _config(tmp_path)
    url, audit = f"sqlite:///{tmp_path / 'server.db'}", f"sqlite:///{tmp_path / 'audit.db'}"
    with ServerAdmin(url, audit) as admin:
        tokens = [admin.add_client(f"client-{k}") for k in range(K)]
        admin.create_job(load_job_spec(job_toml))
    return {"url": url, "audit": audit, "tokens": tokens, "config": config}


@pytest.fixture()
def served(fed: dict) -> Iterator[dict]:
    """``fed`` served in this process as ``fedforest server`` serves it: the database's lease
    held and renewed, the deadline ticker running (every 20 ms)."""
    db = Database(fed["url"])
    audit = open_audit(fed["audit"])
    lease = ServerLease(db, 1)
    lease.acquire()
    lease.keep(lambda: None)
    state = ServerState(db, audit)
    try:
        with TestClient(create_app(db, state=state, tick_seconds=0.02)) as http:
            yield {**fed, "http": http, "db": db, "state": state}
    finally:
        lease.release()
        audit.close()
        db.dispose()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _kinds_and_last(audit: str) -> tuple[list[str], dict]:
    with AuditLog(audit, create=False) as log:
        entries = log.entries(job_id="job-a")
    return [e.kind for e in entries], dict(entries[-1].payload)


def test_a_waiting_job_is_cancelled_by_the_running_server_and_its_sites_are_told(
        served: dict) -> None:
    http, tokens = served["http"], served["tokens"]
    assert http.post("/v1/jobs/job-a/join", headers=auth(tokens[0])).status_code == 200
    r = http.get("/v1/jobs/job-a/task", headers=auth(tokens[0]))
    assert r.headers["X-FedForest-Status"] == "wait"  # waiting for client-1 and client-2
    with ServerAdmin(served["url"], served["audit"]) as admin:
        out = admin.cancel_job("job-a", wait_s=30)
    assert (out.status, out.reason) == ("failed", CANCELLED)
    # the server applied the request: none is left
    with served["db"].session() as s:
        assert s.scalars(select(CancelRow)).all() == []
    # the joined site polling its task, and a site that never joined, read why
    r = http.get("/v1/jobs/job-a/task", headers=auth(tokens[0]))
    assert r.headers["X-FedForest-Status"] == "failed"
    assert r.headers["X-FedForest-Detail"] == CANCELLED
    st = http.get("/v1/jobs/job-a", headers=auth(tokens[2])).json()
    assert (st["status"], st["reason"]) == ("failed", CANCELLED)
    # a site that starts only now is told the job failed, and why (it never started)
    r = http.post("/v1/jobs/job-a/join", headers=auth(tokens[2]))
    assert r.status_code == 409
    assert r.json() == {"error": "job_failed", "detail": CANCELLED}
    kinds, last = _kinds_and_last(served["audit"])
    assert kinds == ["job_created", "client_joined", "job_failed"], kinds
    assert last == {"reason": CANCELLED}
    report = verify_log(served["audit"], job_id="job-a")
    assert report.ok, report.problems
    ok, _, problems = served["state"].core.audit.verify_chain("job-a", began_audited=True)
    assert ok, problems  # what /ui shows


def test_a_running_job_is_cancelled_mid_round_then_pruned_and_stays_failed_after_a_restart(
        served: dict) -> None:
    http, tokens = served["http"], served["tokens"]
    for t in tokens:
        assert http.post("/v1/jobs/job-a/join", headers=auth(t)).status_code == 200
    r = http.get("/v1/jobs/job-a/task", headers=auth(tokens[1]))
    assert r.status_code == 200 and r.headers["X-FedForest-Status"] == "task"
    with ServerAdmin(served["url"], served["audit"]) as admin:
        out = admin.cancel_job("job-a", wait_s=30)
        assert (out.status, out.reason) == ("failed", CANCELLED)
        r = http.get("/v1/jobs/job-a/task", headers=auth(tokens[1]))
        assert (r.headers["X-FedForest-Status"], r.headers["X-FedForest-Detail"]) == \
            ("failed", CANCELLED)
        kinds, last = _kinds_and_last(served["audit"])
        # the round it was in is aborted (its uploads' receipts verify), then the job fails
        assert kinds[-2:] == ["round_aborted", "job_failed"], kinds
        assert last == {"reason": CANCELLED}
        assert verify_log(served["audit"], job_id="job-a").ok
        pruned = admin.prune(job_ids=["job-a"])
    assert pruned.jobs == ["job-a"] and pruned.rounds >= 1
    # a restarted server reads the job as failed, with the reason
    restarted = ServerState(Database(served["url"]), served["state"].core.audit)
    with TestClient(create_app(restarted.core.db, state=restarted, tick_seconds=60)) as again:
        st = again.get("/v1/jobs/job-a", headers=auth(tokens[0])).json()
    restarted.core.db.dispose()
    assert (st["status"], st["reason"]) == ("failed", CANCELLED)


def test_cancelling_an_unknown_or_finished_job_is_an_error_that_records_nothing(
        served: dict) -> None:
    with ServerAdmin(served["url"], served["audit"]) as admin:
        with pytest.raises(CancelError, match="no job 'nope' on this server"):
            admin.cancel_job("nope")
        with served["db"].session() as s:
            s.get(JobRow, "job-a").status = "done"
        with pytest.raises(CancelError, match="job 'job-a' has already finished: it is done; "
                                              "only a waiting or running job can be cancelled"):
            admin.cancel_job("job-a")
    with served["db"].session() as s:
        assert s.scalars(select(CancelRow)).all() == []


def test_a_server_that_does_not_apply_the_request_in_time_is_named_and_the_request_stays(
        served: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ServerState, "apply_cancels", lambda self: [])  # a stalled server
    with ServerAdmin(served["url"], served["audit"]) as admin:
        with pytest.raises(CancelError, match=r"the server \(pid \d+ on .*, port 1\) has not "
                                              r"cancelled job 'job-a' within 0 s; the request "
                                              "stays recorded"):
            admin.cancel_job("job-a", wait_s=0.3)
        assert admin.job("job-a").status == "waiting"
    with served["db"].session() as s:
        assert [c.job_id for c in s.scalars(select(CancelRow))] == ["job-a"]
    monkeypatch.undo()
    served["state"].tick(full_every=1)  # a server that runs again applies it
    with ServerAdmin(served["url"]) as admin:
        assert admin.job("job-a").reason == CANCELLED


def test_with_no_server_running_the_command_cancels_the_job_itself(fed: dict) -> None:
    prune = ["server", "prune", "--config", str(fed["config"]), "--job", "job-a"]
    refused = CliRunner().invoke(cli_app, prune)
    assert refused.exit_code == 2
    assert "error: job 'job-a' is waiting: only finished jobs are pruned (`fedforest server " \
        f"cancel-job --config {fed['config']} --job job-a` stops it)" in \
        " ".join(refused.output.split())
    res = CliRunner().invoke(cli_app, ["server", "cancel-job", "--config", str(fed["config"]),
                                       "--job", "job-a"])
    assert res.exit_code == 0, res.output
    assert "job job-a cancelled: it failed with the reason 'cancelled by the operator'" \
        in " ".join(res.output.split())
    kinds, last = _kinds_and_last(fed["audit"])
    assert kinds == ["job_created", "job_failed"] and last == {"reason": CANCELLED}
    db = Database(fed["url"])
    try:
        assert holder(db) is None  # the command gave the lease back
    finally:
        db.dispose()
    again = CliRunner().invoke(cli_app, ["server", "cancel-job", "--config",
                                         str(fed["config"]), "--job", "job-a"])
    assert again.exit_code == 2
    assert again.output.startswith("error: job 'job-a' has already finished: it is failed "
                                   "(cancelled by the operator)")
    pruned = CliRunner().invoke(cli_app, prune)  # a waiting job has no rounds to delete
    assert pruned.exit_code == 0 and "of 0 finished job(s)" in pruned.output, pruned.output


def test_with_no_server_a_config_without_the_jobs_audit_chain_cancels_nothing(
        fed: dict, tmp_path: Path) -> None:
    """The job's chain is in audit.db; a config naming another audit database would end it
    in a log that has none of it: refused, and the job stays as it was."""
    other = _config(tmp_path, audit="other-audit.db")
    res = CliRunner().invoke(cli_app, ["server", "cancel-job", "--config", str(other),
                                       "--job", "job-a"])
    assert res.exit_code == 2
    out = " ".join(res.output.split())
    assert out.startswith("error: the audit log at sqlite:///"), out
    assert out.endswith("other-audit.db has none of job 'job-a''s entries (it began on another "
                        "audit_database, or none): cancel it with the server config that names "
                        "the audit_database it began with"), out
    with ServerAdmin(fed["url"]) as admin:
        assert admin.job("job-a").status == "waiting"
    kinds, _ = _kinds_and_last(fed["audit"])
    assert kinds == ["job_created"]


def test_with_no_server_a_command_paused_while_a_server_took_over_cancels_nothing(
        fed: dict) -> None:
    """The command holds the database's claim while it cancels the job. Paused (Ctrl-Z)
    longer than the claim lasts, it finds, when it resumes, that a server started meanwhile
    took the database over and serves the job: it saves nothing behind that server's back
    (the job stays as the server has it) and says so."""
    socket_host = socket.gethostname()
    fired: list[int] = []

    def take_over() -> None:  # what a server started while the command was paused does
        other = Database(fed["url"])
        try:
            with other.session() as sess:
                sess.execute(update(LeaseRow).values(renewed_at=LeaseRow.renewed_at - 60))
            ServerLease(other, 9000).acquire()
        finally:
            other.dispose()

    def before(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        words = statement.lstrip().upper()
        if not fired and words.startswith(("UPDATE JOBS ", "INSERT INTO AUDIT_OUTBOX ")):
            fired.append(1)
            take_over()

    event.listen(Engine, "before_cursor_execute", before)
    try:
        res = CliRunner().invoke(cli_app, ["server", "cancel-job", "--config",
                                           str(fed["config"]), "--job", "job-a"])
    finally:
        event.remove(Engine, "before_cursor_execute", before)
    assert fired
    assert res.exit_code == 2, res.output
    assert " ".join(res.output.split()) == (
        "error: job 'job-a' was not cancelled: this command was paused for more than 15 s "
        f"while it held the database, and a server (pid {os.getpid()} on {socket_host}, port "
        "9000) took the database over meanwhile; run the command again (the server that "
        "serves the database then cancels the job)")
    with ServerAdmin(fed["url"]) as admin:
        assert admin.job("job-a").status == "waiting"
    kinds, _ = _kinds_and_last(fed["audit"])
    assert kinds == ["job_created"]
    db = Database(fed["url"])
    try:
        served_by = holder(db)
        assert served_by is not None and served_by.port == 9000  # the server's claim stands
    finally:
        db.dispose()
