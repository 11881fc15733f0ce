"""The jobs' in-memory runtimes, rebuilt from the database by replay.

A runtime is built on first use, and again after a restart or after a step failed unexpectedly
(:meth:`Runtimes.guard` forgets it; the database rolled back). Only the runtimes of waiting and
running jobs are kept: a stopped job's (done or failed: its configuration and site names, no
coordinator) is built for each step that asks for it, and the runtime of a job that stopped
while loaded is forgotten at the next :meth:`Runtimes.drop_stopped`, so that a server running
for weeks keeps no runtime of the jobs that ended (what it keeps of each is the audit log's
tip, about 0.3 KB, and the operator page's last check of its chain, about 0.4 KB: see
``audit_hook._AuditLogSink`` and ``ui._ChainCache``). The coordinator is rebuilt by
replaying the stored (task digest, aggregate, disclosed, participants) of every closed round
through ``next_task``/``submit``, checking each digest; the open round keeps its running sum in
the database. An open secure round is rebuilt from the messages it had accepted
(:meth:`SecAggBridge.resume <server_app.secagg_bridge.SecAggBridge.resume>`): each is stored in
the step that accepted it, so a client whose request was answered never has to send it again.
A job whose rounds do not replay fails with the reason, instead of serving a wrong state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from sqlalchemy.orm import Session

from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError, UploadRejected
from fedforest_secure.protocol import SealedTask, seal, unpack

from .db import Database, JobRow, RoundRow
from .deadlines import Deadlines
from .engine import new_coordinator
from .errors import ApiError
from .jobs import JobRuntime, new_runtime
from .logs import event
from .phases import SECURE, JobStatus, RoundStatus
from .secure_round import ACCUSE, REFUSE, StoredRound
from .spool import Spool, words
from .store import (
    client_names,
    dropped_members,
    identity_keys,
    participants,
    round_messages,
    rounds_of,
    upload_summable,
)

__all__ = ["Runtimes"]



class Runtimes:
    """The runtime of every waiting or running job this process has touched, by job id."""

    def __init__(self, db: Database, spool: Spool, deadlines: Deadlines,
                 on_unresumable: Callable[[Session, JobRow, str], None]) -> None:
        self._db = db
        self._spool = spool
        self._deadlines = deadlines
        #: fails a job whose stored rounds do not replay (in the rebuilding transaction)
        self._on_unresumable = on_unresumable
        self._loaded: dict[str, JobRuntime] = {}

    def peek(self, job_id: str) -> JobRuntime | None:
        """The job's runtime if it is loaded (nothing is built)."""
        return self._loaded.get(job_id)

    def loaded(self) -> dict[str, JobRuntime]:
        """Every loaded runtime, by job id (a copy)."""
        return dict(self._loaded)

    def get(self, job_id: str) -> JobRuntime:
        """The job's runtime, rebuilt from the database if it is not loaded."""
        rt = self._loaded.get(job_id)
        if rt is not None:
            return rt
        with self._db.session() as sess:
            job = sess.get(JobRow, job_id)
            if job is None:
                raise ApiError(404, "unknown_job", f"no job {job_id!r} for this client")
            rt = new_runtime(job_id, JobConfig.from_json(job.config_json),
                             client_names(sess, job_id), job.min_clients, job.round_deadline_s)
            if job.status in (JobStatus.RUNNING, JobStatus.WAITING):
                rt.coord = new_coordinator(rt.config)
                try:
                    self._replay(rt, sess)
                except (RuntimeError, FedForestError, ValueError) as exc:
                    # stored rounds the engine refuses now (or that do not fit together):
                    # the job stops once, with the reason, not on every tick and request
                    self._on_unresumable(sess, job, f"cannot resume: {exc}")
                    rt.release()
        if not rt.stopped:  # a stopped job's is built again when asked: no replay
            self._loaded[job_id] = rt
        return rt

    def drop_stopped(self) -> list[str]:
        """Forget the runtimes of the jobs that stopped (done or failed) while loaded; returns
        their ids. Called between steps: a step that stops a job still holds its runtime until
        its commit."""
        gone = [job_id for job_id, rt in self._loaded.items() if rt.stopped]
        for job_id in gone:
            self.evict(job_id)
        return gone

    def evict(self, job_id: str) -> None:
        """Forget the job's runtime (and its deadline bound): the next use rebuilds it."""
        self._loaded.pop(job_id, None)
        self._deadlines.forget(job_id)

    @contextmanager
    def guard(self, job_id: str) -> Iterator[None]:
        """On an unexpected exception inside the block, forget the job's runtime (the database
        rolls back; the next request rebuilds it, as after a restart). A step's session opens
        inside the block, so a commit that fails forgets it too. A 4xx rejection
        (:class:`ApiError`, or an upload that does not answer its task:
        :class:`~fedforest_secure.errors.UploadRejected`) is raised before anything changes,
        so the runtime is kept."""
        try:
            yield
        except (ApiError, UploadRejected):
            raise
        except BaseException:
            self.evict(job_id)
            raise

    def _replay(self, rt: JobRuntime, sess: Session) -> None:
        coord = rt.coordinator()
        for rr in rounds_of(sess, rt.job_id):
            issued = coord.next_task()
            task = seal(issued) if issued is not None else None
            if task is None or task.round_id != rr.round_id or task.digest().hex() != \
                    rr.task_digest:
                raise RuntimeError(f"replayed task of round {rr.round_id} does not match the "
                                   "stored one")
            if rr.status == RoundStatus.OPEN:
                rt.open_task(task)
                if rt.secure is not None:
                    self._resume_secure(rt, sess, rr, task)
                # every profile: the open round goes on where it was
                event("resume", logging.WARNING, job=rt.job_id, round=rr.round_id,
                      phase=rr.phase)
                break
            total = words(rr.aggregate or b"", "<f8",
                           f"the stored aggregate of round {rr.round_id}").copy()
            contributors = [int(i) for i in json.loads(rr.contributors_json or "[]")]
            flat = unpack(rr.disclosed_blob)[1] if rr.disclosed_blob else {}
            disclosed: dict[int, dict[str, np.ndarray]] = {i: {} for i in contributors}
            for key, arr in flat.items():
                idx, name = key.split("/", 1)
                disclosed[int(idx)][name] = arr
            coord.submit(rr.round_id, total, disclosed=disclosed, participants=contributors)
            coord.pop_events()  # replayed rounds were audited when they first closed

    def _resume_secure(self, rt: JobRuntime, sess: Session, rr: RoundRow,
                       task: SealedTask) -> None:
        """Rebuild the open secure round ``rr`` from the messages stored with it."""
        bridge = rt.secure
        if bridge is None:
            raise RuntimeError("not a secure job")
        bridge.directory = {i: bytes.fromhex(k) for i, k in identity_keys(sess, rt.job_id).items()}
        msgs = round_messages(sess, rt.job_id, rr.round_id)
        asked = participants(rr)
        spool = self._spool

        def loader(idx: int) -> Callable[[], tuple[str, np.ndarray]]:
            def load() -> tuple[str, np.ndarray]:
                vec = spool.read(rt.job_id, rr.round_id, idx)
                if vec is not None:
                    return msgs["upload"][idx], vec
                blob = upload_summable(sess, rt.job_id, rr.round_id, idx)
                if blob is None:
                    raise RuntimeError(f"the masked upload of client {idx} in round "
                                       f"{rr.round_id} was not kept (spool {spool.root})")
                return msgs["upload"][idx], words(
                    blob, "<u8", f"the masked upload of client {idx} in round {rr.round_id}")
            return load

        stored = StoredRound(
            phase=SECURE.parse(rr.phase), adverts=msgs.get("advert", {}),
            shares=msgs.get("shares", {}),
            uploads={idx: loader(idx) for idx in msgs.get("upload", {})},
            unmask=msgs.get("unmask", {}),
            signatures=msgs.get("signature", {}),
            dropped=dropped_members(sess, rt.job_id) & set(asked),
            refused=msgs.get(REFUSE, {}),
            accused={i: int(b) for i, b in msgs.get(ACCUSE, {}).items()})
        bridge.resume(task, asked, stored, rt.words())
