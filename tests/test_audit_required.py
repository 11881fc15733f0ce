"""A job's chain stays in the audit log it began with: a server refuses to serve an
unfinished job whose chain is in another log, or that began with an audit log when the server
keeps none (its rounds would go unaudited while its log, verified, says nothing is wrong)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_app.admin import ServerAdmin
from server_app.audit_hook import open_audit
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.serve import check_audit_chains
from server_app.settings import ConfigError


def _job(tmp_path: Path, tiny_parts, job_dir, audit_url: str | None) -> str:
    parts, feat = tiny_parts
    spec = load_job_spec(job_dir(tmp_path, parts, feat, n_clients=3))
    with ServerAdmin(f"sqlite:///{tmp_path / 'server.db'}", audit_url) as admin:
        for name in spec.clients:
            admin.add_client(name)
        admin.create_job(spec)
    return spec.id


@pytest.mark.parametrize("began_with", ["an audit log", "none"])
@pytest.mark.parametrize("served_with", ["the same log", "another log", "none"])
def test_an_unfinished_job_is_served_only_with_the_audit_log_it_began_with(
        tmp_path: Path, tiny_parts, job_dir, began_with: str, served_with: str) -> None:
    first = f"sqlite:///{tmp_path / 'audit.db'}"
    other = f"sqlite:///{tmp_path / 'other-audit.db'}"
    job = _job(tmp_path, tiny_parts, job_dir, first if began_with == "an audit log" else None)
    url = {"the same log": first, "another log": other, "none": None}[served_with]
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    audit = open_audit(url)
    try:
        refused = {("an audit log", "another log"): "has none of its entries",
                   ("an audit log", "none"): "was created with an audit log, but this server "
                                             "config has no audit_database",
                   ("none", "the same log"): "has none of its entries",
                   ("none", "another log"): "has none of its entries"}.get(
            (began_with, served_with))
        if refused is None:
            check_audit_chains(db, audit, url)
        else:
            with pytest.raises(ConfigError, match=refused) as err:
                check_audit_chains(db, audit, url)
            assert repr(job) in str(err.value)
    finally:
        audit.close()
        db.dispose()


def test_an_audited_job_of_an_older_database_is_marked_by_the_first_audited_start(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """A job created before the server database recorded audited jobs has no mark: a server
    started with the job's audit log marks it, and from then on a server without one
    refuses it."""
    from server_app.db import AuditedJobRow

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    job = _job(tmp_path, tiny_parts, job_dir, url)
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    try:
        with db.session() as sess:  # as an older version left it
            sess.delete(sess.get(AuditedJobRow, job))
        check_audit_chains(db, open_audit(None), None)  # nothing says the job was audited
        audit = open_audit(url)
        try:
            check_audit_chains(db, audit, url)
        finally:
            audit.close()
        with pytest.raises(ConfigError, match="was created with an audit log"):
            check_audit_chains(db, open_audit(None), None)
    finally:
        db.dispose()
