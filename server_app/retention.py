"""What a finished job keeps in the server's database, and ``fedforest server prune``.

While a job runs, its rounds are kept whole (tasks, running sums, aggregates, the uploads and
secure-aggregation messages of the open round) so that a restarted server resumes it. Once the
job is done or failed none of that is read again: members download the model (kept in the job's
row) and verify the audit log (kept in the audit database, which pruning never touches: it is
append-only and every member may check it against their receipts). :func:`prune` deletes the
rounds, uploads and messages of finished jobs and their spooled vectors, and compacts a SQLite
file.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from fedforest_secure.dburl import SqliteWriteError, shown_url, sqlite_file, sqlite_write_error
from fedforest_secure.errors import FedForestError

from .db import AuditMarkRow, Database, JobRow, RoundRow, SecAggMessageRow, UploadRow
from .phases import JobStatus

__all__ = ["DiskFull", "NotFinished", "Pruned", "prune", "sqlite_temp_dir"]

_FINISHED = (JobStatus.DONE, JobStatus.FAILED)


class NotFinished(FedForestError):
    """A job named for pruning has not finished: nothing is deleted. ``config``: the server
    config the cancel command this names takes (a placeholder if unknown)."""

    def __init__(self, job_id: str, status: str, config: str = "<server.toml>") -> None:
        super().__init__(f"job {job_id!r} is {status}: only finished jobs are pruned "
                         f"(`fedforest server cancel-job --config {config} --job {job_id}` "
                         "stops it); nothing was deleted")
        self.job_id, self.status = job_id, status


class DiskFull(FedForestError):
    """The deletion could not be written: the disk under the database file is full, or its
    writes fail (an I/O error: a file size limit, a failing disk). The transaction rolled
    back: nothing was deleted."""

    def __init__(self, db_file: str, refused: SqliteWriteError) -> None:
        then = ("free some space on that disk (a few MB), then run prune again" if refused.full
                else "check that disk's free space (prune needs a few MB), the file size limit "
                     "(`ulimit -f`) and the system log for disk errors, then run prune again")
        super().__init__(f"{refused.why(f'the database file {db_file}')}; nothing was "
                         f"deleted. Prune writes its deletion before the space comes free: "
                         f"{then}")


@dataclass
class Pruned:
    """What :func:`prune` removed (or would remove, with ``dry_run``)."""

    jobs: list[str] = field(default_factory=list)
    rounds: int = 0
    bytes: int = 0  # task, sum and aggregate bytes of the deleted rounds and uploads
    #: why the database file was not compacted after the deletion (None: it was, or had
    #: nothing to give back)
    not_compacted: str | None = None
    #: the size in bytes of the database file when its compaction failed for lack of space:
    #: compacting needs about that much free space on its disk and in SQLite's temporary
    #: directory (None: it did not fail so)
    compact_needs: int | None = None
    #: that temporary directory and what chose it (:func:`sqlite_temp_dir`), with
    #: ``compact_needs``
    compact_temp_dir: tuple[Path, str] | None = None


def sqlite_temp_dir() -> tuple[Path, str]:
    """The directory SQLite writes its temporary files in (VACUUM's copy of the database
    among them), and what chose it: as SQLite on Unix picks it, the first of
    ``SQLITE_TMPDIR``, ``TMPDIR``, ``/var/tmp``, ``/usr/tmp`` and ``/tmp`` that is a
    directory this process may write in (else the working directory); "SQLITE_TMPDIR",
    "TMPDIR" or "the default"."""
    for var in ("SQLITE_TMPDIR", "TMPDIR"):
        where = os.environ.get(var)
        if where and _writable_dir(where):
            return Path(where), var
    return next((Path(d) for d in ("/var/tmp", "/usr/tmp", "/tmp") if _writable_dir(d)),
                Path(".")), "the default"


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def _last_activity(sess: Session, job: JobRow) -> float:
    last = sess.scalar(select(func.max(func.coalesce(RoundRow.closed_at, RoundRow.issued_at)))
                       .where(RoundRow.job_id == job.id))
    return float(last) if last is not None else float(job.created_at)


def _blob_bytes(sess: Session, job_id: str) -> int:
    sizes = sess.execute(select(
        func.coalesce(func.sum(func.length(RoundRow.task_blob)), 0),
        func.coalesce(func.sum(func.length(RoundRow.running_sum)), 0),
        func.coalesce(func.sum(func.length(RoundRow.aggregate)), 0),
        func.coalesce(func.sum(func.length(RoundRow.disclosed_blob)), 0),
    ).where(RoundRow.job_id == job_id)).one()
    uploads = sess.scalar(select(func.coalesce(func.sum(func.length(UploadRow.summable)), 0))
                          .where(UploadRow.job_id == job_id))
    return int(sum(int(s) for s in sizes)) + int(uploads or 0)


def prune(db: Database, spool: Path | None, *, older_than: float | None = None,
          job_ids: list[str] | None = None, dry_run: bool = False) -> Pruned:
    """Delete the round data of finished jobs (tasks, sums, aggregates, uploads, relayed
    messages, spooled vectors); each round's row stays without them.

    Parameters
    ----------
    older_than : epoch seconds, optional
        Only jobs whose last round closed (or that were created, without rounds) before this.
    job_ids : list of str, optional
        Only these jobs (each must be finished).
    dry_run : bool
        Count, delete nothing.

    Raises
    ------
    FedForestError
        A named job that does not exist or has not finished: nothing is deleted.
    DiskFull
        The deletion could not be written (SQLite: its disk is full, or an I/O error):
        nothing is deleted.
    """
    out = Pruned()
    try:
        gone = _delete(db, spool, out, older_than=older_than, job_ids=job_ids,
                       dry_run=dry_run)
    except OperationalError as exc:
        refused = sqlite_write_error(exc)
        if refused is None:
            raise
        raise DiskFull(str(sqlite_file(db.url) or shown_url(db.url)), refused) from exc
    for spooled in gone:  # once the deletion is committed
        shutil.rmtree(spooled, ignore_errors=True)
    if dry_run:
        return out
    try:
        # also what an earlier prune left free: a quarter of the file or more (a running
        # server frees and reuses pages of its own, which are not worth rewriting the file)
        if out.jobs or db.free_share() >= 0.25:
            db.compact()
    except OperationalError as exc:  # the deletion stands: a later prune compacts
        out.not_compacted = str(exc.orig or exc).splitlines()[0]
        db_file = sqlite_file(db.url)
        if sqlite_write_error(exc) is not None and db_file is not None:
            try:
                out.compact_needs = db_file.stat().st_size
            except OSError:
                out.compact_needs = 0
            out.compact_temp_dir = sqlite_temp_dir()
    return out


def _delete(db: Database, spool: Path | None, out: Pruned, *, older_than: float | None,
            job_ids: list[str] | None, dry_run: bool) -> list[Path]:
    """:func:`prune`'s deletion, in one transaction; counted in ``out``. Returns the spool
    directories of the pruned jobs, removed once the transaction committed."""
    gone: list[Path] = []
    with db.session() as sess:
        for job_id in job_ids or []:  # every named job checked before anything is deleted
            named = sess.get(JobRow, job_id)
            if named is None:
                raise FedForestError(f"no job {job_id!r}; nothing was deleted")
            if named.status not in _FINISHED:
                raise NotFinished(job_id, str(named.status))
        query = select(JobRow).where(JobRow.status.in_(_FINISHED))
        if job_ids is not None:
            query = query.where(JobRow.id.in_(job_ids))
        for job in sess.scalars(query):
            if older_than is not None and _last_activity(sess, job) >= older_than:
                continue
            n = int(sess.scalar(select(func.count()).select_from(RoundRow).where(
                RoundRow.job_id == job.id, func.length(RoundRow.task_blob) > 0)) or 0)
            spooled = spool / job.id if spool is not None else None
            if n == 0 and (spooled is None or not spooled.exists()):
                continue
            out.jobs.append(job.id)
            out.rounds += n
            out.bytes += _blob_bytes(sess, job.id)
            if dry_run:
                continue
            sess.execute(delete(UploadRow).where(UploadRow.job_id == job.id))
            sess.execute(delete(AuditMarkRow).where(AuditMarkRow.job_id == job.id))
            sess.execute(delete(SecAggMessageRow).where(  # identity keys (round -1) stay
                SecAggMessageRow.job_id == job.id, SecAggMessageRow.round_id >= 0))
            # each round's row stays without its data: the job's level and rounds done
            # still show (a failed job's too)
            sess.execute(update(RoundRow).where(RoundRow.job_id == job.id).values(
                task_blob=b"", running_sum=None, aggregate=None, disclosed_blob=None))
            if spooled is not None:
                gone.append(spooled)
    return gone
