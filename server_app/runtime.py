"""The server's job state machine: joins, rounds, uploads, deadlines, restart by replay.

Every mutation runs under one lock and is written to the database in the same step, so a server
killed at any point restarts where it was: the coordinator is rebuilt by replaying the stored
(task digest, aggregate, disclosed, participants) of every closed round through
``next_task``/``submit``, checking each digest, and the open round keeps its running sum and the
digests of the uploads it already counted.

A round moves through phases. Without secure aggregation there is one phase, ``upload``. With it,
the :mod:`server_app.secagg_bridge` adds the key-advertisement / share / unmask phases around the
masked upload (see that module).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import select

from fedforest_secure.config import JobConfig
from fedforest_secure.protocol import Task, pack, unpack

from . import engine
from .audit_hook import AuditSink
from .db import ClientRow, Database, JobRow, MemberRow, RoundRow, UploadRow
from .errors import ApiError
from .jobspec import JobSpec, build_config, default_min_clients
from .settings import ConfigError
from .uploads import ParsedUpload, check_against_task, parse_upload

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
    task: Task | None = None
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


class ServerState:
    """All jobs of one server. Thread-safe; every public method is one atomic step."""

    def __init__(self, db: Database, audit: AuditSink,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.audit = audit
        self.clock = clock
        self.lock = threading.RLock()
        self._rts: dict[str, JobRuntime] = {}

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
            self._tick_job(job_id)
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
    def join(self, client: ClientRow, job_id: str) -> dict[str, Any]:
        with self.lock:
            with self.db.session() as sess:
                job, member = self._member(sess, client, job_id)
                if member.state == "dropped":
                    raise ApiError(403, "dropped",
                                   f"this client was dropped at round {member.dropped_round}")
                first = member.state == "invited"
                if first:
                    if job.status != "waiting":
                        raise ApiError(409, "job_started", "the job started without this client")
                    member.state = "active"
                    member.joined_at = self.clock()
                spec = JobSpec.model_validate_json(job.spec_json)
                info = {"job_id": job.id, "client_index": member.client_index,
                        "config": json.loads(job.config_json), "status": job.status,
                        "schema_sha256": spec.schema_sha256(), "min_clients": job.min_clients,
                        "round_deadline": job.round_deadline_s}
            if first:
                self.audit.append(job_id, "client_joined",
                                  {"client": client.name, "client_index": info["client_index"]})
            self._maybe_start(job_id)
            return info

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
            self._tick_job(job_id)
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
                done = sess.get(UploadRow, (job_id, rr.round_id, member.client_index))
                if done is not None:
                    return TaskOffer("wait", round_id=rr.round_id,
                                     detail="upload received; waiting for the other clients")
                return TaskOffer("task", round_id=rr.round_id, body=rr.task_blob,
                                 digest=rr.task_digest,
                                 deadline_in=max(0.0, rr.deadline_at - self.clock()),
                                 audit_head=self.audit.head(job_id), phase=rr.phase)

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
            rr = sess.get(RoundRow, (job_id, round_id))
            if rr is None:
                raise ApiError(404, "unknown_round", f"round {round_id} was not issued")
            return rr.task_blob

    def model(self, client: ClientRow, job_id: str) -> str:
        with self.db.session() as sess:
            job, _ = self._member(sess, client, job_id)
            if job.status != "done" or job.model_json is None:
                raise ApiError(409, "no_model", f"the job is {job.status}; no model yet")
            return job.model_json

    # ------------------------------------------------------------------ uploads
    def upload(self, client: ClientRow, job_id: str, round_id: int, body: bytes
               ) -> dict[str, Any]:
        up = parse_upload(body)
        if up.job_id != job_id or up.round_id != round_id:
            raise ApiError(400, "header_mismatch", "the upload header names another job or round")
        with self.lock:
            self._tick_job(job_id)
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
                check_against_task(up, rt.task, rr.task_digest, rr.encoding)
                self._accumulate(rt, sess, rr, idx, up)
                receipt = self._receipt(rr, idx, up.digest, duplicate=False)
            self._maybe_close(job_id)
            return receipt

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
    def tick(self) -> None:
        """Apply deadlines and finish rounds whose uploads are all in (called periodically)."""
        with self.db.session() as sess:
            ids = list(sess.scalars(select(JobRow.id).where(JobRow.status == "running")))
        for job_id in ids:
            with self.lock:
                self._tick_job(job_id)

    def _tick_job(self, job_id: str) -> None:
        with self.db.session() as sess:
            job = sess.get(JobRow, job_id)
            if job is None or job.status != "running":
                return
            rr = sess.get(RoundRow, (job_id, job.current_round))
            if rr is None or rr.status != "open" or self.clock() < rr.deadline_at:
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

    def _maybe_close(self, job_id: str) -> None:
        rt = self._runtime(job_id)
        with self._guard(job_id), self.db.session() as sess:
            job = sess.get(JobRow, job_id)
            assert_row(job)
            rr = sess.get(RoundRow, (job_id, job.current_round))
            if job.status != "running" or rr is None or rr.status != "open":
                return
            expected = set(json.loads(rr.participants_json)) - set(json.loads(rr.dropped_json))
            got = self._contributors(sess, rr)
            if expected <= set(got):
                self._close(rt, sess, job, rr, got)

    def _deadline(self, job_id: str) -> None:
        rt = self._runtime(job_id)
        with self._guard(job_id), self.db.session() as sess:
            job = sess.get(JobRow, job_id)
            assert_row(job)
            rr = sess.get(RoundRow, (job_id, job.current_round))
            if job.status != "running" or rr is None or rr.status != "open":
                return
            got = self._contributors(sess, rr)
            late = sorted(set(json.loads(rr.participants_json)) - set(got))
            dropped = self._drop(rt, sess, job, late, rr.round_id)
            rr.dropped_json = json.dumps(sorted(set(json.loads(rr.dropped_json)) | set(dropped)))
            if len(got) >= job.min_clients:
                self._close(rt, sess, job, rr, got)
            else:
                reason = (f"round {rr.round_id}: only {len(got)} of the required "
                          f"{job.min_clients} clients answered before the deadline; "
                          "training stopped and no partial sum was released")
                self._fail(sess, job, reason, rr)

    def _drop(self, rt: JobRuntime, sess: Any, job: JobRow, indices: list[int],
              round_id: int) -> list[int]:
        out = []
        for idx in indices:
            member = sess.scalar(select(MemberRow).where(
                MemberRow.job_id == job.id, MemberRow.client_index == idx))
            if member is None or member.state == "dropped":
                continue
            member.state = "dropped"
            member.dropped_round = round_id
            out.append(idx)
            self.audit.append(job.id, "client_dropped", {
                "client": rt.names[idx], "round_id": round_id,
                "reason": "missed the round deadline"})
            _log.warning("job %s: client %s dropped at round %d", job.id, rt.names[idx],
                         round_id)
        return out

    def _fail(self, sess: Any, job: JobRow, reason: str, rr: RoundRow | None) -> None:
        job.status = "failed"
        job.reason = reason
        if rr is not None:
            self.audit.append(job.id, "round_aborted", {"round_id": rr.round_id,
                                                        "reason": reason})
        _log.error("job %s failed: %s", job.id, reason)

    def _close(self, rt: JobRuntime, sess: Any, job: JobRow, rr: RoundRow,
               contributors: list[int]) -> None:
        task = rt.task
        if task is None or task.round_id != rr.round_id:
            raise RuntimeError("runtime out of step with the database")
        uploads = {u.client_index: u for u in sess.scalars(select(UploadRow).where(
            UploadRow.job_id == job.id, UploadRow.round_id == rr.round_id))}
        total = self._total(rt, rr, contributors, uploads)
        disclosed = {idx: unpack(uploads[idx].disclosed)[1] if uploads[idx].disclosed else {}
                     for idx in contributors}
        rt.coord.submit(rr.round_id, total, disclosed=disclosed, participants=list(contributors))
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
        self._audit_round(rt, rr, task, contributors, uploads, total, disclosed)
        self._issue_next(rt, sess, job)

    def _total(self, rt: JobRuntime, rr: RoundRow, contributors: list[int],
               uploads: dict[int, UploadRow]) -> np.ndarray:
        if rr.encoding == "uint64":
            ring = (np.frombuffer(rr.running_sum, dtype="<u8").copy() if rr.running_sum
                    else np.zeros(0, dtype=np.uint64))
            bridge = rt.extra.get("secagg")
            if bridge is not None:
                ring = bridge.unmask(rr, ring, contributors)
            return np.asarray(rt.codec.decode(ring), dtype=np.float64)
        total: np.ndarray | None = None
        for idx in contributors:  # client order: bit-identical to the in-process sum
            vec = np.frombuffer(uploads[idx].summable or b"", dtype="<f8")
            total = vec.copy() if total is None else total + vec
        if total is None:
            raise RuntimeError("closing a round without uploads")
        return total

    def _audit_round(self, rt: JobRuntime, rr: RoundRow, task: Task, contributors: list[int],
                     uploads: dict[int, UploadRow], total: np.ndarray,
                     disclosed: dict[int, dict[str, np.ndarray]]) -> None:
        names = [rt.names[i] for i in contributors]
        arrays = {"aggregate": total, **{f"task/{k}": v for k, v in task.arrays.items()}}
        self.audit.append(rt.job_id, "round", {
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
        active = sorted(sess.scalars(select(MemberRow.client_index).where(
            MemberRow.job_id == job.id, MemberRow.state == "active")))
        if len(active) < job.min_clients:
            self._fail(sess, job, f"only {len(active)} clients remain, fewer than the required "
                       f"{job.min_clients}; training stopped", None)
            return
        task = rt.coord.next_task()
        if task is None:
            model = rt.coord.result()
            text = model.to_json()
            job.model_json = text
            job.model_digest = hashlib.sha256(text.encode()).hexdigest()
            job.status = "done"
            job.reason = "training complete"
            rt.task = None
            self.audit.append(job.id, "model", {"digest": job.model_digest})
            _log.info("job %s done: model %s", job.id, job.model_digest)
            return
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
        rt.task = task
        rt.codec = engine.make_codec(rt.config, task) if ring else None

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
            if job.status in ("running", "waiting"):
                rt.coord = engine.new_coordinator(config)
                rounds = list(sess.scalars(select(RoundRow).where(RoundRow.job_id == job_id)
                                           .order_by(RoundRow.round_id)))
                try:
                    self._replay(rt, rounds)
                except RuntimeError as exc:
                    self._fail(sess, job, f"cannot resume: {exc}", None)
                    rt.coord = None
        self._rts[job_id] = rt
        return rt

    def _replay(self, rt: JobRuntime, rounds: list[RoundRow]) -> None:
        for rr in rounds:
            task = rt.coord.next_task()
            if task is None or task.round_id != rr.round_id or task.digest().hex() != \
                    rr.task_digest:
                raise RuntimeError(f"replayed task of round {rr.round_id} does not match the "
                                   "stored one")
            if rr.status == "open":
                rt.task = task
                rt.codec = engine.make_codec(rt.config, task) if engine.uses_ring(
                    rt.config) else None
                break
            total = np.frombuffer(rr.aggregate or b"", dtype="<f8").copy()
            contributors = [int(i) for i in json.loads(rr.contributors_json or "[]")]
            flat = unpack(rr.disclosed_blob)[1] if rr.disclosed_blob else {}
            disclosed: dict[int, dict[str, np.ndarray]] = {i: {} for i in contributors}
            for key, arr in flat.items():
                idx, name = key.split("/", 1)
                disclosed[int(idx)][name] = arr
            rt.coord.submit(rr.round_id, total, disclosed=disclosed, participants=contributors)


def assert_row(row: object) -> None:
    if row is None:
        raise RuntimeError("row vanished")


class _Evict:
    """On any exception inside the block, forget the job's in-memory runtime (DB rolls back)."""

    def __init__(self, state: ServerState, job_id: str) -> None:
        self.state, self.job_id = state, job_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.state._rts.pop(self.job_id, None)
