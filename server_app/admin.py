"""Operator actions on a server's database from outside the server process.

``fedforest server add-client | create-job | cancel-job | status`` and ``fedforest simulate``
use these to register institutions, create, cancel and follow jobs while the server runs on the
same database; nothing outside :mod:`server_app` reads its tables.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from types import TracebackType

from sqlalchemy import select

from fedforest_secure.audit.log import AuditLog, to_url
from fedforest_secure.dburl import shown_url
from fedforest_secure.errors import FedForestError
from fedforest_secure.protocol.api import JobStatus as JobStatusView

from .audit_hook import AuditSink, open_audit
from .audit_outbox import first_queued
from .auth import add_client, add_operator, remove_operator, revoke_client, rotate_token
from .cancel import CancelError, cancellable, request_cancel
from .db import AuditedJobRow, Database, JobRow, RoundRow
from .jobcheck import check_job
from .jobdiff import differences
from .jobspec import JobSpec
from .lease import LEASE_S, LeaseLost, ServerLease, holder
from .phases import JobStatus
from .retention import Pruned, prune
from .runtime import ServerState
from .serve import spool_dir
from .settings import ConfigError, ServerSettings
from .status import job_status

__all__ = ["JobSummary", "NoModel", "RoundSummary", "ServerAdmin"]


class NoModel(FedForestError, LookupError):
    """A job whose model the operator asked for has none: no such job, not done, failed, or
    a stored model that is not the one the job records."""


@dataclass(frozen=True)
class JobSummary:
    """Where a job stands, as stored."""

    job_id: str
    status: str  # "waiting" | "running" | "done" | "failed"
    reason: str
    round_id: int  # the current round (-1 before the first)
    min_clients: int
    round_deadline_s: float
    model_json: str | None
    model_digest: str | None
    #: What create-job decided for the operator (the DP forest defaults it applied).
    notes: tuple[str, ...] = ()

    @classmethod
    def _of(cls, job: JobRow, notes: tuple[str, ...] = ()) -> JobSummary:
        return cls(job.id, job.status, job.reason, job.current_round, job.min_clients,
                   job.round_deadline_s, job.model_json, job.model_digest, notes)


@dataclass(frozen=True)
class RoundSummary:
    """One issued round, as stored."""

    round_id: int
    level: int
    kind: str
    status: str  # "open" | "closed"


class ServerAdmin:
    """A connection to a server's database (and audit log, for the actions that audit).

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, database: str, audit_database: str | None = None) -> None:
        self._db = Database(database)
        self._audit_url = audit_database
        self._audit: AuditSink | None = None

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> ServerAdmin:
        return cls(settings.database, settings.audit_database)

    def add_client(self, name: str) -> str:
        """Register an institution; returns its token (stored hashed, shown only here)."""
        return add_client(self._db, name)

    def rotate_token(self, name: str) -> str:
        """A new token for client ``name`` (shown only here); the old one stops working."""
        return rotate_token(self._db, name)

    def revoke_client(self, name: str) -> None:
        """Client ``name`` keeps no working token."""
        revoke_client(self._db, name)

    def add_operator(self, name: str) -> str:
        """Register an operator of ``/ui``; returns its token (stored hashed, shown only
        here)."""
        return add_operator(self._db, name)

    def remove_operator(self, name: str) -> None:
        """Delete an operator of ``/ui``: its token stops working at once."""
        remove_operator(self._db, name)

    def create_job(self, spec: JobSpec) -> JobSummary:
        """Create a job for registered clients (audited as ``job_created``), refusing what
        would fail mid-job (:func:`~server_app.jobcheck.check_job`)."""
        checked = check_job(spec)
        if self._audit is None:
            self._audit = open_audit(self._audit_url)
        row = ServerState(self._db, self._audit).create_job(checked.spec)
        return JobSummary._of(row, tuple(checked.notes))

    def cancel_job(self, job_id: str, *, wait_s: float = 30.0) -> JobSummary:
        """Cancel a waiting or running job (:mod:`server_app.cancel`): the server that serves
        the database fails it, within ``wait_s`` seconds, or :class:`CancelError` says it did
        not (the request stays, for the server to apply). With no server on the database this
        process takes its lease and fails the job itself."""
        with self._db.session() as sess:
            cancellable(sess, job_id)  # no such job, or finished: nothing is recorded
        if holder(self._db) is None:
            lease = ServerLease(self._db, 0)
            try:
                lease.acquire()
            except ConfigError:  # a server took the database at this moment: it cancels
                pass
            else:
                # its writes are fenced on the claim, which it renews meanwhile: a command
                # paused past the claim's 15 s, while a server started and took the database
                # over, saves nothing behind that server's back
                lease.keep(lambda _lost: None)
                try:
                    return self._cancel_here(job_id)
                except LeaseLost:
                    serving = holder(self._db)
                    who = ("a server" if serving is None else f"a server (pid {serving.pid} "
                           f"on {serving.host}, port {serving.port})")
                    raise CancelError(
                        f"job {job_id!r} was not cancelled: this command was paused for more "
                        f"than {LEASE_S:.0f} s while it held the database, and {who} took "
                        "the database over meanwhile; run the command again (the server "
                        "that serves the database then cancels the job)") from None
                finally:
                    lease.release()
                    self._db.fence(None)
        request_cancel(self._db, job_id, time.time())
        until = time.monotonic() + wait_s
        while True:
            job = self.job(job_id)
            if job is None:
                raise RuntimeError(f"job {job_id!r} vanished")
            if job.status not in (JobStatus.WAITING, JobStatus.RUNNING):
                return job
            if time.monotonic() >= until:
                serving = holder(self._db)
                who = ("the server" if serving is None else
                       f"the server (pid {serving.pid} on {serving.host}, port {serving.port})")
                raise CancelError(
                    f"{who} has not cancelled job {job_id!r} within {wait_s:.0f} s; the "
                    "request stays recorded and the server applies it at its next check "
                    "(`fedforest server status` shows the job failed then)")
            time.sleep(0.2)

    def _cancel_here(self, job_id: str) -> JobSummary:
        """Fail ``job_id`` as cancelled in this process, which holds the database's lease.
        Its ``job_failed`` entry must end its chain, so this config's audit log must hold
        that chain (a server's start checks the same)."""
        if self._audit is None:
            self._audit = open_audit(self._audit_url)
        with self._db.session() as sess:
            began_audited = sess.get(AuditedJobRow, job_id) is not None
            # a job whose create-job stopped before its job_created entry reached the log
            waiting = first_queued(sess).get(job_id)
        if self._audit.enabled and self._audit.tip(job_id)[0] == 0 and waiting != 1:
            shown = shown_url(to_url(self._audit_url)) if self._audit_url else "?"
            raise CancelError(f"the audit log at {shown} has none of job {job_id!r}'s entries "
                              "(it began on another audit_database, or none): cancel it with "
                              "the server config that names the audit_database it began with")
        if not self._audit.enabled and began_audited:
            raise CancelError(f"job {job_id!r} began with an audit log and this server config "
                              "has no audit_database: cancel it with the server config that "
                              "names the audit_database it began with")
        # the job's entries of steps that committed before a process stopped come first
        self._audit.flush_all(self._db.engine, job_id)
        ServerState(self._db, self._audit, spool=spool_dir(self._db.url)).cancel(job_id)
        job = self.job(job_id)
        if job is None:
            raise RuntimeError(f"job {job_id!r} vanished")
        return job

    def job(self, job_id: str) -> JobSummary | None:
        with self._db.session() as sess:
            job = sess.get(JobRow, job_id)
            return None if job is None else JobSummary._of(job)

    def model(self, job_id: str) -> tuple[bytes, str]:
        """A done job's model file (an evaluation job's result) and its SHA-256: the bytes a
        member downloads (``GET /v1/jobs/{job}/model``), whose digest the log's ``model``
        entry holds; :class:`NoModel` if the job has none, or if the stored model is not the
        one the job's row records, or the one this config's audit log records."""
        with self._db.session() as sess:
            job = sess.get(JobRow, job_id)
            if job is None:
                raise NoModel(f"no job {job_id!r} on this server (`fedforest server status` "
                              "lists its jobs)")
            if job.status == JobStatus.FAILED:
                raise NoModel(f"job {job_id!r} failed ({job.reason}): it has no model")
            if job.status != JobStatus.DONE or job.model_json is None:
                raise NoModel(f"job {job_id!r} is {job.status}: it has no model yet "
                              "(`fedforest server status` shows how far it is)")
            body, recorded = job.model_json.encode(), job.model_digest
        digest = hashlib.sha256(body).hexdigest()
        if digest != recorded:
            raise NoModel(f"the stored model of job {job_id!r} has the SHA-256 {digest}, not "
                          f"the one the job records ({recorded}): the database was changed")
        self._check_logged_model(job_id, digest)
        return body, digest

    def _check_logged_model(self, job_id: str, digest: str) -> None:
        """:class:`NoModel` unless ``digest`` is the one the job's ``model`` entry in this
        config's audit log holds (a job that began with no audit log, or a config that names
        none, has no entry to compare with: the database's own record stands)."""
        if not self._audit_url:
            return
        with self._db.session() as sess:
            if sess.get(AuditedJobRow, job_id) is None:
                return
            waiting = job_id in first_queued(sess)
        shown = shown_url(to_url(self._audit_url))
        with AuditLog(to_url(self._audit_url), create=False) as log:
            entries = log.entries(job_id=job_id, kind="model")
        if not entries:
            raise NoModel(
                f"the model entry of job {job_id!r} still waits in the server's database for "
                f"the audit log at {shown}: the running server appends it when the log "
                "answers; run this command again then" if waiting else
                f"the audit log at {shown} holds no model entry of job {job_id!r}: give the "
                "server config that names the audit_database the job began with")
        entry = entries[-1]
        try:
            logged = entry.payload.get("digest")
        except ValueError:  # a damaged entry
            logged = None
        if logged != digest:
            raise NoModel(f"the stored model of job {job_id!r} has the SHA-256 {digest}, not "
                          f"the one the audit log's model entry (seq {entry.seq}) holds "
                          f"({logged}): the database was changed")

    def evaluation_digests(self, job_id: str) -> list[str] | None:
        """The SHA-256 of each model an evaluation job scores (None: no such job, or not an
        evaluation)."""
        with self._db.session() as sess:
            job = sess.get(JobRow, job_id)
            evaluation = None if job is None else json.loads(job.config_json).get("evaluation")
        return None if not evaluation else [str(d) for d in evaluation["digests"]]

    def differences(self, spec: JobSpec, *, names_given: bool = False) -> list[str] | None:
        """What ``spec`` sets otherwise than the stored job of its id
        (:func:`~server_app.jobdiff.differences`, ``names_given`` as there; empty: the job it
        describes); None if no job has that id."""
        with self._db.session() as sess:
            job = sess.get(JobRow, spec.id)
            return None if job is None else differences(spec, job, names_given=names_given)

    def evaluation_names(self, job_id: str) -> list[str] | None:
        """The label of each model an evaluation job scores, in its order (None: no such job,
        or not an evaluation)."""
        with self._db.session() as sess:
            job = sess.get(JobRow, job_id)
            evaluation = None if job is None else json.loads(job.config_json).get("evaluation")
        return None if not evaluation else [str(n) for n in evaluation["names"]]

    def jobs(self) -> list[JobSummary]:
        with self._db.session() as sess:
            return [JobSummary._of(j) for j in sess.scalars(select(JobRow))]

    def status(self, job_id: str) -> JobStatusView | None:
        """One job as :meth:`statuses` shows it (None: no such job)."""
        with self._db.session() as sess:
            job = sess.get(JobRow, job_id)
            return None if job is None else JobStatusView.model_validate(
                job_status(sess, job, None, time.time()))

    def statuses(self) -> list[JobStatusView]:
        """Every job as ``fedforest status`` shows it to a member (the operator's view)."""
        now = time.time()
        with self._db.session() as sess:
            return [JobStatusView.model_validate(job_status(sess, j, None, now))
                    for j in sess.scalars(select(JobRow).order_by(JobRow.created_at))]

    def prune(self, *, keep_days: float | None = None, job_ids: list[str] | None = None,
              dry_run: bool = False) -> Pruned:
        """Delete the round data of finished jobs (:func:`~server_app.retention.prune`)."""
        cutoff = None if keep_days is None else time.time() - keep_days * 86400.0
        return prune(self._db, spool_dir(self._db.url), older_than=cutoff, job_ids=job_ids,
                     dry_run=dry_run)

    def latest_round(self, job_id: str) -> RoundSummary | None:
        """The job's last issued round, or None before the first."""
        with self._db.session() as sess:
            rr = sess.scalar(select(RoundRow).where(RoundRow.job_id == job_id)
                             .order_by(RoundRow.round_id.desc()).limit(1))
            return None if rr is None else RoundSummary(rr.round_id, rr.level, rr.kind,
                                                        rr.status)

    def close(self) -> None:
        audit, self._audit = self._audit, None
        close = getattr(audit, "close", None)
        if callable(close):
            close()
        self._db.dispose()

    def __enter__(self) -> ServerAdmin:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
