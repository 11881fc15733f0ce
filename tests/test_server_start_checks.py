"""What a server checks before it serves: every unfinished job's audit chain is in the audit
log it is configured with (a restart on another audit database split the chain silently)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_integration_https import setup_fed

from fedforest_cli.sim_processes import start_server

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("form", ["url", "path"])
def test_a_server_refuses_to_serve_a_job_whose_audit_chain_is_in_another_log(
        tmp_path: Path, tiny_parts, job_dir, form: str) -> None:
    """The audit database given as a URL or as a file path: the refusal names the job and
    the log, and the server's lease is given back (the next server starts at once)."""
    from sqlalchemy import func, select

    from server_app.db import Database, LeaseRow

    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3)  # job-a created, audited
    toml = fed.server_toml
    other = tmp_path / "other-audit.db"
    toml.write_text(re.sub(r'(?m)^audit_database = ".*"$',
                           f'audit_database = "{"sqlite:///" if form == "url" else ""}{other}"',
                           toml.read_text()))
    proc = start_server(toml, tmp_path / "server.log")
    try:
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "server.log").read_text()
    assert code != 0, log
    assert "job 'job-a'" in log and "other-audit.db" in log and "audit_database" in log, log
    assert "Traceback" not in log
    db = Database(fed.db_url)
    with db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(LeaseRow)).scalar() == 0
    db.dispose()
