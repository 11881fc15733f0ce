"""SQLAlchemy engines from the database URLs an operator writes (the server's database, an
audit log): a scheme SQLAlchemy does not know, a driver that is not installed or a malformed
URL is a :class:`DatabaseUrlError` saying what to write or install, with the URL's password
hidden (:func:`shown_url`: the password after the user name, one given as a query parameter, and
all of the user part of a URL whose password holds an ``@`` that was not written ``%40``; of a
malformed URL, its scheme only: :func:`_malformed_part`). A SQLite file an
engine creates is readable by its owner only.

A PostgreSQL connection is opened with bounds (:func:`_postgres_connect_args`): a connection
attempt gives up after :data:`PG_CONNECT_TIMEOUT_S` seconds; a statement that waits for a lock
another transaction holds (a server paused, or whose host died, inside a transaction) fails
after :data:`PG_LOCK_TIMEOUT_S` seconds, as a SQLite connection of the server waits for
another's write lock; and TCP keepalives and a TCP user timeout at both ends find a peer
that is gone within about 30 s, so the database ends a dead client's session (and its
transaction's locks) then, not after the system's two hours. The URL's own parameters
(``?connect_timeout=...``, ``?options=-c lock_timeout=...``), ``PGOPTIONS``, a service file
and the role's or database's settings take precedence."""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from .protocol.api import LOCK_WAIT_S

__all__ = ["PG_CONNECT_TIMEOUT_S", "PG_LOCK_TIMEOUT_S", "DatabaseUrlError", "SqliteWriteError",
           "carries_secret", "create_db_engine", "in_memory", "shown_url", "sqlite_file",
           "sqlite_url", "sqlite_write_error"]

_WORKING = "postgresql+psycopg://user:password@host:5432/db or sqlite:///path/to/file.db"
#: query parameters that carry a secret (libpq's ``password``, ``sslpassword``, ...)
_SECRET_PARAMS = ("password", "secret", "token", "passfile")
#: what ``make_url`` raises for a malformed URL (a port that is no number: ValueError)
_MALFORMED = (ArgumentError, ValueError)

#: seconds a PostgreSQL connection attempt may take (a host that does not answer costs a
#: request 10 s, not the system's TCP connect timeout of about two minutes)
PG_CONNECT_TIMEOUT_S = 10
#: seconds a statement on PostgreSQL waits for a lock that another transaction holds, then
#: fails (SQLSTATE 55P03, "canceling statement due to lock timeout"): the busy timeout of the
#: server's SQLite connections too (:data:`~fedforest_secure.protocol.api.LOCK_WAIT_S`, which
#: a client's wait for an answer allows for)
PG_LOCK_TIMEOUT_S = LOCK_WAIT_S
#: TCP keepalives of a PostgreSQL connection, set at both ends: seconds idle before the first
#: probe, seconds between probes, probes unanswered before the connection is dropped
_PG_KEEPALIVES = (10, 5, 3)
#: seconds data sent on a PostgreSQL connection may stay unacknowledged before the connection
#: is dropped (both ends; a peer gone while a reply was in flight is found without keepalives)
_PG_TCP_USER_TIMEOUT_S = 30


class DatabaseUrlError(ValueError):
    """A database URL no engine can be made from; the message says what to do."""


def shown_url(url: str) -> str:
    """``url`` with its secrets hidden (``***``), or a placeholder if it does not parse: the
    password, query parameters that carry one, and a host part holding an ``@`` (a password
    with an ``@`` not written ``%40``: what follows it would read as the host)."""
    try:
        parsed = make_url(url)
    except _MALFORMED:
        return "(a malformed URL)"
    if parsed.host and "@" in parsed.host:
        parsed = parsed.set(username="***", password=None,
                            host=parsed.host.rsplit("@", 1)[1])
    hidden = {k: "***" for k in parsed.query if any(s in k.lower() for s in _SECRET_PARAMS)}
    if hidden:
        parsed = parsed.update_query_dict(hidden)
    return parsed.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def carries_secret(url: str) -> bool:
    """Whether ``url`` holds a secret: a password, a query parameter that carries one, or a
    host part holding an ``@`` (a password whose ``@`` was not written ``%40``); libpq's
    ``passfile`` names a file of passwords, not one (logs hide it all the same)."""
    try:
        parsed = make_url(url)
    except _MALFORMED:
        return False
    return bool(parsed.password) or "@" in (parsed.host or "") or any(
        s in k.lower() for k in parsed.query for s in _SECRET_PARAMS if s != "passfile")


def sqlite_url(path: str | Path) -> str:
    """The ``sqlite:///`` URL of the SQLite file ``path``, its characters percent-encoded where
    a URL would read them otherwise (``?`` as the start of the query, ``%xx`` as an escape):
    :func:`sqlite_file` of it is ``path`` again, whatever the path holds."""
    return URL.create("sqlite", database=str(path)).render_as_string(hide_password=False)


