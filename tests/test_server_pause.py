"""A real server process paused (SIGSTOP) mid-job, as a suspended VM or a swap storm stalls
one: the time it did not run does not count against its sites."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from test_integration_https import (
    launch_client,
    launch_server,
    setup_fed,
    stop_all,
    wait_round,
)

from server_app.db import Database, JobRow, MemberRow, RoundRow, UploadRow

pytestmark = pytest.mark.integration


def _job_state(url: str) -> dict[str, Any]:
    """What a step of the server changes: the job's row, its members, rounds and uploads."""
    db = Database(url)
    try:
        with db.session() as sess:
            job = sess.get(JobRow, "job-a")
            assert job is not None
            return {
                "job": (job.status, job.reason, job.current_round),
                "members": sorted((m.client_index, m.state) for m in sess.scalars(
                    select(MemberRow).where(MemberRow.job_id == "job-a"))),
                "rounds": sorted((r.round_id, r.status, r.phase, r.dropped_json)
                                 for r in sess.scalars(select(RoundRow))),
                "uploads": sorted((u.round_id, u.client_index, u.digest)
                                  for u in sess.scalars(select(UploadRow))),
            }
    finally:
        db.dispose()


def test_a_server_paused_longer_than_the_round_deadline_drops_no_site(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """Paused for more than twice the round deadline while its sites wait on it: when it
    runs again the open round's deadline runs again from then (`event=server_stalled`), no
    site is dropped, and the job ends with every site."""
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, deadline=6.0)
    server = None
    try:
        server = launch_server(fed)
        clients = [launch_client(fed, k) for k in range(3)]
        wait_round(fed, 2)
        server.send_signal(signal.SIGSTOP)
        assert _job_state(fed.db_url)["job"][0] == "running"
        time.sleep(14)
        server.send_signal(signal.SIGCONT)
        codes = [c.wait(180) for c in clients]
    finally:
        if server is not None:
            server.send_signal(signal.SIGCONT)
        stop_all(fed)
    log = (tmp_path / "server.log").read_text()
    assert codes == [0, 0, 0], [(tmp_path / f"client-{k}.log").read_text()[-1500:]
                                for k in range(3)]
    assert "event=server_stalled stalled_s=1" in log, log[-3000:]
    assert "event=drop" not in log
    assert _job_state(fed.db_url)["job"][0] == "done"
