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

from fedforest_secure.protocol import Task, layout_size, upload_size_bound

from .audit_hook import AuditSink
from .db import ClientRow, Database, JobRow, RoundRow
from .deadlines import Deadlines, steady_clock
from .engine import round_codec
from .errors import ApiError
from .notify import Changes
from .phases import JobStatus, MemberState, Phase, RoundStatus
from .replay import Runtimes
from .rounds import RoundDriver
from .spool import Spool
from .store import (
    SeatView,
    job_position,
    open_round,
    round_task_blob,
    seat_view,
    stored_upload_digest,
)

__all__ = ["Core", "check_seat", "check_upload_round"]


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
              spool: Spool, monotonic: Callable[[], float] = steady_clock) -> Core:
        lock = threading.RLock()
        changes = Changes(lock)
        deadlines = Deadlines(db, clock, monotonic)
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

    def upload_limit(self, client: ClientRow, job_id: str, round_id: int, most: int) -> int:
        """The most bytes ``client``'s upload for round ``round_id`` may have, known before
        a byte of it is read: the size a valid upload of that round can reach
        (:func:`~fedforest_secure.protocol.upload_size_bound`), at most ``most``.

        An upload the round cannot take whatever its body is gets the answer
        :meth:`~server_app.runtime.ServerState.upload` would give it after reading it (the
        same 4xx): a non-member, a dropped member, a round not issued or not open, a phase
        that takes no uploads, a client outside the round. A member whose upload the round
        already counted may send it again (a retry): its body is read, up to that round's
        bound, to tell a retry from a different upload. ``upload`` checks everything again
        once the body is in."""
        with self.lock, self.db.connect() as conn:
            seat = seat_view(conn, client, job_id, round_id)
            check_seat(seat, round_id)
            prev = stored_upload_digest(conn, job_id, round_id, seat.client_index)
            if prev is None:
                check_upload_round(seat, round_id, counted=False)
            rt = self.runtimes.get(job_id)
            if rt.task is not None and rt.task.round_id == round_id:
                bound = upload_size_bound(rt.task, rt.words(), rt.config)
            elif prev is None:
                raise ApiError(409, "wrong_round", "the round is not open")
            else:  # a retry of a counted upload of an earlier round: that round's task
                blob = round_task_blob(conn, job_id, round_id)
                if not blob:
                    raise ApiError(410, "pruned", f"round {round_id}'s task was deleted by "
                                   "`fedforest server prune` (the job is finished)")
                task = Task.from_bytes(blob)
                codec = round_codec(rt.config, task)
                words = codec.words if codec is not None else layout_size(task.layout)
                bound = upload_size_bound(task, words, rt.config)
        return most if bound is None else min(most, bound)

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


def check_upload_round(seat: SeatView, round_id: int, *, counted: bool) -> None:
    """The checks on an upload for round ``round_id`` that its body does not change: the
    round is open, in its upload phase, and the client one of its participants. ``counted``:
    whether the round counted this very upload (said with a closed round's 409)."""
    if seat.round_status != RoundStatus.OPEN:
        raise ApiError(409, "round_closed", f"round {round_id} is closed", counted=counted)
    if seat.round_phase != Phase.UPLOAD:
        raise ApiError(409, "wrong_phase", f"round {round_id} is in phase {seat.round_phase}")
    if seat.client_index not in seat.participants():
        raise ApiError(403, "not_participant",
                       f"this client is not a participant of round {round_id}")
