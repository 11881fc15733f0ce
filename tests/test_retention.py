"""fedforest server prune: finished jobs lose their rounds, keep their model; audit export can
be compressed."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete, func, select
from typer.testing import CliRunner

from fedforest_cli._db_locked import locks_named
from fedforest_cli.cli import app
from fedforest_secure.audit import AuditLog
from fedforest_secure.errors import FedForestError
from server_app.db import Database, JobRow, RoundRow, SecAggMessageRow, UploadRow
from server_app.retention import prune

DAY = 86400.0


def add_job(db: Database, spool: Path, job_id: str, status: str, closed_at: float) -> None:
    with db.session() as sess:
        sess.add(JobRow(id=job_id, spec_json="{}", config_json="{}", status=status, reason="",
                        min_clients=1, round_deadline_s=1.0, current_round=1,
                        model_json='{"m": 1}', model_digest="d" * 64, created_at=closed_at))
        sess.flush()
        for r in range(2):
            sess.add(RoundRow(job_id=job_id, round_id=r, kind="sketch", level=0,
                              task_digest="t" * 64, encoding="uint64", participants_json="[0]",
                              issued_at=closed_at - 1, deadline_at=closed_at + 1,
                              status="closed", closed_at=closed_at, task_blob=b"x" * 1000,
                              aggregate=b"y" * 500))
            sess.add(UploadRow(job_id=job_id, round_id=r, client_index=0, digest="u" * 64,
                               summable=b"z" * 100))
            sess.add(SecAggMessageRow(job_id=job_id, round_id=r, stage="shares",
                                      client_index=0, body="{}", digest="s" * 64))
        sess.add(SecAggMessageRow(job_id=job_id, round_id=-1, stage="identity", client_index=0,
                                  body="ab" * 32, digest="i" * 64))
    (spool / job_id / "1").mkdir(parents=True)
    (spool / job_id / "1" / "0.u64").write_bytes(b"\0" * 64)


def counts(db: Database, job_id: str) -> tuple[int, int, int, bool]:
    with db.session() as sess:
        def n(table: type) -> int:
            return int(sess.scalar(select(func.count()).select_from(table)
                                   .where(table.job_id == job_id)) or 0)  # type: ignore[attr-defined]
        job = sess.get(JobRow, job_id)
        return n(RoundRow), n(UploadRow), n(SecAggMessageRow), job is not None and \
            job.model_json is not None


def test_prune_deletes_old_finished_rounds_and_keeps_models_running_and_recent_jobs(
        tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    spool = tmp_path / "s.db.spool"
    now = time.time()
    add_job(db, spool, "old-done", "done", now - 40 * DAY)
    add_job(db, spool, "old-failed", "failed", now - 40 * DAY)
    add_job(db, spool, "recent", "done", now - 2 * DAY)
    add_job(db, spool, "running", "running", now - 40 * DAY)
    dry = prune(db, spool, older_than=now - 30 * DAY, dry_run=True)
    assert sorted(dry.jobs) == ["old-done", "old-failed"] and counts(db, "old-done")[0] == 2
    out = prune(db, spool, older_than=now - 30 * DAY)
    assert sorted(out.jobs) == ["old-done", "old-failed"]
    assert out.rounds == 4 and out.bytes == 2 * (2 * 1500 + 2 * 100)
    # the identity key, the model and the rounds' rows without their data stay
    assert counts(db, "old-done") == (2, 0, 1, True)
    with db.session() as sess:
        left = sess.scalar(select(func.sum(func.length(RoundRow.task_blob))
                                  + func.sum(func.coalesce(func.length(RoundRow.aggregate), 0)))
                           .where(RoundRow.job_id == "old-done"))
    assert left == 0
    assert prune(db, spool, older_than=now - 30 * DAY).jobs == []  # nothing left to prune
    assert not (spool / "old-done").exists()
    for kept in ("recent", "running"):
        assert counts(db, kept) == (2, 2, 3, True) and (spool / kept).exists()
    # a named finished job goes whatever its age; naming a running or unknown one deletes
    # nothing and says why
    with pytest.raises(FedForestError, match=r"job 'running' is running: only finished jobs "
                                             r"are pruned \(`fedforest server cancel-job --config "
                                             r"<server.toml> --job running` stops it\); "
                                             r"nothing was deleted"):
        prune(db, spool, job_ids=["recent", "running"])
    with pytest.raises(FedForestError, match="no job 'recnt'; nothing was deleted"):
        prune(db, spool, job_ids=["recent", "recnt"])
    assert counts(db, "recent") == (2, 2, 3, True) and counts(db, "running")[0] == 2
    assert prune(db, spool, job_ids=["recent"]).jobs == ["recent"]
    db.dispose()


def test_a_prune_whose_compaction_fails_says_so_and_the_next_prune_compacts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deletion commits before the file is compacted: a compaction that meets a lock
    (a busy server) leaves the deletion done and says the file was not compacted; the next
    prune, with nothing left to delete, compacts what the first left free."""
    from sqlalchemy.exc import OperationalError

    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    spool = tmp_path / "s.db.spool"
    now = time.time()
    for k in range(4):
        add_job(db, spool, f"old-{k}", "done", now - 40 * DAY)
        with db.session() as sess:  # rounds of some size: their pages come free
            for r in sess.scalars(select(RoundRow).where(RoundRow.job_id == f"old-{k}")):
                r.task_blob = b"x" * 200_000
    real = db.compact
    locked = OperationalError("VACUUM", {}, Exception("database is locked"))
    monkeypatch.setattr(db, "compact", lambda: (_ for _ in ()).throw(locked))
    out = prune(db, spool, older_than=now - 30 * DAY)
    assert len(out.jobs) == 4 and out.not_compacted == "database is locked"
    assert counts(db, "old-0") == (2, 0, 1, True)  # deleted all the same
    assert db.free_share() >= 0.25  # the deleted rounds' pages
    monkeypatch.setattr(db, "compact", real)
    again = prune(db, spool, older_than=now - 30 * DAY)
    assert again.jobs == [] and again.not_compacted is None
    assert db.free_share() == 0.0
    db.dispose()


