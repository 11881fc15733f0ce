"""One server per database: a second server on the same database refuses to start."""

from __future__ import annotations

import logging
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from db_outage import database_down
from ports import free_port
from test_integration_https import launch_server, setup_fed, stop

from fedforest_cli.sim_processes import start_server, wait_healthy
from server_app.db import Database
from server_app.lease import LEASE_S, ServerLease
from server_app.settings import ConfigError


def test_the_lease_is_held_until_released_or_stale(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    first, second = ServerLease(db, 1), ServerLease(db, 2)
    first.acquire()
    with pytest.raises(ConfigError, match=r"another server \(pid \d+ on .*, port 1\) serves "
                                          r"this database"):
        second.acquire()
    assert first.renew() and not second.renew()
    first.release()
    second.acquire()  # given back: taken at once
    assert second.renew() and not first.renew()
    # a claim not renewed for LEASE_S seconds is free, even if its process still runs
    late = ServerLease(db, 3, clock=lambda: time.time() + LEASE_S + 1)
    late.acquire()
    assert not second.renew()
    db.dispose()


def test_a_lease_that_cannot_be_given_back_is_one_warning_not_a_failed_stop(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A server stopped while its database is down cannot delete its claim: the stop goes on
    (SIGTERM still exits 143) with one warning saying when the next server may start."""
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    lease = ServerLease(db, 1)
    lease.acquire()
    lease.keep(lambda: None)
    with database_down(db):
        lease.release()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == [
        'event=lease_not_returned reason="the database cannot be reached (OperationalError): '
        'the next server on this host takes it at once, one on another host after 15 s"']
    assert not [r for r in caplog.records if r.exc_info]
    with pytest.raises(ConfigError, match="another server"):  # the claim is still there...
        ServerLease(db, 2).acquire()  # ...and its process runs
    db.dispose()


def test_the_lease_of_a_process_gone_on_this_host_is_free_at_once(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    held = ServerLease(db, 1)
    held.acquire()
    from sqlalchemy import update

    from server_app.db import LeaseRow

    with db.connect() as conn:  # as a killed server leaves it: its pid no longer runs
        conn.execute(update(LeaseRow).values(pid=int(gone.stdout)))
    ServerLease(db, 2).acquire()
    db.dispose()


def test_two_servers_taking_a_stale_lease_at_the_same_moment_one_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale lease (its holder killed) and two servers starting together: between the
    moment one reads the stale row and the moment it writes its claim, the other takes it;
    the first refuses to start, rather than both serving until one of them finds its lease
    lost."""
    import server_app.lease as lease_mod

    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    dead = ServerLease(db, 1, clock=lambda: time.time() - 2 * LEASE_S)
    dead.acquire()  # renewed long ago: free for the taking
    first, second = ServerLease(db, 2), ServerLease(db, 3)

    def meanwhile(host: str, pid: int) -> bool:
        monkeypatch.setattr(lease_mod, "_running_here", lambda host, pid: False)
        second.acquire()  # the other server takes the stale lease in between
        return False

    monkeypatch.setattr(lease_mod, "_running_here", meanwhile)
    # (the stale row is older than LEASE_S: the check of its holder is skipped; make it run)
    monkeypatch.setattr(lease_mod, "LEASE_S", 10 * LEASE_S)
    with pytest.raises(ConfigError, match="at the same moment"):
        first.acquire()
    assert second.renew() and not first.renew()
    db.dispose()


@pytest.mark.integration
def test_a_second_server_on_the_same_database_refuses_to_start(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3)
    first = launch_server(fed)
    other = tmp_path / "other"
    other.mkdir()
    port = free_port()
    toml = other / "server.toml"
    toml.write_text(re.sub(r"(?m)^port = \d+$", f"port = {port}", fed.server.toml.read_text()))
    second = start_server(toml, other / "server.log")
    fed.procs.append(second)
    try:
        assert second.wait(120) != 0
        log = (other / "server.log").read_text()
        assert f"another server (pid {first.pid} on" in log and "Traceback" not in log
        first.send_signal(signal.SIGKILL)  # killed: its claim dies with it on this host
        first.wait(30)
        third = start_server(toml, other / "server.log")
        fed.procs.append(third)
        wait_healthy(f"https://127.0.0.1:{port}", fed.certs / "ca.pem", third, timeout=180,
                     cert=fed.certs / "client-0.pem", key=fed.certs / "client-0.key")
    finally:
        for proc in fed.procs:
            stop(proc)


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_server_stopped_with_sigterm_or_sighup_gives_its_lease_back(
        tmp_path: Path, tiny_parts, job_dir, sig: signal.Signals) -> None:
    """systemd and container runtimes stop a server with SIGTERM, a closed terminal with
    SIGHUP: after its graceful shutdown (exit status 128 + the signal's number) the lease row
    is gone, so a replacement (on another host too) starts at once."""
    from sqlalchemy import func, select

    from server_app.db import LeaseRow

    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3)
    server = launch_server(fed)
    try:
        server.send_signal(sig)
        code = server.wait(60)
    finally:
        stop(server)
    assert code == 128 + sig, code
    assert "event=shutdown" in (tmp_path / "server.log").read_text()
    db = Database(fed.db_url)
    with db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(LeaseRow)).scalar() == 0
    db.dispose()


def test_a_start_that_cannot_listen_leaves_a_stalled_servers_claim_alone(
        tmp_path: Path) -> None:
    """A server stalled past LEASE_S (paused, say) still holds its claim row; a second start on
    a port that is taken fails on the port before it touches the claim, so the first server,
    when it resumes, renews its claim and goes on (had the second taken the claim and given
    it back, the first would have stopped on a lost lease and no server would serve)."""
    from server_app.serve import run_server
    from server_app.settings import ServerSettings

    url = f"sqlite:///{tmp_path / 's.db'}"
    db = Database(url)
    stalled = ServerLease(db, 1, clock=lambda: time.time() - 2 * LEASE_S)
    stalled.acquire()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        with pytest.raises(ConfigError, match="Address already in use"):
            run_server(ServerSettings(host="127.0.0.1", database=url), insecure_dev=True,
                       port=taken.getsockname()[1])
    assert stalled.renew()
