"""Persistent server state (SQLAlchemy 2). SQLite by default, any SQLAlchemy URL by config.

Everything a restarted server needs lives here: clients and their hashed tokens, jobs and their
configuration, memberships, every task issued (the exact bytes), every upload's digest, the
running sum of the open round (or, in a secure round, its masked uploads and every
secure-aggregation message it accepted), the aggregate handed to the coordinator for each
closed round, and the audit entries of saved steps until they are in the audit log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from sqlalchemy import (
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    Select,
    String,
    Text,
    UniqueConstraint,
    event,
    inspect,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import (
    DatabaseError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.schema import CreateColumn

from fedforest_secure.dburl import (
    PG_LOCK_TIMEOUT_S,
    DatabaseUrlError,
    create_db_engine,
    in_memory,
    shown_url,
)

from .settings import IN_MEMORY, ConfigError

__all__ = [
    "AFTER_COMMIT",
    "AuditOutboxRow",
    "AuditedJobRow",
    "Base",
    "CancelRow",
    "ClientRow",
    "Database",
    "JobRow",
    "LeaseRow",
    "MemberRow",
    "RoundRow",
    "SecAggMessageRow",
    "UploadRow",
    "lost_race",
]


class Base(DeclarativeBase):
    pass


class ClientRow(Base):
    """An institution, identified by a bearer token (only its hash is stored)."""

    __tablename__ = "clients"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    token_id: Mapped[str] = mapped_column(String(32), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float, default=time.time)


class OperatorRow(Base):
    """Someone who may read the operator page (``/ui``): a bearer token of its own kind
    (``ffo_...``), never valid as a client's, and stored as a hash only."""

    __tablename__ = "operators"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    token_id: Mapped[str] = mapped_column(String(32), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float, default=time.time)


class JobRow(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    spec_json: Mapped[str] = mapped_column(Text)  # the operator's job spec, as validated
    config_json: Mapped[str] = mapped_column(Text)  # JobConfig.to_json()
    status: Mapped[str] = mapped_column(String(16), default="waiting")
    reason: Mapped[str] = mapped_column(Text, default="")
    min_clients: Mapped[int] = mapped_column(Integer)
    round_deadline_s: Mapped[float] = mapped_column(Float)
    current_round: Mapped[int] = mapped_column(Integer, default=-1)
    model_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    #: the final model, loaded only where it is read (it can be megabytes, and every request
    #: of a client loads its job row); the last column, so SQLite reaches the others without
    #: walking its overflow pages
    model_json: Mapped[str | None] = mapped_column(Text, nullable=True, deferred=True)


class AuditedJobRow(Base):
    """A job created with an audit log: its chain is in that log, so no server serves the job
    without one (its own table: databases made before it gain it without a migration)."""

    __tablename__ = "audited_jobs"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)


class AuditOutboxRow(Base):
    """An audit entry of a job, committed with the step that made it and appended to the
    audit log once that step committed (:mod:`server_app.audit_outbox`): the log holds an entry
    only for what the database holds, whenever the server stops. ``seq`` is the place the
    entry takes in the job's chain; ``payload`` its canonical JSON, ``arrays`` its arrays
    (``.npz``). The row is deleted once the entry is in the log (its own table: databases made
    before it gain it without a migration)."""

    __tablename__ = "audit_outbox"
    job_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(40))
    payload: Mapped[str] = mapped_column(Text)
    arrays: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)


class AuditMarkRow(Base):
    """How far a committed step of a job queued its audit chain: ``seq``, the last entry it
    queued (one row per step, inserted with it; :mod:`server_app.audit_outbox`). A log whose
    chain goes beyond the job's largest mark holds steps this database lost (a power loss, a
    restored older copy), and the server refuses to serve the job
    (:func:`server_app.serve.check_audit_chains`). Rows are only inserted, never updated, so
    steps never wait for each other's lock on them (a table of its own: databases made before
    it gain it without a migration; a job without marks is not checked)."""

    __tablename__ = "audit_marks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(200), index=True)
    seq: Mapped[int] = mapped_column(Integer)


class CancelRow(Base):
    """An operator's request to cancel a job (``fedforest server cancel-job``), kept until the
    server that serves this database applies it (:mod:`server_app.cancel`; its own table:
    databases made before it gain it without a migration)."""

    __tablename__ = "cancel_requests"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    requested_at: Mapped[float] = mapped_column(Float)


