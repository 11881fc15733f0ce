"""A server (or a `fedforest server create-job`) killed with SIGKILL at an audit append, then
started again: the audit log and the server database agree, and the job's log verifies with
every site's receipts (``--replay`` included); entries that wait for the log are appended at
the next start, once, and only to the log that holds the job's chain.

The kill lands at an exact instant: the process runs through a wrapper (written to the test's
tmp_path) that SIGKILLs it just before or just after the n-th append of an entry of one kind
to the audit log. An append follows the commit of the step that made the entry
(:mod:`server_app.audit_outbox`): "before" stops the process between the commit and the
append, "after" between the append and the deletion of the entry's waiting row."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from test_integration_https import (
    Fed,
    freeze_mid_job,
    launch_client,
    reference,
    setup_fed,
    stop_all,
    trees,
)

from fedforest_cli.sim_processes import child_env, wait_healthy
from fedforest_cli.simulate import collect_receipts
from fedforest_secure.audit import AuditLog, verify_log
from fedforest_secure.model import ForestModel
from server_app.admin import ServerAdmin
from server_app.settings import load_settings

_WRAPPER = '''
import os, signal, sys
from fedforest_secure.audit.log import AuditLog

WHEN, KIND, NTH = {when!r}, {kind!r}, {nth!r}
real = AuditLog.append
seen = 0


def append(self, job_id, kind, *args, **kw):
    global seen
    ours = str(kind) == KIND
    if ours:
        seen += 1
    if ours and seen == NTH and WHEN == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    head = real(self, job_id, kind, *args, **kw)
    if ours and seen == NTH and WHEN == "after":
        os.kill(os.getpid(), signal.SIGKILL)
    return head


AuditLog.append = append
from fedforest_cli.cli import app
app(prog_name="fedforest")
'''


def _fedforest(tmp: Path, kill: tuple[str, str, int] | None, args: list[str], log: Path
               ) -> subprocess.Popen[bytes]:
    """``fedforest ARGS``, SIGKILLed by itself at the audit append ``kill`` = (when, kind,
    n) if given."""
    cmd = [sys.executable, "-m", "fedforest_cli"]
    if kill is not None:
        when, kind, nth = kill
        wrapper = tmp / f"kill-{when}-{kind}-{nth}.py"
        wrapper.write_text(_WRAPPER.format(when=when, kind=kind, nth=nth))
        cmd = [sys.executable, str(wrapper)]
    with log.open("ab") as fh:
        return subprocess.Popen(cmd + args, stdout=fh, stderr=subprocess.STDOUT,
                                env=child_env())


def _serve(fed: Fed, kill: tuple[str, str, int] | None = None) -> subprocess.Popen[bytes]:
    proc = _fedforest(fed.root, kill, ["server", "--config", str(fed.server_toml)],
                      fed.root / "server.log")
    fed.procs.append(proc)
    wait_healthy(fed.url, fed.certs / "ca.pem", proc, timeout=180,
                 cert=fed.certs / "client-0.pem", key=fed.certs / "client-0.key")
    return proc


def _killed(proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    """Wait until the wrapper killed ``proc``."""
    assert proc.wait(timeout) == -signal.SIGKILL


def _chain(fed: Fed, job: str = "job-a") -> list[tuple[str, int | None]]:
    with AuditLog(fed.audit_url, create=False) as log:
        return [(e.kind, e.round_id) for e in log.entries(job_id=job)]


def _db(fed: Fed, sql: str) -> list[tuple[object, ...]]:
    engine = create_engine(fed.db_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql))]
    finally:
        engine.dispose()


def _small(job_dir):  # type: ignore[no-untyped-def]
    return lambda root, parts, feat, **kw: job_dir(root, parts, feat, trees=2, depth=2, **kw)


@pytest.mark.integration
def test_a_server_killed_at_a_join_a_round_close_and_the_model_leaves_a_log_that_verifies(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """Three kills in one job: just after a site's client_joined entry is appended, just
    before a round's entry is appended (its close committed), just after the model entry is
    appended. Each restart appends what the log lacks and nothing twice: one join per site,
    one entry per round, one model; the model is the uninterrupted run's, and the log
    verifies with every site's receipts and replays."""
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, _small(job_dir), n_clients=3)
    try:
        server = _serve(fed, ("after", "client_joined", 2))
        clients = [launch_client(fed, k) for k in range(3)]
        _killed(server)
        server = _serve(fed, ("before", "round", 2))
        _killed(server)
        server = _serve(fed, ("after", "model", 1))
        _killed(server)
        _serve(fed)
        codes = [c.wait(300) for c in clients]
    finally:
        stop_all(fed)
    assert codes == [0, 0, 0], [(fed.root / f"client-{k}.log").read_text() for k in range(3)]
    got = ForestModel.from_json((fed.root / "client-0.model.json").read_text())
    assert trees(got) == trees(reference(fed))
    chain = _chain(fed)
    assert [k for k, _ in chain].count("client_joined") == 3
    rounds = [r for k, r in chain if k == "round"]
    assert len(rounds) == len(set(rounds)) >= 3, chain
    assert [k for k, _ in chain][-1] == "model" and [k for k, _ in chain].count("model") == 1
    report = verify_log(fed.audit_url, receipts_dir=collect_receipts(fed.root, fed.root / "state"),
                        job_id="job-a", replay=True)
    assert report.ok and not report.running, report.problems
    assert _db(fed, "SELECT count(*) FROM audit_outbox") == [(0,)]


