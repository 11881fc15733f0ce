"""Audit entries committed with the server database, appended to the audit log after.

The audit log is a database of its own, and a step of the server (a join, a drop, a round's
close, the model) changes the server database and makes audit entries: no transaction spans
both. So a step does not append its entries: it writes them to the server database
(:class:`~server_app.db.AuditOutboxRow`, each with the ``seq`` it takes in its job's chain) in
its own transaction, and once that transaction committed they are appended to the log and
their rows deleted (:data:`~server_app.db.AFTER_COMMIT`: in the same step, before it answers).
The log therefore never holds an entry of a step the database rolled back, and an entry of a
committed step is never lost:

* a server stopped between the commit and the append (``kill -9``, power loss) appends the
  entries when it starts again, before it serves (:meth:`Outbox.flush_all`). A commit is on
  disk before the append (SQLite: ``synchronous=FULL``; other databases: their own durable
  commit), so a power loss does not leave the log ahead of the database. Should it be ahead
  anyway (a disk that lied about its flush, a database restored from an older copy), the
  database marks the last ``seq`` each step queued (``audit_marks``, inserted with the entries),
  and the server refuses to start while the log's chain of an unfinished job goes further
  (:func:`~server_app.serve.check_audit_chains`), rather than log its rounds twice;
* one stopped between an append and the deletion of its row finds the entry in the log at its
  ``seq`` and does not append it again (a different entry at that place is an
  :class:`~fedforest_secure.errors.AuditError`);
* an append that fails (the audit database is down or locked) leaves the entries waiting: the
  job's chain tip is not announced (:meth:`Outbox.flush_waiting` is tried first, and its error
  fails the request) until they are in the log, so no client receipt pins a chain that lacks
  an entry of a step it was told about.
"""

from __future__ import annotations

import io
import json
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine, delete, func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, undefer

from fedforest_secure.audit import AuditLog
from fedforest_secure.audit.entry import canonical_json, encode_array, jsonable
from fedforest_secure.audit.kinds import EntryKind, check_payload
from fedforest_secure.errors import AuditError

from .db import AFTER_COMMIT, AuditMarkRow, AuditOutboxRow

__all__ = ["AuditPending", "Outbox", "Queued", "first_queued"]

#: ``Session.info`` keys: the entries a step queued, by job; the last ``seq`` it gave, by job
_QUEUED = "fedforest.audit_queued"
_LAST_SEQ = "fedforest.audit_last_seq"
_MARKS = "fedforest.audit_marks"
#: attempts of a flush that finds the chain moved on under it (another process appended the
#: same entries: a `fedforest server create-job` and a server flushing a new job at once)
_ATTEMPTS = 5


class AuditPending(AuditError):
    """A step committed, but its audit entries could not be appended to the log yet: they
    wait in the server database and are appended when the log answers again."""


@dataclass(frozen=True)
class Queued:
    """One entry waiting for the audit log: its place in the job's chain and its content."""

    seq: int
    kind: str
    payload: dict[str, Any]  # plain JSON values
    arrays: dict[str, np.ndarray]


def _pack(blobs: Mapping[str, bytes]) -> bytes | None:
    """Arrays as stored in the outbox: a little-endian length, a JSON list of ``[name,
    length]``, then each array's ``.npy`` bytes (:func:`encode_array`'s)."""
    if not blobs:
        return None
    head = json.dumps([[name, len(blob)] for name, blob in blobs.items()]).encode()
    return struct.pack("<I", len(head)) + head + b"".join(blobs.values())


def _unpack(packed: bytes | None) -> dict[str, np.ndarray]:
    if not packed:
        return {}
    (size,) = struct.unpack("<I", packed[:4])
    at, out = 4 + size, {}
    for name, length in json.loads(packed[4:at]):
        out[str(name)] = np.lib.format.read_array(io.BytesIO(packed[at:at + length]),
                                                  allow_pickle=False)
        at += length
    return out


def first_queued(sess: Session) -> dict[str, int]:
    """The jobs with entries waiting for the audit log, each with the first waiting ``seq``."""
    rows = sess.execute(select(AuditOutboxRow.job_id, func.min(AuditOutboxRow.seq))
                        .group_by(AuditOutboxRow.job_id))
    return {str(job): int(seq) for job, seq in rows}


