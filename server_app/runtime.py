"""The server's state: what the API routes call. Every public method is one atomic step.

Every mutation runs under one lock and is written to the database in the same step, so a server
killed at any point restarts where it was (:mod:`server_app.replay`). A client that retries a
request the server had already stored gets the same answer (``duplicate``), not an error.

The parts, each in its own module:

================================  ==============================================================
:mod:`server_app.core`            the parts of one server and the job-level steps they share
:mod:`server_app.relay`           the secure-aggregation requests (``/secagg``)
:mod:`server_app._joins`          a site joining or declining a job, and the job's start
:mod:`server_app.phases`          phase, job, member and round enums; the rounds' transition
                                  tables (plain and secure)
:mod:`server_app.rounds`          the round state machine: uploads, phases, deadlines, drops,
                                  closing into the coordinator, issuing the next round
:mod:`server_app.secure_round`    one secure round's phases over the secure-aggregation server
:mod:`server_app.replay`          the jobs' runtimes, rebuilt from the database by replay
:mod:`server_app.store`           the database queries
:mod:`server_app.deadlines`       when the open phase ends (restart-aware), cheap "not yet"
:mod:`server_app.spool`           masked vectors of the open secure round, kept until its close
:mod:`server_app.notify`          wake-ups for long-polling requests
:mod:`server_app.audit_hook`      the audit sink and what a closed round records
:mod:`server_app.audit_outbox`    a step's audit entries, saved with it and appended after
================================  ==============================================================
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select

from fedforest_secure.config import JobConfig
from fedforest_secure.protocol import Task
from fedforest_secure.protocol.uploads import ParsedUpload, check_against_task, parse_upload
from fedforest_secure.secure_sum import make_codec

from ._joins import decline, job_offer, join
from .audit_hook import AuditSink
from .auth import is_revoked
from .cancel import apply_cancels, cancel
from .core import Core, check_seat, check_upload_round
from .db import (
    AuditedJobRow,
    ClientRow,
    Database,
    JobRow,
    MemberRow,
    RoundRow,
    UploadRow,
    lost_race,
)
from .deadlines import steady_clock
from .engine import PlainBounds, uses_secagg
from .errors import ApiError
from .evaljob import evaluation_entry
from .jobcheck import check_job
from .jobs import JobRuntime
from .jobspec import JobSpec, build_config, default_min_clients
from .phases import JobStatus, MemberState, Phase, RoundStatus
from .relay import SecAggRelay
from .replay import Runtimes
from .settings import ConfigError
from .spool import Spool
from .status import job_status
from .store import (
    identity_certs,
    identity_keys,
    job_of,
    member_indices,
    membership,
    participants,
    round_task_blob,
    rounds_of,
    running_job_ids,
    seat_view,
    stored_upload_digest,
)

__all__ = ["JobRuntime", "ServerState", "TaskOffer"]


@dataclass(frozen=True)
class TaskOffer:
    """What ``GET /task`` returns: the task bytes or a status to wait on."""

    status: str  # "task" | "wait" | "done" | "failed" | "dropped"
    round_id: int | None = None
    body: bytes | None = None
    digest: str | None = None
    deadline_in: float | None = None
    audit_head: str | None = None
    phase: str | None = None
    detail: str = ""
    audit_seq: int | None = None


class ServerState:
    """All jobs of one server. Thread-safe; every public method is one atomic step."""

    def __init__(self, db: Database, audit: AuditSink,
                 clock: Callable[[], float] = time.time, *,
                 monotonic: Callable[[], float] = steady_clock,
                 spool: Path | None = None) -> None:
        # ``clock``: the wall clock (timestamps); ``monotonic`` times the deadlines
        self.core = Core.build(db, audit, clock, Spool(spool), monotonic)
        self._relay = SecAggRelay(self.core)
        self._ticks = 0

    @property
    def runtimes(self) -> Runtimes:
        """The jobs' in-memory runtimes."""
        return self.core.runtimes

    @property
    def spool(self) -> Path | None:
        """Where the masked uploads of open secure rounds are kept (None: in the database)."""
        return self.core.spool.root

    @spool.setter
    def spool(self, root: Path | None) -> None:
        self.core.spool.root = root

    @property
    def generation(self) -> int:
        return self.core.changes.generation

    def wait_change(self, generation: int, timeout: float) -> None:
        """Block until the state changed after ``generation`` (or ``timeout`` seconds)."""
        self.core.changes.wait(generation, timeout)

    async def wait_change_async(self, generation: int, timeout: float) -> None:
        """:meth:`wait_change` on the event loop (no worker thread while it waits)."""
        await self.core.changes.wait_async(generation, timeout)

    # ------------------------------------------------------------------ operator actions
    def create_job(self, spec: JobSpec) -> JobRow:
        """Create a job from a spec that passes :func:`~server_app.jobcheck.check_job` (with
        its DP defaults applied)."""
        spec = check_job(spec).spec
        config = build_config(spec)
        min_clients = default_min_clients(spec, config.profile)
        taken = ConfigError(f"job {spec.id!r} already exists")
        with self.core.lock, lost_race(self.core.db, select(JobRow.id).where(
                JobRow.id == spec.id), taken), self.core.db.session() as sess:
            if sess.get(JobRow, spec.id) is not None:
                raise taken
            if self.core.audit.tip(spec.id)[0] > 0:
                # another server database (or one replaced) created this id on the same audit
                # log: a second job's entries would join the first's chain, which then fails
                # to verify
                raise ConfigError(
                    f"the audit database already holds a job {spec.id!r} (its chain of "
                    "entries, from another or an earlier server database): choose another job "
                    "id (the sites that took part in that job refuse a job of the same id, and "
                    "their receipts of it name this log)")
            rows = {c.name: c for c in sess.scalars(
                select(ClientRow).where(ClientRow.name.in_(spec.clients)))}
            missing = [n for n in spec.clients if n not in rows]
            if missing:
                raise ConfigError(f"unknown clients {missing}: run `fedforest server add-client`")
            revoked = [n for n in spec.clients if is_revoked(rows[n])]
            if revoked:
                raise ConfigError(
                    f"revoked clients {revoked}: their tokens no longer authenticate, so the "
                    "job would wait for them forever; give each a new token (`fedforest "
                    "server rotate-token NAME`, and a new certificate if its old one leaked) "
                    "or leave it out of the job's clients")
            job = JobRow(id=spec.id, spec_json=spec.model_dump_json(),
                         config_json=config.to_json(), status=JobStatus.WAITING, reason="",
                         min_clients=min_clients, round_deadline_s=spec.round_deadline,
                         current_round=-1, created_at=self.core.clock(), model_json=None)
            sess.add(job)
            sess.flush()
            if self.core.audit.enabled:
                sess.add(AuditedJobRow(job_id=spec.id))
            for k, name in enumerate(spec.clients):
                sess.add(MemberRow(job_id=spec.id, client_id=rows[name].id, client_index=k,
                                   state=MemberState.INVITED))
            # committed with the job's rows, appended to the log once they committed: a
            # create-job stopped between the two leaves the entry waiting in the server
            # database, and the server appends it when it starts
            self.core.audit.within(sess).append(spec.id, "job_created", {
                "schema": spec.schema_text or json.dumps(spec.data.model_dump() if spec.data
                                                         else {}),
                "hyperparameters": spec.forest.model_dump(),
                **evaluation_entry(config),
                "profile": config.profile,
                "clients": spec.clients, "min_clients": min_clients,
                "round_deadline": spec.round_deadline,
                # the coordinator's whole input besides the aggregates: a verifier replays the
                # rounds with it (``fedforest audit verify --replay``)
                "config": json.loads(config.to_json()),
            })
        return job

    def cancel(self, job_id: str) -> bool:
        """Fail a waiting or running job as cancelled by the operator (:mod:`server_app.cancel`);
        False if it had finished."""
        with self.core.lock:
            done = cancel(self.core, job_id)
        self.core.changes.notify(job_id)
        return done

    def apply_cancels(self) -> list[str]:
        """Cancel the jobs whose cancelling an operator recorded (``fedforest server
        cancel-job``); returns them."""
        return apply_cancels(self.core)

    # ------------------------------------------------------------------ lookups
    def jobs_of(self, client: ClientRow) -> list[dict[str, Any]]:
        with self.core.db.session() as sess:
            rows = sess.execute(select(JobRow, MemberRow).join(
                MemberRow, MemberRow.job_id == JobRow.id).where(MemberRow.client_id == client.id))
            return [{"job_id": j.id, "status": j.status, "client_index": m.client_index,
                     "member_state": m.state} for j, m in rows]

    def status(self, client: ClientRow, job_id: str) -> dict[str, Any]:
        with self.core.lock:
            self.core.tick_if_due(job_id)
            with self.core.db.session() as sess:
                job, member = membership(sess, client, job_id)
                out = job_status(sess, job, member, self.core.clock(),
                                 deadline=self.core.deadlines.of)
            # read after the status: the chain of a job that ended holds its last entry
            seq, head = self.core.audit.tip(job_id)
            return {**out, "audit_seq": seq, "audit_head": head}

    def directory(self, client: ClientRow, job_id: str) -> dict[str, Any]:
        """The job's identity directory ``{client index: Ed25519 verify key hex}``, relayed."""
        with self.core.db.session() as sess:
            membership(sess, client, job_id)
            keys = {str(i): k for i, k in identity_keys(sess, job_id).items()}
            certs = {str(i): json.loads(c) for i, c in identity_certs(sess, job_id).items()}
            n = len(member_indices(sess, job_id))
            return {"job_id": job_id, "n_clients": n, "complete": len(keys) == n, "keys": keys,
                    "certs": certs}

    def rounds(self, client: ClientRow, job_id: str) -> list[dict[str, Any]]:
        with self.core.db.session() as sess:
            membership(sess, client, job_id)
            return [{"round_id": r.round_id, "kind": r.kind, "level": r.level,
                     "status": r.status, "task_digest": r.task_digest}
                    for r in rounds_of(sess, job_id)]

    def task_bytes(self, client: ClientRow, job_id: str, round_id: int) -> bytes:
        """Any task this job issued (clients replay earlier sketch tasks after a restart): the
        open round's from memory, an earlier one's stored bytes. One plain-value membership
        query, no ORM session."""
        with self.core.db.connect() as conn:
            seat_view(conn, client, job_id)  # members only: the same 404 as membership
            body = self._task_body(job_id, round_id)
            if body is not None:
                return body
            blob = round_task_blob(conn, job_id, round_id)
            if blob is None:
                raise ApiError(404, "unknown_round", f"round {round_id} was not issued")
            if not blob:
                raise ApiError(410, "pruned", f"round {round_id}'s task was deleted by "
                               "`fedforest server prune` (the job is finished)")
            return blob

    def open_task_bytes(self, job_id: str, round_id: int) -> bytes | None:
        """The task bytes of round ``round_id`` if it is the job's open round held in memory
        (no query: a step answer carries them after its JSON), None otherwise."""
        return self._task_body(job_id, round_id)

    def _task_body(self, job_id: str, round_id: int, rr: RoundRow | None = None
                   ) -> bytes | None:
        """The open round's task bytes from memory (every client gets the same bytes object,
        nothing is read from the database); with ``rr``, that row's stored bytes otherwise.
        None if round ``round_id`` is not the open round held in memory and no row is given."""
        rt = self.core.runtimes.peek(job_id)
        task = rt.task if rt is not None else None
        if task is not None and task.round_id == round_id:
            return task.to_bytes()
        return rr.task_blob if rr is not None else None

    def audit_log(self, client: ClientRow, job_id: str) -> str:
        """A member's copy of its job's audit log (JSON lines): without the arrays' bytes
        (every entry keeps their digests, so the chain and the receipts verify), unless the
        server sets ``audit_arrays_for_sites``. Other jobs' logs are not served over HTTP:
        the operator reads them, whole, from the audit database."""
        with self.core.db.session() as sess:
            membership(sess, client, job_id)
        audit = self.core.audit
        return audit.export(job_id, arrays=audit.arrays_for_sites)

    def model(self, client: ClientRow, job_id: str) -> str:
        return self.model_and_tip(client, job_id)[0]

    def model_and_tip(self, client: ClientRow, job_id: str) -> tuple[str, int, str]:
        """The final model and the audit chain's tip ``(seq, head)`` after its entry: the
        client keeps both as its model receipt."""
        with self.core.db.session() as sess:
            job, _ = membership(sess, client, job_id)
            if job.status == JobStatus.FAILED:
                raise ApiError(409, "no_model", f"the job failed ({job.reason}): it has no "
                               "model")
            if job.status != JobStatus.DONE or job.model_json is None:
                raise ApiError(409, "no_model", f"the job is {job.status}; no model yet")
            seq, head = self.core.audit.tip(job_id)
            return job.model_json, seq, head

    # ------------------------------------------------------------------ join
    def join(self, client: ClientRow, job_id: str, identity_key: bytes | None = None,
             identity_cert: str | None = None) -> dict[str, Any]:
        """Join a job (:func:`server_app._joins.join`); secure jobs need the client's long-term
        Ed25519 verify key (32 bytes) and take its certification when the client sends one."""
        return join(self.core, client, job_id, identity_key, identity_cert)

    def decline(self, client: ClientRow, job_id: str, reason: str) -> dict[str, Any]:
        """An invited site will not join the job, for ``reason`` (a code):
        :func:`server_app._joins.decline`."""
        return decline(self.core, client, job_id, reason)

    def job_offer(self, client: ClientRow, job_id: str) -> dict[str, Any]:
        """What the join answers, without joining (:func:`server_app._joins.job_offer`)."""
        return job_offer(self.core, client, job_id)

    # ------------------------------------------------------------------ offers
    def offer(self, client: ClientRow, job_id: str) -> TaskOffer:
        """The task this client should answer now, or what to wait for."""
        with self.core.lock:
            self.core.tick_if_due(job_id)
            with self.core.db.session() as sess:
                job, member = membership(sess, client, job_id)
                if member.state == MemberState.DROPPED:
                    return TaskOffer("dropped", detail="this client was dropped at round "
                                                       f"{member.dropped_round}")
                if job.status in (JobStatus.DONE, JobStatus.FAILED):
                    return TaskOffer(job.status, detail=job.reason)
                if member.state != MemberState.ACTIVE:
                    raise ApiError(409, "not_joined", "join the job first")
                if job.status != JobStatus.RUNNING:
                    return TaskOffer("wait", detail="waiting for all clients to join")
                rr = sess.get(RoundRow, (job_id, job.current_round))
                if rr is None or rr.status != RoundStatus.OPEN:
                    return TaskOffer("wait", detail="no open round")
                if member.client_index not in participants(rr):
                    return TaskOffer("wait", detail="not a participant of this round")
                if rr.phase != Phase.UPLOAD or uses_secagg(JobConfig.from_json(job.config_json)):
                    return TaskOffer("wait", round_id=rr.round_id, phase=rr.phase,
                                     detail="secure aggregation: follow GET /v1/jobs/{job}/secagg")
                done = sess.get(UploadRow, (job_id, rr.round_id, member.client_index))
                if done is not None:
                    return TaskOffer("wait", round_id=rr.round_id,
                                     detail="upload received; waiting for the other clients")
                seq, head = self.core.audit.tip(job_id)
                return TaskOffer("task", round_id=rr.round_id,
                                 body=self._task_body(job_id, rr.round_id, rr),
                                 digest=rr.task_digest,
                                 deadline_in=self.core.deadlines.remaining(rr, job),
                                 audit_head=head, audit_seq=seq, phase=rr.phase)

    # ------------------------------------------------------------------ client messages
    def secagg_offer(self, client: ClientRow, job_id: str) -> dict[str, Any]:
        """What this client must do now in the open secure round (or what to wait for)."""
        return self._relay.offer(client, job_id)

    def secagg_answered(self, client: ClientRow, job_id: str) -> bool:
        """Whether :meth:`secagg_offer` would surely say ``wait`` (from memory, no query)."""
        return self._relay.answered_and_waiting(client, job_id)

    def secagg_message(self, client: ClientRow, job_id: str, round_id: int, kind: str,
                       body: bytes) -> dict[str, Any]:
        """Accept a client's ``advert`` / ``shares`` / ``unmask`` message (JSON)."""
        return self._relay.message(client, job_id, round_id, kind, body)

    def secagg_refuse(self, client: ClientRow, job_id: str, round_id: int, reason: str,
                      accused: int | None = None) -> dict[str, Any]:
        """A client refuses a request (a privacy rule); it leaves the job, and says why (and
        whom it accuses of a message that did not authenticate)."""
        return self._relay.refuse(client, job_id, round_id, reason, accused)

    def upload_limit(self, client: ClientRow, job_id: str, round_id: int, most: int) -> int:
        """The most bytes this upload's body may have, checked before it is read
        (:meth:`Core.upload_limit <server_app.core.Core.upload_limit>`)."""
        return self.core.upload_limit(client, job_id, round_id, most)

    def upload(self, client: ClientRow, job_id: str, round_id: int, body: bytes | bytearray
               ) -> dict[str, Any]:
        """Count a client's upload of the open round. The checks read plain values (one
        :func:`~server_app.store.seat_view` query); a masked upload is stored by Core
        ``INSERT`` s, and the job's and round's ORM rows are loaded only when it completes the
        upload phase (a plain upload adds into the round's row, loaded as before)."""
        up = parse_upload(body)
        if up.job_id != job_id or up.round_id != round_id:
            raise ApiError(400, "header_mismatch", "the upload header names another job or round")
        with self.core.lock:
            self.core.tick_if_due(job_id)
            rt = self.core.runtimes.get(job_id)
            # the guard outside the session: a step whose commit fails (a connection lost at
            # the commit) forgets the runtime that took the upload; the retry rebuilds it
            # from what the database kept
            with self.core.runtimes.guard(job_id), self.core.db.session() as sess:
                conn = sess.connection()
                seat = seat_view(conn, client, job_id, round_id)
                check_seat(seat, round_id)
                idx = seat.client_index
                prev = stored_upload_digest(conn, job_id, round_id, idx)
                if prev is not None and seat.round_status == RoundStatus.OPEN:
                    if prev == up.digest:
                        return self._receipt(job_id, round_id, seat.task_digest, idx, prev,
                                             duplicate=True)
                    raise ApiError(409, "conflicting_upload", f"a different upload for round "
                                   f"{round_id} was already counted")
                check_upload_round(seat, round_id,
                                   counted=prev is not None and prev == up.digest)
                if rt.task is None or rt.task.round_id != round_id:
                    raise ApiError(409, "wrong_round", "the round is not open")
                check_against_task(up, rt.task, str(seat.task_digest), str(seat.round_encoding),
                                   None if rt.secure is not None else self._bounds(rt),
                                   words=rt.words(), config=rt.config,
                                   plain_values=partial(_plain_values, up, rt.task, rt.config))
                if rt.secure is not None:
                    sr = self.core.driver.add_masked(rt, conn, job_id, round_id, idx, up)
                    if sr.complete():  # what progress_secure would wait for
                        rr = sess.get(RoundRow, (job_id, round_id))
                        if rr is None:
                            raise RuntimeError(f"round {round_id} vanished")
                        self.core.driver.progress_secure(rt, sess, job_of(sess, job_id), rr)
                else:
                    rr = sess.get(RoundRow, (job_id, round_id))
                    if rr is None:
                        raise RuntimeError(f"round {round_id} vanished")
                    self.core.driver.add_plain(sess, rr, idx, up)
            # after the commit: the head covers the entries of a round this upload closed
            receipt = self._receipt(job_id, round_id, seat.task_digest, idx, up.digest,
                                    duplicate=False)
            if rt.secure is None:  # a secure round moved on in this step already
                self.core.maybe_close(job_id)
            self.core.changes.notify(job_id)
            return receipt

    def _bounds(self, rt: JobRuntime) -> PlainBounds | None:
        """The bounds a plaintext upload of the open round is range-checked against."""
        return rt.bounds()

    def _receipt(self, job_id: str, round_id: int, task_digest: str | None, idx: int,
                 digest: str, *, duplicate: bool) -> dict[str, Any]:
        return {"job_id": job_id, "round_id": round_id, "client_index": idx,
                "upload_sha256": digest, "task_sha256": task_digest, "duplicate": duplicate,
                "audit_head": self.core.audit.head(job_id)}

    # ------------------------------------------------------------------ deadlines
    def tick(self, *, full_every: int = 5) -> None:
        """Apply deadlines and finish rounds whose uploads are all in (called periodically).

        Between deadlines a tick costs no query (:meth:`Deadlines.due`); every ``full_every``-th
        tick applies the operator's requests to cancel jobs, re-reads every running job from
        the database (a fallback: the message that completes a phase closes it itself) and
        forgets the runtimes of the jobs that stopped (:meth:`Runtimes.drop_stopped`).
        Spooled uploads are swept after a round closed."""
        self._ticks += 1
        full = self._ticks % max(full_every, 1) == 1 or full_every <= 1
        if full:
            with self.core.db.session() as sess:
                ids = running_job_ids(sess)
        else:
            ids = self.core.deadlines.watched()
        for job_id in ids:
            with self.core.lock:
                if full:
                    self.core.tick_job(job_id)
                else:
                    self.core.tick_if_due(job_id)
            self.core.changes.notify(job_id)  # after the commit: a deadline may have moved it on
        if full:
            self.apply_cancels()
            with self.core.lock:  # between steps: what the jobs that stopped held goes
                self.core.runtimes.drop_stopped()
                self._relay.keep_only(set(self.core.runtimes.loaded()))
            # entries a failed append left waiting, and those a `fedforest server create-job`
            # stopped after its commit left in the database
            self.core.audit.flush_all(self.core.db.engine)
        if self.core.driver.sweep_due or full:
            with self.core.lock:
                self.core.sweep_spool()


def _plain_values(up: ParsedUpload, task: Task, config: JobConfig) -> np.ndarray:
    """The statistics of a plaintext upload (a fixed-point one decoded by the round's
    codec)."""
    if up.summable.dtype != np.uint64:
        return up.summable
    return make_codec(config, task).decode(up.summable)
