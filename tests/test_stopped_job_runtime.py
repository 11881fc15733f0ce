"""A job that stops mid-round (cancelled, failed at a deadline, or not resumable after a
restart) lets its open round go: the server keeps none of its task in memory, and that
round's task is served as stored, like every other round's (410 once pruned)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select
from state_driver import join_sites
from test_server_secagg_api import (
    env,  # noqa: F401 - the secure-job fixture (K=4, manual clock), reused
    first_round,
    join_all,
    offer,
    post_upload,
    restart,
    run_until_upload,
    upload_body,
)

from fedforest_secure.protocol import Task, make_upload
from server_app.audit_hook import NullAudit
from server_app.auth import add_client
from server_app.db import Database, UploadRow
from server_app.errors import ApiError
from server_app.jobspec import load_job_spec
from server_app.retention import prune
from server_app.runtime import ServerState

K = 3


@pytest.mark.parametrize("stop", ["cancel", "deadline", "unresumable"])
def test_a_job_stopped_mid_round_keeps_no_task_in_memory_and_serves_it_as_stored(
        tmp_path: Path, tiny_parts: Any, job_dir: Any, monkeypatch: pytest.MonkeyPatch,
        stop: str) -> None:
    parts, feat = tiny_parts
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    for k in range(K):
        add_client(db, f"client-{k}")
    st = ServerState(db, NullAudit())
    st.create_job(load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=K,
                                        min_clients=K)))
    rows, workers = join_sites(db, st, "job-a", parts[:K])
    offer = st.offer(rows[0], "job-a")
    assert offer.status == "task" and offer.body is not None
    task = Task.from_bytes(offer.body)
    reply = workers[0].handle(task)
    st.upload(rows[0], "job-a", task.round_id,
              make_upload(task, np.asarray(reply.summable, dtype=np.float64), reply.disclosed))
    rt = st.runtimes.peek("job-a")
    assert rt is not None and rt.task is not None and rt._bounds is not None  # the open round

    if stop == "cancel":
        assert st.cancel("job-a")
    elif stop == "deadline":  # the deadline passes with 1 upload of the K the job needs
        st.core.deadline("job-a")
    else:  # a restart whose replay of the open round fails once that round's task is set
        def resume_fails(name: str, *args: Any, **fields: Any) -> None:
            if name == "resume":
                raise RuntimeError("the open round does not resume")

        st.runtimes.evict("job-a")
        monkeypatch.setattr("server_app.replay.event", resume_fails)
        rt = st.runtimes.get("job-a")
    # the runtime of a job that stopped in a step is kept until the next tick; a stopped job's
    # runtime built anew (the restart's) is not kept
    assert st.runtimes.peek("job-a") is (None if stop == "unresumable" else rt)
    status = st.status(rows[0], "job-a")
    assert status["status"] == "failed", status

    assert (rt.coord, rt.task, rt.codec, rt._bounds) == (None, None, None, None)
    # a member asking for the stopped round's task gets the bytes it was offered, as before
    assert st.task_bytes(rows[0], "job-a", task.round_id) == offer.body
    assert prune(db, tmp_path / "s.db.spool", job_ids=["job-a"]).rounds == 1
    with pytest.raises(ApiError) as err:
        st.task_bytes(rows[0], "job-a", task.round_id)
    assert (err.value.status, err.value.code) == (410, "pruned")
    assert err.value.detail == (f"round {task.round_id}'s task was deleted by `fedforest "
                                "server prune` (the job is finished)")
    db.dispose()


@pytest.mark.parametrize("kept_in", ["table", "spool"])
def test_a_secure_job_whose_open_round_does_not_resume_keeps_no_secure_round_in_memory(
        env: dict[str, Any], tmp_path: Path,  # noqa: F811 - the fixture imported above
        kept_in: str) -> None:
    """A stored masked upload the restarted server cannot read (one byte short of whole
    words: its database row, or its spool file where the server keeps a spool, as on SQLite)
    stops the job with words that say which upload is damaged, and the runtime it keeps holds
    no secure round."""
    if kept_in == "spool":
        env["state"].spool = tmp_path / "server.db.spool"
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    assert post_upload(env, 0, r, upload_body(env, sa, 0, task, vecs[0])).status_code == 200
    if kept_in == "spool":  # the spooled masked upload lost its last byte
        spooled = env["state"].spool / "job-a" / str(r)
        (upload,) = [p for p in spooled.iterdir() if p.name.startswith("0")]
        upload.write_bytes(upload.read_bytes()[:-1])
    else:
        with env["db"].session() as sess:  # the stored masked upload lost its last byte
            row = sess.scalar(select(UploadRow).where(UploadRow.job_id == "job-a",
                                                      UploadRow.client_index == 0))
            assert row is not None and row.summable is not None
            row.summable = row.summable[:-1]
    restart(env)
    rt = env["state"].runtimes.get("job-a")
    o = offer(env, 1)
    assert o["status"] == "failed", o
    assert o["detail"].startswith(f"cannot resume: the masked upload of client 0 in round {r} "
                                  "is damaged: "), o["detail"]
    assert o["detail"].endswith("bytes, not a whole number of 8-byte words"), o["detail"]
    assert rt.secure is not None and rt.secure.current is None
    assert (rt.coord, rt.task, rt.codec, rt._bounds) == (None, None, None, None)
