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


# a # and non-ASCII: a guard (SQLAlchemy keeps a # of the path), not a case that was broken
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


def _old_layout(conf_dir: Path, audit: bool) -> None:
    """A server's databases as earlier versions kept them: the config's resolved path pasted
    into ``sqlite:///`` (a ``?`` of the directory starting the query, ``%41`` read as ``A``)."""
    from server_app.admin import ServerAdmin
    from server_app.audit_hook import open_audit

    with ServerAdmin("sqlite:///" + str(conf_dir / "fed.db")) as admin:
        admin.add_client("site-a")
    if audit:
        open_audit("sqlite:///" + str(conf_dir / "audit.db")).close()


@pytest.mark.parametrize(("dirname", "old_name"), [("conf?x", "conf"),
                                                   ("conf%41", "confA/fed.db")])
def test_a_database_an_earlier_version_kept_outside_the_config_directory_is_refused_until_moved(
        tmp_path: Path, dirname: str, old_name: str) -> None:
    """Earlier versions kept the relative ``sqlite:///fed.db`` of a config in ``conf?x/`` in
    ``./conf`` (of one in ``conf%41/`` in ``confA/fed.db``); the server now opens the file
    beside server.toml. Where that file is missing and the old one is there, it refuses,
    saying how to move it, instead of starting on a new, empty database; moved, the sites
    are there."""
    import shlex
    import subprocess

    from fedforest_secure.dburl import sqlite_url
    from server_app.admin import ServerAdmin
    from server_app.auth import TokenError

    (tmp_path / "confA").mkdir()  # the directory a %41 was read as
    conf_dir = tmp_path / dirname
    conf_dir.mkdir()
    toml = conf_dir / "server.toml"
    toml.write_text('database = "sqlite:///fed.db"\n')
    _old_layout(conf_dir, audit=False)
    old, new = tmp_path / old_name, conf_dir / "fed.db"
    with pytest.raises(ConfigError) as refused:
        load_settings(toml)
    move = f"mv {shlex.quote(str(old))} {shlex.quote(str(new))}"
    assert str(refused.value) == (
        f"server config {toml}: database 'sqlite:///fed.db' is {new}, which does not exist, "
        f"while {old}, the file earlier versions opened for it, does (earlier versions read a "
        "'?' or '%' in the config directory's name as part of the URL). Move the file into "
        f"the config's directory to keep the server's data: `{move}`; if it is another "
        f"server's, give this one's as an absolute URL: database = \"{sqlite_url(new)}\". "
        "Nothing was opened.")
    assert not new.exists()
    subprocess.run(move, shell=True, check=True)
    with ServerAdmin.from_settings(load_settings(toml)) as admin, \
            pytest.raises(TokenError, match="client 'site-a' already exists"):
        admin.add_client("site-a")


def test_the_move_takes_the_old_databases_write_ahead_log_and_spool_with_it(
        tmp_path: Path) -> None:
    """An earlier version's server killed mid-job left steps in its database's write-ahead
    log (``conf-wal``, ``conf-shm``) and an open round's masked uploads in ``conf.spool``: the
    printed command moves them with the file, and the moved database has every step."""
    import shlex
    import subprocess
    import sys

    conf_dir = tmp_path / "conf?x"
    conf_dir.mkdir()
    toml = conf_dir / "server.toml"
    toml.write_text('database = "sqlite:///fed.db"\n')
    _old_layout(conf_dir, audit=False)
    old, new = tmp_path / "conf", conf_dir / "fed.db"
    killed = ("import os, sys\nfrom server_app.admin import ServerAdmin\n"
              "with ServerAdmin(sys.argv[1]) as admin:\n"
              "    admin.add_client('site-b')\n"
              "    os._exit(0)  # no checkpoint: site-b is in the write-ahead log only\n")
    subprocess.run([sys.executable, "-c", killed, "sqlite:///" + str(conf_dir / "fed.db")],
                   check=True, cwd=Path(__file__).resolve().parents[1])
    assert Path(f"{old}-wal").stat().st_size > 0
    (tmp_path / "conf.spool" / "job-a").mkdir(parents=True)
    (tmp_path / "conf.spool" / "job-a" / "1-0.u64").write_bytes(b"\0" * 16)
    with pytest.raises(ConfigError) as refused:
        load_settings(toml)
    q = shlex.quote
    commands = " && ".join([f"mv {q(str(old))} {q(str(new))}",
                            f"mv {q(f'{old}-wal')} {q(f'{new}-wal')}",
                            f"mv {q(f'{old}-shm')} {q(f'{new}-shm')}",
                            f"mv {q(f'{old}.spool')} {q(f'{new}.spool')}"])
    assert f"`{commands}`" in str(refused.value), str(refused.value)
    subprocess.run(commands, shell=True, check=True)
    from server_app.admin import ServerAdmin
    from server_app.auth import TokenError

    with ServerAdmin.from_settings(load_settings(toml)) as admin:
        for name in ("site-a", "site-b"):
            with pytest.raises(TokenError, match=f"client '{name}' already exists"):
                admin.add_client(name)
    assert (Path(f"{new}.spool") / "job-a" / "1-0.u64").read_bytes() == b"\0" * 16


def test_one_file_an_earlier_version_kept_both_databases_in_is_copied_to_each(
        tmp_path: Path) -> None:
    """A config in ``conf?x/`` with relative ``database`` and ``audit_database``: earlier
    versions kept both in one file ``./conf``. The refusal copies it to the first and moves it
    to the second; a server's own file there, or an absolute URL, is opened without a word."""
    import subprocess

    from fedforest_secure.dburl import sqlite_file, sqlite_url

    conf_dir = tmp_path / "conf?x"
    conf_dir.mkdir()
    toml = conf_dir / "server.toml"
    toml.write_text('database = "sqlite:///fed.db"\naudit_database = "audit.db"\n')
    _old_layout(conf_dir, audit=True)
    with pytest.raises(ConfigError) as refused:
        load_settings(toml)
    old, db, audit = tmp_path / "conf", conf_dir / "fed.db", conf_dir / "audit.db"
    commands = f"cp {old} '{db}' && mv {old} '{audit}'"
    assert (f"database 'sqlite:///fed.db' is {db}, which does not exist, while {old}, the file "
            f"earlier versions opened for it, does; audit_database 'audit.db' is {audit}, "
            f"which does not exist, while {old}, the file earlier versions opened for it, "
            f"does (earlier") in str(refused.value)
    assert (f"`{commands}`; if it is another server's, give this one's as an absolute URL: "
            f"database = \"{sqlite_url(db)}\", audit_database = \"{sqlite_url(audit)}\". "
            "Nothing was opened.") in str(refused.value)
    subprocess.run(commands, shell=True, check=True)
    settings = load_settings(toml)
    assert settings.audit_database is not None
    assert (sqlite_file(settings.database), sqlite_file(settings.audit_database)) == (db, audit)
    db.rename(tmp_path / "conf")  # the old file back, and a new one beside server.toml
    db.write_bytes((tmp_path / "conf").read_bytes())
    assert sqlite_file(load_settings(toml).database) == db
    db.unlink()
    toml.write_text(f'database = "{sqlite_url(db)}"\n')
    assert sqlite_file(load_settings(toml).database) == db