class MemberRow(Base):
    """A client invited to a job; ``client_index`` is its position in the job's client list."""

    __tablename__ = "members"
    __table_args__ = (UniqueConstraint("job_id", "client_index"),)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    client_id: Mapped[int] = mapped_column(ForeignKey("clients.id"), primary_key=True)
    client_index: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="invited")  # invited|active|dropped
    joined_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    dropped_round: Mapped[int | None] = mapped_column(Integer, nullable=True)


class RoundRow(Base):
    __tablename__ = "rounds"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    round_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    level: Mapped[int] = mapped_column(Integer)
    task_digest: Mapped[str] = mapped_column(String(64))
    encoding: Mapped[str] = mapped_column(String(8))  # "float64" | "uint64"
    participants_json: Mapped[str] = mapped_column(Text)  # client indices asked
    issued_at: Mapped[float] = mapped_column(Float)
    deadline_at: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default="open")  # open|closed
    phase: Mapped[str] = mapped_column(String(16), default="upload")  # secagg stage or upload
    dropped_json: Mapped[str] = mapped_column(Text, default="[]")  # dropped during this round
    contributors_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    closed_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Big columns are deferred (loaded on first access: a status poll must not read vectors)
    # and come last in the row: SQLite reaches a column stored after a blob of tens of MB
    # by walking the blob's chain of overflow pages, so a small column declared after a task
    # blob made every read of the round's status or phase cost a walk over the whole task.
    task_blob: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    running_sum: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)
    aggregate: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True,
                                                    deferred=True)  # packed float64
    disclosed_blob: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True,
                                                         deferred=True)


class UploadRow(Base):
    __tablename__ = "uploads"
    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    round_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    client_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64))
    received_at: Mapped[float] = mapped_column(Float, default=time.time)
    # Plain float64 sums are kept per client and added in client order when the round closes,
    # so the float result is bit-identical to the in-process run. Fixed-point (uint64) uploads
    # of the open profile are added into RoundRow.running_sum on arrival and not kept. Masked
    # uploads of a secure round are added into the secure-aggregation server's in-memory
    # running sum and kept here only until the round closes, so a restarted server can rebuild
    # that sum. Every summable is cleared when its round closes.
    summable: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)
    disclosed: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)


class SecAggMessageRow(Base):
    """One secure-aggregation message of one client for one round and stage (relayed as is).

    ``round_id = -1, stage = "identity"``: the client's Ed25519 verify key (hex). Otherwise the
    JSON of a message the open round accepted (``advert``, ``shares``, ``upload`` (the masked
    upload's header), ``unmask``) or a ``refuse`` reason; deleted when the round closes.
    """

    __tablename__ = "secagg_messages"
    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    round_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    stage: Mapped[str] = mapped_column(String(32), primary_key=True)
    client_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    body: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(String(64))


class LeaseRow(Base):
    """The one server that serves this database (:mod:`server_app.lease`): a second server
    on the same database would issue and close rounds the first does not know of."""

    __tablename__ = "server_lease"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)  # always 1: one row
    owner: Mapped[str] = mapped_column(String(32))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    port: Mapped[int] = mapped_column(Integer)
    renewed_at: Mapped[float] = mapped_column(Float)
    #: when the holder's process started, "<boot id>:<clock ticks since boot>" (Linux), so a
    #: process that has its pid now is not taken for it; None where that cannot be read
    started: Mapped[str | None] = mapped_column(String(64), nullable=True)


#: columns added to a table after databases were made with it, as (table, column): nullable,
#: so the rows already there read as None; a database without one gains it when opened
_ADDED_COLUMNS = (("server_lease", "started"),)


#: the key of :attr:`Session.info <sqlalchemy.orm.Session.info>` under which a step lists what
#: to do once its transaction committed (callables, run in order by :meth:`Database.session`)
AFTER_COMMIT = "fedforest.after_commit"

#: whether the transaction of the innermost :meth:`Database.session` or :meth:`Database.connect`
#: block of this thread wrote (a one-item list, so that a statement marks the block it ran in);
#: kept only once a fence is set (:meth:`Database.fence`)
_WROTE: ContextVar[list[bool] | None] = ContextVar("fedforest_db_wrote", default=None)

#: seconds one probe of the database (:meth:`Database.unreachable`) answers for
_PROBE_EVERY_S = 2.0