def test_cli_prune_and_a_compressed_audit_export(tmp_path: Path) -> None:
    (tmp_path / "server.toml").write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    add_job(db, tmp_path / "s.db.spool", "old", "done", time.time() - 10 * DAY)
    db.dispose()
    runner = CliRunner()
    res = runner.invoke(app, ["server", "prune", "--config", str(tmp_path / "server.toml"),
                              "--keep-days", "7"])
    assert res.exit_code == 0, res.output
    assert "deleted the data of 2 rounds (0.0 MB of tasks, sums and aggregates) of 1 " \
           "finished job(s): old" \
        in res.output
    res = runner.invoke(app, ["server", "prune", "--config", str(tmp_path / "server.toml")])
    assert res.exit_code == 2 and "--keep-days" in res.output
    res = runner.invoke(app, ["server", "prune", "--config", str(tmp_path / "server.toml"),
                              "--keep-days", "-1"])
    assert res.exit_code == 2 and "must be a finite number of days, 0 or more; got -1" in " ".join(
        res.output.replace("│", " ").split()), res.output
    res = runner.invoke(app, ["server", "prune", "--config", str(tmp_path / "server.toml"),
                              "--job", "nosuch"])
    assert res.exit_code == 2 and "no job 'nosuch'" in res.output
    with AuditLog(tmp_path / "audit.db") as log:
        for k in range(50):
            log.append("old", "client_joined", {"client": f"site-{k}", "client_index": k})
    res = runner.invoke(app, ["audit", "export", "--db", str(tmp_path / "audit.db"),
                              "--format", "jsonl", "--out", str(tmp_path / "old.jsonl.gz")])
    assert res.exit_code == 0, res.output
    lines = gzip.decompress((tmp_path / "old.jsonl.gz").read_bytes()).decode().splitlines()
    assert len(lines) == 50 and json.loads(lines[0])["kind"] == "client_joined"


