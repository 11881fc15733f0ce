"""The server's audit sink, over :mod:`fedforest_secure.audit`.

The server records job creation, joins, drops, every round, disclosures, DP spends, split
decisions and the model digest, and sends the chain tip (seq and hash) with every task, which
clients keep in their receipts. A step records its entries through :meth:`AuditSink.within`
its transaction: they are committed with it and appended to the log once it committed
(:mod:`server_app.audit_outbox`), so the log and the server database agree whenever the
server stops. Without an audit database a :class:`NullAudit` keeps the same interface and a
genesis head.

A job's members read its log (``GET /v1/jobs/{job}/audit``) without the arrays' bytes: each
round's aggregate, from which n-1 colluding sites would subtract their own vectors to get the
last site's, and each site's disclosures. Every entry keeps its arrays' SHA-256 digests, so the
chain and the sites' receipts verify the same. ``arrays_for_sites`` (the server setting
``audit_arrays_for_sites``) serves them the arrays too, for replaying the training; the
operator reads the whole log from the audit database either way.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from fedforest_secure.audit import GENESIS, AuditLog, Entry, export_jsonl, verify_entries
from fedforest_secure.audit.verify import unreadable
from fedforest_secure.dburl import in_memory
from fedforest_secure.errors import AuditError
from fedforest_secure.protocol import Task

from .audit_outbox import Outbox
from .secure_round import SecureRound
from .settings import IN_MEMORY, ConfigError

__all__ = ["AuditSink", "AuditWriter", "NullAudit", "open_audit", "record_events",
           "record_round"]


class AuditWriter(Protocol):
    """Records the entries of one step (:meth:`AuditSink.within`)."""

    def append(self, job_id: str, kind: str, payload: Mapping[str, Any],
               arrays: Mapping[str, np.ndarray] | None = None) -> None: ...


class AuditSink(Protocol):
    enabled: bool  # False: the server keeps no audit log
    #: whether a job's members get its log with the arrays' bytes (``export(arrays=True)``)
    arrays_for_sites: bool

    def within(self, sess: Session) -> AuditWriter:
        """The writer of the step whose transaction is ``sess``: its entries are committed
        with it, and appended to the log once it committed."""
        ...

    def flush_all(self, engine: Engine, job_id: str | None = None) -> None:
        """Append the entries committed in ``engine``'s database (of ``job_id`` only, if
        given) that the log lacks: those of a process stopped between a commit and its
        append, or of an append that failed."""
        ...

    def head(self, job_id: str) -> str: ...

    def tip(self, job_id: str) -> tuple[int, str]: ...

    def export(self, job_id: str, *, arrays: bool = True) -> str:
        """The job's entries as JSON lines; ``arrays=False``: without the arrays' bytes
        (each entry keeps their digests)."""
        ...

    def verify_chain(self, job_id: str, *, began_audited: bool = False,
                     model_digest: str | None = None) -> tuple[bool, int, list[str]]: ...


class NullAudit:
    """Records nothing; the head stays at genesis."""

    enabled = False
    arrays_for_sites = False

    def within(self, sess: Session) -> AuditWriter:
        return self

    def append(self, job_id: str, kind: str, payload: Mapping[str, Any],
               arrays: Mapping[str, np.ndarray] | None = None) -> None:
        return None

    def flush_all(self, engine: Engine, job_id: str | None = None) -> None:
        return None

    def head(self, job_id: str) -> str:
        return GENESIS

    def tip(self, job_id: str) -> tuple[int, str]:
        return 0, GENESIS

    def export(self, job_id: str, *, arrays: bool = True) -> str:
        return ""

    def verify_chain(self, job_id: str, *, began_audited: bool = False,
                     model_digest: str | None = None) -> tuple[bool, int, list[str]]:
        return False, 0, ["the server keeps no audit log (no audit_database in server.toml)"]

    def close(self) -> None:
        return None


class _StepWriter:
    """The entries of one step, queued in its transaction (:class:`Outbox`)."""

    def __init__(self, outbox: Outbox, sess: Session) -> None:
        self._outbox = outbox
        self._sess = sess

    def append(self, job_id: str, kind: str, payload: Mapping[str, Any],
               arrays: Mapping[str, np.ndarray] | None = None) -> None:
        self._outbox.queue(self._sess, job_id, kind, payload, arrays)


class _AuditLogSink:
    """The server is the only writer of its audit log, so each job's tip is kept in memory
    after the first read and replaced on every append (every task offer sends it)."""

    enabled = True

    def __init__(self, log: AuditLog, *, arrays_for_sites: bool = False) -> None:
        self._log = log
        self.arrays_for_sites = arrays_for_sites
        self._tips: dict[str, tuple[int, str]] = {}
        #: the hash of the last entry this server appended to each job's chain (entries other
        #: processes append, such as `fedforest server create-job`'s, clear it)
        self._written: dict[str, str] = {}
        self._mu = threading.Lock()  # an append and a tip read never interleave
        self._outbox = Outbox(log, self._appended)

    def within(self, sess: Session) -> AuditWriter:
        return _StepWriter(self._outbox, sess)

    def _appended(self, job_id: str, seq: int, head: str) -> None:
        with self._mu:
            self._tips[job_id] = (seq, head)
            self._written[job_id] = head

    def flush_all(self, engine: Engine, job_id: str | None = None) -> None:
        self._outbox.flush_all(engine, job_id)

    def head(self, job_id: str) -> str:
        return self.tip(job_id)[1]

    def tip(self, job_id: str) -> tuple[int, str]:
        """``(seq, hash)`` of the job's last entry: sent with every task for client receipts.
        Entries of the job that wait after a failed append are appended first (their error
        is raised): a tip announced covers every step the server answered."""
        self._outbox.flush_waiting(job_id)
        with self._mu:
            cached = self._tips.get(job_id)
            if cached is None:
                cached = self._tips[job_id] = self._log.tip(job_id)
            return cached

    def verify_chain(self, job_id: str, *, began_audited: bool = False,
                     model_digest: str | None = None) -> tuple[bool, int, list[str]]:
        """``(ok, entries, problems)`` of the job's hash chain (entries and links; the stored
        arrays are checked by ``fedforest audit verify``), and what a chain sound in itself can
        still have lost: entries after the tip this server last wrote, every entry of a job
        that ``began_audited``, or the entry of the job's model (``model_digest``)."""
        with self._mu:
            try:
                entries = self._log.entries(job_id=job_id)
            except (AuditError, DBAPIError) as exc:  # a row changed behind the log's back
                return False, 0, [unreadable("entries", exc)]
            written = self._written.get(job_id)
        problems = list(verify_entries(entries).problems)
        if written is not None and (not entries or entries[-1].hash != written):
            where = f"seq {entries[-1].seq}" if entries else "no entry"
            problems.append(f"the chain ends at {where}, not with the entry this server last "
                            "wrote: entries were deleted or rewritten")
        if began_audited and not entries:
            problems.append("the audit log holds no entry of this job, which began with one: "
                            "its chain was deleted, or the server uses another audit_database")
        if model_digest and entries and not any(_model_entry_of(e, model_digest)
                                                for e in entries):
            problems.append("the chain has no model entry for the job's model: its end was "
                            "cut or rewritten")
        return not problems, len(entries), problems

    def export(self, job_id: str, *, arrays: bool = True) -> str:
        """The job's entries as JSON lines, as ``fedforest audit export`` writes them;
        ``arrays=False``: without the arrays' bytes (no ``data``; each entry's ``arrays``
        keeps their digests, which its hash covers)."""
        self._outbox.flush_waiting(job_id)
        buf = io.StringIO()
        export_jsonl(self._log, buf, job_id=job_id, include_arrays=arrays)
        return buf.getvalue()

    def close(self) -> None:
        self._log.close()


