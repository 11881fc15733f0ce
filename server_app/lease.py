"""One server per database: a lease row that the serving process renews.

Two servers on one database would each issue, answer and close rounds of the same jobs, each
unaware of the other's (a client of one is told the round is not open; the job fails). A
server takes the lease when it starts and renews it every ``LEASE_S / 3`` seconds; another
server refuses to start while the lease is held: renewed within ``LEASE_S`` seconds by a
process that, on this host, still runs. A server stopped cleanly gives the lease back; one
that was killed leaves it to be taken at once on its host, or after ``LEASE_S`` elsewhere.

On Linux the lease names its process by pid and start time (and the host's boot), so a
process that has the dead holder's pid now is not taken for it: a server restarted as the same
pid (a container's PID 1 after ``docker restart``, which keeps the host name) takes its own
dead lease at once, and so does a server whose lease pid went to some other process.

The lease's times come from the database's clock: the holder's renewals and every reader's
"now" (a second server, ``fedforest server cancel-job``) are read from it, so hosts whose clocks
differ agree on a claim's age (PostgreSQL's ``clock_timestamp()``; SQLite's ``'now'``, the
clock of the machine that runs the process: a SQLite database in write-ahead-log mode is shared
by the processes of one machine only). A test may pass a clock of its own.

A server that stalled past ``LEASE_S`` (paused, a suspended VM) may find, when it resumes, that
another server took the lease and serves the database. Its writes are fenced: every transaction
of the serving process that wrote reads the lease row before it commits, in the same
transaction (``FOR SHARE`` where the database locks rows: a takeover waits for it), and is
rolled back unless this server still holds the lease (:meth:`ServerLease.keep`). The first such
refusal, or the renewal that finds the lease taken, raises :class:`LeaseLost` and stops the
server, whichever of its requests, ticks or renewals comes first after the stall.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Connection, Float, delete, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from fedforest_secure.errors import FedForestError

from .db import Database, LeaseRow
from .logs import event
from .settings import ConfigError

__all__ = ["LEASE_S", "LeaseLost", "ServerLease", "holder"]

#: a lease not renewed for this many seconds is free
LEASE_S = 15.0

_SAME_MOMENT = ("another server took this database at the same moment: stop it first, or give "
                "this server a database of its own")


class _DatabaseNow(FunctionElement[float]):
    """The database's clock, in seconds since the epoch (the unit of ``renewed_at``)."""

    type = Float()
    name = "database_now"
    inherit_cache = True


#: the databases whose clock the lease reads (in their own SQL)
CLOCKED_DIALECTS = ("postgresql", "sqlite")


def check_clocked(dialect: str) -> None:
    """:class:`ConfigError` unless the lease can read the clock of a ``dialect`` database."""
    if dialect not in CLOCKED_DIALECTS:
        raise ConfigError(
            f"server database: a {dialect} database is not supported (the server's claim on "
            "its database is timed by the database's clock, read in the SQL of SQLite and "
            "PostgreSQL): use SQLite or PostgreSQL")


@compiles(_DatabaseNow, "postgresql")
def _now_postgresql(element: _DatabaseNow, compiler: SQLCompiler, **kw: object) -> str:
    # the time of the statement (now() is the transaction's start), to the microsecond
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(_DatabaseNow, "sqlite")
def _now_sqlite(element: _DatabaseNow, compiler: SQLCompiler, **kw: object) -> str:
    # to the millisecond (CURRENT_TIMESTAMP has whole seconds)
    return "((julianday('now') - 2440587.5) * 86400.0)"


#: a clock that says the time; None: the database's (:class:`_DatabaseNow`)
Clock = Callable[[], float] | None


def _now(sess: Session | Connection, clock: Clock) -> float:
    if clock is not None:
        return clock()
    check_clocked((sess.get_bind() if isinstance(sess, Session) else sess).dialect.name)
    return float(sess.execute(select(_DatabaseNow())).scalar_one())