def test_a_pruned_done_job_still_reports_its_rounds(tmp_path: Path) -> None:
    """A done job's rounds are 1..current_round, all closed: its status counts them after
    prune deleted their rows, as before."""
    from server_app.status import progress

    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    with db.session() as sess:
        sess.add(JobRow(id="j", spec_json="{}", config_json='{"max_depth": 2}', status="done",
                        reason="", min_clients=1, round_deadline_s=1.0, current_round=3,
                        model_json="{}", model_digest="d" * 64, created_at=0.0))
        sess.flush()
        for r in (1, 2, 3):
            sess.add(RoundRow(job_id="j", round_id=r, kind="sketch", level=r - 1,
                              task_digest="t" * 64, encoding="uint64", participants_json="[0]",
                              issued_at=0.0, deadline_at=1.0, status="closed", closed_at=1.0,
                              task_blob=b"x"))

    def rounds_done() -> int:
        with db.session() as sess:
            job = sess.get(JobRow, "j")
            assert job is not None
            return int(progress(sess, job, time.time())["rounds_done"])

    assert rounds_done() == 3
    prune(db, tmp_path / "s.db.spool", job_ids=["j"])
    assert rounds_done() == 3
    db.dispose()


def test_a_pruned_failed_job_keeps_its_level_and_rounds_done(tmp_path: Path) -> None:
    """A failed job's status after prune: the level it reached and the rounds it closed, as
    before (its round rows stay without their data); its tasks are gone (410)."""
    from server_app.status import progress

    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    with db.session() as sess:
        sess.add(JobRow(id="f", spec_json="{}", config_json='{"max_depth": 3}', status="failed",
                        reason="too few sites", min_clients=1, round_deadline_s=1.0,
                        current_round=3, model_json=None, model_digest=None, created_at=0.0))
        sess.flush()
        for r, status in ((1, "closed"), (2, "closed"), (3, "open")):
            sess.add(RoundRow(job_id="f", round_id=r, kind="sketch", level=r - 1,
                              task_digest="t" * 64, encoding="uint64", participants_json="[0]",
                              issued_at=0.0, deadline_at=1.0, status=status, closed_at=1.0,
                              task_blob=b"x" * 10))

    def level_and_done() -> tuple[int, int]:
        with db.session() as sess:
            job = sess.get(JobRow, "f")
            assert job is not None
            p = progress(sess, job, time.time())
            return int(p["level"]), int(p["rounds_done"])

    assert level_and_done() == (2, 2)
    assert prune(db, tmp_path / "s.db.spool", job_ids=["f"]).rounds == 3
    assert level_and_done() == (2, 2)
    db.dispose()


def _sqlite_full() -> sqlite3.OperationalError:
    """SQLite's own "database or disk is full" (SQLITE_FULL), met on a capped database."""
    conn = sqlite3.connect(":memory:")
    conn.execute("PRAGMA max_page_count = 2")
    conn.execute("CREATE TABLE t (x BLOB)")
    try:
        conn.execute("INSERT INTO t VALUES (zeroblob(100000))")
    except sqlite3.OperationalError as exc:
        assert exc.sqlite_errorcode == sqlite3.SQLITE_FULL
        return exc
    finally:
        conn.close()
    raise AssertionError("the capped database took the row")


