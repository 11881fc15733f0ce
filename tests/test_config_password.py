"""A server.toml that gives a database password and that others can read is a warning in the
server's log at start-up (``event=config_warning``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ports import free_port
from sqlalchemy.engine import make_url

from server_app.serve import config_warnings
from server_app.settings import ServerSettings

PG = "postgresql+psycopg://fedforest:s3cret@db.example/fedforest"


def _config(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "server.toml"
    path.write_text("# the settings are given to the check directly\n")
    path.chmod(mode)
    return path


@pytest.mark.parametrize(("mode", "whom"), [(0o644, "other users of this machine"),
                                            (0o640, "its group")])
def test_a_password_in_a_config_others_can_read_is_a_warning(
        tmp_path: Path, mode: int, whom: str) -> None:
    config = _config(tmp_path, mode)
    settings = ServerSettings(database=PG, audit_database=PG.replace("s3cret", "other"))
    assert config_warnings(config, settings) == [
        f"{config}: database and audit_database holds a password and {whom} can read the "
        f"file (mode {mode:04o}); make it readable by the server only (chmod 600 {config}), "
        "or give the password in ~/.pgpass or PGPASSWORD instead"]


@pytest.mark.parametrize("database", [
    PG.replace(":s3cret", "") + "?password=s3cret",  # libpq's password parameter
    "postgresql+psycopg://fedforest:p@ss@db.example/fedforest",  # an @ not written %40
])
def test_a_password_given_other_ways_in_the_url_is_seen(tmp_path: Path, database: str) -> None:
    config = _config(tmp_path, 0o644)
    assert config_warnings(config, ServerSettings(database=database))[0].startswith(
        f"{config}: database holds a password and other users of this machine can read")


@pytest.mark.parametrize(("database", "mode"), [
    (PG, 0o600),  # read by the server only
    (PG.replace(":s3cret", ""), 0o644),  # the password in ~/.pgpass or PGPASSWORD
    (PG.replace(":s3cret", "") + "?passfile=/etc/fedforest/pgpass", 0o644),  # a file of them
    ("sqlite:///fedforest-server.db", 0o644),
])
def test_no_warning_without_a_password_others_can_read(
        tmp_path: Path, database: str, mode: int) -> None:
    assert config_warnings(_config(tmp_path, mode), ServerSettings(database=database)) == []


@pytest.mark.postgres
def test_the_server_started_from_a_readable_config_with_a_password_logs_the_warning(
        tmp_path: Path, pg_cluster: Any, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    """The server's start-up (its listener, database and audit log made; uvicorn's loop
    replaced by a no-op) logs the warning once, naming the file, the password not."""
    import uvicorn

    from server_app.serve import run_server

    url = make_url(pg_cluster.new_database("cfgpw")).set(password="s3cret")
    database = url.render_as_string(hide_password=False)
    config = _config(tmp_path, 0o644)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    run_server(ServerSettings(host="127.0.0.1", database=database), insecure_dev=True,
               port=free_port(), config_file=config)
    log = capfd.readouterr().err  # the server's log lines
    said = [line for line in log.splitlines() if "event=config_warning" in line]
    assert len(said) == 1, log
    assert f'reason="{config}: database holds a password and other users' in said[0]
    assert "event=startup" in log and "s3cret" not in log
