"""The parts of one server and the job-level steps they share (deadlines, closing rounds).

:class:`~server_app.runtime.ServerState` (the facade the routes call) and
:class:`~server_app.relay.SecAggRelay` (the secure-aggregation requests) both work on one
:class:`Core`. Every method here expects the caller to hold :attr:`Core.lock`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from .audit_hook import AuditSink
from .db import Database, JobRow, RoundRow
from .deadlines import Deadlines
from .errors import ApiError
from .notify import Changes
from .phases import JobStatus, MemberState, RoundStatus
from .replay import Runtimes
from .rounds import RoundDriver
from .spool import Spool
from .store import SeatView, job_position, open_round

__all__ = ["Core", "check_seat"]


@dataclass
class Core:
    db: Database
    audit: AuditSink
    clock: Callable[[], float]
    #: one step at a time: every public step of the server holds it
    lock: threading.RLock
    changes: Changes
    deadlines: Deadlines
    spool: Spool
    driver: RoundDriver
    runtimes: Runtimes

    @classmethod
    def build(cls, db: Database, audit: AuditSink, clock: Callable[[], float],
              spool: Spool) -> Core:
        lock = threading.RLock()
        changes = Changes(lock)
        deadlines = Deadlines(db, clock)
        driver = RoundDriver(audit, clock, changes, deadlines, spool)

        def unresumable(sess: Session, job: JobRow, reason: str) -> None:
            driver.fail(sess, job, reason, None, None)

        return cls(db, audit, clock, lock, changes, deadlines, spool, driver,
                   Runtimes(db, spool, deadlines, unresumable))

    def tick_if_due(self, job_id: str) -> None:
        """What a request does before it answers: apply the open round's deadline if it has
        passed. Closing complete rounds is left to the message that completes them and to the
        periodic tick."""
        if self.deadlines.due(job_id):
            self.deadline(job_id)

    def tick_job(self, job_id: str) -> None:
        """Apply the deadline of a running job's open round, or close what is complete."""
        with self.db.session() as sess:
            job = sess.get(JobRow, job_id)
            if job is None or job.status != JobStatus.RUNNING:
                return
            rr = sess.get(RoundRow, (job_id, job.current_round))
            late = rr is not None and rr.status == RoundStatus.OPEN \
                and self.deadlines.passed(rr, job)
        if late:
            self.deadline(job_id)
        else:
            self.maybe_close(job_id)

    def maybe_close(self, job_id: str) -> None:
        rt = self.runtimes.get(job_id)
        with self.runtimes.guard(job_id), self.db.session() as sess:
            found = open_round(sess, job_id)
            if found is not None:
                self.driver.progress(rt, sess, *found)

    def deadline(self, job_id: str) -> None:
        rt = self.runtimes.get(job_id)
        with self.runtimes.guard(job_id), self.db.session() as sess:
            found = open_round(sess, job_id)
            if found is not None:
                self.driver.deadline(rt, sess, *found)

    def sweep_spool(self) -> None:
        """Remove the spooled uploads of rounds that closed."""
        self.driver.sweep_due = False

        def position(job_id: str) -> tuple[str, int] | None:
            with self.db.session() as sess:
                return job_position(sess, job_id)

        self.spool.sweep(position)


def check_seat(seat: SeatView, round_id: int) -> None:
    """The checks on a member's upload or secure-aggregation message for round ``round_id``,
    on a :class:`~server_app.store.SeatView` of that round."""
    if seat.member_state == MemberState.DROPPED:
        raise ApiError(403, "dropped", f"this client was dropped at round {seat.dropped_round}")
    if seat.member_state != MemberState.ACTIVE:
        raise ApiError(409, "not_joined", "join the job first")
    if seat.round_id is None:
        raise ApiError(409, "wrong_round", f"round {round_id} has not been issued "
                       f"(current round: {seat.current_round})")
    if seat.job_status != JobStatus.RUNNING and seat.round_status == RoundStatus.OPEN:
        raise ApiError(409, "job_finished", f"the job is {seat.job_status}")
