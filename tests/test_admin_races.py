"""Two admin commands at once: ``add-client``, ``add-operator``, ``create-job`` and
``cancel-job`` check that a name (or a request) is new, then insert it. The one whose insert
loses the race (another process inserted the same row between its check and its insert) ends
as the check would have ended it: the same one-line error and exit code 2 (``cancel-job``: the
request counts as recorded), never the database's integrity error and its SQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, delete, event, func, select
from typer.testing import CliRunner

from fedforest_cli.cli import app as cli_app
from server_app.admin import ServerAdmin
from server_app.cancel import request_cancel
from server_app.db import CancelRow, Database
from server_app.jobspec import load_job_spec
from server_app.lease import ServerLease


@contextmanager
def raced(table: str, rival: Callable[[], object]) -> Iterator[list[int]]:
    """Just before the first ``INSERT INTO <table>`` of any engine in this process, ``rival``
    runs (another process's command that inserts the same row, committed at once). Yields a
    list that holds one item once that happened."""
    fired: list[int] = []

    def before(_conn: Any, _cursor: object, statement: str, *_args: object) -> None:
        if not fired and statement.lstrip().upper().startswith(f"INSERT INTO {table.upper()} "):
            fired.append(1)
            rival()

    event.listen(Engine, "before_cursor_execute", before)
    try:
        yield fired
    finally:
        event.remove(Engine, "before_cursor_execute", before)


@pytest.fixture()
def server(tmp_path: Path, db_url: str, tiny_parts: Any, job_dir: Any) -> Iterator[dict]:
    """A server config on a database with three registered sites, and a job file."""
    parts, feat = tiny_parts
    config = tmp_path / "server.toml"
    config.write_text(f'database = "{db_url}"\n')
    with ServerAdmin(db_url) as admin:
        for k in range(3):
            admin.add_client(f"client-{k}")
    yield {"config": str(config), "url": db_url,
           "job": str(job_dir(tmp_path / "job", parts, feat, n_clients=3))}


def _run(args: list[str]) -> tuple[int, list[str]]:
    res = CliRunner().invoke(cli_app, args)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.output.splitlines()


def _rival(url: str, act: Callable[[ServerAdmin], object]) -> Callable[[], None]:
    def run() -> None:
        with ServerAdmin(url) as admin:
            act(admin)
    return run


#: what a second registration of hospital-a is told: how to get the name a new token
EXISTS = {
    "add-client": ("client 'hospital-a' already exists (its token was shown once, when it was "
                   "added): `fedforest server rotate-token hospital-a` gives it a new one, "
                   "and the old one stops working (a job the site is in then stops at its "
                   "next request: rotate between its jobs)"),
    "add-operator": ("operator 'hospital-a' already exists (its token was shown once, when it "
                     "was added): `fedforest server remove-operator hospital-a` then "
                     "`fedforest server add-operator hospital-a` give the name a new one (the "
                     "old one then stops working)")}


@pytest.mark.parametrize(("command", "table"), [("add-client", "clients"),
                                                ("add-operator", "operators")])
def test_a_registration_that_loses_the_race_for_its_name_is_told_it_exists(
        server: dict, command: str, table: str) -> None:
    args = ["server", command, "hospital-a", "--config", server["config"]]
    act = {"add-client": lambda admin: admin.add_client("hospital-a"),
           "add-operator": lambda admin: admin.add_operator("hospital-a")}[command]
    with raced(table, _rival(server["url"], act)) as fired:
        lost = _run(args)
    assert fired
    assert lost == (2, [f"error: {EXISTS[command]}"])
    assert _run(args) == lost  # what the check says to the same command later


def test_a_create_job_that_loses_the_race_for_its_id_is_told_it_exists(server: dict) -> None:
    args = ["server", "create-job", "--config", server["config"], "--job", server["job"]]
    spec = load_job_spec(Path(server["job"]))
    with raced("jobs", _rival(server["url"], lambda admin: admin.create_job(spec))) as fired:
        lost = _run(args)
    assert fired
    assert lost == (2, ["error: job 'job-a' already exists"])
    assert _run(args) == lost


def test_a_cancel_request_recorded_meanwhile_by_another_command_counts_as_recorded(
        server: dict) -> None:
    with ServerAdmin(server["url"]) as admin:
        admin.create_job(load_job_spec(Path(server["job"])))
    db = Database(server["url"])
    lease = ServerLease(db, 8443)  # a server serves the database: the request waits for it
    lease.acquire()
    try:
        with raced("cancel_requests", lambda: request_cancel(db, "job-a", 1.0)) as fired:
            request_cancel(db, "job-a", 2.0)
        assert fired
        with db.session() as sess:
            assert sess.scalar(select(func.count()).select_from(CancelRow)) == 1
        args = ["server", "cancel-job", "--config", server["config"], "--job", "job-a",
                "--wait", "0"]
        with db.session() as sess:
            sess.execute(delete(CancelRow))
        with raced("cancel_requests", lambda: request_cancel(db, "job-a", 1.0)) as fired:
            lost = _run(args)
        assert fired
        assert lost[0] == 2 and lost[1][0].startswith("error: the server (pid "), lost
        assert "has not cancelled job 'job-a' within 0 s; the request stays recorded" \
            in lost[1][0]
        assert _run(args) == lost  # asked again: the one request stands
    finally:
        lease.release()
        db.dispose()