class Database:
    """An engine plus a session factory; creates the tables on first use. SQLite in memory
    is refused (:class:`ConfigError`): each connection would have a database of its own."""

    def __init__(self, url: str) -> None:
        if in_memory(url):
            raise ConfigError(f"server database {url}: {IN_MEMORY}")
        # a connection per request thread that reads outside the server's lock (token
        # look-ups, directory, task downloads): as many as the server's thread pool (40)
        kwargs: dict[str, object] = {"pool_size": 10, "max_overflow": 30}
        if url.startswith("sqlite"):
            # a write lock another connection holds: waited for as long as PostgreSQL's
            kwargs["connect_args"] = {"check_same_thread": False,
                                      "timeout": PG_LOCK_TIMEOUT_S}
        else:
            # PostgreSQL: the connection, lock and keepalive bounds of create_db_engine
            kwargs["pool_pre_ping"] = True
        self.url = url
        try:
            self.engine: Engine = create_db_engine(url, **kwargs)
        except DatabaseUrlError as exc:
            raise ConfigError(f"server database: {exc}") from None
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        try:
            try:
                Base.metadata.create_all(self.engine)
            except DatabaseError as exc:
                if not _created_meanwhile(exc):
                    raise
                # another process created the tables between the check and the CREATE
                # (several admin commands at once on a new database): take them as they are
                Base.metadata.create_all(self.engine)
            _add_columns(self.engine)
        except DatabaseError as exc:  # not a database, or one that cannot be reached
            self.engine.dispose()
            raise ConfigError(f"cannot open the server database {shown_url(url)}: "
                              f"{exc.orig or exc}") from None
        self._factory = sessionmaker(self.engine, expire_on_commit=False)
        self._on_unreachable: list[Callable[[DBAPIError], None]] = []
        self._probe_mu = threading.Lock()
        self._probed_at, self._probe_said = -_PROBE_EVERY_S, False
        self._fence: Callable[[Connection], None] | None = None

    def fence(self, check: Callable[[Connection], None] | None) -> None:
        """From now on run ``check(conn)`` in every transaction of :meth:`session` and
        :meth:`connect` that wrote (any statement but a ``SELECT``), on its connection, just
        before it commits: an exception it raises rolls the transaction back and is raised to
        the caller. What a process sets so that it writes only while it holds the database's
        lease (:meth:`ServerLease.keep <server_app.lease.ServerLease.keep>`); a transaction
        that only read costs nothing more. ``None``: no check any more (a lease given back)."""
        if check is not None and not event.contains(self.engine, "before_cursor_execute",
                                                    _note_write):
            event.listen(self.engine, "before_cursor_execute", _note_write)
        self._fence = check

    def on_unreachable(self, fn: Callable[[DBAPIError], None]) -> None:
        """Call ``fn(exc)`` whenever a query fails because the database cannot be reached (a
        refused or lost connection, a timeout): how the server notices an outage of its
        database, whichever request, tick or renewal meets it first."""
        self._on_unreachable.append(fn)

    def unreachable(self, exc: BaseException) -> bool:
        """Whether ``exc`` failed because this database cannot be reached, rather than for
        what a statement did: an operational or interface error (or a connection dropped
        mid-query) after which a fresh connection cannot run ``SELECT 1`` either. A lock, a
        missing table, a full disk or another database's error is no outage: the database
        answers the probe. Never raises; a probe that found the database gone answers for
        every failure within :data:`_PROBE_EVERY_S` seconds (the requests of an outage do not
        each wait for a connection attempt; one that answers is quick to probe again)."""
        if not isinstance(exc, OperationalError | InterfaceError) and not (
                isinstance(exc, DBAPIError) and exc.connection_invalidated):
            return False
        with self._probe_mu:
            if self._probe_said and time.monotonic() - self._probed_at < _PROBE_EVERY_S:
                return True
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
            said = False
        except DBAPIError:
            said = True
        except Exception:  # noqa: BLE001 - a full pool, say: no sign the database is gone
            said = False
        with self._probe_mu:
            self._probed_at, self._probe_said = time.monotonic(), said
        return said

    def _failed(self, exc: DBAPIError) -> None:
        if self._on_unreachable and self.unreachable(exc):
            for fn in self._on_unreachable:
                fn(exc)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction: committed on success, rolled back on any exception. Once it
        committed, the callables the step listed in ``sess.info[AFTER_COMMIT]`` run (the audit
        entries it made are appended to the log: :mod:`server_app.audit_outbox`). With a fence
        set (:meth:`fence`), a transaction that wrote passes it before it commits."""
        wrote = _WROTE.set([False]) if self._fence is not None else None
        try:
            with self._factory() as sess:
                with sess.begin():
                    yield sess
                    if wrote is not None:
                        sess.flush()  # what the commit would write: its statements count
                        self._check_fence(sess.connection)
                for after in sess.info.pop(AFTER_COMMIT, ()):
                    after()
        except DBAPIError as exc:
            self._failed(exc)
            raise
        finally:
            if wrote is not None:
                _WROTE.reset(wrote)

    @contextmanager
    def connect(self, *, fenced: bool = True) -> Iterator[Connection]:
        """A Core transaction (no ORM session): committed on success, rolled back on any
        exception. For requests that read or write plain values only. ``fenced=False``: the
        fence (:meth:`fence`) is not checked (the lease's own renewal and release, whose
        statements name the lease's holder)."""
        wrote = _WROTE.set([False]) if self._fence is not None and fenced else None
        try:
            with self.engine.begin() as conn:
                yield conn
                if wrote is not None:
                    self._check_fence(lambda: conn)
        except DBAPIError as exc:
            self._failed(exc)
            raise
        finally:
            if wrote is not None:
                _WROTE.reset(wrote)

    def _check_fence(self, connection: Callable[[], Connection]) -> None:
        """Run the fence on the block's connection if its transaction wrote."""
        box, check = _WROTE.get(), self._fence
        if box is not None and box[0] and check is not None:
            check(connection())

    def free_share(self) -> float:
        """The share of the file's pages that deleted rows left free (SQLite; 0 elsewhere):
        what :meth:`compact` gives back."""
        if not self.url.startswith("sqlite"):
            return 0.0
        with self.engine.connect() as conn:
            free = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar() or 0)
            pages = int(conn.exec_driver_sql("PRAGMA page_count").scalar() or 0)
        return free / pages if pages else 0.0

    def compact(self) -> None:
        """Give deleted rows' space back to the file system (SQLite: ``VACUUM``; a server
        database elsewhere reclaims it by its own maintenance)."""
        if not self.url.startswith("sqlite"):
            return
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM")
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    def dispose(self) -> None:
        self.engine.dispose()


