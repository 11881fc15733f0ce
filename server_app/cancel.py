"""Cancelling a job: the operator asks (``fedforest server cancel-job``), the server does it.

The server keeps its jobs in memory and holds a lease on its database
(:mod:`server_app.lease`): a command that rewrote a job's row behind its back would leave it
serving, auditing and closing rounds of a job the database says is over. The command records a
request instead (:class:`~server_app.db.CancelRow`), and the server that serves the database
applies it on its next full tick (:meth:`ServerState.tick
<server_app.runtime.ServerState.tick>`), under its lock, through the step every failure of a
job takes (:meth:`RoundDriver.fail <server_app.rounds.RoundDriver.fail>`): the job fails with
the reason :data:`CANCELLED`, its audit chain ends with its ``job_failed`` entry (after a
``round_aborted`` entry for the round it was in, whose uploads the sites hold receipts of), its
sites read the failure and the reason at their next poll, and ``fedforest server prune`` may
delete its rounds. With no server on the database the command takes the lease itself (a server
started meanwhile refuses to start), takes the same step and gives the lease back.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from fedforest_secure.errors import FedForestError

from .core import Core
from .db import CancelRow, Database, JobRow, lost_race
from .phases import JobStatus
from .store import open_round

__all__ = ["CANCELLED", "CancelError", "apply_cancels", "cancel", "cancellable",
           "request_cancel"]

#: the reason a cancelled job fails with (its status, its sites, its ``job_failed`` entry)
CANCELLED = "cancelled by the operator"

_UNFINISHED = (JobStatus.WAITING, JobStatus.RUNNING)


class CancelError(FedForestError, ValueError):
    """A job that cannot be cancelled: there is no such job, or it has finished."""


def cancellable(sess: Session, job_id: str) -> JobRow:
    """The job ``job_id`` if it is waiting or running, else :class:`CancelError` saying why."""
    job = sess.get(JobRow, job_id)
    if job is None:
        raise CancelError(f"no job {job_id!r} on this server (`fedforest server status` lists "
                          "its jobs)")
    if job.status not in _UNFINISHED:
        said = f" ({job.reason})" if job.reason else ""
        raise CancelError(f"job {job_id!r} has already finished: it is {job.status}{said}; "
                          "only a waiting or running job can be cancelled")
    return job


def request_cancel(db: Database, job_id: str, now: float) -> None:
    """Record the operator's request to cancel ``job_id`` (waiting or running), for the
    server to apply (asking twice records one request)."""
    # another process's request recorded between the check and the insert is this one
    with lost_race(db, select(CancelRow.job_id).where(CancelRow.job_id == job_id), None), \
            db.session() as sess:
        cancellable(sess, job_id)
        if sess.get(CancelRow, job_id) is None:
            sess.add(CancelRow(job_id=job_id, requested_at=now))


def cancel(core: Core, job_id: str) -> bool:
    """Fail ``job_id`` with the reason :data:`CANCELLED` and drop its request; False (the
    request dropped all the same) if the job had finished meanwhile. The caller holds
    :attr:`Core.lock` and notifies the job's waiters after it."""
    with core.runtimes.guard(job_id), core.db.session() as sess:
        request = sess.get(CancelRow, job_id)
        if request is not None:
            sess.delete(request)
        job = sess.get(JobRow, job_id)
        if job is None or job.status not in _UNFINISHED:
            return False
        found = open_round(sess, job_id)
        # its sites may hold receipts of their uploads to the open round: the log says it was
        # aborted (no sum of it released), and the job's failure follows
        core.driver.fail(sess, job, CANCELLED, found[1] if found is not None else None,
                         core.runtimes.peek(job_id), ended=True)
        return True


def apply_cancels(core: Core) -> list[str]:
    """Cancel every job an operator asked to cancel (one query when none was asked); returns
    the jobs cancelled."""
    with core.db.session() as sess:
        asked = list(sess.scalars(select(CancelRow.job_id)))
    done = []
    for job_id in asked:
        with core.lock:
            if cancel(core, job_id):
                done.append(job_id)
        core.changes.notify(job_id)
    return done
