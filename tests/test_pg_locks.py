"""PostgreSQL connections wait a bounded time for a lock (``fedforest_secure.dburl``).

A server paused (or whose host died) inside a write transaction keeps its row locks. A server
that takes over, or an admin command, fails after the lock timeout (30 s, as SQLite's busy
timeout) with the error a SQLite lock gives, instead of waiting for ever; TCP keepalives at
both ends let the database end a dead client's session."""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import make_url
from typer.testing import CliRunner

import fedforest_secure.dburl as dburl
from fedforest_cli.cli import app as cli_app
from fedforest_secure.audit import AuditLog
from server_app.app import create_app
from server_app.audit_hook import NullAudit
from server_app.auth import add_client
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.logs import LOGGER
from server_app.runtime import ServerState

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

pytestmark = pytest.mark.postgres


@pytest.fixture()
def pg_url(pg_cluster: Any) -> str:
    return str(pg_cluster.new_database("locks"))


@contextmanager
def rows_locked(pg_cluster: Any, url: str, table: str) -> Iterator[None]:
    """Another connection holds every row of ``table`` locked (``FOR UPDATE``) in an open
    transaction, as a server paused in the middle of a step does."""
    import psycopg

    with psycopg.connect(host=str(pg_cluster.root), port=5432, user="fedforest",
                         dbname=make_url(url).database) as holder:
        holder.execute(f"SELECT * FROM {table} FOR UPDATE")
        try:
            yield
        finally:
            holder.rollback()


def _param(conn: Any, name: str) -> str:
    return str(conn.connection.dbapi_connection.info.get_parameters().get(name))


def test_every_postgres_engine_waits_30_s_for_a_lock_and_keeps_its_connections_alive(
        pg_url: str) -> None:
    db = Database(pg_url)
    audit = AuditLog(pg_url)  # the server's audit log, on its own engine
    try:
        for engine in (db.engine, audit.engine):
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "30s"
                assert _param(conn, "connect_timeout") == "10"
                assert (_param(conn, "keepalives_idle"), _param(conn, "keepalives_interval"),
                        _param(conn, "keepalives_count"), _param(conn, "tcp_user_timeout")
                        ) == ("10", "5", "3", "30000")
                # the database's end of a TCP connection too (on this test's unix socket these
                # settings read 0: they are checked as set for the session)
                assert dict(conn.exec_driver_sql(
                    "SELECT name, source FROM pg_settings WHERE name IN ('lock_timeout', "
                    "'tcp_keepalives_idle', 'tcp_keepalives_interval', "
                    "'tcp_keepalives_count', 'tcp_user_timeout')").all()) == dict.fromkeys(
                    ("lock_timeout", "tcp_keepalives_idle", "tcp_keepalives_interval",
                     "tcp_keepalives_count", "tcp_user_timeout"), "session")
                assert _param(conn, "options") in ("None", "")  # PgBouncer refuses options
    finally:
        audit.close()
        db.dispose()


def test_the_urls_own_settings_win(pg_url: str) -> None:
    url = f"{pg_url}&connect_timeout=4&options={quote('-c lock_timeout=2s')}"
    db = Database(url)
    try:
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "2s"
            assert _param(conn, "connect_timeout") == "4"
    finally:
        db.dispose()


def test_pgoptions_and_a_search_path_in_it_still_hold(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings given in PGOPTIONS (a schema on the search path, a lock timeout of their own)
    are the connection's: the server's bounds never replace them."""
    db = Database(pg_url)
    try:
        with db.engine.begin() as conn:
            conn.exec_driver_sql("CREATE SCHEMA IF NOT EXISTS ff_opts")
    finally:
        db.dispose()
    monkeypatch.setenv("PGOPTIONS", "-c search_path=ff_opts -c lock_timeout=3s")
    db = Database(pg_url)
    try:
        with db.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW search_path").scalar() == "ff_opts"
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "3s"
            tables = {r[0] for r in conn.exec_driver_sql(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'ff_opts'").all()}
            assert "jobs" in tables  # made in the schema PGOPTIONS names
    finally:
        db.dispose()


def test_a_server_step_that_meets_a_locked_row_fails_after_the_lock_timeout(
        pg_cluster: Any, pg_url: str, tmp_path: Path, tiny_parts: Any, job_dir: Any,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A server whose database has rows locked by another transaction (a stalled server it
    took over from) answers the step that needs them after the lock timeout (here 1 s): a
    500 and one error line, as on SQLite after its busy timeout; once the rows are free the
    site's retry goes through."""
    monkeypatch.setattr(dburl, "PG_LOCK_TIMEOUT_S", 1, raising=False)
    caplog.set_level(logging.INFO, logger=LOGGER)
    parts, feat = tiny_parts
    db = Database(pg_url)
    tokens = [add_client(db, f"client-{k}") for k in range(3)]
    state = ServerState(db, NullAudit())
    state.create_job(load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=3)))
    http = TestClient(create_app(db, state=state, tick_seconds=3600),
                      raise_server_exceptions=False)
    join = {"url": "/v1/jobs/job-a/join", "headers": {"Authorization": f"Bearer {tokens[0]}"}}
    answers: list[Any] = []
    try:
        with http, rows_locked(pg_cluster, pg_url, "members"):
            began = time.monotonic()
            step = threading.Thread(target=lambda: answers.append(http.post(**join)),
                                    daemon=True)
            step.start()
            step.join(timeout=20)
            took = time.monotonic() - began
            assert answers, "the step still waits for the locked rows after 20 s"
        assert took < 10, took
        res = answers[0]
        assert res.status_code == 500, res.text
        assert res.json()["detail"] == ("the server failed: the server's database failed "
                                        "(its log has the traceback)")
        errors = [r.getMessage() for r in caplog.records
                  if r.getMessage().startswith("event=error ")]
        assert len(errors) == 1 and "canceling statement due to lock timeout" in errors[0], \
            errors
        with http:
            assert http.post(**join).status_code == 200  # the rows are free: the retry joins
    finally:
        db.dispose()


def test_an_admin_command_that_meets_a_locked_row_fails_in_one_line(
        pg_cluster: Any, pg_url: str, tmp_path: Path) -> None:
    url = f"{pg_url}&options={quote('-c lock_timeout=1s')}"
    db = Database(url)
    add_client(db, "hospital-a")
    db.dispose()
    config = tmp_path / "server.toml"
    config.write_text(f'database = "{url}"\n')
    with rows_locked(pg_cluster, pg_url, "clients"):
        res = CliRunner().invoke(cli_app, ["server", "revoke-client", "hospital-a",
                                           "--config", str(config)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == 2, res.output
    assert res.output.splitlines() == [
        f"error: the database {dburl.shown_url(url)} has rows locked by another process's "
        "open transaction (a paused or stuck server, or another tool), and the wait for them "
        "timed out: resume or stop that process, or try again once it is done"]