def sqlite_file(db: str) -> Path | None:
    """The file a database is kept in: ``db`` itself when it is a path, the file a
    ``sqlite://`` URL names; None for another database (or SQLite in memory)."""
    if "://" not in db:
        try:
            return Path(db).expanduser()
        except RuntimeError:  # ~name of no user: the path as it is written
            return Path(db)
    try:
        parsed = make_url(db)
    except _MALFORMED:
        return None
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    if database.startswith("file:"):  # a SQLite URI (``?uri=true``): its path part
        database = database[len("file:"):].split("?", 1)[0]
        if not database or database == ":memory:":
            return None
    try:
        return Path(database).expanduser()
    except RuntimeError:  # ~name of no user: the path as SQLite reads it
        return Path(database)


class SqliteWriteError(NamedTuple):
    """An error of SQLite's file I/O (:func:`sqlite_write_error`): ``full`` for SQLITE_FULL
    ("database or disk is full"), otherwise an SQLITE_IOERR (``reading`` for a read's), which
    a full disk, a file size limit or a failing disk each give; ``said``: SQLite's words."""

    full: bool
    reading: bool
    said: str

    def why(self, what: str) -> str:
        """What an operator reads of it for ``what`` (a database file, the server's
        database): ``<what> cannot be written: the disk is full (<said>)``, or ``an I/O error
        writing <what> (<said>: a full disk, a file size limit or a failing disk)``."""
        if self.full:
            return f"{what} cannot be written: the disk is full ({self.said})"
        if self.reading:
            return f"an I/O error reading {what} ({self.said}: a failing disk)"
        return (f"an I/O error writing {what} ({self.said}: a full disk, a file size limit or "
                "a failing disk)")


_READS = (sqlite3.SQLITE_IOERR_READ, sqlite3.SQLITE_IOERR_SHORT_READ)


def sqlite_write_error(exc: BaseException) -> SqliteWriteError | None:
    """What SQLite said when ``exc`` (a SQLAlchemy error or the driver's own) is an error of
    its file I/O: ``SQLITE_FULL`` (its disk is full) or ``SQLITE_IOERR`` (a write, sync or
    read that failed: a full disk, a file over the size limit, a failing disk); None for any
    other error."""
    from sqlalchemy.exc import DBAPIError

    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    code = getattr(orig, "sqlite_errorcode", None)
    if not (isinstance(orig, sqlite3.Error) and isinstance(code, int)
            and code & 0xFF in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)):
        return None
    full = code & 0xFF == sqlite3.SQLITE_FULL
    said = (str(orig).splitlines() or [""])[0] or (
        "database or disk is full" if full else "disk I/O error")
    return SqliteWriteError(full, code in _READS, said)


def in_memory(db: str) -> bool:
    """Whether ``db`` (a URL or a SQLite path) is a SQLite database kept in memory:
    ``sqlite://``, ``:memory:``, a ``file::memory:`` URI or one with ``mode=memory``. Each
    connection to one has a database of its own, gone when it closes."""
    if "://" not in db:
        return db.strip() == ":memory:"
    try:
        parsed = make_url(db)
    except _MALFORMED:
        return False
    if parsed.get_backend_name() != "sqlite":
        return False
    database = parsed.database or ""
    return (database in ("", ":memory:") or database.startswith("file::memory:")
            or parsed.query.get("mode") == "memory"
            or (database.startswith("file:") and "mode=memory" in database))


def _malformed_part(url: str) -> str:
    """What the error of a malformed ``url`` shows of it: its scheme only. Where a URL does not
    parse, which of its characters belong to the password is not known (an ``@`` of the
    password not written ``%40``, the ``@`` before the host left out, a ``/`` in the
    password), so all that follows the scheme shows as ``***``."""
    scheme, sep, _ = url.partition("://")
    return f"{scheme}{sep}***" if sep and scheme.replace("+", "").isalnum() else "***"


