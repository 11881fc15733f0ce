"""The append-only audit log, stored through SQLAlchemy (SQLite by default, any URL).

The API can append and read, never update or delete. An append is one transaction that reads the
job's head and inserts the next entry (and its arrays); threads sharing an :class:`AuditLog` are
serialised by a lock, and separate writers (processes, other ``AuditLog`` objects) that race for
the same ``seq`` hit the ``UNIQUE(job_id, seq)`` constraint: the loser re-reads the head and
tries again, so the chain never forks. The byte format is described in
:mod:`fedforest_secure.audit.entry`.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import Engine, create_engine, inspect, make_url, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.pool import StaticPool

from ..errors import AuditError
from . import _tables as t
from .entry import GENESIS, ArrayInfo, Entry, decode_array, encode_array, format_timestamp
from .kinds import EntryKind, check_payload

if TYPE_CHECKING:
    from sqlalchemy.engine import Row

    from .recorder import JobRecorder

__all__ = ["AuditLog", "Clock", "to_url"]

Clock = Callable[[], datetime]

_MAX_ATTEMPTS = 50
_MAX_JOB_ID = 200


def to_url(db: str | Path) -> str:
    """A SQLAlchemy URL for ``db``: URLs (``scheme://...``) pass through, paths become SQLite."""
    text = str(db)
    if "://" in text:
        return text
    return f"sqlite:///{Path(text).expanduser().resolve()}"


def _missing_sqlite_file(url: str) -> bool:
    """Whether ``url`` names a SQLite file that does not exist (opening it would create it)."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite"):
        return False
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return False
    return not Path(database).expanduser().exists()


def _utc_now() -> datetime:
    return datetime.now(UTC)


class AuditLog:
    """An append-only, hash-chained log of every aggregate exchanged in federated jobs.

    Parameters
    ----------
    url:
        A SQLAlchemy URL or a file path (a SQLite file). Exactly one of ``url`` and ``engine``.
    engine:
        An existing engine (e.g. the server's); the log only touches its own two tables.
    clock:
        Returns the timezone-aware time stamped on each entry (inject a fixed one in tests).
    create:
        Create the tables if absent. With ``False`` a missing log raises :class:`AuditError`.
    """

    def __init__(self, url: str | Path | None = None, *, engine: Engine | None = None,
                 clock: Clock | None = None, create: bool = True) -> None:
        if (url is None) == (engine is None):
            raise TypeError("give exactly one of url and engine")
        self._owns_engine = engine is None
        if engine is None:
            full = to_url(url if url is not None else "")
            if not create and _missing_sqlite_file(full):
                raise AuditError(f"no audit log at {url}")
            engine = create_engine(full)
        self._engine = engine
        self._clock: Clock = clock or _utc_now
        self._lock = threading.RLock()
        if create:
            t.metadata.create_all(engine)
        else:
            names = set(inspect(engine).get_table_names())
            if not {t.entries.name, t.arrays.name} <= names:
                self.close()
                raise AuditError("the database holds no audit log tables")

    @classmethod
    def in_memory(cls, *, clock: Clock | None = None) -> AuditLog:
        """A log in a private in-memory SQLite database (one connection shared by threads)."""
        engine = create_engine("sqlite://", poolclass=StaticPool,
                               connect_args={"check_same_thread": False})
        log = cls(engine=engine, clock=clock)
        log._owns_engine = True
        return log

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        """Release the connections of an engine this log created (a given engine is left open)."""
        if self._owns_engine:
            self._engine.dispose()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------

    def append(self, job_id: str, kind: EntryKind | str, payload: Mapping[str, Any],
               arrays: Mapping[str, np.ndarray] | None = None, *,
               expected_head: str | None = None) -> str:
        """Append one entry to ``job_id``'s chain and return the new head (hex SHA-256).

        ``payload`` must be JSON-able (numpy scalars, tuples and enums are converted) and carry
        the keys :mod:`~fedforest_secure.audit.kinds` lists for ``kind``; ``arrays`` are stored
        as bytes with their SHA-256 in the hashed entry. With ``expected_head`` the append is a
        compare-and-swap: :class:`AuditError` if the job's head has moved on.
        Bad input raises ``ValueError`` / ``TypeError`` and writes nothing.
        """
        if not isinstance(job_id, str) or not job_id or len(job_id) > _MAX_JOB_ID \
                or not job_id.isprintable():
            raise ValueError(f"bad job id {job_id!r}")
        entry_kind = EntryKind(kind)
        encoded = {name: encode_array(name, arr) for name, arr in (arrays or {}).items()}
        infos = {name: info for name, (info, _) in encoded.items()}
        draft = Entry.build(job_id=job_id, seq=1, kind=entry_kind.value,
                            timestamp=format_timestamp(self._clock()), payload=payload,
                            arrays=infos, prev_hash=GENESIS)
        check_payload(entry_kind, draft.payload, set(infos))
        blobs = {name: blob for name, (_, blob) in encoded.items()}
        with self._lock:
            for attempt in range(_MAX_ATTEMPTS):
                try:
                    return self._try_append(draft, infos, blobs, expected_head)
                except (IntegrityError, OperationalError) as exc:
                    if isinstance(exc, OperationalError) and "locked" not in str(exc).lower():
                        raise
                    time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
        raise AuditError(f"job {job_id!r}: could not append after {_MAX_ATTEMPTS} attempts "
                         "(concurrent writers)")

    def _try_append(self, draft: Entry, infos: Mapping[str, ArrayInfo],
                    blobs: Mapping[str, bytes], expected_head: str | None) -> str:
        with self._engine.begin() as conn:
            row = conn.execute(
                select(t.entries.c.seq, t.entries.c.hash)
                .where(t.entries.c.job_id == draft.job_id)
                .order_by(t.entries.c.seq.desc()).limit(1)
            ).first()
            seq, prev = (int(row.seq), str(row.hash)) if row is not None else (0, GENESIS)
            if expected_head is not None and expected_head != prev:
                raise AuditError(f"job {draft.job_id!r}: head is {prev}, not {expected_head}")
            entry = Entry.build(job_id=draft.job_id, seq=seq + 1, kind=draft.kind,
                                timestamp=format_timestamp(self._clock()),
                                payload=draft.payload, arrays=infos, prev_hash=prev)
            self._insert(conn, entry, blobs)
        return entry.hash

    def _insert(self, conn: Any, entry: Entry, blobs: Mapping[str, bytes]) -> None:
        conn.execute(t.entries.insert().values(
            job_id=entry.job_id, seq=entry.seq, kind=entry.kind, round_id=entry.round_id,
            timestamp=entry.timestamp, payload=entry.payload_json, arrays=entry.arrays_json,
            prev_hash=entry.prev_hash, hash=entry.hash))
        if blobs:
            conn.execute(t.arrays.insert(), [
                {"job_id": entry.job_id, "seq": entry.seq, "name": name, "data": blob}
                for name, blob in blobs.items()])

    def import_entry(self, entry: Entry, blobs: Mapping[str, bytes]) -> str:
        """Append an entry made elsewhere (an export), verbatim, if it extends the chain.

        The entry must be the next ``seq``, link to the current head, hash correctly, and come
        with exactly its arrays, each matching its digest; otherwise :class:`AuditError`.
        """
        try:
            check_payload(EntryKind(entry.kind), entry.payload, set(blobs))
            infos = entry.arrays
            if set(infos) != set(blobs):
                raise ValueError("arrays do not match their descriptors")
            for name, info in infos.items():
                decode_array(info, blobs[name])
            if entry.computed_hash() != entry.hash:
                raise ValueError("hash does not match the entry")
        except ValueError as exc:
            raise AuditError(f"{entry.label}: cannot import: {exc}") from exc
        with self._lock, self._engine.begin() as conn:
            row = conn.execute(
                select(t.entries.c.seq, t.entries.c.hash)
                .where(t.entries.c.job_id == entry.job_id)
                .order_by(t.entries.c.seq.desc()).limit(1)
            ).first()
            seq, head = (int(row.seq), str(row.hash)) if row is not None else (0, GENESIS)
            if entry.seq != seq + 1 or entry.prev_hash != head:
                raise AuditError(f"{entry.label}: cannot import: does not extend the chain "
                                 f"(head is seq {seq})")
            self._insert(conn, entry, blobs)
        return entry.hash

    def job(self, job_id: str) -> JobRecorder:
        """A recorder with one typed method per entry kind, bound to ``job_id``."""
        from .recorder import JobRecorder

        return JobRecorder(self, job_id)

    # -- reading -------------------------------------------------------------------------------

    def head(self, job_id: str) -> str:
        """The hash of the job's last entry; the genesis value (64 zeros) if it has none."""
        with self._lock, self._engine.connect() as conn:
            value = conn.execute(
                select(t.entries.c.hash).where(t.entries.c.job_id == job_id)
                .order_by(t.entries.c.seq.desc()).limit(1)
            ).scalar()
        return str(value) if value is not None else GENESIS

    def tip(self, job_id: str) -> tuple[int, str]:
        """``(seq, hash)`` of the job's last entry, ``(0, genesis)`` if none: what a server
        announces with each task so that clients can write a :class:`~.receipts.Receipt`."""
        with self._lock, self._engine.connect() as conn:
            row = conn.execute(
                select(t.entries.c.seq, t.entries.c.hash).where(t.entries.c.job_id == job_id)
                .order_by(t.entries.c.seq.desc()).limit(1)
            ).first()
        return (int(row.seq), str(row.hash)) if row is not None else (0, GENESIS)

    def jobs(self) -> list[str]:
        """Every job id in the log, sorted."""
        with self._lock, self._engine.connect() as conn:
            rows = conn.execute(select(t.entries.c.job_id).distinct()).scalars().all()
        return sorted(str(r) for r in rows)

    def entries(self, job_id: str | None = None, round_id: int | None = None,
                kind: EntryKind | str | None = None) -> list[Entry]:
        """Entries ordered by job and ``seq``, optionally of one job, round or kind."""
        query = select(t.entries).order_by(t.entries.c.job_id, t.entries.c.seq,
                                           t.entries.c.id)
        if job_id is not None:
            query = query.where(t.entries.c.job_id == job_id)
        if round_id is not None:
            query = query.where(t.entries.c.round_id == round_id)
        if kind is not None:
            query = query.where(t.entries.c.kind == EntryKind(kind).value)
        with self._lock, self._engine.connect() as conn:
            return [_entry_from_row(r) for r in conn.execute(query)]

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries())

    def stored_arrays(self, job_id: str, seq: int) -> dict[str, bytes]:
        """The raw stored bytes of one entry's arrays, by name (unchecked)."""
        query = select(t.arrays.c.name, t.arrays.c.data).where(
            t.arrays.c.job_id == job_id, t.arrays.c.seq == seq)
        with self._lock, self._engine.connect() as conn:
            return {str(r.name): bytes(r.data) for r in conn.execute(query)}

    def array(self, entry: Entry, name: str) -> np.ndarray:
        """One stored array of ``entry``, decoded; :class:`AuditError` if it was altered."""
        info = entry.arrays.get(name)
        if info is None:
            raise KeyError(f"{entry.label} has no array {name!r}")
        blob = self.stored_arrays(entry.job_id, entry.seq).get(name)
        if blob is None:
            raise AuditError(f"{entry.label}: stored array {name!r} is missing")
        try:
            return decode_array(info, blob)
        except ValueError as exc:
            raise AuditError(f"{entry.label}: stored array {name!r}: {exc}") from exc


def _entry_from_row(row: Row[Any]) -> Entry:
    return Entry(job_id=str(row.job_id), seq=int(row.seq), kind=str(row.kind),
                 timestamp=str(row.timestamp), payload_json=str(row.payload),
                 arrays_json=str(row.arrays), prev_hash=str(row.prev_hash),
                 hash=str(row.hash), row_id=int(row.id))
