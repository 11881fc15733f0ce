"""A real server process paused (SIGSTOP) mid-job, as a suspended VM or a swap storm stalls
one: the time it did not run does not count against its sites, and a server whose database
another server took over meanwhile writes nothing more and stops with an error."""

from __future__ import annotations

import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from ports import free_port
from sqlalchemy import select
from test_integration_https import (
    Provisioned,
    freeze_mid_job,
    launch_client,
    launch_server,
    setup_fed,
    stop_all,
)

from fedforest_secure.audit import AuditLog
from server_app.db import Database, JobRow, MemberRow, RoundRow, UploadRow
from server_app.lease import LEASE_S

pytestmark = pytest.mark.integration


def _pause_holding_no_lock(proc: subprocess.Popen[bytes], *db_files: Path) -> None:
    """SIGSTOP ``proc`` at a moment it holds no lock on the SQLite files ``db_files`` (the
    server database and the audit log): paused inside a transaction it would hold one, and no
    other server could take the database over."""
    for _ in range(100):
        proc.send_signal(signal.SIGSTOP)
        _wait_stopped(proc.pid)  # a signal is delivered later: it could still take a lock
        if all(_unlocked(f) for f in db_files):
            return
        proc.send_signal(signal.SIGCONT)  # let it finish its transaction
        time.sleep(0.05)
    raise AssertionError("the server held a database lock at every try")


def _wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Wait until process ``pid`` is stopped (state T in /proc/<pid>/stat)."""
    deadline = time.monotonic() + timeout
    stat = Path(f"/proc/{pid}/stat")
    while stat.read_text().rpartition(")")[2].split()[0] != "T":
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.005)


def _unlocked(db_file: Path) -> bool:
    conn = sqlite3.connect(db_file, timeout=0.2)
    try:
        conn.execute("BEGIN EXCLUSIVE")  # no other connection reads or writes it
        conn.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def _wait_for(log: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{log.name} has no {text!r}: {log.read_text()}"
        time.sleep(0.1)


def _job_state(url: str) -> dict[str, Any]:
    """What a step of the server changes: the job's row, its members, rounds and uploads."""
    db = Database(url)
    try:
        with db.session() as sess:
            job = sess.get(JobRow, "job-a")
            assert job is not None
            return {
                "job": (job.status, job.reason, job.current_round),
                "members": sorted((m.client_index, m.state) for m in sess.scalars(
                    select(MemberRow).where(MemberRow.job_id == "job-a"))),
                "rounds": sorted((r.round_id, r.status, r.phase, r.dropped_json)
                                 for r in sess.scalars(select(RoundRow))),
                "uploads": sorted((u.round_id, u.client_index, u.digest)
                                  for u in sess.scalars(select(UploadRow))),
            }
    finally:
        db.dispose()


def test_a_server_paused_longer_than_the_round_deadline_drops_no_site(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """Paused for more than twice the round deadline while its sites wait on it: when it
    runs again the open round's deadline runs again from then (`event=server_stalled`), no
    site is dropped, and the job ends with every site."""
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, deadline=6.0)
    server = None
    try:
        server = launch_server(fed)
        clients = [launch_client(fed, k) for k in range(3)]
        freeze_mid_job(fed, clients[0], 2)  # the job cannot end before the server's pause
        server.send_signal(signal.SIGSTOP)
        clients[0].send_signal(signal.SIGCONT)
        assert _job_state(fed.db_url)["job"][0] == "running"
        time.sleep(14)
        server.send_signal(signal.SIGCONT)
        codes = [c.wait(180) for c in clients]
    finally:
        if server is not None:
            server.send_signal(signal.SIGCONT)
        stop_all(fed)
    log = (tmp_path / "server.log").read_text()
    assert codes == [0, 0, 0], [(tmp_path / f"client-{k}.log").read_text()[-1500:]
                                for k in range(3)]
    assert "event=server_stalled stalled_s=1" in log, log[-3000:]
    assert "event=drop" not in log
    assert _job_state(fed.db_url)["job"][0] == "done"


def test_a_paused_server_whose_database_was_taken_over_writes_nothing_and_fails(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """Server A is paused past its lease (15 s) and past the round deadline; server B starts
    on the same database, takes it over and resumes the round. When A runs again it changes
    nothing in the database (no drop, no abort, no audit entry), logs `event=lease_lost`
    naming B, and exits with status 2 and the same words."""
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, deadline=12.0)
    a = None
    try:
        a = launch_server(fed)
        # the sites are A's: they retry A while it is paused, and gone
        clients = [launch_client(fed, k) for k in range(3)]
        freeze_mid_job(fed, clients[0], 2)  # the job cannot end before A's pause
        _pause_holding_no_lock(a, tmp_path / "server.db", tmp_path / "audit.db")
        clients[0].send_signal(signal.SIGCONT)
        assert _job_state(fed.db_url)["job"][0] == "running"
        time.sleep(LEASE_S + 1)
        port_b = free_port()
        toml_b = tmp_path / "server-b.toml"
        toml_b.write_text(fed.server_toml.read_text().replace(f"port = {fed.server.port}\n",
                                                              f"port = {port_b}\n"))
        b_server = Provisioned(fed.certs, port_b, toml_b, fed.server.tokens)
        b = b_server.launch(tmp_path / "server-b.log", fed.procs)
        _wait_for(tmp_path / "server-b.log", "event=resume job=job-a round=")
        before = _job_state(fed.db_url)
        a.send_signal(signal.SIGCONT)
        code = a.wait(60)
        after = _job_state(fed.db_url)
        assert b.poll() is None  # B serves on
    finally:
        if a is not None:
            a.send_signal(signal.SIGCONT)
        stop_all(fed)
    log = (tmp_path / "server.log").read_text()
    said = (f"another server (pid {b.pid} on {socket.gethostname()}, port {port_b}) took this "
            "database over and serves its jobs now: this server's claim was not renewed for "
            "15 s (the process was paused or stalled that long) or its process was taken for "
            "dead. This server stopped serving the database, and saved none of its steps "
            "after that")
    assert code == 2, log[-3000:]
    assert f'event=lease_lost reason="{said}"' in log, log[-3000:]
    assert f"error: {said}" in " ".join(log.split())
    assert "event=drop" not in log and "event=job_failed" not in log
    assert after == before
    assert after["job"][0] == "running" and {s for _, s in after["members"]} == {"active"}
    with AuditLog(fed.audit_url, create=False) as audit:
        kinds = {e.kind for e in audit.entries(job_id="job-a")}
    assert not kinds & {"client_dropped", "round_aborted", "job_failed"}, kinds
