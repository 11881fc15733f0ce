"""A server database that lost steps its audit log holds (a power loss, a restore from an
older copy): the server refuses to serve the job rather than log its rounds again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from nacl.signing import SigningKey
from test_server_secagg_api import K, env_all_audited, h  # noqa: F401 (the fixture)

from server_app.audit_hook import open_audit
from server_app.db import Database
from server_app.serve import check_audit_chains
from server_app.settings import ConfigError


def join(env: dict, k: int) -> None:
    key = bytes(SigningKey.generate().verify_key).hex()
    r = env["http"].post("/v1/jobs/job-a/join", headers=h(env, k), json={"identity_key": key})
    assert r.status_code == 200, r.text


def test_a_server_database_behind_its_audit_log_is_refused_at_start(
        env_all_audited: dict, tmp_path: Path) -> None:  # noqa: F811
    env = env_all_audited
    url = env["db"].url
    if not url.startswith("sqlite:///"):
        pytest.skip("copies a SQLite file")
    audit_url = str(tmp_path / "audit.db")
    join(env, 0)
    older = tmp_path / "older.db"  # what a power loss leaves: the database of an earlier step
    with sqlite3.connect(url.removeprefix("sqlite:///")) as src, sqlite3.connect(older) as dst:
        src.backup(dst)
    for k in range(1, K):
        join(env, k)
    tip = env["audit"].tip("job-a")[0]
    assert tip == 1 + K  # job_created and the joins
    check_audit_chains(env["db"], env["audit"], audit_url)  # the database that goes with it
    db, audit = Database(f"sqlite:///{older}"), open_audit(audit_url)
    try:
        with pytest.raises(ConfigError) as err:
            check_audit_chains(db, audit, audit_url)
    finally:
        audit.close()  # type: ignore[attr-defined]
        db.dispose()
    assert str(err.value) == (
        f"job 'job-a': the audit log at sqlite:///{audit_url} holds its entries up to seq "
        f"{tip}, but the server database knows only those up to seq 2: the database lost "
        "steps it had saved "
        "(a power loss, or a restore from an older copy), and serving the job from there "
        "would log its rounds again. Restore the server database that belongs to this audit "
        "log, or cancel the job (`fedforest server cancel-job --config <server.toml> --job "
        "job-a`) and start the server again")


def test_a_step_of_a_running_server_during_the_check_is_not_taken_for_lost_steps(
        env_all_audited: dict, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A second server started on the database of a running one checks the chains before the
    lease refuses it: a step the running server saves (and logs) while the check reads is
    not taken for steps the database lost, so the second server meets the lease's refusal,
    not a false "the database lost steps"."""
    env = env_all_audited
    audit_url = str(tmp_path / "audit.db")
    join(env, 0)
    db, audit = Database(env["db"].url), open_audit(audit_url)
    real_tip = audit.tip
    stepped: list[int] = []

    def tip(job_id: str) -> tuple[int, str]:
        if not stepped:  # the running server's next step lands as the log's tip is read
            stepped.append(1)
            join(env, 1)
        return real_tip(job_id)

    monkeypatch.setattr(audit, "tip", tip)
    try:
        check_audit_chains(db, audit, audit_url)
    finally:
        audit.close()
        db.dispose()
    assert stepped == [1]


def test_each_audited_step_inserts_its_mark_and_updates_no_job_row(
        env_all_audited: dict) -> None:  # noqa: F811
    """A step's audit position is a row of its own, inserted (the largest is how far the log
    may go), never an update of a row other steps of the job also write: a step never waits
    for another's lock on it."""
    from sqlalchemy import event, func, select

    from server_app.db import AuditMarkRow

    env = env_all_audited
    statements: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    event.listen(env["db"].engine, "before_cursor_execute", seen)
    try:
        join(env, 0)
        join(env, 1)
    finally:
        event.remove(env["db"].engine, "before_cursor_execute", seen)
    assert not [s for s in statements if s.lstrip().upper().startswith("UPDATE JOBS")]
    with env["db"].session() as sess:
        marks = sess.scalars(select(AuditMarkRow.seq).where(AuditMarkRow.job_id == "job-a")
                             .order_by(AuditMarkRow.id)).all()
        assert sess.scalar(select(func.max(AuditMarkRow.seq))) == env["audit"].tip("job-a")[0]
    assert list(marks) == sorted(marks) and len(marks) >= 3  # job_created, two joins
