"""A server's database that another process holds locked: the commands' one-line error.

SQLite lets one connection write at a time. ``fedforest server``, its admin commands and
``fedforest evaluate`` wait for another process's write transaction (the connection's busy
timeout), then fail with "database is locked": a server paused or stuck mid-transaction, or a
tool that holds one open. PostgreSQL locks rows: a statement that waits for a row another
transaction holds fails after the connection's lock timeout
(:data:`~fedforest_secure.dburl.PG_LOCK_TIMEOUT_S`, SQLSTATE 55P03). :func:`locks_named` turns
either into an error naming the database, and so a write the disk refused (full, or an I/O
error: :func:`full_message`).
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fedforest_secure.errors import FedForestError

from ._common import fail

if TYPE_CHECKING:
    from fedforest_secure.dburl import SqliteWriteError

__all__ = ["full_message", "is_locked", "locked_message", "locks_named"]


#: PostgreSQL's SQLSTATE of a statement that waited for a lock longer than its lock timeout
_LOCK_NOT_AVAILABLE = "55P03"


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` (a SQLAlchemy error or the driver's own) is SQLite's "database is
    locked" (another connection held the write lock for the whole busy timeout) or
    PostgreSQL's lock timeout (another transaction held a row for the whole lock timeout)."""
    return _sqlite_busy(exc) or _postgres_lock_timeout(exc)


def _orig(exc: BaseException) -> BaseException:
    from sqlalchemy.exc import DBAPIError  # loaded already by the command that met it

    return exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc


def _sqlite_busy(exc: BaseException) -> bool:
    orig = _orig(exc)
    code = getattr(orig, "sqlite_errorcode", None)
    return (isinstance(orig, sqlite3.OperationalError) and isinstance(code, int)
            and code & 0xFF == sqlite3.SQLITE_BUSY)


def _postgres_lock_timeout(exc: BaseException) -> bool:
    return getattr(_orig(exc), "sqlstate", None) == _LOCK_NOT_AVAILABLE


def _locked_now(path: Path) -> bool:
    """Whether a process holds a write transaction on the SQLite file ``path`` now (a write
    transaction begun and rolled back at once; nothing is written)."""
    if not path.is_file():
        return False
    try:
        conn = sqlite3.connect(path, timeout=0.2, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return is_locked(exc)
    return False


def locked_message(config: Path, exc: BaseException | None = None) -> str:
    """The error for a lock met on the databases ``config`` names: for SQLite's "database is
    locked", the file that is locked now (both, or the one there is, if none is any more); for
    PostgreSQL's lock timeout (``exc``), its databases."""
    from fedforest_secure.dburl import shown_url, sqlite_file
    from server_app.settings import load_settings

    try:
        settings = load_settings(config)
        urls = [settings.database, settings.audit_database]
    except FedForestError:  # it loaded when the command began: changed since
        urls = []
    if exc is not None and _postgres_lock_timeout(exc):
        shown = list(dict.fromkeys(shown_url(u) for u in urls if u and sqlite_file(u) is None))
        what = (f"the database {' or '.join(shown)}" if shown
                else f"a database that {config} names")
        return (f"{what} has rows locked by another process's open transaction (a paused or "
                "stuck server, or another tool), and the wait for them timed out: resume or "
                "stop that process, or try again once it is done")
    files = list(dict.fromkeys(f for f in (sqlite_file(u) for u in urls if u) if f))
    named = [f for f in files if _locked_now(f)] or files
    what = (f"the database file {' or '.join(str(f) for f in named)}" if named
            else f"a database that {config} names")
    return (f"{what} is locked by another process that holds a write transaction on it (a "
            "paused or stuck server, or another tool): resume or stop that process, or try "
            "again once it is done")


@contextmanager
def locks_named(config: Path) -> Iterator[None]:
    """Run a command's work on the databases ``config`` names; a "database is locked" ends it
    with :func:`locked_message` (the CLI's one-line error, exit 2) instead of a traceback."""
    try:
        yield
    except Exception as exc:
        if is_locked(exc):
            fail(OSError(locked_message(config, exc)))
        from fedforest_secure.dburl import sqlite_write_error  # sqlalchemy: loaded already

        refused = sqlite_write_error(exc)
        if refused is None:
            raise
        fail(OSError(full_message(config, refused)))


def full_message(config: Path, refused: SqliteWriteError) -> str:
    """The error for a write SQLite's disk refused (:func:`sqlite_write_error`: full, or an
    I/O error) on the databases ``config`` names: the SQLite file(s) on a disk with little
    room left (both, or the one there is, if none is)."""
    from fedforest_secure.dburl import sqlite_file
    from server_app.settings import load_settings

    try:
        settings = load_settings(config)
        urls = [settings.database, settings.audit_database]
    except FedForestError:  # it loaded when the command began: changed since
        urls = []
    files = list(dict.fromkeys(f for f in (sqlite_file(u) for u in urls if u) if f))
    named = [f for f in files if _free_bytes(f) < _LITTLE_ROOM] or files
    what = (f"the database file {' or '.join(str(f) for f in named)}" if named
            else f"a database that {config} names")
    then = ("Free some space on that disk" if refused.full
            else "Check that disk's free space, the file size limit (`ulimit -f`) and the "
                 "system log for disk errors")
    return (f"{refused.why(what)}; the command's change was not made. {then}, then run the "
            "command again")


_LITTLE_ROOM = 64 << 20  # bytes: less free space than this on a database's disk is named


def _free_bytes(path: Path) -> int:
    try:
        return shutil.disk_usage(path.parent).free
    except OSError:
        return 0
