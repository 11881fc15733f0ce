"""One server per database: a second server on the same database refuses to start."""

from __future__ import annotations

import logging
import os
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
from sqlalchemy import update
from test_integration_https import launch_server, setup_fed, stop

from fedforest_cli.sim_processes import child_env, start_server, wait_healthy
from server_app.db import Database, LeaseRow
from server_app.lease import LEASE_S, ServerLease, holder
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
    with db.connect() as conn:  # as a killed server leaves it: its pid no longer runs
        conn.execute(update(LeaseRow).values(pid=int(gone.stdout)))
    ServerLease(db, 2).acquire()
    db.dispose()


_OTHER_HOST = """
import os, socket, sys, time
_real = time.time
time.time = lambda: _real() + float(sys.argv[2])  # this host's clock, skewed
socket.gethostname = lambda: "host-b"
from server_app.db import Database
from server_app.lease import ServerLease, holder
db = Database(sys.argv[1])
print("holder:", None if holder(db) is None else holder(db).port, flush=True)
try:
    ServerLease(db, 8).acquire()
    print("took the claim", flush=True)
except Exception as exc:
    print(f"refused: {exc}", flush=True)
"""


def _on_other_host(url: str, skew: float) -> list[str]:
    """What a process on host ``host-b``, whose clock is ``skew`` s off this one's, sees of
    ``url``'s lease (:func:`holder`, as ``cancel-job`` asks it) and whether it takes it."""
    out = subprocess.run([sys.executable, "-c", _OTHER_HOST, url, str(skew)],
                         capture_output=True, text=True, env=child_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.parametrize("skew", [20.0, 3600.0])
def test_a_host_whose_clock_is_ahead_does_not_take_a_live_claim(db_url: str,
                                                                skew: float) -> None:
    """The claim's age is read on the database's clock, not on the reader's: a host whose
    clock is 20 s (or an hour) ahead sees the claim renewed just now as held, and a second
    server there refuses to start."""
    db = Database(db_url)
    live = ServerLease(db, 1)
    live.acquire()
    seen, verdict = _on_other_host(db_url, skew)
    assert seen == "holder: 1"
    assert re.fullmatch(
        rf"refused: another server \(pid {os.getpid()} on {re.escape(socket.gethostname())}, "
        r"port 1\) serves this database \(it renewed its claim [0-9]+ s ago\): stop it first, "
        r"or give this server a database of its own", verdict), verdict
    assert live.renew()
    db.dispose()


@pytest.mark.parametrize("skew", [-20.0, -3600.0])
def test_a_host_whose_clock_is_behind_takes_a_stale_claim(db_url: str, skew: float) -> None:
    """A claim last renewed LEASE_S + 1 s ago on the database's clock (this machine's: the
    database runs here) is free for a host whose own clock is behind (it would have waited
    for the difference, or an hour)."""
    db = Database(db_url)
    stale = ServerLease(db, 1)
    stale.acquire()
    _rewrite(db, renewed_at=time.time() - LEASE_S - 1, host="host-a")
    assert _on_other_host(db_url, skew) == ["holder: None", "took the claim"]
    assert not stale.renew()
    db.dispose()


linux_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="process start times are read from /proc (Linux)")

_HOLD = """
import sys
from server_app.db import Database
from server_app.lease import ServerLease
ServerLease(Database(sys.argv[1]), 7).acquire()
print("held", flush=True)
sys.stdin.read()
"""


def _other_server(url: str) -> subprocess.Popen[str]:
    """Another process that takes ``url``'s lease as a server does, and holds it until it is
    killed."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, url], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=child_env())
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _killed(proc: subprocess.Popen[str]) -> None:
    """kill -9: the process's lease row stays as it left it."""
    proc.kill()
    proc.communicate(timeout=30)


def _rewrite(db: Database, **values: object) -> None:
    with db.connect() as conn:
        conn.execute(update(LeaseRow).values(**values))


def _refused(db: Database, pid: int) -> pytest.RaisesExc[ConfigError]:
    return pytest.raises(ConfigError, match=(
        rf"^another server \(pid {pid} on {re.escape(socket.gethostname())}, port 7\) serves "
        r"this database \(it renewed its claim \d+ s ago\): stop it first, or give this "
        r"server a database of its own$"))