def create_db_engine(url: str, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine(url, **kwargs)``, or :class:`DatabaseUrlError`."""
    shown = shown_url(url)
    try:
        parsed = make_url(url)
    except _MALFORMED as exc:
        why = " (its port must be a number)" if "int()" in str(exc) else ""
        if "@" not in url and why:
            why = (" (its port must be a number; a user name and password end with an @: "
                   "user:password@host)")
        raise DatabaseUrlError(f"malformed database URL {_malformed_part(url)!r}{why}: write "
                               f"{_WORKING}") from None
    if parsed.host and "@" in parsed.host:
        raise DatabaseUrlError(f"database URL {shown}: the part before the host holds an @ "
                               "(in the password?): write each @, :, / or % of the user name "
                               "and password percent-encoded (@ as %40), or leave the "
                               "password out of the URL and give it in ~/.pgpass or "
                               "PGPASSWORD")
    if parsed.drivername == "postgresql+psycopg2":
        raise DatabaseUrlError(f"database URL {shown}: FedForest Secure uses psycopg 3: write "
                               "postgresql+psycopg://... (pip install "
                               "'fedforest-secure[postgres]')")
    if parsed.get_backend_name() == "postgresql":
        kwargs["connect_args"] = _postgres_connect_args(parsed.query,
                                                        kwargs.get("connect_args", {}))
    try:
        engine = create_engine(url, **kwargs)
    except NoSuchModuleError:
        raise DatabaseUrlError(f"database URL {shown}: unknown scheme "
                               f"{parsed.drivername!r}; write {_WORKING}") from None
    except ImportError as exc:
        raise DatabaseUrlError(f"database URL {shown}: its driver is not installed ({exc}); "
                               "for PostgreSQL: pip install 'fedforest-secure[postgres]'"
                               ) from None
    if parsed.get_backend_name() == "postgresql":
        event.listen(engine, "connect", _postgres_session_bounds)
    # the file SQLite opens: the URL's path as it is (SQLite does not expand a ~), not for
    # a URI whose query says mode=ro, rw or memory (they create no file); a ? in a path that
    # is no URI is part of the file's name
    raw, query = parsed.database or "", ""
    if raw.startswith("file:"):
        raw, _, query = raw[len("file:"):].partition("?")
    mode = parsed.query.get("mode") or "".join(re.findall(r"(?:^|&)mode=([^&]*)", query))
    if sqlite_file(url) is not None and raw and mode not in ("ro", "rw", "memory"):
        event.listen(engine, "do_connect", _create_owner_only(Path(raw)))
    return engine


def _postgres_connect_args(query: Mapping[str, Any], given: Mapping[str, Any]
                           ) -> dict[str, Any]:
    """The libpq parameters of a PostgreSQL engine: its connection and keepalive bounds (the
    module's docstring), under those the URL's ``query``, ``PGCONNECT_TIMEOUT`` or the caller
    (``given``) sets. The database's end is set once connected
    (:func:`_postgres_session_bounds`)."""
    idle, interval, count = _PG_KEEPALIVES
    ours: dict[str, Any] = {"connect_timeout": PG_CONNECT_TIMEOUT_S, "keepalives": 1,
                            "keepalives_idle": idle, "keepalives_interval": interval,
                            "keepalives_count": count,
                            "tcp_user_timeout": _PG_TCP_USER_TIMEOUT_S * 1000}
    if os.environ.get("PGCONNECT_TIMEOUT"):
        del ours["connect_timeout"]
    return {**{k: v for k, v in ours.items() if k not in query}, **given}


def _postgres_session_bounds(dbapi_connection: Any, _record: object) -> None:
    """A new PostgreSQL connection's bounds at the database's end (its lock timeout, TCP
    keepalives and user timeout), each set only where it still has the database's default: a
    value the URL's ``options``, ``PGOPTIONS``, a service file, the role or the database gives
    wins, and a setting this PostgreSQL lacks is passed over. Set after connecting, not in
    libpq's ``options`` (which would override ``PGOPTIONS`` and a service file's, and which
    PgBouncer refuses)."""
    idle, interval, count = _PG_KEEPALIVES
    wanted = (("lock_timeout", PG_LOCK_TIMEOUT_S * 1000), ("tcp_keepalives_idle", idle),
              ("tcp_keepalives_interval", interval), ("tcp_keepalives_count", count),
              ("tcp_user_timeout", _PG_TCP_USER_TIMEOUT_S * 1000))
    rows = ", ".join(f"('{name}', '{int(value)}')" for name, value in wanted)
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(
            "SELECT set_config(s.name, v.setting, false) FROM (VALUES " + rows + ") AS "
            "v(name, setting) JOIN pg_settings s ON s.name = v.name WHERE s.source = 'default'")
    finally:
        cursor.close()
    dbapi_connection.commit()  # a session setting made in a transaction rolled back is undone


def _create_owner_only(path: Path) -> Callable[..., None]:
    """A ``do_connect`` listener that creates the SQLite file ``path``, empty and readable by
    its owner only, when a connection would create it: what the file holds (the tokens'
    digests, the sites' disclosures, an audit log) is the server's, and SQLite gives its WAL
    and journal files the file's mode. A file that exists keeps the mode it has."""

    def create(*_: object) -> None:
        if not path.exists() and path.parent.is_dir():  # else SQLite's own error
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))

    return create
