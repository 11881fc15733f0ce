"""The round state machine on the server: counting uploads, moving through the phases of
:mod:`server_app.phases`, deadlines and drops, closing a round into the coordinator, issuing
the next.

Every method runs inside the caller's transaction (a :class:`~sqlalchemy.orm.Session`) under the
server's lock, and changes the job's rows and its :class:`~server_app.jobs.JobRuntime` together.
A plain round has one phase, ``upload``, and closes when every participant that was not dropped
has uploaded. A secure round moves through the phases of its
:class:`~server_app.secure_round.SecureRound`; each phase ends when every client it expects has
answered, or at its deadline (then the missing clients are dropped and the phase closes with
whoever answered); each phase gets the full round deadline.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from fedforest_secure.errors import (
    AbortedRound,
    FedForestError,
    InvalidMessage,
    OverflowRisk,
    ProtocolError,
    SchemaError,
    SumOutOfRange,
)
from fedforest_secure.model import ForestModel
from fedforest_secure.protocol import pack, seal, unpack
from fedforest_secure.protocol.uploads import ParsedUpload
from fedforest_secure.secagg import KeyMismatch, MaskedUpload, parse

from .audit_hook import AuditSink, record_events, record_round
from .db import JobRow, RoundRow, UploadRow
from .deadlines import Deadlines
from .engine import uses_ring
from .errors import ApiError
from .jobs import JobRuntime
from .jobspec import stored_schema_text
from .logs import event
from .notify import Changes
from .phases import JobStatus, MemberState, Phase, RoundStatus
from .secure_round import ACCUSE, REFUSE, SecureRound
from .spool import Spool
from .store import (
    add_dropped,
    add_message,
    clear_round_messages,
    clear_summables,
    closed_rounds,
    contributors,
    identity_keys,
    insert_message,
    insert_upload,
    member_at,
    member_indices,
    participants,
    printable,
    round_dropped,
    uploads_of,
)

__all__ = ["RoundDriver", "secagg_step"]

_T = TypeVar("_T")


def secagg_step(fn: Callable[[], None]) -> None:
    """Run one secure-aggregation step; map its rejections to 4xx (nothing changes on error).
    An :class:`AbortedRound` passes through: the round cannot go on."""
    try:
        fn()
    except InvalidMessage as exc:
        raise ApiError(400, "invalid_message", str(exc)) from exc
    except AbortedRound:
        raise
    except ProtocolError as exc:
        raise ApiError(409, "protocol_error", str(exc)) from exc


def _closing(step: Callable[[], _T], job_id: str, round_id: int) -> _T:
    """Run ``step``, which closes a phase of a secure round. An exception the
    secure-aggregation server does not raise by design (a message its checks let through, a
    defect) becomes an :class:`AbortedRound`: the job fails once with the reason, instead of
    the step failing again on every request and deadline tick. A :class:`MemoryError` passes
    through (no defect: the request fails, the next tick tries again)."""
    try:
        return step()
    except (AbortedRound, MemoryError):
        raise
    except Exception as exc:
        event("close_error", logging.ERROR, job=job_id, round=round_id, exc=exc)
        raise AbortedRound(f"the server failed to close the phase ({type(exc).__name__}: "
                           f"{exc})") from exc


def _disclosed(upload: UploadRow) -> dict[str, np.ndarray]:
    """The items a client disclosed with its upload."""
    return unpack(upload.disclosed)[1] if upload.disclosed else {}


def _who_left(names: dict[int, str], refused: dict[int, str], dropped: set[int],
              accused: dict[int, int]) -> str:
    """The sites an aborted secure round lost, by name: ``client-1 refused (stopped);
    client-2 refused (invalid_message, accusing client-0); client-3 and client-4 missed the
    deadline`` (a refusal drops a site too: named once)."""
    said = [f"{names[k]} refused ({why}"
            + (f", accusing {names[accused[k]]})" if k in accused else ")")
            for k, why in refused.items()]
    late = [names[k] for k in sorted(dropped) if k not in refused]
    if late:
        listed = late[0] if len(late) == 1 else ", ".join(late[:-1]) + " and " + late[-1]
        said.append(f"{listed} missed the deadline")
    return "; ".join(said)


def _accusations(names: dict[int, str], accused: dict[int, int]) -> str:
    """Whom the refusing sites accused, most accused first: ``accused by the sites that
    refused: client-0 (3 sites), client-2 (1 site)`` ("" if none did): the site an operator
    may exclude before running the job again (threat_model.md §2.4)."""
    if not accused:
        return ""
    counts = Counter(accused.values())
    listed = ", ".join(f"{names[v]} ({n} site{'s' if n != 1 else ''})"
                       for v, n in sorted(counts.items(), key=lambda vn: (-vn[1], vn[0])))
    return f"; accused by the sites that refused: {listed}"


class RoundDriver:
    """Moves the jobs' rounds along; holds no state of its own beyond the spool sweep flag."""

    def __init__(self, audit: AuditSink, clock: Callable[[], float], changes: Changes,
                 deadlines: Deadlines, spool: Spool) -> None:
        self.audit = audit
        self.clock = clock
        self.changes = changes
        self.deadlines = deadlines
        self.spool = spool
        #: a round closed since the last sweep: its spooled uploads can go
        self.sweep_due = True

    # ------------------------------------------------------------------ uploads
    def add_plain(self, sess: Session, rr: RoundRow, idx: int, up: ParsedUpload) -> None:
        """Count a plain upload: fixed-point vectors into the running sum now (memory
        O(vector)), float64 vectors kept to be added in client order at the close."""
        disclosed = pack({"type": "disclosed"}, up.disclosed) if up.disclosed else None
        if rr.encoding == "uint64":
            if rr.running_sum is None:
                total = up.summable.copy()
            else:
                total = np.frombuffer(rr.running_sum, dtype="<u8").copy()
                total += up.summable  # wraps mod 2^64 by design
            rr.running_sum = total.astype("<u8").tobytes()
            summable = None
        else:
            summable = up.summable.astype("<f8").tobytes()
        sess.add(UploadRow(job_id=rr.job_id, round_id=rr.round_id, client_index=idx,
                           digest=up.digest, received_at=self.clock(), summable=summable,
                           disclosed=disclosed))

    def add_masked(self, rt: JobRuntime, conn: Connection, job_id: str, round_id: int, idx: int,
                   up: ParsedUpload) -> SecureRound:
        """Add a masked upload into the secure round's running sum and keep it (spool or
        database) until the round closes, so a restarted server can add it again. The rows are
        Core ``INSERT`` s in the caller's transaction; the caller moves the round on (with
        :meth:`progress_secure`) when the returned round is complete."""
        sr = rt.secure.current if rt.secure is not None else None
        if sr is None or sr.round_id != round_id or sr.phase is not Phase.UPLOAD:
            raise ApiError(409, "wrong_phase", f"round {round_id} is not collecting uploads")
        if up.secagg is None:
            raise ApiError(400, "malformed_upload", "a masked upload needs its secagg header")
        try:
            header = parse(MaskedUpload, up.secagg)
        except InvalidMessage as exc:
            raise ApiError(400, "invalid_message", str(exc)) from exc
        if header.sender != idx:
            raise ApiError(403, "wrong_sender", "the upload header names another client")
        secagg_step(lambda: sr.server.receive_upload(header, up.summable))
        disclosed = pack({"type": "disclosed"}, up.disclosed) if up.disclosed else None
        vec = up.summable.astype("<u8", copy=False)
        spooled = self.spool.root is not None
        if spooled:
            self.spool.write(job_id, round_id, idx, vec)
        insert_upload(conn, job_id, round_id, idx, up.digest, self.clock(),
                      None if spooled else vec.tobytes(), disclosed)
        insert_message(conn, job_id, round_id, Phase.UPLOAD.value, idx, up.secagg,
                       hashlib.sha256(up.secagg.encode()).hexdigest())
        return sr

    # ------------------------------------------------------------------ moving on
    def progress(self, rt: JobRuntime, sess: Session, job: JobRow, rr: RoundRow) -> None:
        """Close what is complete: every phase of a secure round whose clients all answered;
        a plain round once every participant that was not dropped has uploaded."""
        if rt.secure is not None:
            self.progress_secure(rt, sess, job, rr)
            return
        expected = set(participants(rr)) - set(round_dropped(rr))
        got = contributors(sess, rr)
        if expected <= set(got):
            self.close(rt, sess, job, rr, got)

    def progress_secure(self, rt: JobRuntime, sess: Session, job: JobRow, rr: RoundRow, *,
                        force: bool = False) -> None:
        """Advance the open secure round through every phase that is complete (or, with
        ``force``, close the current phase with whoever answered); finish it at the end."""
        bridge = rt.secure
        sr = bridge.current if bridge is not None else None
        if bridge is None or sr is None or sr.round_id != rr.round_id \
                or rr.status != RoundStatus.OPEN:
            return
        phase = sr.phase
        try:
            while True:
                phase = sr.phase
                if not force and not sr.complete():
                    return
                force = False
                sr.phase_closed(phase)
                if sr.accused:
                    # a site refused a peer's message that did not authenticate: the round
                    # stops here, so a site sending chosen peers shares they cannot use does
                    # not pick which honest sites leave a job that goes on (threat_model.md
                    # §2.4; a malicious server drops whom it likes, §2.2)
                    raise AbortedRound("a site refused the round over a peer's message that "
                                       "did not authenticate")
                kept = sr.server.uploaded
                if phase is Phase.UPLOAD and len(kept) < job.min_clients:
                    # the job's own floor, which may lie above the threshold t: no sum over
                    # fewer sites is released (nobody is asked for unmasking shares)
                    raise AbortedRound(f"only {len(kept)} masked uploads, fewer than the job's "
                                       f"min_clients = {job.min_clients}")
                if rt.plan.after(phase) is None:  # the last phase: the round's sum comes out
                    ring = _closing(sr.finish, job.id, rr.round_id)
                    if sr.server.corrupt_shares:  # routed around: the sum is exact, say who
                        event("corrupt_shares", logging.WARNING, job=job.id, round=rr.round_id,
                              report=sr.server.corrupt_report(rt.names))
                    bridge.finished(sr)
                    survivors = sorted(int(u) for u in (sr.request.survivors
                                                        if sr.request else ()))
                    self.close(rt, sess, job, rr, survivors, ring=ring, secure=sr)
                    return
                rr.phase = _closing(sr.advance, job.id, rr.round_id)
                self.changes.touch(job.id)
                rr.deadline_at = self.deadlines.opened(job.id, job.round_deadline_s)
        except AbortedRound as exc:
            bridge.current = None
            who = _who_left(rt.names, sr.refused, sr.dropped, sr.accused)
            if isinstance(exc, KeyMismatch) and exc.senders:
                who += ("; " if who else "") + "sites whose shares may be corrupt: " + ", ".join(
                    rt.names[i] for i in sorted(exc.senders))
            self.fail(sess, job, f"round {rr.round_id}: secure aggregation aborted in phase "
                      f"{phase}: {exc}" + (f" [{who}]" if who else "")
                      + _accusations(rt.names, sr.accused)
                      + "; no partial sum was released", rr, rt)

    def deadline(self, rt: JobRuntime, sess: Session, job: JobRow, rr: RoundRow) -> None:
        """The open phase's deadline passed: drop who did not answer and go on without them
        (a plain round closes if at least ``min_clients`` uploaded, else the job fails)."""
        if rt.secure is not None:
            sr = rt.secure.current
            if sr is None or sr.round_id != rr.round_id:
                return
            late = sorted(sr.missing())
            dropped = self.drop(rt, sess, job, late, rr.round_id,
                                reason=f"missed the round deadline (phase {sr.phase})")
            sr.dropped.update(late)
            add_dropped(rr, dropped)
            self.progress_secure(rt, sess, job, rr, force=True)
            return
        got = contributors(sess, rr)
        late = sorted(set(participants(rr)) - set(got))
        add_dropped(rr, self.drop(rt, sess, job, late, rr.round_id))
        if len(got) >= job.min_clients:
            self.close(rt, sess, job, rr, got)
        else:
            self.fail(sess, job, f"round {rr.round_id}: only {len(got)} of the required "
                      f"{job.min_clients} clients answered before the deadline; training "
                      "stopped and no partial sum was released", rr, rt)

    def drop(self, rt: JobRuntime, sess: Session, job: JobRow, indices: list[int],
             round_id: int, reason: str = "missed the round deadline", *,
             accused: str | None = None) -> list[int]:
        """Drop members from the job (audited, with the site a refusing member ``accused``
        of a message that did not authenticate, if any); returns those that were not dropped
        before."""
        out = []
        for idx in indices:
            member = member_at(sess, job.id, idx)
            if member is None or member.state == MemberState.DROPPED:
                continue
            member.state = MemberState.DROPPED
            member.dropped_round = round_id
            out.append(idx)
            self.changes.touch(job.id)
            payload = {"client": rt.names[idx], "round_id": round_id, "reason": reason}
            if accused is not None:
                payload["accused"] = accused
            self.audit.within(sess).append(job.id, "client_dropped", payload)
            event("drop", logging.WARNING, job=job.id, client=rt.names[idx], index=idx,
                  round=round_id, reason=reason)
        return out

    def fail(self, sess: Session, job: JobRow, reason: str, rr: RoundRow | None,
             rt: JobRuntime | None, *, ended: bool = False) -> None:
        """Stop the job with ``reason``, audited as the abort of ``rr`` if given, else as the
        job's failure between rounds; with ``ended`` as both, the abort first (a job stopped
        from outside mid-round: its sites hold receipts of the round's uploads)."""
        self.changes.touch(job.id)
        reason = printable(reason)
        job.status = JobStatus.FAILED
        job.reason = reason
        if rt is not None:
            rt.release()  # a stopped job grows no more trees, and its open round is over
        audit = self.audit.within(sess)
        if rr is not None:
            audit.append(job.id, "round_aborted", {"round_id": rr.round_id, "reason": reason})
        if rr is None or ended:
            audit.append(job.id, "job_failed", {"reason": reason})
        event("job_failed", logging.ERROR, job=job.id, reason=reason)

    # ------------------------------------------------------------------ closing
    def close(self, rt: JobRuntime, sess: Session, job: JobRow, rr: RoundRow,
              contributors: list[int], *, ring: np.ndarray | None = None,
              secure: SecureRound | None = None) -> None:
        """Hand the round's sum to the coordinator, audit it, and issue the next round. An
        aggregate the coordinator rejects, or any exception it raises on it, fails the job
        once, cleanly, with the reason (never a 5xx on every retry and tick)."""
        started = secure.phase_opened if secure is not None else time.perf_counter()
        task = rt.task
        if task is None or task.round_id != rr.round_id:
            raise RuntimeError("runtime out of step with the database")
        uploads = uploads_of(sess, rr)
        if set(contributors) - set(uploads):
            raise RuntimeError("a survivor of the secure round has no upload row")
        problem = None
        try:
            total = self._total(rt, rr, contributors, uploads, ring)
        except SumOutOfRange as exc:  # a site sent values outside the codec's range
            total, problem = np.zeros(0), str(exc)
        except OverflowRisk as exc:  # a packed sum whose count lane wrapped
            total, problem = np.zeros(0), f"the aggregate could not be decoded ({exc})"
        disclosed = {idx: _disclosed(uploads[idx]) for idx in contributors}
        coord = rt.coordinator()
        if problem is None and not np.isfinite(total).all():
            problem = "the aggregate has non-finite entries"
        if problem is None:
            try:
                coord.submit(rr.round_id, total, disclosed=disclosed,
                             participants=list(contributors))
            except (FedForestError, ValueError, ArithmeticError) as exc:
                problem = f"the aggregate was rejected ({type(exc).__name__}: {exc})"
            except MemoryError:  # no defect: the request fails, the next tick tries again
                raise
            except Exception as exc:  # a defect of the coordinator: the job stops here once
                event("close_error", logging.ERROR, job=job.id, round=rr.round_id, exc=exc)
                problem = (f"the coordinator failed on the round's aggregate "
                           f"({type(exc).__name__}: {exc})")
        clear_summables(sess, rr)
        rr.running_sum = None
        if problem is not None:
            self.fail(sess, job, f"round {rr.round_id}: {problem}; training stopped and no "
                      "aggregate was released", rr, rt)
            return
        rr.status = RoundStatus.CLOSED
        rr.closed_at = self.clock()
        rr.aggregate = total.astype("<f8").tobytes()
        rr.contributors_json = json.dumps(contributors)
        rr.disclosed_blob = pack({"type": "disclosed_all"}, {
            f"{idx}/{name}": arr for idx, items in disclosed.items()
            for name, arr in items.items()})
        self.sweep_due = True
        if secure is not None:  # the round's relay state is not needed once its sum is out;
            # its refusals stay, so a refusal sent again is answered as the recorded one
            clear_round_messages(sess, job.id, rr.round_id, keep=(REFUSE, ACCUSE))
        audit = self.audit.within(sess)
        record_round(audit, rt.job_id, rt.names, task=task, task_digest=rr.task_digest,
                     encoding=rr.encoding, contributors=contributors,
                     uploads={i: uploads[i].digest for i in contributors}, total=total,
                     disclosed=disclosed, masked=rt.secure is not None, secure=secure)
        spends, decisions = coord.pop_events()
        record_events(audit, rt.job_id, rr.round_id, spends, decisions)
        # dropped: the sites dropped during the round, also one dropped after its upload
        # (which the sum holds, so it counts among the clients too)
        dropped = set(round_dropped(rr)) | (set(participants(rr)) - set(contributors))
        if secure is not None:
            dropped |= secure.dropped
        event("round", job=job.id, round=rr.round_id, level=rr.level, kind=rr.kind,
              clients=len(contributors), dropped=len(dropped),
              seconds=rr.closed_at - rr.issued_at,
              phase_s=secure.timeline() if secure is not None else None,
              close_s=time.perf_counter() - started)
        self.issue_next(rt, sess, job)

    def _total(self, rt: JobRuntime, rr: RoundRow, contributors: list[int],
               uploads: dict[int, UploadRow], ring: np.ndarray | None) -> np.ndarray:
        """The round's sum as float64: a ring sum decoded, or the float64 uploads added in
        client order (bit-identical to the in-process sum)."""
        if ring is None and rr.encoding == "uint64":
            ring = (np.frombuffer(rr.running_sum, dtype="<u8").copy() if rr.running_sum
                    else np.zeros(0, dtype=np.uint64))
        if ring is not None:
            if rt.codec is None:
                raise RuntimeError("a ring sum in a round without a codec")
            # checked: an entry no len(contributors) honest encodings can sum to is refused
            return np.asarray(rt.codec.decode_sum(ring, len(contributors)), dtype=np.float64)
        total: np.ndarray | None = None
        for idx in contributors:
            vec = np.frombuffer(uploads[idx].summable or b"", dtype="<f8")
            with np.errstate(over="ignore", invalid="ignore"):  # checked by the caller
                total = vec.copy() if total is None else total + vec
        if total is None:
            raise RuntimeError("closing a round without uploads")
        return total

    # ------------------------------------------------------------------ issuing
    def issue_next(self, rt: JobRuntime, sess: Session, job: JobRow) -> None:
        """Open the coordinator's next round for the active members, or finish the job."""
        self.changes.touch(job.id)
        active = member_indices(sess, job.id, MemberState.ACTIVE)
        if len(active) < job.min_clients:
            self.fail(sess, job, f"only {len(active)} clients remain, fewer than the required "
                      f"{job.min_clients}; training stopped", None, rt)
            return
        coord = rt.coordinator()
        issued = coord.next_task()
        if issued is None:
            # the model file sites download: the forest with the job's schema (feature names,
            # levels, classes) and site names, or an evaluation job's result as it is; the
            # audit log's digest is of these bytes
            result = coord.result()
            schema = stored_schema_text(job.spec_json)
            try:
                text = (result.for_job(schema, [rt.names[k] for k in sorted(rt.names)])
                        if isinstance(result, ForestModel) else result).to_json()
            except SchemaError as exc:  # the job's stored schema: no model without it
                self.fail(sess, job, f"training finished, but the model cannot carry the "
                          f"job's schema ({exc}); no model was stored", None, rt)
                return
            job.model_json = text
            job.model_digest = hashlib.sha256(text.encode()).hexdigest()
            job.status = JobStatus.DONE
            job.reason = ("training complete" if isinstance(result, ForestModel)
                          else "evaluation complete")
            rt.release()  # the model is stored
            self.audit.within(sess).append(job.id, "model", {"digest": job.model_digest})
            event("job_done", job=job.id, rounds=closed_rounds(sess, job.id),
                  model_sha256=job.model_digest, server_cpu_s=time.process_time())
            return
        task = seal(issued)  # packed and hashed once for the row, the round setup and clients
        if task.round_id <= job.current_round:
            raise RuntimeError("the coordinator issued a round id that is not increasing")
        now = self.clock()
        rr = RoundRow(job_id=job.id, round_id=task.round_id, kind=task.kind.value,
                      level=task.level, task_blob=task.to_bytes(),
                      task_digest=task.digest().hex(),
                      encoding="uint64" if uses_ring(rt.config) else "float64",
                      participants_json=json.dumps(active), issued_at=now,
                      deadline_at=self.deadlines.opened(job.id, job.round_deadline_s),
                      status=RoundStatus.OPEN, phase=rt.plan.first, dropped_json="[]")
        sess.add(rr)
        job.current_round = task.round_id
        rt.open_task(task)
        bridge = rt.secure
        if bridge is None:
            return
        sess.flush()
        if not bridge.directory:
            bridge.directory = {i: bytes.fromhex(k)
                                for i, k in identity_keys(sess, job.id).items()}
        missing = sorted(set(active) - set(bridge.directory))
        if missing:
            self.fail(sess, job, f"clients {missing} have no registered identity key", None, rt)
            return
        riding = dict(bridge.pending)
        sr = bridge.start(task, active, rt.words())
        for idx in sorted(sr.server.advertised):  # the adverts that rode on the last round
            add_message(sess, job.id, task.round_id, "advert", idx,
                        riding[idx].model_dump_json())
        rr.phase = sr.phase
        self.progress_secure(rt, sess, job, rr)
