"""A server's SQLite database that another process holds locked (``fedforest_cli._db_locked``):
``fedforest server`` and its admin commands end with one line naming the file, exit 2."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from ports import free_port
from typer.testing import CliRunner

from fedforest_cli._db_locked import locked_message
from fedforest_cli.cli import app as cli_app
from server_app.admin import ServerAdmin
from server_app.jobspec import load_job_spec

_HOLD = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(120)
"""


@contextmanager
def write_locked(path: Path) -> Iterator[None]:
    """Another process holds a write transaction on the SQLite file ``path`` (as a server
    paused mid-transaction does)."""
    with subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdout=subprocess.PIPE,
                          text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
            yield
        finally:
            proc.kill()


@pytest.fixture()
def quick_locks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The databases' SQLite connections wait 0.2 s for another's write lock (not 30 s or
    5 s), then fail with "database is locked" as they would after their wait."""
    import fedforest_secure.audit._sql as audit_sql
    import server_app.db as server_db

    for module in (server_db, audit_sql):
        real = module.create_db_engine

        def quick(url: str, _real: Any = real, **kwargs: Any) -> Any:
            if url.startswith("sqlite"):
                kwargs["connect_args"] = {**kwargs.get("connect_args", {}), "timeout": 0.2}
            return _real(url, **kwargs)

        monkeypatch.setattr(module, "create_db_engine", quick)


@pytest.fixture()
def loggers_kept() -> Iterator[None]:
    """The server's loggers as they were after the test (a server started in this process
    sends them to the stderr of the CLI runner, closed once the command ends)."""
    kept = {name: (logger.handlers[:], logger.level, logger.propagate)
            for name in ("fedforest.server", "uvicorn.error")
            for logger in [logging.getLogger(name)]}
    yield
    for name, (handlers, level, propagate) in kept.items():
        logger = logging.getLogger(name)
        logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate


@pytest.fixture()
def fed(tmp_path: Path, tiny_parts, job_dir) -> dict:  # type: ignore[no-untyped-def]
    """job-a (open) created for 3 registered sites, on SQLite files with an audit log."""
    parts, feat = tiny_parts
    job_toml = job_dir(tmp_path / "job", parts, feat, n_clients=3)
    config = tmp_path / "server.toml"
    config.write_text(f'database = "sqlite:///{tmp_path / "server.db"}"\n'
                      f'audit_database = "sqlite:///{tmp_path / "audit.db"}"\n')
    with ServerAdmin(f"sqlite:///{tmp_path / 'server.db'}",
                     f"sqlite:///{tmp_path / 'audit.db'}") as admin:
        for k in range(3):
            admin.add_client(f"client-{k}")
        admin.create_job(load_job_spec(job_toml))
    return {"config": config, "server_db": tmp_path / "server.db",
            "audit_db": tmp_path / "audit.db",
            "job_b": job_dir(tmp_path / "job-b", parts, feat, n_clients=3, job_id="job-b")}


def _said(file: Path | str) -> str:
    return (f"error: the database file {file} is locked by another process that holds a write "
            "transaction on it (a paused or stuck server, or another tool): resume or stop "
            "that process, or try again once it is done")


@pytest.mark.parametrize("command", ["server", "cancel-job", "add-client", "create-job"])
def test_a_command_on_a_locked_server_database_names_the_file_in_one_line(
        fed: dict, quick_locks: None, loggers_kept: None, command: str) -> None:
    config = str(fed["config"])
    args = {"server": ["server", "--config", config, "--insecure-dev",
                       "--port", str(free_port())],
            "cancel-job": ["server", "cancel-job", "--config", config, "--job", "job-a",
                           "--wait", "1"],
            "add-client": ["server", "add-client", "client-9", "--config", config],
            "create-job": ["server", "create-job", "--config", config,
                           "--job", str(fed["job_b"])]}[command]
    with write_locked(fed["server_db"]):
        res = CliRunner().invoke(cli_app, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == 2, res.output
    assert res.output.splitlines() == [_said(fed["server_db"])]


def test_the_file_named_is_the_one_locked_now(fed: dict) -> None:
    """The error names the database file another process holds locked when the command
    fails (the server's or the audit log's); both when neither is locked any more."""
    with write_locked(fed["audit_db"]):
        assert "error: " + locked_message(fed["config"]) == _said(fed["audit_db"])
    with write_locked(fed["server_db"]):
        assert "error: " + locked_message(fed["config"]) == _said(fed["server_db"])
    assert "error: " + locked_message(fed["config"]) == _said(
        f"{fed['server_db']} or {fed['audit_db']}")
