"""``server.toml`` as the server reads it: what it refuses when it loads, and how it resolves
relative paths (from the config file's directory, never the current one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_app.settings import ConfigError, load_settings

_IN_MEMORY = ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite:///:memory:",
              "sqlite:///file::memory:?uri=true", "sqlite:///file:x?mode=memory&uri=true"]


@pytest.mark.parametrize("url", _IN_MEMORY)
@pytest.mark.parametrize("key", ["database", "audit_database"])
def test_an_in_memory_database_is_refused_when_the_settings_load(
        tmp_path: Path, key: str, url: str) -> None:
    """Each connection to SQLite in memory has a database of its own, gone when it closes: a
    server on one ran without its tables, a token `add-client` printed was gone at once."""
    path = tmp_path / "server.toml"
    path.write_text(f'{key} = "{url}"\n')
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert f"{key}: an in-memory database keeps nothing; give a file" in str(err.value)
    assert str(path) in str(err.value)


def test_a_bare_in_memory_audit_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text('audit_database = ":memory:"\n')
    with pytest.raises(ConfigError, match="audit_database: an in-memory database keeps "
                                          "nothing; give a file"):
        load_settings(path)


def test_the_admin_commands_refuse_an_in_memory_database(tmp_path: Path) -> None:
    """`server add-client` on an in-memory database printed a token that was gone at once:
    it is an error naming the option, and no token is printed."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app

    (tmp_path / "server.toml").write_text('database = "sqlite://"\n')
    done = CliRunner().invoke(app, ["server", "add-client", "site-a",
                                    "--config", str(tmp_path / "server.toml")])
    assert done.exit_code == 2, done.output
    assert "database: an in-memory database keeps nothing" in done.output
    assert "ffs_" not in done.output


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_the_server_database_and_audit_sink_refuse_memory_without_settings(url: str) -> None:
    """The admin API (``ServerAdmin``) builds a Database from a URL without the settings."""
    from server_app.admin import ServerAdmin
    from server_app.audit_hook import open_audit

    with pytest.raises(ConfigError, match="in-memory database keeps nothing"):
        ServerAdmin(url)
    with pytest.raises(ConfigError, match="in-memory database keeps nothing"):
        open_audit(url)


@pytest.mark.parametrize("given", ["rel-audit.db", "logs/rel-audit.db",
                                   "sqlite:///rel-audit.db"])
def test_a_relative_audit_database_is_resolved_from_the_configs_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    """A bare path, like a sqlite:/// URL, names a file beside server.toml, wherever the
    server is started from."""
    conf_dir, elsewhere = tmp_path / "conf", tmp_path / "elsewhere"
    conf_dir.mkdir()
    elsewhere.mkdir()
    (conf_dir / "server.toml").write_text(f'audit_database = "{given}"\n')
    monkeypatch.chdir(elsewhere)
    settings = load_settings(Path("../conf/server.toml"))
    name = given.removeprefix("sqlite:///")
    assert settings.audit_database == f"sqlite:///{(conf_dir / name).resolve()}"


def test_an_absolute_or_home_audit_path_is_not_moved(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "server.toml").write_text(
        f'audit_database = "{tmp_path / "abs.db"}"\n')
    assert load_settings(tmp_path / "server.toml").audit_database == (
        f"sqlite:///{tmp_path / 'abs.db'}")
    (tmp_path / "server.toml").write_text('audit_database = "~/audit.db"\n')
    assert load_settings(tmp_path / "server.toml").audit_database == (
        f"sqlite:///{tmp_path / 'home' / 'audit.db'}")


@pytest.mark.parametrize("key", ["port", "tick_seconds", "max_upload_bytes", "body_timeout_s"])
def test_a_boolean_where_a_number_is_due_is_refused(tmp_path: Path, key: str) -> None:
    """`port = true` was read as port 1."""
    path = tmp_path / "server.toml"
    path.write_text(f"{key} = true\n")
    with pytest.raises(ConfigError, match=rf"{key}: Input should be a valid \w+, not true"):
        load_settings(path)


def test_a_whole_float_where_an_integer_is_due_is_still_read(tmp_path: Path) -> None:
    """TOML writes 2e9 as a float: it was read as 2000000000 and still is (only booleans are
    refused)."""
    path = tmp_path / "server.toml"
    path.write_text("max_upload_bytes = 2e9\nport = 9443\n")
    assert load_settings(path).max_upload_bytes == 2_000_000_000


@pytest.mark.parametrize("dirname", ["conf?x", "conf%41", "conf#1 é"])
def test_relative_databases_stay_beside_a_config_whose_directory_holds_url_characters(
        tmp_path: Path, dirname: str) -> None:
    """A ``?`` in the config's directory started the URL's query and a ``%41`` was decoded
    to ``A``: the database and the audit log were opened elsewhere (one file ``conf``, both
    of them in it). Each is now the file beside server.toml, made readable by its owner only."""
    import stat

    from fedforest_secure.dburl import sqlite_file
    from server_app.admin import ServerAdmin
    from server_app.audit_hook import open_audit

    conf_dir = tmp_path / dirname
    conf_dir.mkdir()
    (conf_dir / "server.toml").write_text('database = "sqlite:///fed.db?timeout=5"\n'
                                          'audit_database = "audit.db"\n')
    settings = load_settings(conf_dir / "server.toml")
    assert sqlite_file(settings.database) == conf_dir / "fed.db"
    assert settings.database.endswith("?timeout=5")  # the URL's own query is kept
    assert settings.audit_database is not None
    assert sqlite_file(settings.audit_database) == conf_dir / "audit.db"
    with ServerAdmin.from_settings(settings) as admin:
        admin.add_client("site-a")
    open_audit(settings.audit_database).close()
    assert [p.name for p in tmp_path.iterdir()] == [dirname]
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in conf_dir.glob("*.db")} == {
        "fed.db": 0o600, "audit.db": 0o600}
