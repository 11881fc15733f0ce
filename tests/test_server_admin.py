"""``server_app.admin.ServerAdmin``: what the CLI and the simulation do to a server's database."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedforest_secure.audit import AuditLog
from server_app.admin import JobSummary, ServerAdmin
from server_app.audit_hook import NullAudit
from server_app.auth import authenticate
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState
from server_app.settings import ConfigError

K = 3


def test_register_create_and_follow_a_job(tmp_path: Path, tiny_parts, job_dir,
                                          make_db_url) -> None:
    parts, feat = tiny_parts
    spec = load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=K))
    url, audit = make_db_url("server"), make_db_url("audit")
    with ServerAdmin(url, str(audit)) as admin:
        with pytest.raises(ConfigError, match="unknown clients"):
            admin.create_job(spec)
        tokens = [admin.add_client(f"client-{k}") for k in range(K)]
        created = admin.create_job(spec)
        assert created == admin.job("job-a")
        assert created is not None and created.status == "waiting" and created.round_id == -1
        assert admin.jobs() == [created] and admin.job("no-such-job") is None
        assert admin.latest_round("job-a") is None
    with AuditLog(str(audit), create=False) as log:
        assert [e.kind for e in log.entries(job_id="job-a")] == ["job_created"]
    # the server joins the clients on the same database; the admin sees the first round
    db = Database(url)
    state = ServerState(db, NullAudit())
    for t in tokens:
        row = authenticate(db, t)
        assert row is not None
        state.join(row, "job-a")
    db.dispose()
    with ServerAdmin(url) as admin:
        job = admin.job("job-a")
        rr = admin.latest_round("job-a")
    assert isinstance(job, JobSummary) and job.status == "running" and job.round_id >= 0
    assert rr is not None and (rr.round_id, rr.level, rr.status) == (job.round_id, 0, "open")


def test_create_job_refuses_an_id_whose_chain_is_already_in_the_audit_database(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """A second server database sharing the audit database: the job id already has a chain
    there, so creating it again is refused and writes nothing to either database (two jobs'
    entries in one chain would make the first job's log fail to verify)."""
    parts, feat = tiny_parts
    spec = load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=K))
    audit = f"sqlite:///{tmp_path / 'audit.db'}"
    first, second = (f"sqlite:///{tmp_path / n}" for n in ("first.db", "second.db"))
    with ServerAdmin(first, audit) as admin:
        for name in spec.clients:
            admin.add_client(name)
        admin.create_job(spec)
    with ServerAdmin(second, audit) as admin:
        for name in spec.clients:
            admin.add_client(name)
        with pytest.raises(ConfigError, match=r"the audit database already holds a job "
                                              r"'job-a'.*choose another job id"):
            admin.create_job(spec)
        assert admin.jobs() == []
    with AuditLog(audit, create=False) as log:
        assert [e.kind for e in log.entries(job_id="job-a")] == ["job_created"]


def test_a_server_database_that_is_not_a_database_is_a_configuration_error(
        tmp_path: Path) -> None:
    junk = tmp_path / "server.db"
    junk.write_text("notes, not a database\n")
    with pytest.raises(ConfigError, match=r"cannot open the server database .*server\.db: "
                                          r"file is not a database"):
        Database(f"sqlite:///{junk}")
    assert junk.read_text() == "notes, not a database\n"


def test_the_database_error_hides_a_password_in_its_url() -> None:
    # nothing listens on port 1 of 127.0.0.1: the connection is refused at once
    pytest.importorskip("psycopg")
    with pytest.raises(ConfigError) as caught:
        Database("postgresql+psycopg://fed:s3cret@127.0.0.1:1/fed")
    assert "s3cret" not in str(caught.value) and "fed:***@127.0.0.1:1" in str(caught.value)


def test_a_leaked_token_is_replaced_or_revoked_by_the_operator(tmp_path: Path) -> None:
    """`server rotate-token` gives a client a new token (the old one stops authenticating);
    `server revoke-client` leaves it none that works."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app

    (tmp_path / "server.toml").write_text(
        f'host = "127.0.0.1"\nport = 8443\ndatabase = "sqlite:///{tmp_path / "s.db"}"\n'
        f'[tls]\ncert = "{tmp_path / "c.pem"}"\nkey = "{tmp_path / "c.key"}"\n')
    cfg = ["--config", str(tmp_path / "server.toml")]
    run = CliRunner().invoke
    first = run(app, ["server", "add-client", "site-a", *cfg])
    assert first.exit_code == 0, first.output
    old = first.output.strip().splitlines()[-1]
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    assert authenticate(db, old) is not None
    rotated = run(app, ["server", "rotate-token", "site-a", *cfg])
    assert rotated.exit_code == 0, rotated.output
    new = rotated.output.strip().splitlines()[-1]
    assert new.startswith("ffs_") and new != old
    assert authenticate(db, old) is None and authenticate(db, new) is not None
    revoked = run(app, ["server", "revoke-client", "site-a", *cfg])
    assert revoked.exit_code == 0 and "revoked" in revoked.output
    assert authenticate(db, new) is None and authenticate(db, old) is None
    unknown = run(app, ["server", "rotate-token", "site-z", *cfg])
    assert unknown.exit_code != 0 and "no client 'site-z'" in unknown.output
    db.dispose()


def test_a_leaked_operator_token_is_removed_and_replaced(tmp_path: Path) -> None:
    """`server remove-operator` deletes an operator: its ffo_ token opens the page no more
    (checked on every request), and `add-operator` registers the name again with a new one."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app
    from server_app.auth import authenticate_operator

    (tmp_path / "server.toml").write_text(f'database = "sqlite:///{tmp_path / "s.db"}"\n')
    cfg = ["--config", str(tmp_path / "server.toml")]
    run = CliRunner().invoke
    old = run(app, ["server", "add-operator", "alice", *cfg]).output.strip().splitlines()[-1]
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    assert authenticate_operator(db, old) is not None
    removed = run(app, ["server", "remove-operator", "alice", *cfg])
    assert removed.exit_code == 0 and "removed" in removed.output, removed.output
    assert authenticate_operator(db, old) is None
    again = run(app, ["server", "add-operator", "alice", *cfg])
    assert again.exit_code == 0, again.output
    new = again.output.strip().splitlines()[-1]
    assert new != old and authenticate_operator(db, new) is not None
    unknown = run(app, ["server", "remove-operator", "bob", *cfg])
    assert unknown.exit_code != 0 and "no operator 'bob'" in unknown.output
    db.dispose()


def test_the_server_groups_config_option_reaches_its_sub_commands(tmp_path: Path) -> None:
    """`fedforest server -c server.toml status`: the group's help lists --config; given before
    the sub-command it is the sub-command's (it was "Missing option '--config'")."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app

    toml = tmp_path / "server.toml"
    toml.write_text(f'database = "sqlite:///{tmp_path / "s.db"}"\n')
    run = CliRunner().invoke
    added = run(app, ["server", "-c", str(toml), "add-client", "site-a"])
    assert added.exit_code == 0, added.output
    status = run(app, ["server", "--config", str(toml), "status"])
    assert status.exit_code == 0 and "no jobs yet" in status.output
    with ServerAdmin(f"sqlite:///{tmp_path / 's.db'}") as admin:
        assert admin.rotate_token("site-a").startswith("ffs_")  # registered in that database
