"""Database URLs an operator may write: a scheme SQLAlchemy does not know, a driver that is
not installed, a malformed URL: each is a one-line error saying what to write or install,
never a traceback, and never the URL's password."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from fedforest_secure.audit import AuditLog
from fedforest_secure.dburl import create_db_engine
from fedforest_secure.errors import AuditError
from server_app.db import Database
from server_app.settings import ConfigError


@pytest.mark.parametrize("url", ["postgres://fed:s3cret@127.0.0.1:5/fed",
                                 "mysqlx://fed:s3cret@127.0.0.1/fed"])
def test_an_unknown_scheme_names_the_ones_that_work(url: str) -> None:
    with pytest.raises(ConfigError) as server:
        Database(url)
    with pytest.raises(AuditError) as audit:
        AuditLog(url)
    for exc in (server.value, audit.value):
        text = str(exc)
        assert "postgresql+psycopg://" in text and "sqlite:///" in text, text
        assert "s3cret" not in text


def test_a_driver_that_is_not_installed_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as on a machine without the extra
    url = "postgresql+psycopg://fed:s3cret@127.0.0.1:5/fed"
    with pytest.raises(ConfigError) as server:
        Database(url)
    with pytest.raises(AuditError) as audit:
        AuditLog(url)
    for exc in (server.value, audit.value):
        assert "fedforest-secure[postgres]" in str(exc) and "s3cret" not in str(exc)


def test_psycopg2_urls_are_pointed_to_psycopg_3() -> None:
    with pytest.raises(ConfigError, match=r"postgresql\+psycopg://"):
        Database("postgresql+psycopg2://fed@127.0.0.1:5/fed")


def test_two_processes_creating_a_new_database_at_once_both_open_it(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process created the tables between this one's check and its CREATE (four
    `server add-client` at once on a new database): its CREATE fails ("table clients already
    exists"; PostgreSQL: a duplicate key in pg_type) and the tables it found are taken as
    they are."""
    from sqlalchemy.exc import OperationalError

    import server_app.db as db_mod

    real = db_mod.Base.metadata.create_all
    calls = []

    def racing(engine, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            real(engine, **kw)  # the other process's tables
            raise OperationalError("CREATE TABLE clients", {},
                                   Exception("table clients already exists"))
        return real(engine, **kw)

    monkeypatch.setattr(db_mod.Base.metadata, "create_all", racing)
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    assert len(calls) == 2
    db.dispose()


def test_the_files_the_server_creates_are_its_users_only(tmp_path: Path) -> None:
    """The server's SQLite database (tokens' digests, the sites' disclosures) with its WAL
    files, a SQLite audit log and the spool directory of masked uploads, created by the
    server, are readable by its user only, whatever the umask; a file that exists keeps its
    mode."""
    import stat

    import numpy as np

    from server_app.spool import Spool

    old = os.umask(0o022)
    try:
        (tmp_path / "given.db").touch(0o640)
        db = Database(f"sqlite:///{tmp_path / 'server.db'}")
        given = Database(f"sqlite:///{tmp_path / 'given.db'}")
        log = AuditLog(tmp_path / "audit.db")
        Spool(tmp_path / "server.db.spool").write("job-a", 1, 0, np.zeros(4, dtype="<u8"))
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        db.dispose()
        given.dispose()
        log.close()
    finally:
        os.umask(old)
    assert {"server.db-wal", "server.db-shm", "audit.db"} <= set(modes), modes
    assert modes == {**{n: 0o600 for n in modes if n.startswith(("server.db", "audit.db"))},
                     "server.db.spool": 0o700,
                     **{n: 0o640 for n in modes if n.startswith("given.db")}}, modes


@pytest.mark.parametrize(("db", "path"), [
    ("audit.db", "audit.db"),
    ("~/audit.db", "{home}/audit.db"),
    ("sqlite:////data/audit.db", "/data/audit.db"),
    ("sqlite+pysqlite:///rel/audit.db?timeout=5", "rel/audit.db"),
    ("sqlite:///file:/data/audit.db?mode=ro&uri=true", "/data/audit.db"),
    ("sqlite://", None),
    ("sqlite:///:memory:", None),
    ("postgresql+psycopg://u@h/db", None),
])
def test_the_file_a_database_is_kept_in(db: str, path: str | None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """What `audit export` must never write over: a path (``~`` expanded) or the file of a
    ``sqlite://`` URL (a SQLite URI's path part); nothing for another database."""
    from pathlib import Path

    from fedforest_secure.dburl import sqlite_file

    monkeypatch.setenv("HOME", "/home/site")
    want = None if path is None else Path(path.format(home="/home/site"))
    assert sqlite_file(db) == want


@pytest.mark.parametrize(("db", "memory"), [
    ("sqlite://", True),
    ("sqlite:///:memory:", True),
    (":memory:", True),
    ("sqlite:///file::memory:?uri=true", True),
    ("sqlite:///file:shared?mode=memory&cache=shared&uri=true", True),
    ("sqlite:///audit.db", False),
    ("sqlite:///file:/data/audit.db?mode=ro&uri=true", False),
    ("audit.db", False),
    ("postgresql+psycopg://u@h/db", False),
    ("not a url://", False),
])
def test_a_sqlite_database_kept_in_memory_is_told_from_a_file(db: str, memory: bool) -> None:
    """What the server refuses as its database or audit log: SQLite in memory keeps nothing
    beyond the connection that made it."""
    from fedforest_secure.dburl import in_memory

    assert in_memory(db) is memory


def test_a_database_file_whose_name_holds_mode_memory_is_a_file(tmp_path: Path) -> None:
    """Only a query or a ``file:`` URI asks SQLite for memory; a file's name does not."""
    from fedforest_secure.dburl import in_memory

    assert not in_memory(f"sqlite:///{tmp_path / 'mode=memory.db'}")
    assert in_memory("sqlite:///file:x?mode=memory&uri=true")


@pytest.mark.parametrize("form", ["uri_rwc", "tilde_inside", "tilde_first", "tilde_user",
                                  "mode_in_path"])
def test_a_sqlite_file_made_through_a_uri_or_an_unusual_path_is_its_users_only(
        tmp_path: Path, form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mode=rwc`` creates the file (only ``mode=ro``, ``rw`` and ``memory`` do not); a ``~``
    is an ordinary character to SQLite (``sqlite:///~/x.db`` is ``./~/x.db``; ``~h`` of no
    user is no traceback), and so is a directory named ``mode=rw``: each file SQLite makes
    comes out 0600."""
    monkeypatch.chdir(tmp_path)
    for d in ("fed~1", "~", "mode=rw"):
        (tmp_path / d).mkdir()
    url, path = {
        "uri_rwc": (f"sqlite:///file:{tmp_path / 'made.db'}?mode=rwc&uri=true", "made.db"),
        "tilde_inside": (f"sqlite:///{tmp_path / 'fed~1' / 'made.db'}", "fed~1/made.db"),
        "tilde_first": ("sqlite:///~/made.db", "~/made.db"),
        "tilde_user": ("sqlite:///~nosuchuser9.db", "~nosuchuser9.db"),
        "mode_in_path": (f"sqlite:///{tmp_path / 'mode=rw' / 'made.db'}", "mode=rw/made.db"),
    }[form]
    old = os.umask(0o022)
    try:
        engine = create_db_engine(url)
        with engine.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        engine.dispose()
    finally:
        os.umask(old)
    made = tmp_path / path
    assert made.exists() and stat.S_IMODE(made.stat().st_mode) == 0o600


# ? and %41 were misread; the others are a guard (SQLAlchemy keeps a # of the path)
@pytest.mark.parametrize("name", ["conf?x", "conf%41", "x#y", "a b é", "@:+;=&[]"])
def test_a_sqlite_url_names_its_path_whatever_the_path_holds(tmp_path: Path,
                                                             name: str) -> None:
    """A path pasted into ``sqlite:///`` read its ``?`` as the query and ``%41`` as ``A``.
    The engine opens the file itself (made owner-only; a ``?`` made an empty file of the
    path's part before it instead)."""
    from fedforest_secure.dburl import sqlite_file, sqlite_url

    path = tmp_path / name / "made.db"
    path.parent.mkdir()
    url = sqlite_url(path)
    assert sqlite_file(url) == path
    old = os.umask(0o022)
    try:
        engine = create_db_engine(url)
        with engine.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        engine.dispose()
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert [p.name for p in path.parent.iterdir()] == ["made.db"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