def _model_entry_of(entry: Entry, digest: str) -> bool:
    try:
        return entry.kind == "model" and entry.payload.get("digest") == digest
    except ValueError:  # a damaged entry: verify_entries names it
        return False


def open_audit(url: str | None, *, arrays_for_sites: bool = False) -> AuditSink:
    """The audit log at ``url`` (SQLAlchemy URL or SQLite path), or a :class:`NullAudit`;
    SQLite in memory is refused (:class:`ConfigError`): a job's chain would not outlive the
    connection that wrote it. ``arrays_for_sites``: members read their job's log with the
    arrays' bytes (the setting ``audit_arrays_for_sites``), else without them."""
    if not url:
        return NullAudit()
    if in_memory(url):
        raise ConfigError(f"audit_database {url}: {IN_MEMORY}")
    return _AuditLogSink(AuditLog(url), arrays_for_sites=arrays_for_sites)


def record_round(sink: AuditWriter, job_id: str, names: Mapping[int, str], *, task: Task,
                 task_digest: str, encoding: str, contributors: Sequence[int],
                 uploads: Mapping[int, str], total: np.ndarray,
                 disclosed: Mapping[int, Mapping[str, np.ndarray]], masked: bool,
                 secure: SecureRound | None = None) -> None:
    """The ``round`` entry of a closed round, then one ``disclosure`` entry per disclosed item.

    The aggregate is logged in full; the task by its digest (the exact bytes every client
    hashed and bound its masks to) and the shape of its arrays. Its arrays are as large as the
    aggregate (per-node thresholds) and follow from the configuration and the earlier
    aggregates: ``fedforest audit verify --replay`` recomputes each task and checks it.
    ``uploads`` maps each contributor to its upload's digest.
    """
    extra: dict[str, Any] = {"task_arrays": {
        k: {"dtype": np.asarray(v).dtype.str, "shape": list(np.shape(v))}
        for k, v in sorted(task.arrays.items())}}
    if secure is not None:
        req = secure.request
        extra["secagg"] = {
            "threshold": secure.server.t,
            "advertised": [names[i] for i in sorted(secure.server.advertised)],
            "shared": [names[i] for i in sorted(secure.server.shared)],
            "recovered": [names[i] for i in (req.dropped if req else ())],
            "unmasked_by": [names[i] for i in sorted(secure.server.answered)],
        }
        if secure.server.corrupt_shares:  # shares routed around in this round's unmasking
            extra["secagg"]["corrupt_shares"] = [
                {"sender": names[w], "owner": names[o], "secret": what}
                for w, o, what in secure.server.corrupt_shares]
    sink.append(job_id, "round", {
        **extra,
        "round_id": task.round_id, "clients": [names[i] for i in contributors],
        "uploads": {names[i]: uploads[i] for i in contributors},
        "masked": masked,
        "task_kind": task.kind.value, "level": task.level,
        "layout": [b.to_json() for b in task.layout], "task_digest": task_digest,
        "params": task.params, "encoding": encoding,
    }, {"aggregate": total})
    for idx, items in disclosed.items():
        for item, arr in items.items():
            sink.append(job_id, "disclosure", {
                "client": names[idx], "item": item, "round_id": task.round_id},
                {"data": arr})


def record_events(sink: AuditWriter, job_id: str, round_id: int,
                  spends: Sequence[Mapping[str, Any]],
                  decisions: Sequence[Mapping[str, Any]]) -> None:
    """The coordinator's DP spends and split decisions of a closed round."""
    for sp in spends:
        sink.append(job_id, "dp_spend", {
            "epsilon": sp["epsilon"], "delta": sp["delta"], "mechanism": sp["mechanism"],
            "total_epsilon": sp["total_epsilon"], "total_delta": sp["total_delta"],
            "round_id": sp["round"], "sigma_client": sp["sigma_client"],
            # the release's zCDP bound: the job's total composes from these alone
            "rho": sp["rho"], "xi": sp["xi"]})
    for dec in decisions:
        sink.append(job_id, "split", {"splits": dec["splits"], "level": dec["level"],
                                      "round_id": round_id})
