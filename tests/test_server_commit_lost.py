"""A secure round's masked upload whose commit fails (on PostgreSQL: the connection is lost at
the commit, as in a database restart or fail-over): the database keeps nothing of it, the
server forgets the in-memory round that took it, and the client's retry of the same bytes is
counted. The round then closes with the plain sum, as if nothing had failed."""

# ruff: noqa: F811  (the fixtures are imported from test_server_secagg_api and used as parameters)
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event, select
from test_server_secagg_api import (
    K,
    aggregate,
    env,  # noqa: F401 - the secure-job fixture (K=4, t=3, manual clock), reused
    first_round,
    h,
    join_all,
    offer,
    post_upload,
    run_until_upload,
    sign,
    unmask,
    upload_body,
)

from fedforest_secure.protocol import make_upload
from fedforest_secure.secure_sum import make_codec
from server_app.db import Database, UploadRow

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


def lose_the_commit_of_the_next_upload(db: Database, request: pytest.FixtureRequest,
                                       backend: str) -> list[int]:
    """The commit of the next transaction that stores an upload fails: on PostgreSQL its
    connection is terminated by the database just before (``pg_terminate_backend``, as a
    restart of the database does), on SQLite the driver's connection is closed (its
    transaction is gone with it).
    Returns a list that holds one item once that happened."""
    fired: list[int] = []

    def on_execute(conn: Any, _cursor: object, statement: str, *_args: object) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO UPLOADS"):
            conn.info["stores_an_upload"] = True

    def on_commit(conn: Any) -> None:
        if fired or not conn.info.pop("stores_an_upload", False):
            return
        fired.append(1)
        if backend == "postgres":
            import psycopg

            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            cluster = request.getfixturevalue("pg_cluster")
            with psycopg.connect(host=str(cluster.root), port=5432, user="fedforest",
                                 dbname="postgres", autocommit=True) as admin:
                # waits (up to 10 s) until the backend is gone: the COMMIT meets a dead
                # connection
                assert admin.execute("SELECT pg_terminate_backend(%s, 10000)",
                                     (pid,)).fetchone() == (True,)
        else:
            conn.connection.dbapi_connection.close()

    event.listen(db.engine, "before_cursor_execute", on_execute)
    event.listen(db.engine, "commit", on_commit)
    return fired


def test_a_masked_upload_whose_commit_failed_is_counted_when_retried(
        env: dict, db_backend: str, request: pytest.FixtureRequest) -> None:
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    body0 = upload_body(env, sa, 0, task, vecs[0])
    fired = lose_the_commit_of_the_next_upload(env["db"], request, db_backend)
    answering = TestClient(env["http"].app, raise_server_exceptions=False)
    first = answering.post(f"/v1/jobs/job-a/rounds/{r}/upload", content=body0,
                           headers={**h(env, 0), "Content-Type": "application/octet-stream"})
    assert fired
    assert first.status_code == 500, first.text
    assert first.json()["detail"] == ("the server failed: the server's database failed (its "
                                      "log has the traceback)")
    with env["db"].session() as s:
        assert list(s.scalars(select(UploadRow.client_index)
                              .where(UploadRow.round_id == r))) == []
    # the site retries the same bytes: counted now
    retry = post_upload(env, 0, r, body0)
    assert retry.status_code == 200, retry.text
    assert retry.json()["duplicate"] is False
    for k in range(1, K):
        assert post_upload(env, k, r, upload_body(env, sa, k, task, vecs[k])).status_code \
            == 200
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200
    for k in range(K):
        assert unmask(env, sa, k, r).status_code == 200
    want = make_codec(config, task).decode(sum(vecs.values(), np.zeros_like(vecs[0])))
    assert np.array_equal(aggregate(env, r), want)
    o = offer(env, 0)
    assert o["status"] == "task" and o["round_id"] == r + 1, o


def test_an_upload_refused_for_its_task_keeps_the_jobs_runtime(env: dict) -> None:
    """A refused upload changes nothing: the in-memory round stays loaded (no rebuild from
    the database for each bad upload)."""
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    loaded = env["state"].runtimes.peek("job-a")
    assert loaded is not None
    wrong = make_upload(task, vecs[0][:-1], {}, secagg="{}")  # one word short
    res = post_upload(env, 0, r, wrong)
    assert res.status_code == 400 and res.json()["error"] == "wrong_layout", res.text
    assert env["state"].runtimes.peek("job-a") is loaded
