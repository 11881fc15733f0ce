"""Concurrent requests against a real server process (uvicorn, TLS, mTLS) on each database
backend: uploads racing each other (and their own retries) are each counted exactly once."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from test_integration_https import Fed, launch_server, setup_fed, stop_all

from client_app.transport import tls_context
from fedforest_secure.config import JobConfig
from fedforest_secure.federation import client_seed
from fedforest_secure.protocol import Task, make_upload
from fedforest_secure.worker import Worker
from server_app.db import Database, RoundRow, UploadRow

pytestmark = pytest.mark.integration

K = 5


def _client(fed: Fed, k: int) -> httpx.Client:
    site = fed.sites[k]
    ctx = tls_context(fed.certs / "ca.pem", fed.certs / f"{site.name}.pem",
                      fed.certs / f"{site.name}.key")
    return httpx.Client(base_url=fed.url, verify=ctx, timeout=60,
                        headers={"Authorization": f"Bearer {site.token}"})


def test_racing_uploads_and_retries_are_each_counted_once(tmp_path: Path, tiny_parts, job_dir,
                                                          make_db_url) -> None:
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=K, make_db_url=make_db_url)
    launch_server(fed)
    https = [_client(fed, k) for k in range(K)]
    try:
        infos = [h.post("/v1/jobs/job-a/join").json() for h in https]
        config = JobConfig.from_json(json.dumps(infos[0]["config"]))
        first = https[0].get("/v1/jobs/job-a/task")
        assert first.status_code == 200, first.text
        task = Task.from_bytes(first.content)
        replies = [Worker(config, *parts[k], client_index=k,
                          seed=client_seed(config, k)).handle(task) for k in range(K)]
        bodies = [make_upload(task, np.asarray(r.summable, dtype=np.float64), r.disclosed)
                  for r in replies]
        # every client sends its upload twice at once (a retry racing the original): 2K
        # requests released together
        start = threading.Barrier(2 * K)
        answers: list[tuple[int, int, dict]] = []
        mu = threading.Lock()

        def send(k: int) -> None:
            start.wait()
            r = https[k].post(f"/v1/jobs/job-a/rounds/{task.round_id}/upload",
                              content=bodies[k],
                              headers={"Content-Type": "application/octet-stream"})
            with mu:
                answers.append((k, r.status_code, r.json()))

        threads = [threading.Thread(target=send, args=(k,)) for k in range(K) for _ in "ab"]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        for h in https:
            h.close()
        stop_all(fed)
    assert len(answers) == 2 * K
    for k in range(K):
        mine = [(code, body) for j, code, body in answers if j == k]
        fresh = [b for code, b in mine if code == 200 and b["duplicate"] is False]
        # the other copy is a duplicate of the open round, or arrived after the round closed
        # and is told it was counted
        again = [b for code, b in mine if (code == 200 and b["duplicate"] is True)
                 or (code == 409 and b["error"] == "round_closed" and b["counted"] is True)]
        assert len(fresh) == 1 and len(again) == 1, mine
    db = Database(fed.db_url)
    try:
        with db.session() as s:
            rr = s.get(RoundRow, ("job-a", task.round_id))
            assert rr is not None and rr.status == "closed"
            assert json.loads(rr.contributors_json or "[]") == list(range(K))
            assert s.query(UploadRow).filter_by(round_id=task.round_id).count() == K
            aggregate = np.frombuffer(rr.aggregate or b"", dtype="<f8")
    finally:
        db.dispose()
    expected = np.zeros_like(aggregate)
    for r in replies:  # the server adds in client order whatever the arrival order
        expected = expected + np.asarray(r.summable, dtype=np.float64)
    np.testing.assert_array_equal(aggregate, expected)