@pytest.mark.integration
@pytest.mark.parametrize("ends", ["drop", "abort"])
def test_a_server_killed_just_after_a_deadline_drop_is_logged_keeps_the_drop(
        tmp_path: Path, tiny_parts, job_dir, ends: str) -> None:
    """A frozen site misses round 2's deadline and the server is killed just after its
    client_dropped entry (``drop``: 4 sites, 3 needed, the job goes on) or the round's
    round_aborted entry (``abort``: 3 sites, 3 needed) is appended. The restarted server
    holds what the log says: the site stays dropped when it wakes (the job ends without it),
    or the job stays failed; the log verifies with every site's receipts."""
    parts, feat = tiny_parts
    n = 4 if ends == "drop" else 3
    fed = setup_fed(tmp_path, parts, feat, _small(job_dir), n_clients=n, min_clients=3,
                    deadline=8.0)
    frozen = n - 1
    try:
        server = _serve(fed, ("after", "client_dropped" if ends == "drop" else "round_aborted",
                              1))
        clients = [launch_client(fed, k) for k in range(n)]
        freeze_mid_job(fed, clients[frozen], 2)
        _killed(server)
        _serve(fed)
        time.sleep(1.0)
        clients[frozen].send_signal(signal.SIGCONT)
        codes = [c.wait(300) for c in clients]
    finally:
        stop_all(fed)
    state = _db(fed, "SELECT m.state FROM members m JOIN clients c ON c.id = m.client_id "
                     f"WHERE m.job_id = 'job-a' AND c.name = 'client-{frozen}'")
    status = _db(fed, "SELECT status FROM jobs WHERE id = 'job-a'")
    chain = _chain(fed)
    assert state == [("dropped",)], chain
    assert status == [("done" if ends == "drop" else "failed",)], chain
    if ends == "drop":
        assert codes[:3] == [0, 0, 0]
        assert [k for k, _ in chain].count("client_dropped") == 1
    report = verify_log(fed.audit_url, receipts_dir=collect_receipts(fed.root, fed.root / "state"),
                        job_id="job-a", replay=True)
    assert report.ok and not report.running, report.problems


@pytest.mark.integration
def test_a_create_job_killed_at_its_job_created_entry_leaves_a_job_the_server_serves(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """`fedforest server create-job` killed after its commit and before its job_created entry
    is appended (job-b, job-d), or just after it is appended (job-c): `cancel-job` with no
    server running cancels job-d, the server starts, each job's chain holds its job_created
    entry once, and the server cancels job-b and job-c."""
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, _small(job_dir), n_clients=3)
    for job, when in (("job-b", "before"), ("job-c", "after"), ("job-d", "before")):
        toml = tmp_path / f"{job}.toml"
        toml.write_text(fed.job_toml.read_text().replace('id = "job-a"', f'id = "{job}"'))
        proc = _fedforest(tmp_path, (when, "job_created", 1),
                          ["server", "create-job", "--config", str(fed.server_toml),
                           "--job", str(toml)], tmp_path / f"create-{job}.log")
        _killed(proc, 120)
    with ServerAdmin.from_settings(load_settings(fed.server_toml)) as admin:
        assert admin.cancel_job("job-d").reason == "cancelled by the operator"
    assert _chain(fed, "job-d") == [("job_created", None), ("job_failed", None)]
    try:
        _serve(fed)
        for job in ("job-b", "job-c"):
            assert _chain(fed, job) == [("job_created", None)]
            with ServerAdmin.from_settings(load_settings(fed.server_toml)) as admin:
                assert admin.cancel_job(job).reason == "cancelled by the operator"
    finally:
        stop_all(fed)
    for job in ("job-b", "job-c"):
        assert _chain(fed, job) == [("job_created", None), ("job_failed", None)]
    assert verify_log(fed.audit_url).ok


