"""The secure-aggregation requests of clients: what to send now, their messages, refusals.

The server relays: every accepted message is handed to the open round's
:class:`~server_app.secure_round.SecureRound` (whose checks apply; a rejection changes nothing),
stored with the round in the same step (so a restarted server rebuilds the round from it), and
the round moves on through its phases as soon as one is complete. A retried message the server
had already stored gets the same answer (``duplicate``); a different one is a conflict.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy.orm import Session

from fedforest_secure.errors import InvalidMessage

from .core import Core, check_seat
from .db import ClientRow, JobRow, MemberRow, RoundRow
from .errors import ApiError
from .jobs import JobRuntime
from .phases import JobStatus, MemberState, Phase, RoundStatus
from .rounds import secagg_step
from .secure_round import ACCUSE, REFUSE, SecureRound, parse_message, sender_of
from .store import (
    SeatView,
    add_message,
    insert_message,
    job_of,
    membership,
    printable,
    seat_view,
    stored_digest,
    stored_message,
)

__all__ = ["SecAggRelay"]


class SecAggRelay:
    """The ``/secagg`` requests of one server."""

    def __init__(self, core: Core) -> None:
        self.core = core
        #: ``(job, client id) -> client index`` of members an offer found (an index never
        #: changes), for :meth:`answered_and_waiting`
        self._index: dict[tuple[str, int], int] = {}

    def keep_only(self, job_ids: set[str]) -> None:
        """Drop what was kept of the members of every job but ``job_ids`` (those whose runtime
        is loaded; the others' stopped): a member whose index is dropped is asked
        :meth:`offer` again, which finds it anew."""
        for key in [k for k in self._index if k[0] not in job_ids]:
            del self._index[key]

    def answered_and_waiting(self, client: ClientRow, job_id: str) -> bool:
        """Whether this client answered the open phase of the job's open secure round and the
        phase still waits for others: then :meth:`offer` would say ``wait``. Read from memory
        without a query, so a long poll can wait without asking the database each time; only
        if the server's lock is free at once (a step holding it may be halfway through moving
        the round on): otherwise False, and the caller asks :meth:`offer`. A step that changes
        what the client waits for (a phase closing, a drop, the job ending) notifies the
        pollers, so a long poll that took its generation before asking never sleeps through
        it; a deadline that passed is applied by the periodic tick."""
        idx = self._index.get((job_id, client.id))
        if idx is None or not self.core.lock.acquire(blocking=False):
            return False
        try:
            rt = self.core.runtimes.peek(job_id)
            sr = rt.secure.current if rt is not None and rt.secure is not None else None
            if sr is None or idx not in sr.participants or idx in sr.dropped:
                return False
            return idx in sr.expected() and sr.server.has_answered(idx)
        finally:
            self.core.lock.release()

    def offer(self, client: ClientRow, job_id: str) -> dict[str, Any]:
        """What this client must do now in the open secure round (or what to wait for)."""
        with self.core.lock:
            self.core.tick_if_due(job_id)
            with self.core.db.connect() as conn:
                seat = seat_view(conn, client, job_id)
                if seat.member_state == MemberState.DROPPED:
                    return {"status": "dropped",
                            "detail": f"this client was dropped at round {seat.dropped_round}"}
                if seat.job_status in (JobStatus.DONE, JobStatus.FAILED):
                    return {"status": seat.job_status, "detail": seat.job_reason}
                if seat.member_state != MemberState.ACTIVE:
                    raise ApiError(409, "not_joined", "join the job first")
                if seat.job_status != JobStatus.RUNNING:
                    return {"status": "wait", "detail": "waiting for all clients to join"}
                bridge = self.core.runtimes.get(job_id).secure
            if bridge is None:
                raise ApiError(409, "not_secure", "this job does not use secure aggregation")
            sr = bridge.current
            if seat.round_status != RoundStatus.OPEN or seat.deadline_at is None or \
                    sr is None or sr.round_id != seat.round_id:
                return {"status": "wait", "detail": "no open round"}
            self._index[(job_id, client.id)] = seat.client_index  # until the job stops
            action, message = sr.action_for(seat.client_index)
            seq, head = self.core.audit.tip(job_id)
            return {"status": "task" if action != "wait" else "wait", "action": action,
                    "round_id": seat.round_id, "phase": sr.phase,
                    "task_digest": seat.task_digest, "message": message,
                    "deadline_in": self.core.deadlines.remaining_at(seat.deadline_at,
                                                                    seat.round_deadline_s),
                    "audit_seq": seq, "audit_head": head,
                    "detail": "" if action != "wait" else f"waiting for the other clients "
                                                          f"({sr.phase})"}

    def _secure_member(self, seat: SeatView, job_id: str, round_id: int, phase: Phase
                       ) -> tuple[JobRuntime, SecureRound, int]:
        check_seat(seat, round_id)
        rt = self.core.runtimes.get(job_id)
        if rt.secure is None:
            raise ApiError(409, "not_secure", "this job does not use secure aggregation")
        sr = rt.secure.current
        if seat.round_status != RoundStatus.OPEN or sr is None or sr.round_id != round_id:
            raise ApiError(409, "round_closed", f"round {round_id} is not open")
        if sr.phase is not phase:
            raise ApiError(409, "wrong_phase", f"round {round_id} is in phase {sr.phase}, "
                           f"not {phase}")
        if seat.client_index not in sr.participants:
            raise ApiError(403, "not_participant",
                           f"this client is not a participant of round {round_id}")
        return rt, sr, seat.client_index

    def message(self, client: ClientRow, job_id: str, round_id: int, kind: str,
                       body: bytes) -> dict[str, Any]:
        """Accept a client's ``advert`` / ``shares`` / ``unmask`` message (JSON).

        The checks read plain values (:func:`~server_app.store.seat_view`) and the message is
        stored by a Core ``INSERT`` in the request's transaction; the job's and the round's ORM
        rows are loaded only when the message completes the open phase."""
        try:
            phase, msg = parse_message(kind, body)
        except InvalidMessage as exc:
            raise ApiError(400, "invalid_message", str(exc)) from exc
        digest = hashlib.sha256(body).hexdigest()
        with self.core.lock:
            self.core.tick_if_due(job_id)
            with self.core.runtimes.guard(job_id), self.core.db.session() as sess:
                conn = sess.connection()
                seat = seat_view(conn, client, job_id, round_id)
                prev = stored_digest(conn, job_id, round_id, kind, seat.client_index)
                if prev is not None:  # a retry (e.g. the response was lost in a restart)
                    if prev != digest:
                        raise ApiError(409, "conflicting_message", f"a different {kind} message "
                                       f"for round {round_id} was already accepted")
                    return {"job_id": job_id, "round_id": round_id, "accepted": kind,
                            "duplicate": True}
                rt, sr, idx = self._secure_member(seat, job_id, round_id, phase)
                if sender_of(msg) != idx:
                    raise ApiError(403, "wrong_sender", "the message names another client")
                secagg_step(lambda: sr.receive(msg))
                insert_message(conn, job_id, round_id, kind, idx, body.decode(), digest)
                if sr.complete():  # what progress_secure would wait for
                    job = job_of(sess, job_id)
                    rr = sess.get(RoundRow, (job_id, round_id))
                    if rr is None:
                        raise RuntimeError(f"round {round_id} vanished")
                    self.core.driver.progress_secure(rt, sess, job, rr)
            self.core.changes.notify(job_id)
            return {"job_id": job_id, "round_id": round_id, "accepted": kind,
                    "duplicate": False}

    def refuse(self, client: ClientRow, job_id: str, round_id: int, reason: str,
               accused: int | None = None) -> dict[str, Any]:
        """A member of the open secure round refuses a request (a privacy rule); it leaves the
        job. ``reason`` is a code from :data:`~fedforest_secure.errors.REFUSAL_CODES` (the
        route validated it) and ``accused`` (code ``invalid_message`` only) the index of the
        peer whose relayed message did not authenticate: only these reach the job status and
        the audit log, which name the accused site (and the abort reason how many sites
        accused it). The same refusal sent again (its answer lost on the way) gets the same
        answer, ``duplicate`` true, whatever became of the round since (it closed, or the job
        ended): the server recorded it, and the site keeps its receipt. Open jobs, closed or
        other rounds, and clients outside the round's roster get a 4xx and change nothing; so
        does an accusation of a client that is not another participant of the round (400), and
        another refusal of a round by a site its refusal dropped (403)."""
        with self.core.lock:
            with self.core.runtimes.guard(job_id), self.core.db.session() as sess:
                job, member = membership(sess, client, job_id)
                again = _refused_before(sess, member, job_id, round_id, reason, accused)
                if not again:
                    self._take_refusal(sess, job, member, round_id, reason, accused)
            if not again:
                self.core.changes.notify(job_id)
            # the chain's tip, past this site's client_dropped entry: its receipt of the refusal
            seq, head = self.core.audit.tip(job_id)
            return {"job_id": job_id, "round_id": round_id, "recorded": True,
                    "duplicate": again, "audit_seq": seq, "audit_head": head}

    def _take_refusal(self, sess: Session, job: JobRow, member: MemberRow, round_id: int,
                      reason: str, accused: int | None) -> None:
        """Drop the refusing ``member`` from the job's open secure round ``round_id`` (4xx
        for a round that is not open, a client outside it, an accusation of a non-peer)."""
        job_id = job.id
        rt = self.core.runtimes.get(job_id)
        if rt.secure is None:
            raise ApiError(409, "not_secure", "this job does not use secure aggregation: "
                           "there is nothing to refuse")
        rr = sess.get(RoundRow, (job_id, job.current_round))
        sr = rt.secure.current
        if rr is None or rr.round_id != round_id or rr.status != RoundStatus.OPEN \
                or sr is None or sr.round_id != round_id:
            raise ApiError(409, "round_closed", f"round {round_id} is not the open round")
        idx = member.client_index
        if member.state != MemberState.ACTIVE or idx not in sr.participants \
                or idx in sr.dropped:
            raise ApiError(403, "not_participant",
                           f"this client is not a member of round {round_id}")
        if accused is not None and (accused == idx or accused not in sr.participants):
            raise ApiError(400, "invalid_accusation",
                           f"client {accused} is not another participant of round "
                           f"{round_id}")
        why = printable(reason, 300)
        sr.refused[idx] = why
        sr.dropped.add(idx)
        if stored_message(sess, job_id, round_id, REFUSE, idx) is None:
            add_message(sess, job_id, round_id, REFUSE, idx, why)
        said = f"refused: {why}"
        if accused is not None:
            sr.accused[idx] = accused
            if stored_message(sess, job_id, round_id, ACCUSE, idx) is None:
                add_message(sess, job_id, round_id, ACCUSE, idx, str(accused))
            said += f" ({rt.names[accused]}'s message did not authenticate)"
        self.core.driver.drop(rt, sess, job, [idx], job.current_round, reason=said,
                              accused=None if accused is None else rt.names[accused])
        self.core.driver.progress_secure(rt, sess, job, rr)


def _refused_before(sess: Session, member: MemberRow, job_id: str, round_id: int, reason: str,
                    accused: int | None) -> bool:
    """Whether the server recorded this very refusal already: ``member`` was dropped at round
    ``round_id`` for its refusal with code ``reason``, accusing ``accused`` (the stored
    refusal and accusation outlive the round's close)."""
    if member.state != MemberState.DROPPED or member.dropped_round != round_id:
        return False
    idx = member.client_index
    refusal = stored_message(sess, job_id, round_id, REFUSE, idx)
    if refusal is None or refusal.body != printable(reason, 300):
        return False
    accusation = stored_message(sess, job_id, round_id, ACCUSE, idx)
    return (None if accusation is None else accusation.body) == (
        None if accused is None else str(accused))
