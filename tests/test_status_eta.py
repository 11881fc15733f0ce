"""A running job's ETA: the time per level so far times the levels left. A level that takes
longer than that (a site stalls) has no ETA: the status says by how much it overran and how long
until the open phase's deadline, when the sites that did not answer are dropped."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from server_app.db import Database, JobRow, RoundRow
from server_app.status import progress

T0 = 1_000_000.0


def _job(tmp_path: Path, levels_issued: list[float], max_depth: int = 8) -> Database:
    """A running job of depth ``max_depth`` whose level ``i``'s first round was issued at
    ``T0 + levels_issued[i]``; the last level's round is open."""
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    with db.session() as sess:
        sess.add(JobRow(id="j", spec_json="{}", config_json=json.dumps({"max_depth": max_depth}),
                        status="running", reason="", min_clients=1, round_deadline_s=60.0,
                        current_round=len(levels_issued) - 1))
        sess.flush()
        for level, at in enumerate(levels_issued):
            last = level == len(levels_issued) - 1
            sess.add(RoundRow(job_id="j", round_id=level, kind="sketch", level=level,
                              task_digest="t" * 64, encoding="uint64", participants_json="[0]",
                              issued_at=T0 + at, deadline_at=T0 + at + 60,
                              status="open" if last else "closed",
                              closed_at=None if last else T0 + at + 9, task_blob=b""))
    return db


def _progress(db: Database, now: float,
              deadline: Callable[[RoundRow, JobRow], float] | None = None) -> dict[str, Any]:
    with db.session() as sess:
        job = sess.get(JobRow, "j")
        assert job is not None
        return progress(sess, job, T0 + now, deadline=deadline)


def _eta(db: Database, now: float) -> float | None:
    return _progress(db, now)["eta_s"]  # type: ignore[no-any-return]


def test_the_eta_is_the_time_per_level_times_the_levels_left(tmp_path: Path) -> None:
    db = _job(tmp_path, [0.0, 10.0, 20.0])  # 10 s per level; level 2 of 0..8 open
    assert _eta(db, 20.0) == pytest.approx(70.0)  # levels 2..8 left
    assert _eta(db, 24.0) == pytest.approx(66.0)


def test_a_level_that_overruns_has_no_eta_but_its_overrun_and_the_phase_deadline(
        tmp_path: Path) -> None:
    db = _job(tmp_path, [0.0, 10.0, 20.0])  # level 2's round: issued at 20, deadline at 80
    on_time = _progress(db, 30.0)  # level 2 took its 10 s: levels 3..8 left
    assert on_time["eta_s"] == pytest.approx(60.0) and on_time["overrun_s"] is None
    assert on_time["deadline_in_s"] == pytest.approx(50.0)
    # level 2 waits for a stalled site: no "about 1 s" while it waits, but how long it has
    # overrun and when the phase's deadline drops the sites that did not answer
    stalled = _progress(db, 50.0)
    assert stalled["eta_s"] is None
    assert stalled["overrun_s"] == pytest.approx(20.0)
    assert stalled["deadline_in_s"] == pytest.approx(30.0)
    # past the deadline (the server drops them at its next tick): 0, never negative
    assert _progress(db, 95.0)["deadline_in_s"] == 0.0


def test_the_deadline_is_the_servers_when_it_moved_it_after_a_restart(tmp_path: Path) -> None:
    from server_app.deadlines import Deadlines

    db = _job(tmp_path, [0.0, 10.0, 20.0])  # the stored deadline: 80
    # a server restarted at 70 gives the open phase a full round deadline (60 s) from its
    # start: 130, which the status tells (the job status and the operator page pass
    # Deadlines.of, as here)
    restarted = Deadlines(db, clock=lambda: T0 + 70.0, monotonic=lambda: 0.0)
    later = _progress(db, 100.0, deadline=restarted.of)
    assert later["deadline_in_s"] == pytest.approx(30.0)
    assert _progress(db, 50.0)["deadline_in_s"] == pytest.approx(30.0)  # the stored one


def test_a_job_without_an_open_round_has_no_deadline(tmp_path: Path) -> None:
    db = _job(tmp_path, [0.0, 10.0, 20.0])
    with db.session() as sess:
        rr = sess.get(RoundRow, ("j", 2))
        assert rr is not None
        rr.status, rr.closed_at = "closed", T0 + 29.0
    assert _progress(db, 30.0)["deadline_in_s"] is None


def test_a_job_without_a_depth_limit_has_no_eta(tmp_path: Path) -> None:
    db = _job(tmp_path, [0.0, 10.0, 20.0], max_depth=0)  # trees grow until no node splits
    assert _eta(db, 24.0) is None