class LeaseLost(FedForestError):
    """Another process took the database's lease from this server: the server stops, and the
    step that found it out was rolled back."""


def _lost(taker: tuple[int, str, int] | None) -> LeaseLost:
    """Why this server stopped, once ``taker`` (its pid, host and port; None: a process that
    gave the lease back since) took the lease."""
    if taker is None:
        who = ("another process took this database over and gave it back (a `fedforest server "
               "cancel-job`, or a server stopped since)")
    else:
        pid, host, port = taker
        who = (f"another server (pid {pid} on {host}, port {port}) took this "
               "database over and serves its jobs now")
    return LeaseLost(f"{who}: this server's claim was not renewed for {LEASE_S:.0f} s (the "
                     "process was paused or stalled that long) or its process was taken for "
                     "dead. This server stopped serving the database, and saved none of its "
                     "steps after that")


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _started(pid: int) -> str | None:
    """When process ``pid`` started, as ``"<boot id>:<clock ticks since boot>"`` (Linux:
    field 22 of ``/proc/<pid>/stat``); None where that cannot be read (another system, no
    such process, or one that ``/proc`` hides)."""
    boot = _boot_id()
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name before it may hold anything
    if boot is None or len(fields) < 20 or not fields[19].isdigit():
        return None
    return f"{boot}:{fields[19]}"


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _running_here(host: str, pid: int, started: str | None) -> bool:
    """Whether the lease's holder (``pid``, started at ``started``, on ``host``) may still
    run: on another host, or another boot of this one (another machine with its host name),
    it is assumed so; here, while a process with its pid and start time runs."""
    if host != socket.gethostname():
        return True
    mine = _started(os.getpid())
    if started is not None and mine is not None:
        if started.partition(":")[0] != mine.partition(":")[0]:
            return True
        if not _exists(pid):
            return False
        now = _started(pid)
        return now is None or now == started  # unreadable (hidden): assumed to be the holder
    # a start time is missing (not Linux, or a holder from a version that did not record it)
    if started is None and mine is not None and pid == os.getpid():
        return False  # this process records its start time: it is not that holder
    return _exists(pid)


def _held(row: LeaseRow, now: float) -> bool:
    """Whether ``row``'s server still holds the lease: renewed within ``LEASE_S`` seconds
    (``now`` read from the clock it was renewed by) by a process that, on this host, still
    runs."""
    return now - row.renewed_at < LEASE_S and _running_here(row.host, row.pid, row.started)


def holder(db: Database, clock: Clock = None) -> LeaseRow | None:
    """The lease of the server that serves ``db`` now, or None when no server does (its age
    read on the database's clock, or ``clock``)."""
    with db.session() as sess:
        row = sess.get(LeaseRow, 1)
        return row if row is not None and _held(row, _now(sess, clock)) else None


#: the fence's read of the lease row (:meth:`ServerLease._fence`), built once: every
#: transaction of the serving process that wrote runs it, and a statement built anew each time
#: costs more than the read itself (its cache key, and its result's columns matched again)
_FENCE_READ = (select(LeaseRow.owner, LeaseRow.pid, LeaseRow.host, LeaseRow.port)
               .where(LeaseRow.id == 1).with_for_update(read=True))