@contextlib.contextmanager
def _deletes_fail(error: sqlite3.OperationalError) -> Iterator[None]:
    """Every DELETE statement fails with SQLite's ``error``."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.exc import OperationalError

    def refuse(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            raise OperationalError(statement, None, error)

    event.listen(Engine, "before_cursor_execute", refuse)
    try:
        yield
    finally:
        event.remove(Engine, "before_cursor_execute", refuse)


@pytest.fixture
def full_on_delete() -> Iterator[None]:
    """Every DELETE statement fails as on a full disk (SQLite's SQLITE_FULL)."""
    with _deletes_fail(_sqlite_full()):
        yield


def _sqlite_ioerr() -> sqlite3.OperationalError:
    """SQLite's "disk I/O error" of a write (SQLITE_IOERR_WRITE), as its driver raises it."""
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode = sqlite3.SQLITE_IOERR_WRITE  # type: ignore[attr-defined]
    return exc


def test_prune_on_a_full_disk_names_the_file_and_deletes_nothing(
        tmp_path: Path, full_on_delete: None) -> None:
    (tmp_path / "server.toml").write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    add_job(db, tmp_path / "s.db.spool", "old", "done", time.time() - 10 * DAY)
    res = CliRunner().invoke(app, ["server", "prune", "--config", str(tmp_path / "server.toml"),
                                   "--job", "old"])
    assert res.exit_code == 2, res.output
    assert " ".join(res.output.split()) == (
        f"error: the database file {tmp_path / 's.db'} cannot be written: the disk is full "
        "(database or disk is full); nothing was deleted. Prune writes its deletion before "
        "the space comes free: free some space on that disk (a few MB), then run prune again")
    assert counts(db, "old") == (2, 2, 3, True)
    assert (tmp_path / "s.db.spool" / "old" / "1" / "0.u64").is_file()
    db.dispose()


def test_a_command_on_a_full_disk_names_the_database_file(
        tmp_path: Path, full_on_delete: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A command's write the disk refuses ends with one line naming the file, not
    SQLAlchemy's traceback."""
    import typer

    (tmp_path / "server.toml").write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    add_job(db, tmp_path / "s.db.spool", "old", "done", time.time() - 10 * DAY)
    with pytest.raises(typer.Exit) as ended:
        with locks_named(tmp_path / "server.toml"), db.session() as sess:
            sess.execute(delete(UploadRow))
    assert ended.value.exit_code == 2
    assert " ".join(capsys.readouterr().err.split()) == (
        f"error: the database file {tmp_path / 's.db'} cannot be written: the disk is full "
        "(database or disk is full); the command's change was not made. Free some space on "
        "that disk, then run the command again")
    db.dispose()


def test_prune_over_the_file_size_limit_says_it_is_an_io_error_not_a_full_disk(
        tmp_path: Path) -> None:
    """SQLite's writes refused by a file size limit (EFBIG: SQLITE_IOERR_WRITE) on a disk with
    room: prune says it is an I/O error writing the file and what to check, not that the disk
    is full, and deletes nothing."""
    import resource
    import subprocess
    import sys

    from fedforest_cli.sim_processes import child_env

    (tmp_path / "server.toml").write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    add_job(db, tmp_path / "s.db.spool", "old", "done", time.time() - 10 * DAY)
    db.dispose()
    limit = 70_000  # bytes: less than the deletion writes to the journal

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    done = subprocess.run([sys.executable, "-m", "fedforest_cli", "server", "prune",
                           "--config", str(tmp_path / "server.toml"), "--job", "old"],
                          capture_output=True, text=True, env=child_env(), timeout=120,
                          preexec_fn=small_files, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert " ".join(done.stderr.split()) == (
        f"error: an I/O error writing the database file {tmp_path / 's.db'} (disk I/O error: a "
        "full disk, a file size limit or a failing disk); nothing was deleted. Prune writes "
        "its deletion before the space comes free: check that disk's free space (prune needs "
        "a few MB), the file size limit (`ulimit -f`) and the system log for disk errors, "
        "then run prune again")
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    assert counts(db, "old") == (2, 2, 3, True)
    assert (tmp_path / "s.db.spool" / "old" / "1" / "0.u64").is_file()
    db.dispose()


def test_a_commands_io_error_names_the_database_file_and_says_what_to_check(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An I/O error (not SQLITE_FULL) is not called a full disk."""
    import typer

    (tmp_path / "server.toml").write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    add_job(db, tmp_path / "s.db.spool", "old", "done", time.time() - 10 * DAY)
    with pytest.raises(typer.Exit) as ended, _deletes_fail(_sqlite_ioerr()):
        with locks_named(tmp_path / "server.toml"), db.session() as sess:
            sess.execute(delete(UploadRow))
    assert ended.value.exit_code == 2
    assert " ".join(capsys.readouterr().err.split()) == (
        f"error: an I/O error writing the database file {tmp_path / 's.db'} (disk I/O error: "
        "a full disk, a file size limit or a failing disk); the command's change was not "
        "made. Check that disk's free space, the file size limit (`ulimit -f`) and the system "
        "log for disk errors, then run the command again")
    db.dispose()


@pytest.mark.parametrize("temp", ["TMPDIR", "SQLITE_TMPDIR", None])
def test_a_compaction_that_fails_for_lack_of_space_names_the_disk_and_the_temporary_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, temp: str | None) -> None:
    """VACUUM copies the file into SQLite's temporary directory, then back: the advice names
    the database's disk and that directory, and what chose it."""
    from sqlalchemy.exc import OperationalError

    from server_app.retention import sqlite_temp_dir

    (tmp_path / "server.toml").write_text(f'database = "sqlite:///{tmp_path}/s.db"\n')
    (tmp_path / "tmp").mkdir()
    monkeypatch.delenv("SQLITE_TMPDIR", raising=False)
    monkeypatch.delenv("TMPDIR", raising=False)
    if temp is not None:
        monkeypatch.setenv(temp, str(tmp_path / "tmp"))
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    add_job(db, tmp_path / "s.db.spool", "old", "done", time.time() - 10 * DAY)
    db.dispose()
    full = OperationalError("VACUUM", None, _sqlite_full())
    monkeypatch.setattr(Database, "compact", lambda self: (_ for _ in ()).throw(full))
    res = CliRunner().invoke(app, ["server", "prune", "--config", str(tmp_path / "server.toml"),
                                   "--job", "old"])
    assert res.exit_code == 0, res.output
    size = (tmp_path / "s.db").stat().st_size
    where = (f"{tmp_path / 'tmp'} (set by {temp})" if temp is not None
             else f"{sqlite_temp_dir()[0]} (SQLite's default: neither SQLITE_TMPDIR nor TMPDIR "
                  "names a directory)")
    assert " ".join(res.output.split()).endswith(
        "the database file was not compacted (database or disk is full): the deleted data is "
        "gone, its space stays in the file until a prune compacts it; compacting copies the "
        f"file and needs free space about the file's size ({size / 1e6:.1f} MB) both on its "
        f"disk and in SQLite's temporary directory {where}: free that much in both (or set "
        "SQLITE_TMPDIR to a directory with room), then run prune again")
    if temp is None and os.access("/var/tmp", os.W_OK | os.X_OK):  # SQLite's first default
        assert sqlite_temp_dir() == (Path("/var/tmp"), "the default")


def test_a_commit_the_disk_refuses_keeps_every_spooled_vector(tmp_path: Path) -> None:
    """The disk refuses the deletion's COMMIT (where SQLite writes its journal), two jobs:
    the spool of neither is removed, and nothing was deleted."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.exc import OperationalError

    from server_app.retention import DiskFull

    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    spool = tmp_path / "s.db.spool"
    for j in ("a", "b"):
        add_job(db, spool, j, "done", time.time() - 10 * DAY)
    full = _sqlite_full()

    def refuse(conn: object) -> None:
        raise OperationalError("COMMIT", None, full)

    event.listen(Engine, "commit", refuse)
    try:
        with pytest.raises(DiskFull):
            prune(db, spool, job_ids=["a", "b"])
    finally:
        event.remove(Engine, "commit", refuse)
    assert sorted(p.name for p in spool.iterdir()) == ["a", "b"]
    assert (spool / "a" / "1" / "0.u64").is_file() and (spool / "b" / "1" / "0.u64").is_file()
    assert counts(db, "a") == (2, 2, 3, True) and counts(db, "b") == (2, 2, 3, True)
    db.dispose()
