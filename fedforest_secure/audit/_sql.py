"""The audit log's SQLAlchemy store (private: use :class:`~fedforest_secure.audit.log.AuditLog`).

``audit_entries`` holds one row per entry, the canonical texts verbatim; ``UNIQUE(job_id, seq)``
makes two writers that race for the same ``seq`` fail instead of forking the chain.
``audit_arrays`` holds the ``.npy`` bytes of each entry's arrays, keyed by ``(job_id, seq, name)``.
``round_id`` is a query convenience copied from the payload (not hashed; verification checks it).
SQLite keeps whatever value a column is set to behind the log's back (text in an integer column,
text in a blob): reading a row back, a ``seq`` that is not an integer is an
:class:`~fedforest_secure.errors.AuditError` naming the row, a stored array that is not bytes is
reported with its :class:`~.store.StoredArray`, and ``round_id`` is given as it is stored.
Threads sharing a store are serialised by a lock; separate writers (processes, other stores)
that race for the same ``seq`` hit the constraint, which the store reports as a
:class:`~fedforest_secure.audit.store.ChainRace`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    inspect,
    select,
)
from sqlalchemy.engine import Row
from sqlalchemy.exc import DatabaseError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.pool import StaticPool

from ..dburl import DatabaseUrlError, create_db_engine, shown_url, sqlite_file, sqlite_url
from ..errors import AuditError
from .entry import GENESIS, Entry
from .store import ChainRace, IndexRow, StoredArray

__all__ = ["Engine", "SqlStore", "to_url"]

metadata = MetaData()

#: what a driver returns for a blob
_BYTES = (bytes, bytearray, memoryview)

entries = Table(
    "audit_entries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(200), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("kind", String(40), nullable=False),
    Column("round_id", Integer, nullable=True),
    Column("timestamp", String(40), nullable=False),
    Column("payload", Text, nullable=False),
    Column("arrays", Text, nullable=False),
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
    UniqueConstraint("job_id", "seq", name="uq_audit_entries_job_seq"),
    Index("ix_audit_entries_job_round", "job_id", "round_id"),
)

arrays = Table(
    "audit_arrays",
    metadata,
    Column("job_id", String(200), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("name", String(200), nullable=False),
    Column("data", LargeBinary, nullable=False),
    PrimaryKeyConstraint("job_id", "seq", "name", name="pk_audit_arrays"),
)


def to_url(db: str | Path) -> str:
    """A SQLAlchemy URL for ``db``: URLs (``scheme://...``) pass through, a path becomes the
    URL of its SQLite file (:func:`~fedforest_secure.dburl.sqlite_url`)."""
    text = str(db)
    if "://" in text:
        return text
    return sqlite_url(Path(text).expanduser().resolve())


def _missing_sqlite_file(url: str) -> bool:
    """Whether ``url`` names a SQLite file (a path, or a ``file:`` URI's path part) that does
    not exist: opening it would create it."""
    path = sqlite_file(url)
    return path is not None and not path.exists()


class SqlStore:
    """Audit entries in two SQLAlchemy tables, through an engine of its own (from a URL or a
    SQLite path) or a given one (of which it only touches its two tables).

    With ``create=False`` a missing log raises :class:`AuditError` instead of being created.
    """

    def __init__(self, url: str | Path | None = None, *, engine: Engine | None = None,
                 create: bool = True) -> None:
        if (url is None) == (engine is None):
            raise TypeError("give exactly one of url and engine")
        self._owns_engine = engine is None
        if engine is None:
            full = to_url(url if url is not None else "")
            if not create and _missing_sqlite_file(full):
                raise AuditError(f"no audit log at {url}")
            # a server's audit log outlives database restarts: a pooled connection is checked
            # before use (PostgreSQL), not found dead by the append that needed it
            try:
                engine = create_db_engine(full, pool_pre_ping=not full.startswith("sqlite"))
            except DatabaseUrlError as exc:
                raise AuditError(f"audit log: {exc}") from None
        self.engine = engine
        self._lock = threading.RLock()
        try:
            if create:
                metadata.create_all(engine)
                return
            tables = set(inspect(engine).get_table_names())
        except DatabaseError as exc:  # not a database, or one that cannot be opened
            self.close()
            where = (str(url) if url is not None and "://" not in str(url)  # a file path
                     else shown_url(str(url)) if url is not None
                     else engine.url.render_as_string(hide_password=True))
            raise AuditError(f"cannot read the audit log at {where}: {exc.orig or exc}") from None
        if not {entries.name, arrays.name} <= tables:
            self.close()
            raise AuditError("the database holds no audit log tables")

    @classmethod
    def in_memory(cls) -> SqlStore:
        """A private in-memory SQLite database (one connection shared by threads)."""
        store = cls(engine=create_engine("sqlite://", poolclass=StaticPool,
                                         connect_args={"check_same_thread": False}))
        store._owns_engine = True
        return store

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()

    # -- writing -------------------------------------------------------------------------------

    def append_next(self, job_id: str, make: Callable[[int, str], Entry],
                    blobs: Mapping[str, bytes]) -> Entry:
        try:
            with self._lock, self.engine.begin() as conn:
                entry = make(*self._last(conn, job_id))
                conn.execute(entries.insert().values(
                    job_id=entry.job_id, seq=entry.seq, kind=entry.kind,
                    round_id=entry.round_id, timestamp=entry.timestamp,
                    payload=entry.payload_json, arrays=entry.arrays_json,
                    prev_hash=entry.prev_hash, hash=entry.hash))
                if blobs:
                    conn.execute(arrays.insert(), [
                        {"job_id": entry.job_id, "seq": entry.seq, "name": name, "data": blob}
                        for name, blob in blobs.items()])
        except IntegrityError as exc:
            raise ChainRace(str(exc)) from exc
        except OperationalError as exc:
            if "locked" not in str(exc).lower():
                raise
            raise ChainRace(str(exc)) from exc
        return entry

    # -- reading -------------------------------------------------------------------------------

    @staticmethod
    def _last(conn: Connection, job_id: str) -> tuple[int, str]:
        row = conn.execute(
            select(entries.c.seq, entries.c.hash).where(entries.c.job_id == job_id)
            .order_by(entries.c.seq.desc()).limit(1)
        ).first()
        if row is None:
            return 0, GENESIS
        return _seq(row.seq, f"the last entry of job {job_id!r}"), str(row.hash)

    def last(self, job_id: str) -> tuple[int, str]:
        with self._lock, self.engine.connect() as conn:
            return self._last(conn, job_id)

    def jobs(self) -> list[str]:
        with self._lock, self.engine.connect() as conn:
            rows = conn.execute(select(entries.c.job_id).distinct()).scalars().all()
        return sorted(str(r) for r in rows)

    def entries(self, job_id: str | None = None, round_id: int | None = None,
                kind: str | None = None) -> list[Entry]:
        query = select(entries).order_by(entries.c.job_id, entries.c.seq, entries.c.id)
        if job_id is not None:
            query = query.where(entries.c.job_id == job_id)
        if round_id is not None:
            query = query.where(entries.c.round_id == round_id)
        if kind is not None:
            query = query.where(entries.c.kind == kind)
        with self._lock, self.engine.connect() as conn:
            return [_entry_from_row(r) for r in conn.execute(query)]

    def arrays_of(self, job_id: str, seq: int) -> dict[str, bytes]:
        query = select(arrays.c.name, arrays.c.data).where(
            arrays.c.job_id == job_id, arrays.c.seq == seq)
        with self._lock, self.engine.connect() as conn:
            # a value that is not bytes (a blob rewritten as text) as its text's bytes: they
            # cannot match the digest of a .npy array, whose first byte is not UTF-8
            return {str(r.name): bytes(r.data) if isinstance(r.data, _BYTES)
                    else str(r.data).encode() for r in conn.execute(query)}

    def scan_arrays(self, job_id: str | None = None) -> Iterator[StoredArray]:
        order = (arrays.c.job_id, arrays.c.seq, arrays.c.name)
        query = select(arrays).order_by(*order)
        keys = select(*order).order_by(*order)
        if job_id is not None:
            query = query.where(arrays.c.job_id == job_id)
            keys = keys.where(arrays.c.job_id == job_id)
        done: set[tuple[Any, ...]] = set()
        try:
            with self.engine.connect() as conn:
                for row in conn.execute(query):
                    done.add((row.job_id, row.seq, row.name))
                    yield _stored_array(row.job_id, row.seq, row.name, row.data)
            return
        except DBAPIError:  # a row the database cannot return (text that is not UTF-8)
            pass
        # the rest one at a time: a row that cannot be read is reported, the others checked
        with self.engine.connect() as conn:
            for key in conn.execute(keys).all():
                if tuple(key) in done:
                    continue
                try:
                    data = conn.execute(select(arrays.c.data).where(
                        arrays.c.job_id == key.job_id, arrays.c.seq == key.seq,
                        arrays.c.name == key.name)).scalar_one()
                except DBAPIError as exc:
                    yield StoredArray(str(key.job_id), _seq(key.seq, "a stored array"),
                                      str(key.name), b"", error=_db_error(exc))
                else:
                    yield _stored_array(key.job_id, key.seq, key.name, data)

    def scan_index(self, job_id: str | None = None) -> Iterator[IndexRow]:
        query = select(entries.c.job_id, entries.c.seq, entries.c.kind, entries.c.round_id,
                       entries.c.payload)
        if job_id is not None:
            query = query.where(entries.c.job_id == job_id)
        with self.engine.connect() as conn:
            for row in conn.execute(query):
                yield IndexRow(str(row.job_id), _seq(row.seq, f"an entry of job {row.job_id!r}"),
                               str(row.kind), row.round_id, str(row.payload))


def _seq(value: object, what: str) -> int:
    """A stored ``seq``; :class:`AuditError` naming ``what`` if it is not an integer."""
    if type(value) is not int:
        raise AuditError(f"{what} has seq {value!r}, not an integer: the audit database was "
                         "changed behind the log's back")
    return value


def _db_error(exc: DBAPIError) -> str:
    """What the database said when it could not return a value."""
    orig = exc.orig if exc.orig is not None else exc
    return f"{type(orig).__name__}: {str(orig)[:200]}"


def _stored_array(job_id: object, seq: object, name: object, data: object) -> StoredArray:
    if isinstance(data, _BYTES):
        return StoredArray(str(job_id), _seq(seq, "a stored array"), str(name), bytes(data))
    return StoredArray(str(job_id), _seq(seq, "a stored array"), str(name), b"",
                       error=f"the database holds {type(data).__name__}, not bytes")


def _entry_from_row(row: Row[Any]) -> Entry:
    return Entry(job_id=str(row.job_id),
                 seq=_seq(row.seq, f"row {row.id} of the audit log (job {row.job_id!r})"),
                 kind=str(row.kind), timestamp=str(row.timestamp), payload_json=str(row.payload),
                 arrays_json=str(row.arrays), prev_hash=str(row.prev_hash),
                 hash=str(row.hash), row_id=int(row.id))
