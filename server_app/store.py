"""The queries the server runs on its database (rows in :mod:`server_app.db`).

Each function takes the caller's :class:`~sqlalchemy.orm.Session`, so one request's reads and
writes share one transaction (committed or rolled back as a whole by
:meth:`Database.session <server_app.db.Database.session>`).
"""

from __future__ import annotations

import hashlib
import json
from typing import NamedTuple

from sqlalchemy import Connection, Executable, bindparam, delete, func, insert, select, update
from sqlalchemy.orm import Session, undefer

from .auth import REVOKED
from .db import ClientRow, JobRow, MemberRow, RoundRow, SecAggMessageRow, UploadRow
from .errors import ApiError
from .phases import JobStatus, MemberState, RoundStatus

__all__ = [
    "IDENTITY",
    "IDENTITY_CERT",
    "printable",
    "add_dropped",
    "add_message",
    "clear_round_messages",
    "clear_summables",
    "client_names",
    "contributors",
    "dropped_members",
    "identity_certs",
    "identity_keys",
    "job_of",
    "job_position",
    "member_at",
    "member_indices",
    "members_of",
    "membership",
    "open_round",
    "open_round_deadline",
    "participants",
    "revoked_members",
    "round_dropped",
    "round_messages",
    "rounds_of",
    "running_job_ids",
    "SeatView",
    "seat_view",
    "stored_digest",
    "stored_message",
    "stored_upload_digest",
    "insert_message",
    "insert_upload",
    "round_task_blob",
    "upload_summable",
    "uploads_of",
    "Reader",
]

#: What the plain-value queries run on: a request's ORM session, or a Core connection (no ORM
#: objects, no unit of work: the hot paths of polls, messages and uploads)
Reader = Session | Connection

#: ``SecAggMessageRow.stage`` of a client's long-term identity key (``round_id = -1``)
IDENTITY = "identity"
#: the message stage of a client's identity certification (its TLS certificate and signature)
IDENTITY_CERT = "identity-cert"
#: stage of the message (round -1) in which an invited site says why it declines the job
DECLINED = "declined"


def printable(text: str, limit: int | None = None) -> str:
    """``text`` (cut to ``limit`` characters) with every control character but newline and tab
    replaced by U+FFFD: a client's words stored in a text column (PostgreSQL's text cannot
    hold NUL; no backend should store terminal escapes from a client)."""
    cut = text if limit is None else text[:limit]
    return "".join(c if c.isprintable() or c in "\n\t" else "\ufffd" for c in cut)


def membership(sess: Session, client: ClientRow, job_id: str) -> tuple[JobRow, MemberRow]:
    """The job and the client's membership; one 404 for "no such job" and "not your job"
    (no cross-job probing)."""
    job = sess.get(JobRow, job_id)
    member = sess.get(MemberRow, (job_id, client.id)) if job is not None else None
    if job is None or member is None:
        raise ApiError(404, "unknown_job", f"no job {job_id!r} for this client")
    return job, member


class SeatView(NamedTuple):
    """What a client's poll of a job reads: its membership and the job's current round."""

    job_status: str
    job_reason: str
    current_round: int
    round_deadline_s: float
    client_index: int
    member_state: str
    dropped_round: int | None
    #: the round asked for (by default the job's current round; None if it was not issued):
    #: id, status, task digest and the stored deadline of its open phase
    round_id: int | None
    round_status: str | None
    task_digest: str | None
    deadline_at: float | None
    #: the round's open phase, its encoding and the client indices it asked (JSON list)
    round_phase: str | None = None
    round_encoding: str | None = None
    participants_json: str | None = None

    def participants(self) -> list[int]:
        """The client indices the round asked (:func:`participants` of its row)."""
        return [int(i) for i in json.loads(self.participants_json or "[]")]


def _seat_query(which: object) -> Executable:
    return (select(JobRow.status, JobRow.reason, JobRow.current_round, JobRow.round_deadline_s,
                   MemberRow.client_index, MemberRow.state, MemberRow.dropped_round,
                   RoundRow.round_id, RoundRow.status, RoundRow.task_digest,
                   RoundRow.deadline_at, RoundRow.phase, RoundRow.encoding,
                   RoundRow.participants_json)
            .join(MemberRow, (MemberRow.job_id == JobRow.id)
                  & (MemberRow.client_id == bindparam("client_id")))
            .outerjoin(RoundRow, (RoundRow.job_id == JobRow.id) & (RoundRow.round_id == which))
            .where(JobRow.id == bindparam("job_id")))