def _waiting_join(tmp_path: Path, tiny_parts, job_dir, monkeypatch) -> tuple[str, str]:
    """job-a created on audit.db, then client-0's join saved while the audit log fails: its
    client_joined entry (seq 2) waits in the server database. Returns the two URLs."""
    from server_app.audit_hook import open_audit
    from server_app.audit_outbox import AuditPending
    from server_app.auth import add_client, authenticate
    from server_app.db import Database
    from server_app.jobspec import load_job_spec
    from server_app.runtime import ServerState

    parts, feat = tiny_parts
    db_url, audit_url = f"sqlite:///{tmp_path / 's.db'}", f"sqlite:///{tmp_path / 'audit.db'}"
    db = Database(db_url)
    token = [add_client(db, f"client-{k}") for k in range(3)][0]
    audit = open_audit(audit_url)
    state = ServerState(db, audit)
    state.create_job(load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=3)))
    client = authenticate(db, token)
    assert client is not None
    def failing(*args: object, **kw: object) -> str:
        raise ConnectionError("the audit database stopped answering")

    with monkeypatch.context() as patch:
        patch.setattr(AuditLog, "append", failing)
        with pytest.raises(AuditPending):
            state.join(client, "job-a")
    audit.close()  # type: ignore[attr-defined]
    db.dispose()
    return db_url, audit_url


def test_a_server_start_appends_the_entries_that_wait_once(tmp_path: Path, tiny_parts,
                                                           job_dir, monkeypatch) -> None:
    from server_app.audit_hook import open_audit
    from server_app.db import Database
    from server_app.serve import check_audit_chains, flush_waiting_entries

    db_url, audit_url = _waiting_join(tmp_path, tiny_parts, job_dir, monkeypatch)
    db = Database(db_url)
    try:
        for _ in range(2):  # a second start finds nothing waiting
            audit = open_audit(audit_url)
            check_audit_chains(db, audit, audit_url)
            flush_waiting_entries(db, audit, audit_url)
            assert audit.tip("job-a")[0] == 2
            audit.close()  # type: ignore[attr-defined]
        with AuditLog(audit_url, create=False) as log:
            assert [(e.kind, e.payload.get("client")) for e in log.entries(job_id="job-a")] \
                == [("job_created", None), ("client_joined", "client-0")]
    finally:
        db.dispose()


def test_a_start_whose_waiting_entries_another_process_appends_meanwhile_serves(
        tmp_path: Path, tiny_parts, job_dir, monkeypatch) -> None:
    """A server starting reads the entries that wait; another process (a `fedforest evaluate`
    or `server create-job` flushing the same job) appends them to the log and deletes their
    rows right after that read: the start finds them in the log and goes on, each entry in
    the chain once (it read each row whole in its one query, not its arrays afterwards)."""
    from sqlalchemy import event

    from server_app.audit_hook import open_audit
    from server_app.db import Database
    from server_app.serve import flush_waiting_entries

    db_url, audit_url = _waiting_join(tmp_path, tiny_parts, job_dir, monkeypatch)
    db, other_db = Database(db_url), Database(db_url)
    audit, other = open_audit(audit_url), open_audit(audit_url)
    flushed: list[str] = []

    def other_flushes(conn: object, cursor: object, statement: str, *args: object) -> None:
        if not flushed and "ORDER BY audit_outbox.seq" in statement:  # the rows just read
            flushed.append(statement)
            other.flush_all(other_db.engine)

    event.listen(db.engine, "after_cursor_execute", other_flushes)
    try:
        flush_waiting_entries(db, audit, audit_url)
        assert flushed and audit.tip("job-a")[0] == 2
        with AuditLog(audit_url, create=False) as log:
            assert [(e.kind, e.payload.get("client")) for e in log.entries(job_id="job-a")] \
                == [("job_created", None), ("client_joined", "client-0")]
    finally:
        event.remove(db.engine, "after_cursor_execute", other_flushes)
        for sink in (audit, other):
            sink.close()  # type: ignore[attr-defined]
        db.dispose()
        other_db.dispose()


