"""Operator actions on a server's database from outside the server process.

``fedforest server add-client | create-job | status`` and ``fedforest simulate`` use these to
register institutions, create jobs and follow a job while the server runs on the same database;
nothing outside :mod:`server_app` reads its tables.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from types import TracebackType

from sqlalchemy import select

from fedforest_secure.protocol.api import JobStatus as JobStatusView

from .audit_hook import AuditSink, open_audit
from .auth import add_client, add_operator, remove_operator, revoke_client, rotate_token
from .db import Database, JobRow, RoundRow
from .jobcheck import check_job
from .jobspec import JobSpec
from .retention import Pruned, prune
from .runtime import ServerState
from .serve import spool_dir
from .settings import ServerSettings
from .status import job_status

__all__ = ["JobSummary", "RoundSummary", "ServerAdmin"]


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

    def job(self, job_id: str) -> JobSummary | None:
        with self._db.session() as sess:
            job = sess.get(JobRow, job_id)
            return None if job is None else JobSummary._of(job)

    def evaluation_digests(self, job_id: str) -> list[str] | None:
        """The SHA-256 of each model an evaluation job scores (None: no such job, or not an
        evaluation)."""
        with self._db.session() as sess:
            job = sess.get(JobRow, job_id)
            evaluation = None if job is None else json.loads(job.config_json).get("evaluation")
        return None if not evaluation else [str(d) for d in evaluation["digests"]]

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
