"""SQLAlchemy engines from the database URLs an operator writes (the server's database, an
audit log): a scheme SQLAlchemy does not know, a driver that is not installed or a malformed
URL is a :class:`DatabaseUrlError` saying what to write or install, with the URL's password
hidden."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

__all__ = ["DatabaseUrlError", "create_db_engine", "shown_url", "sqlite_file"]

_WORKING = "postgresql+psycopg://user:password@host:5432/db or sqlite:///path/to/file.db"


class DatabaseUrlError(ValueError):
    """A database URL no engine can be made from; the message says what to do."""


def shown_url(url: str) -> str:
    """``url`` with its password hidden (``***``), or a placeholder if it does not parse."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(a malformed URL)"


def sqlite_file(db: str) -> Path | None:
    """The file a database is kept in: ``db`` itself when it is a path, the file a
    ``sqlite://`` URL names; None for another database (or SQLite in memory)."""
    if "://" not in db:
        return Path(db).expanduser()
    try:
        parsed = make_url(db)
    except ArgumentError:
        return None
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    if database.startswith("file:"):  # a SQLite URI (``?uri=true``): its path part
        database = database[len("file:"):].split("?", 1)[0]
        if not database or database == ":memory:":
            return None
    return Path(database).expanduser()


def create_db_engine(url: str, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine(url, **kwargs)``, or :class:`DatabaseUrlError`."""
    shown = shown_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise DatabaseUrlError(f"malformed database URL {url.split('@')[-1]!r}: write "
                               f"{_WORKING}") from None
    if parsed.drivername == "postgresql+psycopg2":
        raise DatabaseUrlError(f"database URL {shown}: FedForest Secure uses psycopg 3: write "
                               "postgresql+psycopg://... (pip install "
                               "'fedforest-secure[postgres]')")
    try:
        return create_engine(url, **kwargs)
    except NoSuchModuleError:
        raise DatabaseUrlError(f"database URL {shown}: unknown scheme "
                               f"{parsed.drivername!r}; write {_WORKING}") from None
    except ImportError as exc:
        raise DatabaseUrlError(f"database URL {shown}: its driver is not installed ({exc}); "
                               "for PostgreSQL: pip install 'fedforest-secure[postgres]'"
                               ) from None