@linux_proc
def test_a_server_restarted_as_the_pid_of_its_killed_predecessor_takes_its_lease_at_once(
        tmp_path: Path) -> None:
    """A container's server is PID 1, and is again after ``docker restart`` (same host name):
    the killed server's lease names this very pid, with another start time, and is free."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    db = Database(url)
    other = _other_server(url)
    with _refused(db, other.pid):  # while it runs, the other server holds the lease
        ServerLease(db, 2).acquire()
    _killed(other)
    _rewrite(db, pid=os.getpid())  # as the restarted PID 1 finds it: its own pid
    assert holder(db) is None
    lease = ServerLease(db, 2)
    lease.acquire()
    assert lease.renew()
    db.dispose()


@linux_proc
def test_a_process_that_has_a_killed_servers_pid_now_is_not_taken_for_that_server(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    db = Database(url)
    other = _other_server(url)
    _killed(other)
    stranger = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                stdin=subprocess.PIPE, text=True)
    try:
        _rewrite(db, pid=stranger.pid)  # the dead server's pid, reused by a process that runs
        assert holder(db) is None
        ServerLease(db, 2).acquire()
    finally:
        _killed(stranger)
    db.dispose()


@linux_proc
def test_a_lease_from_another_boot_of_this_host_name_waits_for_its_renewals_to_stop(
        tmp_path: Path) -> None:
    """Another machine with this host name (or this one before a reboot) holds the lease:
    its pid says nothing here, so the lease is held until it is not renewed for LEASE_S."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    db = Database(url)
    other = _other_server(url)
    _killed(other)  # its pid runs nowhere on this machine
    _rewrite(db, started="another-boot:12345")
    with _refused(db, other.pid):
        ServerLease(db, 2).acquire()
    late = ServerLease(db, 2, clock=lambda: time.time() + LEASE_S + 1)
    late.acquire()
    assert late.renew()
    db.dispose()


@linux_proc
def test_a_lease_without_a_start_time_is_free_when_it_names_this_process(
        tmp_path: Path) -> None:
    """A server of a version that recorded no start time was killed, and this server runs as
    its pid: this process records its start time, so it is not that server; a row without a
    start time naming another live process is held."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    db = Database(url)
    _killed(_other_server(url))
    stranger = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                stdin=subprocess.PIPE, text=True)
    try:
        _rewrite(db, pid=stranger.pid, started=None, port=7)
        with _refused(db, stranger.pid):
            ServerLease(db, 2).acquire()
    finally:
        _killed(stranger)
    _rewrite(db, pid=os.getpid())
    assert holder(db) is None
    ServerLease(db, 2).acquire()
    db.dispose()


def test_a_database_whose_lease_table_has_no_start_time_column_gains_it(db_url: str) -> None:
    """A server database made before the lease recorded start times: opening it adds the
    column, the row there reads as having none, and its dead holder's lease is taken at once."""
    from sqlalchemy import create_engine, text

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    engine = create_engine(db_url)
    with engine.begin() as conn:  # the table as those versions made it
        conn.execute(text("CREATE TABLE server_lease (id INTEGER NOT NULL, owner VARCHAR(32) "
                          "NOT NULL, host VARCHAR(255) NOT NULL, pid INTEGER NOT NULL, port "
                          "INTEGER NOT NULL, renewed_at FLOAT NOT NULL, PRIMARY KEY (id))"))
        conn.execute(text("INSERT INTO server_lease VALUES (1, :owner, :host, :pid, 7, :at)"),
                     {"owner": "f" * 32, "host": socket.gethostname(),
                      "pid": int(gone.stdout), "at": time.time()})
    engine.dispose()
    db = Database(db_url)
    with db.session() as sess:
        row = sess.get(LeaseRow, 1)
        assert row is not None and row.owner == "f" * 32 and row.started is None
    assert holder(db) is None
    lease = ServerLease(db, 2)
    lease.acquire()
    with db.session() as sess:
        row = sess.get(LeaseRow, 1)
        assert row is not None and row.owner == lease.owner
        assert (row.started is not None) == Path("/proc/self/stat").exists()
    db.dispose()
    Database(db_url).dispose()  # opened again: the column is there