class ServerLease:
    """This process's claim on ``db`` (:meth:`acquire`, :meth:`renew`, :meth:`release`), timed
    by the database's clock (or ``clock``)."""

    def __init__(self, db: Database, port: int, clock: Clock = None) -> None:
        self.db, self.port, self.clock = db, port, clock
        self.owner = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: why this server stopped serving once another process took its lease (None: held)
        self.lost: LeaseLost | None = None
        self._lost_mu = threading.Lock()
        self._on_lost: Callable[[LeaseLost], None] = lambda err: None

    def acquire(self) -> None:
        """Take the lease, or raise :class:`ConfigError` naming the server that holds it."""
        try:
            with self.db.session() as sess:
                row = sess.get(LeaseRow, 1)
                now = _now(sess, self.clock)
                if row is not None and row.owner != self.owner and _held(row, now):
                    age = now - row.renewed_at
                    raise ConfigError(
                        f"another server (pid {row.pid} on {row.host}, port {row.port}) "
                        f"serves this database (it renewed its claim {age:.0f} s ago): "
                        "stop it first, or give this server a database of its own")
                mine = {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                        "started": _started(os.getpid()), "port": self.port, "renewed_at": now}
                if row is None:
                    sess.add(LeaseRow(id=1, **mine))
                else:
                    # taken over only as it was read: a server that took it in between wins
                    taken = sess.execute(
                        update(LeaseRow)
                        .where(LeaseRow.id == 1, LeaseRow.owner == row.owner,
                               LeaseRow.renewed_at == row.renewed_at)
                        .values(**mine)
                        .execution_options(synchronize_session=False))
                    if not taken.rowcount:  # type: ignore[attr-defined]
                        raise ConfigError(_SAME_MOMENT)
        except IntegrityError:  # another server inserted the row first
            raise ConfigError(_SAME_MOMENT) from None

    def renew(self) -> bool:
        """Renew the lease; False if another server holds it now."""
        with self.db.connect(fenced=False) as conn:
            res = conn.execute(update(LeaseRow).where(LeaseRow.id == 1,
                                                      LeaseRow.owner == self.owner)
                               .values(renewed_at=_DatabaseNow() if self.clock is None
                                       else self.clock()))
            return bool(res.rowcount)

    def release(self) -> None:
        """Give the lease back (a stopped server): the next server starts at once. With the
        database unreachable the lease stays (one warning says so) and the stop goes on."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            with self.db.connect(fenced=False) as conn:
                conn.execute(delete(LeaseRow).where(LeaseRow.owner == self.owner))
        except SQLAlchemyError as exc:
            if not self.db.unreachable(exc):
                raise
            event("lease_not_returned", logging.WARNING,
                  reason=f"the database cannot be reached ({type(exc).__name__}): the next "
                  f"server on this host takes it at once, one on another host after "
                  f"{LEASE_S:.0f} s")

    def keep(self, on_lost: Callable[[LeaseLost], None]) -> None:
        """Hold the lease while serving: fence every write of this process's database on it
        (:meth:`Database.fence <server_app.db.Database.fence>`), and renew it every
        ``LEASE_S / 3`` seconds from a daemon thread until :meth:`release`. Once another
        process took it, :attr:`lost` says so, ``on_lost`` is called once (from the thread
        that found out), and every write raises :class:`LeaseLost` and is rolled back."""
        self._on_lost = on_lost
        self.db.fence(self._fence)

        def loop() -> None:
            while not self._stop.wait(LEASE_S / 3):
                try:
                    held = self.renew()
                    if not held:
                        with self.db.session() as sess:
                            row = sess.get(LeaseRow, 1)
                            err = _lost(None if row is None else (row.pid, row.host, row.port))
                except Exception:  # noqa: BLE001 - a database hiccup: try again next time
                    continue
                if not held:
                    self._lose(err)
                    return

        self._thread = threading.Thread(target=loop, name="server-lease", daemon=True)
        self._thread.start()

    def _fence(self, conn: Connection) -> None:
        """In a transaction that wrote, before its commit: :class:`LeaseLost` (the transaction
        is rolled back) unless this server holds the lease. ``FOR SHARE`` holds a takeover
        (an ``UPDATE`` of the row) until the transaction ends (SQLite leaves it out: a
        transaction that wrote holds the database's one write lock already)."""
        if self.lost is not None:
            raise LeaseLost(str(self.lost))
        row = conn.execute(_FENCE_READ).first()
        if row is not None and row.owner == self.owner:
            return
        err = _lost(None if row is None else (row.pid, row.host, row.port))
        self._lose(err)
        raise LeaseLost(str(err))

    def _lose(self, err: LeaseLost) -> None:
        with self._lost_mu:
            if self.lost is not None:
                return
            self.lost = err
        self._on_lost(err)