@contextmanager
def lost_race(db: Database, row: Select[Any], error: Exception | None) -> Iterator[None]:
    """Around a step that checks a row is not there, then inserts it: an insert that lost a
    race (another process inserted the row between the check and the insert, and a unique
    constraint refused this one) raises ``error``, what the check says, once ``row`` reads
    the other process's row; with ``error`` None the step ends as if it had inserted it.
    Another integrity error is raised as it is."""
    try:
        yield
    except IntegrityError:
        with db.session() as sess:
            if sess.execute(row).first() is None:
                raise
        if error is not None:
            raise error from None


def _created_meanwhile(exc: DatabaseError) -> bool:
    """Whether ``exc`` is a CREATE or ADD COLUMN that lost a race with another process's
    (SQLite: "already exists", "duplicate column"; PostgreSQL: "already exists", or a
    duplicate key in its catalogue)."""
    text = str(exc.orig or exc)
    return any(s in text for s in ("already exists", "duplicate key", "duplicate column"))


def _add_columns(engine: Engine) -> None:
    """Add the columns of :data:`_ADDED_COLUMNS` that the database's tables lack."""
    for table, name in _ADDED_COLUMNS:
        with engine.connect() as conn:
            if name in {c["name"] for c in inspect(conn).get_columns(table)}:
                continue
        column = CreateColumn(Base.metadata.tables[table].c[name]).compile(dialect=engine.dialect)
        quoted = engine.dialect.identifier_preparer.quote(table)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {quoted} ADD COLUMN {column}")
        except DatabaseError as exc:
            if not _created_meanwhile(exc):  # another process added it meanwhile: it is there
                raise


def _note_write(conn: Connection, cursor: object, statement: str, parameters: object,
                context: object, executemany: bool) -> None:
    """Mark the running block's transaction as one that wrote (any statement but a read)."""
    box = _WROTE.get()
    if box is not None and not box[0] and \
            statement.lstrip()[:6].upper() not in ("SELECT", "PRAGMA"):
        box[0] = True


def _sqlite_pragmas(dbapi_conn: object, _record: object) -> None:
    cur = dbapi_conn.cursor()  # type: ignore[attr-defined]
    # 64 KiB pages for a new file (no effect on an existing one): task blobs run to tens of MB,
    # and a blob on 4 KiB pages is a chain of thousands of overflow pages (5x slower to write)
    cur.execute("PRAGMA page_size=65536")
    cur.execute("PRAGMA journal_mode=WAL")
    # FULL: a commit is on disk before it returns, so the audit entries a step appends after
    # its commit (and a site's receipt of them) never get ahead of the database after a power
    # loss (NORMAL in WAL mode left the last commits to the next checkpoint)
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()