#: :func:`seat_view`'s two queries (the job's current round, a given round), built once: the
#: statement objects keep their compiled form and cache key, so a poll binds three values
#: instead of building, hashing and looking up an expression tree
_SEAT_CURRENT = _seat_query(JobRow.current_round)
_SEAT_ROUND = _seat_query(bindparam("round_id"))


def seat_view(sess: Reader, client: ClientRow, job_id: str, round_id: int | None = None
              ) -> SeatView:
    """:func:`membership` and a round (``round_id``, or the job's current round) as plain
    values, in one query without ORM objects (every poll and message of every client asks
    it); the same 404."""
    params: dict[str, object] = {"client_id": client.id, "job_id": job_id}
    if round_id is not None:
        params["round_id"] = round_id
    row = sess.execute(_SEAT_CURRENT if round_id is None else _SEAT_ROUND, params).first()
    if row is None:
        raise ApiError(404, "unknown_job", f"no job {job_id!r} for this client")
    (status, reason, current, round_deadline_s, index, state, dropped_round, rid, round_status,
     task_digest, deadline_at, phase, encoding, participants_json) = row
    return SeatView(job_status=status, job_reason=reason, current_round=current,
                    round_deadline_s=round_deadline_s, client_index=index, member_state=state,
                    dropped_round=dropped_round, round_id=rid, round_status=round_status,
                    task_digest=task_digest, deadline_at=deadline_at, round_phase=phase,
                    round_encoding=encoding, participants_json=participants_json)


def job_of(sess: Session, job_id: str) -> JobRow:
    """A job the server is acting on (it cannot vanish: jobs are never deleted)."""
    job = sess.get(JobRow, job_id)
    if job is None:
        raise RuntimeError(f"job {job_id!r} vanished")
    return job


def open_round(sess: Session, job_id: str) -> tuple[JobRow, RoundRow] | None:
    """The running job and its open round, or None when there is nothing to act on."""
    job = job_of(sess, job_id)
    rr = sess.get(RoundRow, (job_id, job.current_round))
    if job.status != JobStatus.RUNNING or rr is None or rr.status != RoundStatus.OPEN:
        return None
    return job, rr


def open_round_deadline(sess: Session, job_id: str) -> tuple[float, float] | None:
    """``(round deadline in seconds, stored deadline of the open phase)`` of a running job's
    open round (one small query), or None."""
    row = sess.execute(
        select(JobRow.status, JobRow.round_deadline_s, RoundRow.status, RoundRow.deadline_at)
        .join(RoundRow, (RoundRow.job_id == JobRow.id)
              & (RoundRow.round_id == JobRow.current_round))
        .where(JobRow.id == job_id)).first()
    if row is None or row[0] != JobStatus.RUNNING or row[2] != RoundStatus.OPEN:
        return None
    return float(row[1]), float(row[3])


def running_job_ids(sess: Session) -> list[str]:
    return list(sess.scalars(select(JobRow.id).where(JobRow.status == JobStatus.RUNNING)))


def job_position(sess: Session, job_id: str) -> tuple[str, int] | None:
    """``(status, current round)`` of a job, or None if there is no such job."""
    row = sess.execute(select(JobRow.status, JobRow.current_round)
                       .where(JobRow.id == job_id)).first()
    return None if row is None else (str(row[0]), int(row[1]))


def members_of(sess: Session, job_id: str) -> list[MemberRow]:
    return list(sess.scalars(select(MemberRow).where(MemberRow.job_id == job_id)))


def member_at(sess: Session, job_id: str, idx: int) -> MemberRow | None:
    return sess.scalar(select(MemberRow).where(MemberRow.job_id == job_id,
                                               MemberRow.client_index == idx))


def member_indices(sess: Session, job_id: str, state: MemberState | None = None) -> list[int]:
    """The client indices of the job's members (in ``state``, if given), sorted."""
    query = select(MemberRow.client_index).where(MemberRow.job_id == job_id)
    if state is not None:
        query = query.where(MemberRow.state == state)
    return sorted(sess.scalars(query))


def dropped_members(sess: Session, job_id: str) -> set[int]:
    return set(member_indices(sess, job_id, MemberState.DROPPED))


