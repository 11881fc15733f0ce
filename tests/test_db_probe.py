"""How the server tells an outage of its database from a failed statement: a probe that never
raises (the deadline ticker calls it in its error path) and that one outage does not repeat for
every failing request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from db_outage import database_down
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from server_app.db import Database


def _failure() -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception("database is locked"))


def test_a_probe_that_fails_for_another_reason_says_no_outage_and_never_raises(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full connection pool (sqlalchemy's TimeoutError, no DBAPIError) is no sign that the
    database is gone; it must not escape the probe (it ended the deadline ticker's loop)."""
    db = Database(f"sqlite:///{tmp_path / 's.db'}")

    def full(*_a: Any, **_k: Any) -> Any:
        raise PoolTimeout("QueuePool limit of size 5 overflow 10 reached")

    monkeypatch.setattr(db.engine, "connect", full)
    assert db.unreachable(_failure()) is False
    db.dispose()


def test_an_outage_is_probed_once_for_the_failures_that_follow_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    assert db.unreachable(_failure()) is False  # it answers: a failed statement
    with database_down(db):
        connects: list[int] = []
        real = db.engine.connect

        def counted(*a: Any, **k: Any) -> Any:
            connects.append(1)
            return real(*a, **k)

        monkeypatch.setattr(db.engine, "connect", counted)
        assert [db.unreachable(_failure()) for _ in range(5)] == [True] * 5
        assert len(connects) == 1
    db.dispose()


def test_every_request_thread_of_the_server_gets_a_connection_at_once(tmp_path: Path) -> None:
    """The server runs requests in a pool of 40 threads, each reading with a connection of its
    own: 40 transactions open at once on the SQLite database all get one, none waits for
    another to end (a pool of 15 made the 16th wait, and time out after 30 s under load)."""
    import threading

    from sqlalchemy import text

    threads = 40
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    together = threading.Barrier(threads, timeout=10)
    failed: list[BaseException] = []

    def read() -> None:
        try:
            with db.session() as sess:
                sess.execute(text("SELECT 1"))
                together.wait()  # every thread holds its connection here
        except BaseException as exc:  # reported by the test
            failed.append(exc)

    workers = [threading.Thread(target=read) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    db.engine.dispose()
    assert failed == [], failed[:1]
