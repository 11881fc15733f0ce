"""The server's job state machine: joins, rounds, uploads, deadlines, restart by replay.

Every mutation runs under one lock and is written to the database in the same step, so a server
killed at any point restarts where it was: the coordinator is rebuilt by replaying the stored
(task digest, aggregate, disclosed, participants) of every closed round through
``next_task``/``submit``, checking each digest, and the open round keeps its running sum and the
digests of the uploads it already counted. An open secure round is rebuilt from the messages it
had accepted (:meth:`SecAggBridge.resume`): each is stored in the step that accepted it, so a
client whose request was answered never has to send it again, and a client that retries a
request the server had already stored gets the same answer (``duplicate``), not an error.
After a restart the open round's deadline runs again from the server's start, so clients that
were backing off while it was down are not dropped for the server's outage.

A round moves through phases. Without secure aggregation there is one phase, ``upload``. With it,
the :mod:`server_app.secagg_bridge` adds the key-advertisement / share / unmask phases around the
masked upload (see that module); each phase gets the full round deadline.

Every state change notifies :attr:`ServerState.changed`, so long-polling requests
(``?wait=``) return as soon as there is something new for their client.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import delete, select

from fedforest_secure.config import JobConfig
from fedforest_secure.errors import AbortedRound, FedForestError, InvalidMessage, ProtocolError
from fedforest_secure.protocol import SealedTask, Task, pack, seal, unpack
from fedforest_secure.protocol.uploads import ParsedUpload, check_against_task, parse_upload
from fedforest_secure.secagg import KeyAdvert, MaskedUpload, ShareBundle, UnmaskResponse, parse

from . import engine
from .audit_hook import AuditSink
from .db import ClientRow, Database, JobRow, MemberRow, RoundRow, SecAggMessageRow, UploadRow
from .errors import ApiError
from .jobspec import JobSpec, build_config, default_min_clients
from .secagg_bridge import SecAggBridge, SecureRound, StoredRound
from .settings import ConfigError

__all__ = ["JobRuntime", "ServerState", "TaskOffer"]

_log = logging.getLogger("fedforest.server")


@dataclass
class JobRuntime:
    """In-memory state of one running job (rebuilt from the database on demand)."""

    job_id: str
    config: JobConfig
    names: dict[int, str]
    min_clients: int
    deadline_s: float
    coord: Any = None
    #: The open round's task, sealed: packed and hashed once, the same bytes for every client
    task: SealedTask | None = None
    codec: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


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
                 clock: Callable[[], float] = time.time, *, spool: Path | None = None) -> None:
        self.db = db
        self.audit = audit
        #: Where the masked uploads of open secure rounds are kept (one file each, removed once
        #: the round closes); None keeps them in the database (``UploadRow.summable``). A file
        #: is written once and unlinked, where a database blob is written and then freed page by
        #: page: with vectors of tens of MB that difference is the upload step's latency.
        self.spool = spool
        self.clock = clock
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.generation = 0
        self._rts: dict[str, JobRuntime] = {}
        self._dirty: set[str] = set()
        #: Per job, a time before which no deadline of its open round can pass (see
        #: :meth:`_tick_if_due`); absent when unknown.
        self._due: dict[str, float] = {}
        self._sweep_due = True  # spooled uploads of closed rounds may be left: sweep
        self._ticks = 0
        self.started_at = clock()

    def _deadline_at(self, rr: RoundRow, job: JobRow) -> float:
        """The open phase's deadline; never earlier than a full deadline after this server
        started (a restart must not drop the clients that waited for it)."""
        return max(rr.deadline_at, self.started_at + job.round_deadline_s)

    def _notify(self, job_id: str | None = None) -> None:
        """Wake the long-polling requests (call after the step's commit).

        With ``job_id``, only if the step changed what clients of the job wait for: a member's
        state, the job's status or round, or the round's phase (each marked by
        :meth:`_touch`). Accepting one client's message changes nothing another client waits
        for, so it does not wake (and re-run) every poller of the job: with K clients that
        would be K x K offers per step instead of K. A poller re-checks every second anyway.
        """
        if job_id is not None:
            if job_id not in self._dirty:
                return
            self._dirty.discard(job_id)
        with self.changed:
            self.generation += 1
            self.changed.notify_all()

    def _touch(self, job_id: str) -> None:
        """Mark that the job's view changed (see :meth:`_notify`)."""
        self._dirty.add(job_id)

    def wait_change(self, generation: int, timeout: float) -> None:
        """Block until the state changed after ``generation`` (or ``timeout`` seconds)."""
        with self.changed:
            self.changed.wait_for(lambda: self.generation != generation, timeout)

    def _tip(self, job_id: str) -> tuple[int, str]:
        tip = getattr(self.audit, "tip", None)
        if callable(tip):
            seq, head = tip(job_id)
            return int(seq), str(head)
        return 0, self.audit.head(job_id)
    # ------------------------------------------------------------------ operator actions
    def create_job(self, spec: JobSpec) -> JobRow:
        config = build_config(spec)
        min_clients = default_min_clients(spec, config.profile)
        with self.lock, self.db.session() as sess:
            if sess.get(JobRow, spec.id) is not None:
                raise ConfigError(f"job {spec.id!r} already exists")
            rows = {c.name: c for c in sess.scalars(
                select(ClientRow).where(ClientRow.name.in_(spec.clients)))}
            missing = [n for n in spec.clients if n not in rows]
            if missing:
                raise ConfigError(f"unknown clients {missing}: run `fedforest server add-client`")
            job = JobRow(id=spec.id, spec_json=spec.model_dump_json(),
                         config_json=config.to_json(), status="waiting", reason="",
                         min_clients=min_clients, round_deadline_s=spec.round_deadline,
                         current_round=-1, created_at=self.clock())
            sess.add(job)
            sess.flush()
            for k, name in enumerate(spec.clients):
                sess.add(MemberRow(job_id=spec.id, client_id=rows[name].id, client_index=k,
                                   state="invited"))
        self.audit.append(spec.id, "job_created", {
            "schema": spec.schema_text or json.dumps(spec.data.model_dump() if spec.data else {}),
            "hyperparameters": spec.forest.model_dump(),
            "profile": config.profile,
            "clients": spec.clients, "min_clients": min_clients,
            "round_deadline": spec.round_deadline,
            # the coordinator's whole input besides the aggregates: a verifier replays the
            # rounds with it (``fedforest audit verify --replay``)
            "config": json.loads(config.to_json()),
        })
        return job

    # ------------------------------------------------------------------ lookups
    def _member(self, sess: Any, client: ClientRow, job_id: str) -> tuple[JobRow, MemberRow]:
        job = sess.get(JobRow, job_id)
        member = sess.get(MemberRow, (job_id, client.id)) if job is not None else None
        if job is None or member is None:
            # the same answer for "no such job" and "not your job": no cross-job probing
            raise ApiError(404, "unknown_job", f"no job {job_id!r} for this client")
        return job, member

    def jobs_of(self, client: ClientRow) -> list[dict[str, Any]]:
        with self.db.session() as sess:
            rows = sess.execute(select(JobRow, MemberRow).join(
                MemberRow, MemberRow.job_id == JobRow.id).where(MemberRow.client_id == client.id))
            return [{"job_id": j.id, "status": j.status, "client_index": m.client_index,
                     "member_state": m.state} for j, m in rows]

    def status(self, client: ClientRow, job_id: str) -> dict[str, Any]:
        with self.lock:
            self._tick_if_due(job_id)
            with self.db.session() as sess:
                job, member = self._member(sess, client, job_id)
                members = list(sess.scalars(select(MemberRow).where(MemberRow.job_id == job_id)))
                return {
                    "job_id": job.id, "status": job.status, "reason": job.reason,
                    "round_id": job.current_round, "client_index": member.client_index,
                    "member_state": member.state, "min_clients": job.min_clients,
                    "n_clients": len(members),
                    "active_clients": sum(m.state == "active" for m in members),
                    "joined_clients": sum(m.state != "invited" for m in members),
                    "model_digest": job.model_digest,
                    "audit_head": self.audit.head(job_id),
                }

    # ------------------------------------------------------------------ join
    def join(self, client: ClientRow, job_id: str, identity_key: bytes | None = None
             ) -> dict[str, Any]:
        """Join a job. Secure jobs need the client's long-term Ed25519 verify key (32 bytes),
        registered once, audited, and relayed to the other clients in the directory."""
        with self.lock:
            with self.db.session() as sess:
                job, member = self._member(sess, client, job_id)
                if member.state == "dropped":
                    raise ApiError(403, "dropped",
                                   f"this client was dropped at round {member.dropped_round}")
                secure = engine.uses_secagg(JobConfig.from_json(job.config_json))
                idx = member.client_index
                stored = sess.get(SecAggMessageRow, (job_id, -1, "identity", idx))
                if secure:
                    if identity_key is None or len(identity_key) != 32:
                        raise ApiError(400, "identity_required", "this job uses secure "
                                       "aggregation: join with your Ed25519 identity key "
                                       "(32 bytes, hex) as {\"identity_key\": ...}")
                    if stored is not None and stored.body != identity_key.hex():
                        raise ApiError(409, "identity_mismatch", "this client joined with "
                                       "another identity key; it cannot change mid-job")
                first = member.state == "invited"
                if first:
                    self._touch(job_id)
                    if job.status != "waiting":
                        raise ApiError(409, "job_started", "the job started without this client")
                    member.state = "active"
                    member.joined_at = self.clock()
                    if secure and identity_key is not None and stored is None:
                        sess.add(SecAggMessageRow(
                            job_id=job_id, round_id=-1, stage="identity", client_index=idx,
                            body=identity_key.hex(),
                            digest=hashlib.sha256(identity_key).hexdigest()))
                spec = JobSpec.model_validate_json(job.spec_json)
                info = {"job_id": job.id, "client_index": idx, "client_name": client.name,
                        "config": json.loads(job.config_json), "status": job.status,
                        "schema_sha256": spec.schema_sha256(), "min_clients": job.min_clients,
                        "round_deadline": job.round_deadline_s, "secure_aggregation": secure}
            if first:
                payload: dict[str, Any] = {"client": client.name, "client_index": idx}
                if secure and identity_key is not None:
                    payload["identity_key"] = identity_key.hex()
                self.audit.append(job_id, "client_joined", payload)
            self._maybe_start(job_id)
            self._notify(job_id)
            return info

    def directory(self, client: ClientRow, job_id: str) -> dict[str, Any]:
        """The job's identity directory ``{client index: Ed25519 verify key hex}``, relayed."""
        with self.db.session() as sess:
            job, _member = self._member(sess, client, job_id)
            rows = sess.scalars(select(SecAggMessageRow).where(
                SecAggMessageRow.job_id == job_id, SecAggMessageRow.round_id == -1,
                SecAggMessageRow.stage == "identity"))
            n = len(list(sess.scalars(select(MemberRow.client_index).where(
                MemberRow.job_id == job_id))))
            keys = {str(r.client_index): r.body for r in rows}
            return {"job_id": job_id, "n_clients": n, "complete": len(keys) == n,
                    "keys": keys}

    def _maybe_start(self, job_id: str) -> None:
        with self.db.session() as sess:
            job = sess.get(JobRow, job_id)
            if job is None or job.status != "waiting":
                return
            states = list(sess.scalars(select(MemberRow.state).where(MemberRow.job_id == job_id)))
            if any(s == "invited" for s in states):
                return
        rt = self._runtime(job_id)
        with self._guard(job_id), self.db.session() as sess:
            job = sess.get(JobRow, job_id)
            assert_row(job)
            job.status = "running"
            self._issue_next(rt, sess, job)

    # ------------------------------------------------------------------ tasks
    def offer(self, client: ClientRow, job_id: str) -> TaskOffer:
        """The task this client should answer now, or what to wait for."""
        with self.lock:
            self._tick_if_due(job_id)
            with self.db.session() as sess:
                job, member = self._member(sess, client, job_id)
                if member.state == "dropped":
                    return TaskOffer("dropped", detail=f"dropped at round {member.dropped_round}")
                if job.status in ("done", "failed"):
                    return TaskOffer(job.status, detail=job.reason)
                if member.state != "active":
                    raise ApiError(409, "not_joined", "join the job first")
                if job.status != "running":
                    return TaskOffer("wait", detail="waiting for all clients to join")
                rr = sess.get(RoundRow, (job_id, job.current_round))
                if rr is None or rr.status != "open":
                    return TaskOffer("wait", detail="no open round")
                if member.client_index not in json.loads(rr.participants_json):
                    return TaskOffer("wait", detail="not a participant of this round")
                if rr.phase != "upload" or engine.uses_secagg(
                        JobConfig.from_json(job.config_json)):
                    return TaskOffer("wait", round_id=rr.round_id, phase=rr.phase,
                                     detail="secure aggregation: follow GET /v1/jobs/{job}/secagg")
                done = sess.get(UploadRow, (job_id, rr.round_id, member.client_index))
                if done is not None:
                    return TaskOffer("wait", round_id=rr.round_id,
                                     detail="upload received; waiting for the other clients")
                seq, head = self._tip(job_id)
                return TaskOffer("task", round_id=rr.round_id,
                                 body=self._task_body(job_id, rr.round_id, rr),
                                 digest=rr.task_digest,
                                 deadline_in=max(0.0, self._deadline_at(rr, job)
                                                 - self.clock()),
                                 audit_head=head, audit_seq=seq, phase=rr.phase)

    # ------------------------------------------------------------------ secure aggregation
    def secagg_offer(self, client: ClientRow, job_id: str) -> dict[str, Any]:
        """What this client must do now in the open secure round (or what to wait for)."""
        with self.lock:
            self._tick_if_due(job_id)
            with self.db.session() as sess:
                job, member = self._member(sess, client, job_id)
                if member.state == "dropped":
                    return {"status": "dropped",
                            "detail": f"dropped at round {member.dropped_round}"}
                if job.status in ("done", "failed"):
                    return {"status": job.status, "detail": job.reason}
                if member.state != "active":
                    raise ApiError(409, "not_joined", "join the job first")
                if job.status != "running":
                    return {"status": "wait", "detail": "waiting for all clients to join"}
                rt = self._runtime(job_id)
                bridge = rt.extra.get("secagg")
                if bridge is None:
                    raise ApiError(409, "not_secure", "this job does not use secure aggregation")
                rr = sess.get(RoundRow, (job_id, job.current_round))
                sr = bridge.current
                if rr is None or rr.status != "open" or sr is None or \
                        sr.round_id != rr.round_id:
                    return {"status": "wait", "detail": "no open round"}
                action, message = sr.action_for(member.client_index)
                seq, head = self._tip(job_id)
                return {"status": "task" if action != "wait" else "wait", "action": action,
                        "round_id": rr.round_id, "phase": sr.phase,
                        "task_digest": rr.task_digest, "message": message,
                        "deadline_in": max(0.0, self._deadline_at(rr, job) - self.clock()),
                        "audit_seq": seq, "audit_head": head,
                        "detail": "" if action != "wait" else f"waiting for the other clients "
                                                              f"({sr.phase})"}

    def _secure_member(self, sess: Any, client: ClientRow, job_id: str, round_id: int,
                       phase: str) -> tuple[JobRuntime, JobRow, RoundRow, SecureRound, int]:
        job, member = self._member(sess, client, job_id)
        rr = self._round_for_upload(sess, job, member, round_id)
        rt = self._runtime(job_id)
        bridge = rt.extra.get("secagg")
        if bridge is None:
            raise ApiError(409, "not_secure", "this job does not use secure aggregation")
        sr = bridge.current
        if rr.status != "open" or sr is None or sr.round_id != round_id:
            raise ApiError(409, "round_closed", f"round {round_id} is not open")
        if sr.phase != phase:
            raise ApiError(409, "wrong_phase", f"round {round_id} is in phase {sr.phase}, "
                           f"not {phase}")
        if member.client_index not in sr.participants:
            raise ApiError(403, "not_participant",
                           f"this client is not a participant of round {round_id}")
        return rt, job, rr, sr, member.client_index

    def _secagg_call(self, fn: Callable[[], None]) -> None:
        """Run one state-machine step; map its rejections to 4xx (nothing changes on error)."""
        try:
            fn()
        except InvalidMessage as exc:
            raise ApiError(400, "invalid_message", str(exc)) from exc
        except AbortedRound:
            raise
        except ProtocolError as exc:
            raise ApiError(409, "protocol_error", str(exc)) from exc

    def secagg_message(self, client: ClientRow, job_id: str, round_id: int, kind: str,
                       body: bytes) -> dict[str, Any]:
        """Accept a client's ``advert`` / ``shares`` / ``unmask`` message (JSON)."""
        model, phase = {"advert": (KeyAdvert, "advertise"), "shares": (ShareBundle, "share"),
                        "unmask": (UnmaskResponse, "unmask")}[kind]
        try:
            msg: Any = parse(model, body)
        except InvalidMessage as exc:
            raise ApiError(400, "invalid_message", str(exc)) from exc
        digest = hashlib.sha256(body).hexdigest()
        with self.lock:
            self._tick_if_due(job_id)
            with self._guard(job_id), self.db.session() as sess:
                _job, member = self._member(sess, client, job_id)
                prev = sess.get(SecAggMessageRow, (job_id, round_id, kind, member.client_index))
                if prev is not None:  # a retry (e.g. the response was lost in a restart)
                    if prev.digest != digest:
                        raise ApiError(409, "conflicting_message", f"a different {kind} message "
                                       f"for round {round_id} was already accepted")
                    return {"job_id": job_id, "round_id": round_id, "accepted": kind,
                            "duplicate": True}
                rt, job, rr, sr, idx = self._secure_member(sess, client, job_id, round_id, phase)
                sender = msg.client_id if kind == "advert" else msg.sender
                if sender != idx:
                    raise ApiError(403, "wrong_sender", "the message names another client")
                handler = {"advert": sr.server.receive_advert,
                           "shares": sr.server.receive_shares,
                           "unmask": sr.server.receive_unmask}[kind]
                self._secagg_call(lambda: handler(msg))
                sess.add(SecAggMessageRow(job_id=job_id, round_id=round_id, stage=kind,
                                          client_index=idx, body=body.decode(), digest=digest))
                sess.flush()
                self._secure_progress(rt, sess, job, rr)
            self._notify(job_id)
            return {"job_id": job_id, "round_id": round_id, "accepted": kind,
                    "duplicate": False}

    def secagg_refuse(self, client: ClientRow, job_id: str, round_id: int, reason: str
                      ) -> dict[str, Any]:
        """A client refuses a request (a privacy rule); it leaves the job, and says why."""
        with self.lock:
            with self._guard(job_id), self.db.session() as sess:
                job, member = self._member(sess, client, job_id)
                rt = self._runtime(job_id)
                bridge = rt.extra.get("secagg")
                rr = sess.get(RoundRow, (job_id, job.current_round))
                why = f"refused: {reason[:300]}"
                sr = bridge.current if bridge is not None else None
                if sr is not None and rr is not None and rr.status == "open":
                    sr.refused[member.client_index] = reason[:300]
                    sr.dropped.add(member.client_index)
                    if sess.get(SecAggMessageRow, (job_id, rr.round_id, "refuse",
                                                   member.client_index)) is None:
                        sess.add(SecAggMessageRow(
                            job_id=job_id, round_id=rr.round_id, stage="refuse",
                            client_index=member.client_index, body=reason[:300],
                            digest=hashlib.sha256(reason[:300].encode()).hexdigest()))
                self._drop(rt, sess, job, [member.client_index], job.current_round, reason=why)
                if sr is not None and rr is not None and rr.status == "open":
                    self._secure_progress(rt, sess, job, rr)
            self._notify(job_id)
            return {"job_id": job_id, "round_id": round_id, "recorded": True}

    def rounds(self, client: ClientRow, job_id: str) -> list[dict[str, Any]]:
        with self.db.session() as sess:
            self._member(sess, client, job_id)
            rows = sess.scalars(select(RoundRow).where(RoundRow.job_id == job_id)
                                .order_by(RoundRow.round_id))
            return [{"round_id": r.round_id, "kind": r.kind, "level": r.level,
                     "status": r.status, "task_digest": r.task_digest} for r in rows]

    def task_bytes(self, client: ClientRow, job_id: str, round_id: int) -> bytes:
        """Any task this job issued (clients replay earlier sketch tasks after a restart)."""
        with self.db.session() as sess:
            self._member(sess, client, job_id)
            body = self._task_body(job_id, round_id)
            if body is not None:
                return body
            rr = sess.get(RoundRow, (job_id, round_id))
            if rr is None:
                raise ApiError(404, "unknown_round", f"round {round_id} was not issued")
            return rr.task_blob

    def _task_body(self, job_id: str, round_id: int, rr: RoundRow | None = None
                   ) -> bytes | None:
        """The open round's task bytes from memory (every client gets the same bytes object,
        nothing is read from the database); with ``rr``, that row's stored bytes otherwise.
        None if round ``round_id`` is not the open round held in memory and no row is given."""
        rt = self._rts.get(job_id)
        task = rt.task if rt is not None else None
        if task is not None and task.round_id == round_id:
            return task.to_bytes()
        return rr.task_blob if rr is not None else None

    def audit_log(self, client: ClientRow, job_id: str) -> str:
        """A member's copy of its job's audit log (JSON lines). Other jobs' logs are not
        served over HTTP: the operator reads them from the audit database."""
        with self.db.session() as sess:
            self._member(sess, client, job_id)
        return self.audit.export(job_id)

    def model(self, client: ClientRow, job_id: str) -> str:
        with self.db.session() as sess:
            job, _ = self._member(sess, client, job_id)
            if job.status != "done" or job.model_json is None:
                raise ApiError(409, "no_model", f"the job is {job.status}; no model yet")
            return job.model_json

    # ------------------------------------------------------------------ uploads
    def upload(self, client: ClientRow, job_id: str, round_id: int, body: bytes | bytearray
               ) -> dict[str, Any]:
        up = parse_upload(body)
        if up.job_id != job_id or up.round_id != round_id:
            raise ApiError(400, "header_mismatch", "the upload header names another job or round")
        with self.lock:
            self._tick_if_due(job_id)
            rt = self._runtime(job_id)
            with self.db.session() as sess:
                job, member = self._member(sess, client, job_id)
                idx = member.client_index
                rr = self._round_for_upload(sess, job, member, round_id)
                prev = sess.get(UploadRow, (job_id, round_id, idx))
                if prev is not None:
                    if rr.status == "open" and prev.digest == up.digest:
                        return self._receipt(rr, idx, prev.digest, duplicate=True)
                    if rr.status == "open":
                        raise ApiError(409, "conflicting_upload",
                                       f"a different upload for round {round_id} was already "
                                       "counted")
                if rr.status != "open":
                    raise ApiError(409, "round_closed", f"round {round_id} is closed",
                                   counted=prev is not None and prev.digest == up.digest)
                if rr.phase != "upload":
                    raise ApiError(409, "wrong_phase", f"round {round_id} is in phase {rr.phase}")
                if idx not in json.loads(rr.participants_json):
                    raise ApiError(403, "not_participant",
                                   f"this client is not a participant of round {round_id}")
                if rt.task is None or rt.task.round_id != round_id:
                    raise ApiError(409, "wrong_round", "the round is not open")
                bridge = rt.extra.get("secagg")
                check_against_task(up, rt.task, rr.task_digest, rr.encoding,
                                   None if bridge is not None else self._bounds(rt))
                if bridge is not None:
                    with self._guard(job_id):
                        self._secure_upload(rt, sess, job, rr, idx, up)
                        receipt = self._receipt(rr, idx, up.digest, duplicate=False)
                else:
                    self._accumulate(rt, sess, rr, idx, up)
                    receipt = self._receipt(rr, idx, up.digest, duplicate=False)
            self._maybe_close(job_id)
            self._notify(job_id)
            return receipt

    def _bounds(self, rt: JobRuntime) -> engine.PlainBounds:
        """The open round's plaintext bounds (computed once per round)."""
        task = rt.task
        assert task is not None
        cached = rt.extra.get("bounds")
        if cached is None or cached[0] != task.round_id:
            cached = (task.round_id, engine.plain_bounds(rt.config, task))
            rt.extra["bounds"] = cached
        bounds: engine.PlainBounds = cached[1]
        return bounds

    def _secure_upload(self, rt: JobRuntime, sess: Any, job: JobRow, rr: RoundRow, idx: int,
                       up: ParsedUpload) -> None:
        sr = rt.extra["secagg"].current
        if sr is None or sr.round_id != rr.round_id or sr.phase != "upload":
            raise ApiError(409, "wrong_phase", f"round {rr.round_id} is not collecting uploads")
        if up.secagg is None:
            raise ApiError(400, "malformed_upload", "a masked upload needs its secagg header")
        try:
            header = parse(MaskedUpload, up.secagg)
        except InvalidMessage as exc:
            raise ApiError(400, "invalid_message", str(exc)) from exc
        if header.sender != idx:
            raise ApiError(403, "wrong_sender", "the upload header names another client")
        self._secagg_call(lambda: sr.server.receive_upload(header, up.summable))
        disclosed = pack({"type": "disclosed"}, up.disclosed) if up.disclosed else None
        # the masked vector is kept until the round closes, so a restarted server can add it
        # into the rebuilt running sum again (the in-memory sum stays O(vector))
        vec = up.summable.astype("<u8", copy=False)
        if self.spool is not None:
            self._spool_write(rr.job_id, rr.round_id, idx, vec)
        sess.add(UploadRow(job_id=rr.job_id, round_id=rr.round_id, client_index=idx,
                           digest=up.digest, received_at=self.clock(),
                           summable=None if self.spool is not None else vec.tobytes(),
                           disclosed=disclosed))
        sess.add(SecAggMessageRow(job_id=rr.job_id, round_id=rr.round_id, stage="upload",
                                  client_index=idx, body=up.secagg,
                                  digest=hashlib.sha256(up.secagg.encode()).hexdigest()))
        sess.flush()
        self._secure_progress(rt, sess, job, rr)

    def _secure_progress(self, rt: JobRuntime, sess: Any, job: JobRow, rr: RoundRow, *,
                         force: bool = False) -> None:
        """Advance the open secure round through every phase that is complete (or, with
        ``force``, close the current phase with whoever answered); finish it at the end."""
        bridge: SecAggBridge = rt.extra["secagg"]
        sr = bridge.current
        if sr is None or sr.round_id != rr.round_id or rr.status != "open":
            return
        phase = sr.phase
        try:
            while sr.phase in ("advertise", "share", "upload", "unmask"):
                phase = sr.phase
                if sr.missing() and not force:
                    break
                force = False
                if phase == "unmask":
                    ring = sr.server.finish()
                    bridge.finished(sr)
                    contributors = sorted(int(u) for u in (sr.request.survivors
                                                           if sr.request else ()))
                    self._close(rt, sess, job, rr, contributors, ring=ring, secure=sr)
                    return
                sr.advance()
                self._touch(job.id)
                rr.phase = sr.phase
                rr.deadline_at = self.clock() + job.round_deadline_s
        except AbortedRound as exc:
            bridge.current = None
            refused = "; ".join(f"{rt.names[k]} refused ({why})" for k, why in sr.refused.items())
            self._fail(sess, job, f"round {rr.round_id}: secure aggregation aborted in phase "
                       f"{phase}: {exc}"
                       + (f" [{refused}]" if refused else "")
                       + "; no partial sum was released", rr)

    def _round_for_upload(self, sess: Any, job: JobRow, member: MemberRow,
                          round_id: int) -> RoundRow:
        if member.state == "dropped":
            raise ApiError(403, "dropped", f"this client was dropped at round "
                           f"{member.dropped_round}")
        if member.state != "active":
            raise ApiError(409, "not_joined", "join the job first")
        rr = sess.get(RoundRow, (job.id, round_id))
        if rr is None:
            raise ApiError(409, "wrong_round", f"round {round_id} has not been issued "
                           f"(current round: {job.current_round})")
        if job.status != "running" and rr.status == "open":
            raise ApiError(409, "job_finished", f"the job is {job.status}")
        return rr

    def _receipt(self, rr: RoundRow, idx: int, digest: str, *, duplicate: bool
                 ) -> dict[str, Any]:
        return {"job_id": rr.job_id, "round_id": rr.round_id, "client_index": idx,
                "upload_sha256": digest, "task_sha256": rr.task_digest, "duplicate": duplicate,
                "audit_head": self.audit.head(rr.job_id)}

    def _accumulate(self, rt: JobRuntime, sess: Any, rr: RoundRow, idx: int,
                    up: ParsedUpload) -> None:
        disclosed = pack({"type": "disclosed"}, up.disclosed) if up.disclosed else None
        if rr.encoding == "uint64":
            # masked or fixed-point: add into the running sum now (memory O(vector))
            if rr.running_sum is None:
                total = up.summable.copy()
            else:
                total = np.frombuffer(rr.running_sum, dtype="<u8").copy()
                total += up.summable  # wraps mod 2^64 by design
            rr.running_sum = total.astype("<u8").tobytes()
            sess.add(UploadRow(job_id=rr.job_id, round_id=rr.round_id, client_index=idx,
                               digest=up.digest, received_at=self.clock(), summable=None,
                               disclosed=disclosed))
        else:
            sess.add(UploadRow(job_id=rr.job_id, round_id=rr.round_id, client_index=idx,
                               digest=up.digest, received_at=self.clock(),
                               summable=up.summable.astype("<f8").tobytes(),
                               disclosed=disclosed))

    # ------------------------------------------------------------------ closing rounds
    def tick(self, *, full_every: int = 5) -> None:
        """Apply deadlines and finish rounds whose uploads are all in (called periodically).

        Between deadlines a tick costs no query (:meth:`_tick_if_due`); every ``full_every``-th
        tick re-reads every running job from the database (a fallback: the message that
        completes a phase closes it itself). Spooled uploads are swept after a round closed."""
        self._ticks += 1
        full = self._ticks % max(full_every, 1) == 1 or full_every <= 1
        if full:
            with self.db.session() as sess:
                ids = list(sess.scalars(select(JobRow.id).where(JobRow.status == "running")))
        else:
            ids = list(self._due)
        for job_id in ids:
            with self.lock:
                if full:
                    self._tick_job(job_id)
                else:
                    self._tick_if_due(job_id)
            self._notify(job_id)  # after the commit: a deadline may have moved the job on
        if self._sweep_due or full:
            with self.lock:
                self._sweep_due = False
                self._sweep_spool()

    def _tick_if_due(self, job_id: str) -> None:
        """What a request does before it answers: apply the open round's deadline if it has
        passed (one small query). Closing complete rounds is left to the message that
        completes them and to the periodic :meth:`tick`."""
        due = self._due.get(job_id)
        if due is not None and self.clock() < due:
            return  # no deadline can have passed yet: no query
        with self.db.session() as sess:
            row = sess.execute(select(JobRow.status, JobRow.round_deadline_s, RoundRow.status,
                                      RoundRow.deadline_at).join(RoundRow, (
                                          RoundRow.job_id == JobRow.id) & (
                                          RoundRow.round_id == JobRow.current_round))
                               .where(JobRow.id == job_id)).first()
        if row is None or row[0] != "running" or row[2] != "open":
            self._due.pop(job_id, None)
            return
        at = max(row[3], self.started_at + row[1])
        if self.clock() >= at:
            self._due.pop(job_id, None)
            self._deadline(job_id)
        else:
            # Deadlines only move later (each phase and round sets now + the job's fixed
            # round deadline), so this one is a lower bound for every later one of the job;
            # the periodic tick reads the database in any case.
            self._due[job_id] = at

    def _tick_job(self, job_id: str) -> None:
        with self.db.session() as sess:
            job = sess.get(JobRow, job_id)
            if job is None or job.status != "running":
                return
            rr = sess.get(RoundRow, (job_id, job.current_round))
            if rr is None or rr.status != "open" or self.clock() < self._deadline_at(rr, job):
                late = False
            else:
                late = True
        if late:
            self._deadline(job_id)
        else:
            self._maybe_close(job_id)

    def _contributors(self, sess: Any, rr: RoundRow) -> list[int]:
        return sorted(sess.scalars(select(UploadRow.client_index).where(
            UploadRow.job_id == rr.job_id, UploadRow.round_id == rr.round_id)))

    def _open_round(self, sess: Any, job_id: str) -> tuple[JobRow, RoundRow] | None:
        """The running job and its open round, or None when there is nothing to act on."""
        job = sess.get(JobRow, job_id)
        assert_row(job)
        rr = sess.get(RoundRow, (job_id, job.current_round))
        if job.status != "running" or rr is None or rr.status != "open":
            return None
        return job, rr

    def _maybe_close(self, job_id: str) -> None:
        rt = self._runtime(job_id)
        with self._guard(job_id), self.db.session() as sess:
            found = self._open_round(sess, job_id)
            if found is None:
                return
            job, rr = found
            if rt.extra.get("secagg") is not None:
                self._secure_progress(rt, sess, job, rr)
                return
            expected = set(json.loads(rr.participants_json)) - set(json.loads(rr.dropped_json))
            got = self._contributors(sess, rr)
            if expected <= set(got):
                self._close(rt, sess, job, rr, got)

    def _deadline(self, job_id: str) -> None:
        rt = self._runtime(job_id)
        with self._guard(job_id), self.db.session() as sess:
            found = self._open_round(sess, job_id)
            if found is None:
                return
            job, rr = found
            bridge = rt.extra.get("secagg")
            if bridge is not None:
                sr = bridge.current
                if sr is None or sr.round_id != rr.round_id:
                    return
                late = sorted(sr.missing())
                dropped = self._drop(rt, sess, job, late, rr.round_id,
                                     reason=f"missed the round deadline (phase {sr.phase})")
                sr.dropped.update(late)
                _add_dropped(rr, dropped)
                self._secure_progress(rt, sess, job, rr, force=True)
                return
            got = self._contributors(sess, rr)
            late = sorted(set(json.loads(rr.participants_json)) - set(got))
            dropped = self._drop(rt, sess, job, late, rr.round_id)
            _add_dropped(rr, dropped)
            if len(got) >= job.min_clients:
                self._close(rt, sess, job, rr, got)
            else:
                reason = (f"round {rr.round_id}: only {len(got)} of the required "
                          f"{job.min_clients} clients answered before the deadline; "
                          "training stopped and no partial sum was released")
                self._fail(sess, job, reason, rr)

    def _drop(self, rt: JobRuntime, sess: Any, job: JobRow, indices: list[int],
              round_id: int, reason: str = "missed the round deadline") -> list[int]:
        out = []
        for idx in indices:
            member = sess.scalar(select(MemberRow).where(
                MemberRow.job_id == job.id, MemberRow.client_index == idx))
            if member is None or member.state == "dropped":
                continue
            member.state = "dropped"
            member.dropped_round = round_id
            out.append(idx)
            self._touch(job.id)
            self.audit.append(job.id, "client_dropped", {
                "client": rt.names[idx], "round_id": round_id, "reason": reason})
            _log.warning("job %s: client %s dropped at round %d", job.id, rt.names[idx],
                         round_id)
        return out

    def _fail(self, sess: Any, job: JobRow, reason: str, rr: RoundRow | None) -> None:
        self._touch(job.id)
        job.status = "failed"
        job.reason = reason
        rt = self._rts.get(job.id)
        if rt is not None and rt.extra.get("secagg") is not None:
            rt.extra["secagg"].current = None
        if rr is not None:
            self.audit.append(job.id, "round_aborted", {"round_id": rr.round_id,
                                                        "reason": reason})
        _log.error("job %s failed: %s", job.id, reason)

    def _close(self, rt: JobRuntime, sess: Any, job: JobRow, rr: RoundRow,
               contributors: list[int], *, ring: np.ndarray | None = None,
               secure: SecureRound | None = None) -> None:
        task = rt.task
        if task is None or task.round_id != rr.round_id:
            raise RuntimeError("runtime out of step with the database")
        uploads = {u.client_index: u for u in sess.scalars(select(UploadRow).where(
            UploadRow.job_id == job.id, UploadRow.round_id == rr.round_id))}
        if set(contributors) - set(uploads):
            raise RuntimeError("a survivor of the secure round has no upload row")
        if ring is not None:
            total = np.asarray(rt.codec.decode(ring), dtype=np.float64)
        else:
            total = self._total(rt, rr, contributors, uploads)
        disclosed = {idx: unpack(uploads[idx].disclosed)[1] if uploads[idx].disclosed else {}
                     for idx in contributors}
        problem = None
        if not np.isfinite(total).all():
            problem = "the aggregate has non-finite entries"
        else:
            try:
                rt.coord.submit(rr.round_id, total, disclosed=disclosed,
                                participants=list(contributors))
            except (FedForestError, ValueError, ArithmeticError) as exc:
                problem = f"the aggregate was rejected ({type(exc).__name__}: {exc})"
        if problem is not None:
            # fail the round and the job once, cleanly: never a 5xx on every retry and tick
            for u in uploads.values():
                u.summable = None
            rr.running_sum = None
            self._fail(sess, job, f"round {rr.round_id}: {problem}; training stopped and no "
                       "aggregate was released", rr)
            return
        rr.status = "closed"
        rr.closed_at = self.clock()
        rr.aggregate = total.astype("<f8").tobytes()
        rr.contributors_json = json.dumps(contributors)
        rr.disclosed_blob = pack({"type": "disclosed_all"}, {
            f"{idx}/{name}": arr for idx, items in disclosed.items()
            for name, arr in items.items()})
        rr.running_sum = None
        for u in uploads.values():
            u.summable = None
        self._sweep_due = True
        if secure is not None:  # the round's relay state is not needed once its sum is out
            sess.execute(delete(SecAggMessageRow).where(
                SecAggMessageRow.job_id == job.id, SecAggMessageRow.round_id == rr.round_id))
        self._audit_round(rt, rr, task, contributors, uploads, total, disclosed, secure)
        spends, decisions = rt.coord.pop_events()
        for sp in spends:
            self.audit.append(rt.job_id, "dp_spend", {
                "epsilon": sp["epsilon"], "delta": sp["delta"], "mechanism": sp["mechanism"],
                "total_epsilon": sp["total_epsilon"], "total_delta": sp["total_delta"],
                "round_id": sp["round"], "sigma_client": sp["sigma_client"]})
        for dec in decisions:
            self.audit.append(rt.job_id, "split", {"splits": dec["splits"],
                                                   "level": dec["level"],
                                                   "round_id": rr.round_id})
        self._issue_next(rt, sess, job)

    def _total(self, rt: JobRuntime, rr: RoundRow, contributors: list[int],
               uploads: dict[int, UploadRow]) -> np.ndarray:
        if rr.encoding == "uint64":
            ring = (np.frombuffer(rr.running_sum, dtype="<u8").copy() if rr.running_sum
                    else np.zeros(0, dtype=np.uint64))
            return np.asarray(rt.codec.decode(ring), dtype=np.float64)
        total: np.ndarray | None = None
        for idx in contributors:  # client order: bit-identical to the in-process sum
            vec = np.frombuffer(uploads[idx].summable or b"", dtype="<f8")
            with np.errstate(over="ignore", invalid="ignore"):  # checked by the caller
                total = vec.copy() if total is None else total + vec
        if total is None:
            raise RuntimeError("closing a round without uploads")
        return total

    def _audit_round(self, rt: JobRuntime, rr: RoundRow, task: Task, contributors: list[int],
                     uploads: dict[int, UploadRow], total: np.ndarray,
                     disclosed: dict[int, dict[str, np.ndarray]],
                     secure: SecureRound | None = None) -> None:
        names = [rt.names[i] for i in contributors]
        # The aggregate in full; the task by its digest (the exact bytes every client hashed
        # and bound its masks to) and the shape of its arrays. Its arrays are as large as the
        # aggregate (per-node thresholds) and follow from the configuration and the earlier
        # aggregates: `fedforest audit verify --replay` recomputes each task and checks it.
        arrays = {"aggregate": total}
        extra: dict[str, Any] = {"task_arrays": {
            k: {"dtype": np.asarray(v).dtype.str, "shape": list(np.shape(v))}
            for k, v in sorted(task.arrays.items())}}
        if secure is not None:
            req = secure.request
            extra["secagg"] = {
                "threshold": secure.server.t,
                "advertised": [rt.names[i] for i in sorted(secure.server.advertised)],
                "shared": [rt.names[i] for i in sorted(secure.server.shared)],
                "recovered": [rt.names[i] for i in (req.dropped if req else ())],
                "unmasked_by": [rt.names[i] for i in sorted(secure.server.answered)],
            }
        self.audit.append(rt.job_id, "round", {**extra,
            "round_id": rr.round_id, "clients": names,
            "uploads": {rt.names[i]: uploads[i].digest for i in contributors},
            "masked": bool(rt.extra.get("secagg") is not None),
            "task_kind": task.kind.value, "level": task.level,
            "layout": [b.to_json() for b in task.layout], "task_digest": rr.task_digest,
            "params": task.params, "encoding": rr.encoding,
        }, arrays)
        for idx, items in disclosed.items():
            for item, arr in items.items():
                self.audit.append(rt.job_id, "disclosure", {
                    "client": rt.names[idx], "item": item, "round_id": rr.round_id},
                    {"data": arr})

    # ------------------------------------------------------------------ issuing rounds
    def _issue_next(self, rt: JobRuntime, sess: Any, job: JobRow) -> None:
        self._touch(job.id)
        active = sorted(sess.scalars(select(MemberRow.client_index).where(
            MemberRow.job_id == job.id, MemberRow.state == "active")))
        if len(active) < job.min_clients:
            self._fail(sess, job, f"only {len(active)} clients remain, fewer than the required "
                       f"{job.min_clients}; training stopped", None)
            return
        issued = rt.coord.next_task()
        if issued is None:
            model = rt.coord.result()
            text = model.to_json()
            job.model_json = text
            job.model_digest = hashlib.sha256(text.encode()).hexdigest()
            job.status = "done"
            job.reason = "training complete"
            rt.task = None
            self.audit.append(job.id, "model", {"digest": job.model_digest})
            _log.info("job %s done: model %s (server CPU so far %.1f s)", job.id,
                      job.model_digest, time.process_time())
            return
        task = seal(issued)  # packed and hashed once for the row, the round setup and clients
        if task.round_id <= job.current_round:
            raise RuntimeError("the coordinator issued a round id that is not increasing")
        now = self.clock()
        ring = engine.uses_ring(rt.config)
        sess.add(RoundRow(job_id=job.id, round_id=task.round_id, kind=task.kind.value,
                          level=task.level, task_blob=task.to_bytes(),
                          task_digest=task.digest().hex(),
                          encoding="uint64" if ring else "float64",
                          participants_json=json.dumps(active), issued_at=now,
                          deadline_at=now + job.round_deadline_s, status="open",
                          phase="upload", dropped_json="[]"))
        job.current_round = task.round_id
        self._due[job.id] = now + job.round_deadline_s  # a lower bound (see _tick_if_due)
        rt.task = task
        rt.codec = engine.make_codec(rt.config, task) if ring else None
        bridge = rt.extra.get("secagg")
        if bridge is not None:
            sess.flush()
            if not bridge.directory:
                bridge.directory = self._load_directory(sess, job.id)
            missing = sorted(set(active) - set(bridge.directory))
            if missing:
                self._fail(sess, job, f"clients {missing} have no registered identity key", None)
                return
            riding = dict(bridge.pending)
            sr = bridge.start(task, active)
            for idx in sorted(sr.server.advertised):  # the adverts that rode on the last round
                text = riding[idx].model_dump_json()
                sess.add(SecAggMessageRow(job_id=job.id, round_id=task.round_id, stage="advert",
                                          client_index=idx, body=text,
                                          digest=hashlib.sha256(text.encode()).hexdigest()))
            rr = sess.get(RoundRow, (job.id, task.round_id))
            rr.phase = bridge.current.phase if bridge.current else "advertise"
            self._secure_progress(rt, sess, job, rr)

    def _load_directory(self, sess: Any, job_id: str) -> dict[int, bytes]:
        rows = sess.scalars(select(SecAggMessageRow).where(
            SecAggMessageRow.job_id == job_id, SecAggMessageRow.round_id == -1,
            SecAggMessageRow.stage == "identity"))
        return {int(r.client_index): bytes.fromhex(r.body) for r in rows}

    # ------------------------------------------------------------------ runtime (re)build
    def _guard(self, job_id: str) -> _Evict:
        return _Evict(self, job_id)

    def _runtime(self, job_id: str) -> JobRuntime:
        rt = self._rts.get(job_id)
        if rt is not None:
            return rt
        with self.db.session() as sess:
            job = sess.get(JobRow, job_id)
            if job is None:
                raise ApiError(404, "unknown_job", f"no job {job_id!r} for this client")
            config = JobConfig.from_json(job.config_json)
            names = {m.client_index: c.name for m, c in sess.execute(
                select(MemberRow, ClientRow).join(ClientRow, ClientRow.id == MemberRow.client_id)
                .where(MemberRow.job_id == job_id))}
            rt = JobRuntime(job_id, config, names, job.min_clients, job.round_deadline_s)
            if engine.uses_secagg(config):
                rt.extra["secagg"] = SecAggBridge(
                    job_id, _secagg_threshold(config),
                    neighbours=config.profile.get("neighbours"))
            if job.status in ("running", "waiting"):
                rt.coord = engine.new_coordinator(config)
                rounds = list(sess.scalars(select(RoundRow).where(RoundRow.job_id == job_id)
                                           .order_by(RoundRow.round_id)))
                try:
                    self._replay(rt, rounds, sess)
                except RuntimeError as exc:
                    self._fail(sess, job, f"cannot resume: {exc}", None)
                    rt.coord = None
        self._rts[job_id] = rt
        return rt

    def _replay(self, rt: JobRuntime, rounds: list[RoundRow], sess: Any) -> None:
        for rr in rounds:
            issued = rt.coord.next_task()
            task = seal(issued) if issued is not None else None
            if task is None or task.round_id != rr.round_id or task.digest().hex() != \
                    rr.task_digest:
                raise RuntimeError(f"replayed task of round {rr.round_id} does not match the "
                                   "stored one")
            if rr.status == "open":
                rt.task = task
                rt.codec = engine.make_codec(rt.config, task) if engine.uses_ring(
                    rt.config) else None
                if rt.extra.get("secagg") is not None:
                    self._resume_secure(rt, sess, rr, task)
                break
            total = np.frombuffer(rr.aggregate or b"", dtype="<f8").copy()
            contributors = [int(i) for i in json.loads(rr.contributors_json or "[]")]
            flat = unpack(rr.disclosed_blob)[1] if rr.disclosed_blob else {}
            disclosed: dict[int, dict[str, np.ndarray]] = {i: {} for i in contributors}
            for key, arr in flat.items():
                idx, name = key.split("/", 1)
                disclosed[int(idx)][name] = arr
            rt.coord.submit(rr.round_id, total, disclosed=disclosed, participants=contributors)
            rt.coord.pop_events()  # replayed rounds were audited when they first closed

    def _resume_secure(self, rt: JobRuntime, sess: Any, rr: RoundRow, task: Task) -> None:
        """Rebuild the open secure round ``rr`` from the messages stored with it."""
        bridge: SecAggBridge = rt.extra["secagg"]
        bridge.directory = self._load_directory(sess, rt.job_id)
        msgs: dict[str, dict[int, str]] = {}
        for m in sess.scalars(select(SecAggMessageRow).where(
                SecAggMessageRow.job_id == rt.job_id, SecAggMessageRow.round_id == rr.round_id)):
            msgs.setdefault(m.stage, {})[int(m.client_index)] = m.body
        participants = [int(i) for i in json.loads(rr.participants_json)]
        dropped = set(sess.scalars(select(MemberRow.client_index).where(
            MemberRow.job_id == rt.job_id, MemberRow.state == "dropped")))

        def loader(idx: int) -> Callable[[], tuple[str, np.ndarray]]:
            def load() -> tuple[str, np.ndarray]:
                path = self._spool_file(rt.job_id, rr.round_id, idx)
                if path is not None and path.is_file():
                    return msgs["upload"][idx], np.fromfile(path, dtype="<u8")
                blob = sess.scalar(select(UploadRow.summable).where(
                    UploadRow.job_id == rt.job_id, UploadRow.round_id == rr.round_id,
                    UploadRow.client_index == idx))
                if blob is None:
                    raise RuntimeError(f"the masked upload of client {idx} in round "
                                       f"{rr.round_id} was not kept (spool {self.spool})")
                return msgs["upload"][idx], np.frombuffer(blob, dtype="<u8")
            return load

        stored = StoredRound(
            phase=rr.phase, adverts=msgs.get("advert", {}), shares=msgs.get("shares", {}),
            uploads={idx: loader(idx) for idx in msgs.get("upload", {})},
            unmask=msgs.get("unmask", {}), dropped=dropped & set(participants),
            refused=msgs.get("refuse", {}))
        bridge.resume(task, participants, stored)
        _log.warning("job %s: resumed secure round %d in phase %s after a restart", rt.job_id,
                     rr.round_id, rr.phase)


    # ------------------------------------------------------------------ upload spool
    def _spool_file(self, job_id: str, round_id: int, idx: int) -> Path | None:
        if self.spool is None:
            return None
        return self.spool / job_id / str(round_id) / f"{idx}.u64"

    def _spool_write(self, job_id: str, round_id: int, idx: int, vec: np.ndarray) -> None:
        path = self._spool_file(job_id, round_id, idx)
        if path is None:
            raise RuntimeError("no spool directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            np.ascontiguousarray(vec, dtype="<u8").tofile(fh)
        os.replace(tmp, path)  # whole or absent, never half a vector

    def _sweep_spool(self) -> None:
        """Remove the spooled uploads of rounds that closed (after their commit; under the
        lock, so no upload of the open round is being written meanwhile)."""
        if self.spool is None or not self.spool.is_dir():
            return
        for job_dir in self.spool.iterdir():
            rounds = [d for d in job_dir.iterdir() if d.name.isdigit()]
            if not rounds:
                continue
            with self.db.session() as sess:
                row = sess.execute(select(JobRow.status, JobRow.current_round).where(
                    JobRow.id == job_dir.name)).first()
            for d in rounds:
                if row is None or row[0] != "running" or int(d.name) < row[1]:
                    shutil.rmtree(d, ignore_errors=True)


def _add_dropped(rr: RoundRow, dropped: list[int]) -> None:
    """Record more dropped clients on a round (a sorted JSON list, no duplicates)."""
    rr.dropped_json = json.dumps(sorted(set(json.loads(rr.dropped_json)) | set(dropped)))


def _secagg_threshold(config: JobConfig) -> float | int:
    thr = config.profile.get("threshold", 0.67)
    return int(thr) if isinstance(thr, int) and not isinstance(thr, bool) else float(thr)


def assert_row(row: object) -> None:
    if row is None:
        raise RuntimeError("row vanished")


class _Evict:
    """On an unexpected exception inside the block, forget the job's in-memory runtime (the DB
    rolls back; the next request rebuilds it from the database, as after a restart). A 4xx
    rejection (:class:`ApiError`) is raised before anything changes, so the runtime is kept."""

    def __init__(self, state: ServerState, job_id: str) -> None:
        self.state, self.job_id = state, job_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None and not (isinstance(exc_type, type)
                                         and issubclass(exc_type, ApiError)):
            self.state._rts.pop(self.job_id, None)
            self.state._due.pop(self.job_id, None)  # the rolled-back round's deadline is back