def client_names(sess: Session, job_id: str) -> dict[int, str]:
    """``{client index: client name}`` of the job's members."""
    rows = sess.execute(select(MemberRow.client_index, ClientRow.name)
                        .join(ClientRow, ClientRow.id == MemberRow.client_id)
                        .where(MemberRow.job_id == job_id))
    return {int(idx): str(name) for idx, name in rows}


def revoked_members(sess: Session, job_id: str) -> set[int]:
    """The client indices of the job's members whose clients are revoked (no token of theirs
    authenticates: :func:`~server_app.auth.revoke_client`)."""
    return {int(idx) for idx in sess.scalars(
        select(MemberRow.client_index).join(ClientRow, ClientRow.id == MemberRow.client_id)
        .where(MemberRow.job_id == job_id, ClientRow.token_hash == REVOKED))}


def rounds_of(sess: Session, job_id: str) -> list[RoundRow]:
    return list(sess.scalars(select(RoundRow).where(RoundRow.job_id == job_id)
                             .order_by(RoundRow.round_id)))


def closed_rounds(sess: Session, job_id: str) -> int:
    """How many rounds of the job closed (rows kept until the job is pruned)."""
    return int(sess.scalar(select(func.count()).select_from(RoundRow).where(
        RoundRow.job_id == job_id, RoundRow.status == RoundStatus.CLOSED)) or 0)


def participants(rr: RoundRow) -> list[int]:
    """The client indices the round asked."""
    return [int(i) for i in json.loads(rr.participants_json)]


def round_dropped(rr: RoundRow) -> list[int]:
    """The clients dropped during the round."""
    return [int(i) for i in json.loads(rr.dropped_json)]


def add_dropped(rr: RoundRow, dropped: list[int]) -> None:
    """Record more dropped clients on a round (a sorted JSON list, no duplicates)."""
    rr.dropped_json = json.dumps(sorted(set(round_dropped(rr)) | set(dropped)))


def uploads_of(sess: Session, rr: RoundRow) -> dict[int, UploadRow]:
    """The round's upload rows with their disclosed items (one query, not one per row)."""
    return {u.client_index: u for u in sess.scalars(
        select(UploadRow).options(undefer(UploadRow.disclosed)).where(
            UploadRow.job_id == rr.job_id, UploadRow.round_id == rr.round_id))}


def clear_summables(sess: Session, rr: RoundRow) -> None:
    """Forget the round's per-client vectors (one ``UPDATE``; its sum is out)."""
    sess.execute(update(UploadRow).where(UploadRow.job_id == rr.job_id,
                                         UploadRow.round_id == rr.round_id)
                 .values(summable=None).execution_options(synchronize_session=False))


def contributors(sess: Session, rr: RoundRow) -> list[int]:
    """The clients whose upload the round counted, sorted."""
    return sorted(sess.scalars(select(UploadRow.client_index).where(
        UploadRow.job_id == rr.job_id, UploadRow.round_id == rr.round_id)))


def upload_summable(sess: Session, job_id: str, round_id: int, idx: int) -> bytes | None:
    return sess.scalar(select(UploadRow.summable).where(
        UploadRow.job_id == job_id, UploadRow.round_id == round_id,
        UploadRow.client_index == idx))


def add_message(sess: Session, job_id: str, round_id: int, stage: str, idx: int, body: str,
                digest: str | None = None) -> None:
    """Store one accepted secure-aggregation message (digest: SHA-256 of ``body`` by default)."""
    sess.add(SecAggMessageRow(job_id=job_id, round_id=round_id, stage=stage, client_index=idx,
                              body=body,
                              digest=digest or hashlib.sha256(body.encode()).hexdigest()))


def declines_of(sess: Session, job_id: str) -> dict[int, str]:
    """``{client index: reason}`` of the job's invited sites that declined it."""
    rows = sess.execute(select(SecAggMessageRow.client_index, SecAggMessageRow.body).where(
        SecAggMessageRow.job_id == job_id, SecAggMessageRow.round_id == -1,
        SecAggMessageRow.stage == DECLINED))
    return {int(idx): str(body) for idx, body in rows}


def stored_message(sess: Session, job_id: str, round_id: int, stage: str, idx: int
                   ) -> SecAggMessageRow | None:
    return sess.get(SecAggMessageRow, (job_id, round_id, stage, idx))