class Outbox:
    """Queues a step's audit entries in its transaction and appends them to ``log`` once it
    committed; ``on_written(job, seq, hash)`` is told of every entry appended."""

    def __init__(self, log: AuditLog, on_written: Callable[[str, int, str], None]) -> None:
        self._log = log
        self._on_written = on_written
        #: jobs whose entries wait after a failed append, with the engine they wait in
        self._waiting: dict[str, Engine] = {}
        self._mu = threading.RLock()  # one flush at a time

    # ------------------------------------------------------------------ queueing
    def queue(self, sess: Session, job_id: str, kind: str, payload: Mapping[str, Any],
              arrays: Mapping[str, np.ndarray] | None = None) -> None:
        """Write one entry of ``job_id`` in ``sess``'s transaction, checked as
        :meth:`AuditLog.append <fedforest_secure.audit.AuditLog.append>` checks it (bad input
        raises here and the step rolls back); it is appended to the log once ``sess``
        committed."""
        plain = jsonable(payload)
        kept = {name: np.asarray(arr) for name, arr in (arrays or {}).items()}
        # a name or dtype the log refuses is refused now
        blobs = {name: encode_array(name, arr)[1] for name, arr in kept.items()}
        check_payload(EntryKind(kind), plain, set(kept))
        seq = self._next_seq(sess, job_id)
        sess.add(AuditOutboxRow(job_id=job_id, seq=seq, kind=kind, payload=canonical_json(plain),
                                arrays=_pack(blobs)))
        # committed with the step: how far the log may go (checked at a server's start); one
        # row per step, inserted, so no step waits for another's lock on it
        marks: dict[str, AuditMarkRow] = sess.info.setdefault(_MARKS, {})
        if job_id in marks:
            marks[job_id].seq = seq
        else:
            marks[job_id] = AuditMarkRow(job_id=job_id, seq=seq)
            sess.add(marks[job_id])
        queued: dict[str, list[Queued]] | None = sess.info.get(_QUEUED)
        if queued is None:
            queued = sess.info[_QUEUED] = {}
            engine = sess.get_bind()
            if not isinstance(engine, Engine):
                raise TypeError("an audited step's session is bound to an engine")
            sess.info.setdefault(AFTER_COMMIT, []).append(
                lambda: self._committed(engine, queued))
        queued.setdefault(job_id, []).append(Queued(seq, kind, plain, kept))

    def _next_seq(self, sess: Session, job_id: str) -> int:
        """The place of the next entry of ``job_id``: after the log's last entry and after
        every entry waiting (this step's included)."""
        last: dict[str, int] = sess.info.setdefault(_LAST_SEQ, {})
        if job_id not in last:
            waiting = sess.scalar(select(func.max(AuditOutboxRow.seq))
                                  .where(AuditOutboxRow.job_id == job_id))
            last[job_id] = max(int(waiting or 0), self._log.tip(job_id)[0])
        last[job_id] += 1
        return last[job_id]

    def _committed(self, engine: Engine, queued: dict[str, list[Queued]]) -> None:
        for job_id, entries in queued.items():
            self.flush(job_id, engine, entries)

    # ------------------------------------------------------------------ appending
    def flush(self, job_id: str, engine: Engine, entries: list[Queued] | None = None) -> None:
        """Append the entries of ``job_id`` waiting in ``engine``'s database (``entries``: the
        ones a step just committed, if none wait from before) and delete their rows. On
        failure they keep waiting (:meth:`flush_waiting` tries again) and the error is
        raised."""
        with self._mu:
            try:
                self._flush(job_id, engine, entries)
            except AuditError:  # this log is not the job's: said as it is
                self._waiting[job_id] = engine
                raise
            except Exception as exc:  # the log's database failed: the entries wait
                self._waiting[job_id] = engine
                said = (f"the database failed ({type(exc.orig or exc).__name__})"
                        if isinstance(exc, DBAPIError) else f"{type(exc).__name__}: {exc}")
                raise AuditPending(
                    f"job {job_id!r}: audit entries of a step the server saved could not be "
                    f"appended to the audit log yet ({said}): they wait in the server "
                    "database and are appended when the log answers again (the server tries "
                    "at every check and at its start)") from exc
            self._waiting.pop(job_id, None)

    def flush_waiting(self, job_id: str | None = None) -> None:
        """Append what waits after an append that failed (of ``job_id``, or of every job)."""
        if not self._waiting or (job_id is not None and job_id not in self._waiting):
            return  # the common case: no lock taken (every tip read asks)
        with self._mu:
            todo = dict(self._waiting) if job_id is None else (
                {job_id: self._waiting[job_id]} if job_id in self._waiting else {})
            for job, engine in todo.items():
                self.flush(job, engine)

    def flush_all(self, engine: Engine, job_id: str | None = None) -> None:
        """Append every entry waiting in ``engine``'s database (of ``job_id`` only, if given):
        at a server's start, those of steps that committed before a process stopped; at its
        ticks, those of a failed append, or of a `fedforest server create-job` stopped after
        its commit."""
        with self._mu:
            with Session(engine) as sess:
                jobs = sorted(first_queued(sess))
            for job in jobs:
                if job_id is None or job == job_id:
                    self.flush(job, engine)

    def _flush(self, job_id: str, engine: Engine, entries: list[Queued] | None) -> None:
        for attempt in range(_ATTEMPTS):
            seq, head = self._log.tip(job_id)
            if entries is None or job_id in self._waiting or (
                    entries and entries[0].seq > seq + 1):
                entries = self._load(engine, job_id)  # entries from before wait too
            if not entries:
                return
            try:
                for entry in entries:
                    if entry.seq <= seq:  # appended before the server stopped or by another
                        self._check_logged(job_id, entry)
                        continue
                    if entry.seq != seq + 1:
                        raise AuditError(
                            f"job {job_id!r}: the audit log's chain ends at seq {seq}, but the "
                            f"server database's next entry of the job takes seq {entry.seq}: "
                            "this audit log is not the one the job began with")
                    head = self._log.append(job_id, entry.kind, entry.payload, entry.arrays,
                                            expected_head=head)
                    seq = entry.seq
                    self._on_written(job_id, seq, head)
            except AuditError:
                if attempt + 1 < _ATTEMPTS and self._log.tip(job_id)[0] > seq:
                    entries = None  # another process appended meanwhile: read again
                    continue
                raise
            self._on_written(job_id, seq, head)  # the tip, also when nothing was appended
            with engine.begin() as conn:
                conn.execute(delete(AuditOutboxRow).where(AuditOutboxRow.job_id == job_id,
                                                          AuditOutboxRow.seq <= entries[-1].seq))
            return

    @staticmethod
    def _load(engine: Engine, job_id: str) -> list[Queued]:
        with Session(engine) as sess:
            # every column in the one query (``arrays`` is deferred elsewhere): another process
            # flushing the same job may delete the rows right after it, and a second query for
            # their arrays would find them gone
            rows = sess.scalars(select(AuditOutboxRow).where(AuditOutboxRow.job_id == job_id)
                                .options(undefer(AuditOutboxRow.arrays))
                                .order_by(AuditOutboxRow.seq)).all()
            return [Queued(r.seq, r.kind, _payload(r), _unpack(r.arrays)) for r in rows]

    def _check_logged(self, job_id: str, entry: Queued) -> None:
        """The log's entry at ``entry.seq`` must be ``entry`` (same kind and payload)."""
        found = next((e for e in self._log.entries(job_id=job_id, kind=entry.kind)
                      if e.seq == entry.seq), None)
        if found is None or found.payload_json != canonical_json(entry.payload):
            raise AuditError(
                f"job {job_id!r}: the audit log's entry seq {entry.seq} is not the "
                f"{entry.kind} entry the server database holds for that place: another "
                "process wrote this job's chain, or the server database was restored from "
                "an older copy; the entry was not appended")


def _payload(row: AuditOutboxRow) -> dict[str, Any]:
    value = json.loads(row.payload)
    if not isinstance(value, dict):
        raise AuditError(f"job {row.job_id!r}: the waiting audit entry seq {row.seq} has no "
                         "payload object")
    return value