def test_two_processes_adding_the_start_time_column_at_once_both_open_the_database(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process added the column between this one's look at the table and its ALTER
    (SQLite: "duplicate column name"; PostgreSQL: "already exists"): the column it added is
    taken as it is."""
    import server_app.db as db_mod

    Database(db_url).dispose()  # the column is there already...

    class Blind:  # ...but this process looked before the other added it
        def __init__(self, _conn: object) -> None:
            pass

        def get_columns(self, _table: str) -> list[dict[str, object]]:
            return []

    monkeypatch.setattr(db_mod, "inspect", Blind)
    Database(db_url).dispose()


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

    def meanwhile(host: str, pid: int, started: str | None) -> bool:
        monkeypatch.setattr(lease_mod, "_running_here", lambda host, pid, started: False)
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


def _taken_over(url: str) -> ServerLease:
    """Another server takes ``url``'s lease as it takes a stale one (its holder stalled past
    LEASE_S), in a process of its own (a Database of its own)."""
    other = ServerLease(Database(url), 9, clock=lambda: time.time() + LEASE_S + 1)
    other.acquire()
    return other


def _taken_message() -> str:
    return (f"another server (pid {os.getpid()} on {socket.gethostname()}, port 9) took this "
            "database over and serves its jobs now: this server's claim was not renewed for "
            "15 s (the process was paused or stalled that long) or its process was taken for "
            "dead. This server stopped serving the database, and saved none of its steps "
            "after that")


def test_a_server_whose_lease_was_taken_writes_nothing_more(db_url: str) -> None:
    """The serving process's writes are fenced on its lease: once another server took it, a
    transaction that wrote (ORM session or Core) is rolled back with LeaseLost, reads go on,
    and the lease's own renewal and release still run (they name their holder)."""
    from sqlalchemy import func, insert, select

    from server_app.auth import add_client
    from server_app.db import ClientRow
    from server_app.lease import LeaseLost

    db = Database(db_url)
    lease = ServerLease(db, 1)
    lease.acquire()
    told: list[LeaseLost] = []
    lease.keep(told.append)
    add_client(db, "before")  # held: written
    other = _taken_over(db_url)
    said = re.escape(_taken_message())
    with pytest.raises(LeaseLost, match=f"^{said}$"):
        add_client(db, "after")
    assert told == [lease.lost] and str(lease.lost) == _taken_message()
    with pytest.raises(LeaseLost, match=f"^{said}$"), db.connect() as conn:
        conn.execute(insert(ClientRow).values(name="core", token_id="t", token_hash="h"))
    with db.session() as sess:  # reads are not fenced
        assert sess.scalars(select(ClientRow.name)).all() == ["before"]
    assert not lease.renew()
    lease.release()  # the other server's claim stays
    assert other.renew()
    # a process that serves nothing (an admin command) writes as before
    admin = Database(db_url)
    add_client(admin, "admin")
    with admin.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ClientRow)).scalar() == 2
    for d in (db, admin, other.db):
        d.dispose()


def test_a_lease_given_back_by_another_process_fences_the_stalled_server_too(
        tmp_path: Path) -> None:
    """`fedforest server cancel-job` run while the server was stalled takes its stale lease,
    cancels and gives it back: the row is gone, and the stalled server writes nothing more."""
    from server_app.auth import add_client
    from server_app.lease import LeaseLost

    url = f"sqlite:///{tmp_path / 's.db'}"
    db = Database(url)
    lease = ServerLease(db, 1)
    lease.acquire()
    lease.keep(lambda err: None)
    other = _taken_over(url)
    other.release()
    with pytest.raises(LeaseLost, match=r"^another process took this database over and gave "
                                        r"it back \(a `fedforest server cancel-job`, or a "
                                        r"server stopped since\): "):
        add_client(db, "after")
    lease.release()
    db.dispose()
    other.db.dispose()


def test_a_request_of_a_server_whose_lease_was_taken_is_answered_503_and_changes_nothing(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """The join that finds the lease taken is rolled back and answered 503 ``not_serving``
    (the sites retry); from then on every request is, /health included."""
    import warnings

    from server_app.app import create_app
    from server_app.audit_hook import NullAudit
    from server_app.auth import add_client
    from server_app.db import MemberRow
    from server_app.jobspec import load_job_spec
    from server_app.limits import NOT_SERVING
    from server_app.runtime import ServerState

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
        from fastapi.testclient import TestClient

    parts, feat = tiny_parts
    url = f"sqlite:///{tmp_path / 's.db'}"
    db = Database(url)
    token = add_client(db, "client-0")
    for k in (1, 2):
        add_client(db, f"client-{k}")
    state = ServerState(db, NullAudit())
    state.create_job(load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=3)))
    lease = ServerLease(db, 1)
    lease.acquire()
    lease.keep(lambda err: None)
    refused = {"error": "not_serving", "detail": NOT_SERVING}
    with TestClient(create_app(db, state=state, tick_seconds=60, lease=lease)) as http:
        assert http.get("/health").status_code == 200
        other = _taken_over(url)
        r = http.post("/v1/jobs/job-a/join", headers={"Authorization": f"Bearer {token}"})
        assert (r.status_code, r.json()) == (503, refused)
        assert lease.lost is not None
        r = http.get("/health")
        assert (r.status_code, r.json()) == (503, refused)
    with db.session() as sess:
        assert {m.state for m in sess.query(MemberRow)} == {"invited"}
    lease.release()
    db.dispose()
    other.db.dispose()


def test_a_database_whose_clock_the_lease_cannot_read_is_refused_by_name() -> None:
    """The lease reads the database's clock in SQLite's and PostgreSQL's SQL: a server on
    another kind of database is refused at its start with one line naming it, not with an
    SQL error from its first claim."""
    from server_app.lease import check_clocked
    from server_app.settings import ConfigError

    check_clocked("sqlite")
    check_clocked("postgresql")
    with pytest.raises(ConfigError) as exc:
        check_clocked("mysql")
    assert str(exc.value) == (
        "server database: a mysql database is not supported (the server's claim on its "
        "database is timed by the database's clock, read in the SQL of SQLite and "
        "PostgreSQL): use SQLite or PostgreSQL")
