"""A database URL's secrets never reach a log line or an error message: the password after the
user name, one given as a query parameter (libpq reads ``?password=``), and a password holding
an ``@`` that was not percent-encoded; a malformed URL is a message, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ports import free_port

from fedforest_cli.sim_processes import child_env
from fedforest_secure.dburl import DatabaseUrlError, create_db_engine, shown_url

SECRET = "Hunter2Secret"


@pytest.mark.parametrize("url", [
    f"postgresql+psycopg://fed:{SECRET}@127.0.0.1:5432/fedforest",
    f"postgresql+psycopg://fed@127.0.0.1:5432/fedforest?password={SECRET}",
    f"postgresql+psycopg://fed@127.0.0.1/fedforest?sslpassword={SECRET}&connect_timeout=5",
    f"postgresql+psycopg://fed:Ab@{SECRET}@127.0.0.1:5432/fedforest",
    f"postgresql+psycopg://fed@127.0.0.1:5543x/fedforest?password={SECRET}",
])
def test_a_shown_url_holds_no_secret(url: str) -> None:
    shown = shown_url(url)
    assert SECRET not in shown and ":Ab" not in shown, shown


def test_a_query_parameter_that_is_no_secret_stays_readable() -> None:
    shown = shown_url(f"postgresql+psycopg://fed@h/db?password={SECRET}&connect_timeout=5")
    assert "connect_timeout=5" in shown and "password=***" in shown


def test_a_port_that_is_no_number_is_a_message_not_a_traceback() -> None:
    with pytest.raises(DatabaseUrlError, match=r"malformed database URL "
                                               r"'postgresql\+psycopg://\*\*\*' "
                                               r"\(its port must be a number\)") as err:
        create_db_engine(f"postgresql+psycopg://fed:{SECRET}@127.0.0.1:5543x/db"
                         f"?password={SECRET}")
    assert SECRET not in str(err.value)


@pytest.mark.parametrize(("url", "shown"), [
    (f"postgresql+psycopg://fed:{SECRET}/fedforest?host=/run/postgresql",
     "'postgresql+psycopg://***' (its port must be a number; a user name and "
     "password end with an @: user:password@host)"),
    (f"postgresql+psycopg:/fed:{SECRET}/db", "'***'"),
    (f"fed:{SECRET}", "'***'"),
    # an @ of the password not written %40, and the @ before the host left out
    (f"postgresql+psycopg://fed:p@{SECRET}:w0rd/fedforest",
     "'postgresql+psycopg://***' (its port must be a number)"),
])
def test_a_malformed_url_without_an_at_is_shown_without_what_may_be_its_password(
        url: str, shown: str) -> None:
    with pytest.raises(DatabaseUrlError) as err:
        create_db_engine(url)
    assert str(err.value).startswith(f"malformed database URL {shown}: write "), str(err.value)
    assert SECRET not in str(err.value)


def test_an_unencoded_at_in_the_password_is_said_before_any_connection() -> None:
    """psycopg would try the host ``<rest of the password>@127.0.0.1`` and name it in its
    error: the URL is refused first, without the password, with the remedy."""
    with pytest.raises(DatabaseUrlError, match="percent-encoded .@ as %40.") as err:
        create_db_engine(f"postgresql+psycopg://fed:Ab@{SECRET}@127.0.0.1:5432/fedforest")
    assert SECRET not in str(err.value)


#: docs/deployment.md's unix-socket URL with a password added and its @ left out: the password
#: reads as the port of a host named after the user
NO_AT = f"postgresql+psycopg://fedforest:{SECRET}/fedforest?host=/run/postgresql"
NO_AT_SAID = ("malformed database URL 'postgresql+psycopg://***' (its port "
              "must be a number; a user name and password end with an @: "
              "user:password@host): write postgresql+psycopg://user:password@host:5432/db or "
              "sqlite:///path/to/file.db")


def test_a_url_whose_at_was_left_out_is_said_malformed_without_its_password(
        tmp_path: Path) -> None:
    """``fedforest server`` (start, status) and ``fedforest audit ... --db`` say what is wrong
    with the URL and show its would-be port, the password, as ***."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app

    config = tmp_path / "server.toml"
    config.write_text(f'database = "{NO_AT}"\n')
    runner = CliRunner()
    for args, code, said in (
            (["server", "status", "--config", str(config)], 2,
             f"error: server database: {NO_AT_SAID}"),
            (["audit", "show", "--db", NO_AT.replace("/fedforest?", "/audit?")], 1,
             "error: audit log: " + NO_AT_SAID.replace("/fedforest'", "/audit'"))):
        res = runner.invoke(app, args, env={"COLUMNS": "1000"})
        out = res.output.replace("\n", "")
        assert res.exit_code == code and SECRET not in out, out
        assert out.startswith(said), out
    started = subprocess.run(
        [sys.executable, "-m", "fedforest_cli", "server", "--config", str(config),
         "--insecure-dev", "--port", str(free_port())],
        capture_output=True, text=True, timeout=120, env={**child_env(), "COLUMNS": "1000"})
    assert started.returncode == 2 and SECRET not in started.stdout + started.stderr, started
    assert f"error: server database: {NO_AT_SAID}" in started.stderr.replace("\n", ""), \
        started.stderr