#: :func:`stored_digest`'s query, built once (asked by every secure-aggregation message)
_STORED_DIGEST = select(SecAggMessageRow.digest).where(
    SecAggMessageRow.job_id == bindparam("job_id"),
    SecAggMessageRow.round_id == bindparam("round_id"),
    SecAggMessageRow.stage == bindparam("stage"),
    SecAggMessageRow.client_index == bindparam("idx"))


def stored_digest(sess: Reader, job_id: str, round_id: int, stage: str, idx: int
                  ) -> str | None:
    """The digest of the stored message (one column, no ORM object), or None."""
    return sess.scalar(_STORED_DIGEST, {"job_id": job_id, "round_id": round_id,
                                        "stage": stage, "idx": idx})


#: the Core statements of the hot paths, built once (their compiled form is cached with them)
_INSERT_MESSAGE = insert(SecAggMessageRow)
_INSERT_UPLOAD = insert(UploadRow)
_UPLOAD_DIGEST = select(UploadRow.digest).where(
    UploadRow.job_id == bindparam("job_id"), UploadRow.round_id == bindparam("round_id"),
    UploadRow.client_index == bindparam("idx"))
_TASK_BLOB = select(RoundRow.task_blob).where(RoundRow.job_id == bindparam("job_id"),
                                              RoundRow.round_id == bindparam("round_id"))


def insert_message(conn: Connection, job_id: str, round_id: int, stage: str, idx: int,
                   body: str, digest: str) -> None:
    """:func:`add_message` as one Core ``INSERT`` on the request's connection (no ORM object
    and no flush): the row is in the request's transaction, committed with it."""
    conn.execute(_INSERT_MESSAGE, {"job_id": job_id, "round_id": round_id, "stage": stage,
                                   "client_index": idx, "body": body, "digest": digest})


def insert_upload(conn: Connection, job_id: str, round_id: int, idx: int, digest: str,
                  received_at: float, summable: bytes | None, disclosed: bytes | None) -> None:
    """One upload row as a Core ``INSERT`` in the request's transaction."""
    conn.execute(_INSERT_UPLOAD, {"job_id": job_id, "round_id": round_id, "client_index": idx,
                                  "digest": digest, "received_at": received_at,
                                  "summable": summable, "disclosed": disclosed})


def stored_upload_digest(sess: Reader, job_id: str, round_id: int, idx: int) -> str | None:
    """The digest of the upload the round counted from client ``idx``, or None."""
    return sess.scalar(_UPLOAD_DIGEST, {"job_id": job_id, "round_id": round_id, "idx": idx})


def round_task_blob(sess: Reader, job_id: str, round_id: int) -> bytes | None:
    """The task bytes a round was issued with, or None if it was not issued."""
    return sess.scalar(_TASK_BLOB, {"job_id": job_id, "round_id": round_id})


def round_messages(sess: Session, job_id: str, round_id: int) -> dict[str, dict[int, str]]:
    """``{stage: {client index: body}}`` of the messages stored with a round."""
    out: dict[str, dict[int, str]] = {}
    for m in sess.scalars(select(SecAggMessageRow).where(
            SecAggMessageRow.job_id == job_id, SecAggMessageRow.round_id == round_id)):
        out.setdefault(m.stage, {})[int(m.client_index)] = m.body
    return out


def clear_round_messages(sess: Session, job_id: str, round_id: int,
                         keep: tuple[str, ...] = ()) -> None:
    """Delete the messages stored with a round, but those of the stages in ``keep``."""
    sess.execute(delete(SecAggMessageRow).where(
        SecAggMessageRow.job_id == job_id, SecAggMessageRow.round_id == round_id,
        SecAggMessageRow.stage.not_in(keep)))


def identity_keys(sess: Session, job_id: str) -> dict[int, str]:
    """The job's identity directory ``{client index: Ed25519 verify key hex}``."""
    return {int(i): b for i, b in round_messages(sess, job_id, -1).get(IDENTITY, {}).items()}


def identity_certs(sess: Session, job_id: str) -> dict[int, str]:
    """The identity certifications ``{client index: {"cert": PEM, "sig": hex} JSON}``."""
    return {int(i): b for i, b in
            round_messages(sess, job_id, -1).get(IDENTITY_CERT, {}).items()}