def test_a_server_start_refuses_entries_that_another_entry_holds_the_place_of(
        tmp_path: Path, tiny_parts, job_dir, monkeypatch) -> None:
    """The log holds another entry where the waiting one belongs (another process wrote the
    job's chain, or the server database is an older copy): the server does not start, and
    says why; nothing is appended."""
    from server_app.audit_hook import open_audit
    from server_app.db import Database
    from server_app.serve import check_audit_chains, flush_waiting_entries
    from server_app.settings import ConfigError

    db_url, audit_url = _waiting_join(tmp_path, tiny_parts, job_dir, monkeypatch)
    with AuditLog(audit_url) as log:
        log.job("job-a").client_joined("client-1")
    db, audit = Database(db_url), open_audit(audit_url)
    try:
        check_audit_chains(db, audit, audit_url)
        with pytest.raises(ConfigError) as err:
            flush_waiting_entries(db, audit, audit_url)
        assert str(err.value) == (
            f"the audit log at {audit_url} cannot take the entries the server database holds "
            "for it: job 'job-a': the audit log's entry seq 2 is not the client_joined entry "
            "the server database holds for that place: another process wrote this job's "
            "chain, or the server database was restored from an older copy; the entry was not "
            "appended. Start the server with the audit_database its jobs began with")
    finally:
        audit.close()  # type: ignore[attr-defined]
        db.dispose()
    with AuditLog(audit_url, create=False) as log:
        assert [(e.kind, e.payload.get("client")) for e in log.entries(job_id="job-a")] \
            == [("job_created", None), ("client_joined", "client-1")]


def test_a_server_refused_by_the_lease_appends_nothing_that_waits(
        tmp_path: Path, tiny_parts, job_dir, monkeypatch) -> None:
    """A second server started by mistake on the database (here with the same audit log) is
    refused by the running server's lease before it touches the entries that wait: they are
    the running server's to append."""
    from server_app.db import Database
    from server_app.lease import ServerLease
    from server_app.serve import run_server
    from server_app.settings import ConfigError, ServerSettings

    db_url, audit_url = _waiting_join(tmp_path, tiny_parts, job_dir, monkeypatch)
    db = Database(db_url)
    running = ServerLease(db, 1)
    running.acquire()  # this live process holds the database
    try:
        with pytest.raises(ConfigError, match="another server"):
            run_server(ServerSettings(host="127.0.0.1", database=db_url,
                                      audit_database=audit_url), insecure_dev=True, port=0)
        with AuditLog(audit_url, create=False) as log:
            assert [e.kind for e in log.entries(job_id="job-a")] == ["job_created"]
    finally:
        running.release()
        db.dispose()


def test_a_start_whose_audit_log_fails_says_to_check_it_not_to_change_the_config(
        tmp_path: Path, tiny_parts, job_dir, monkeypatch) -> None:
    """An audit database that fails while the waiting entries are appended (down, locked) is
    named as such: the entries keep waiting; the configuration is not wrong."""
    from server_app.audit_hook import open_audit
    from server_app.db import Database
    from server_app.serve import flush_waiting_entries
    from server_app.settings import ConfigError

    db_url, audit_url = _waiting_join(tmp_path, tiny_parts, job_dir, monkeypatch)
    db, audit = Database(db_url), open_audit(audit_url)

    def failing(*args: object, **kw: object) -> str:
        raise ConnectionError("the audit database stopped answering")

    try:
        with monkeypatch.context() as patch:
            patch.setattr(AuditLog, "append", failing)
            with pytest.raises(ConfigError) as err:
                flush_waiting_entries(db, audit, audit_url)
        assert str(err.value).endswith("Check that the audit database answers, then start "
                                       "the server again")
        assert "began with" not in str(err.value)
        flush_waiting_entries(db, audit, audit_url)  # it answers again: appended
        assert audit.tip("job-a")[0] == 2
    finally:
        audit.close()  # type: ignore[attr-defined]
        db.dispose()
