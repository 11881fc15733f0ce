"""A running job's ETA: the time per level so far times the levels left, and a level that
takes longer than the others (a site stalls) does not run the estimate down to zero."""

from __future__ import annotations

import json
from pathlib import Path

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


def _eta(db: Database, now: float) -> float | None:
    with db.session() as sess:
        job = sess.get(JobRow, "j")
        assert job is not None
        return progress(sess, job, T0 + now)["eta_s"]  # type: ignore[no-any-return]


def test_the_eta_is_the_time_per_level_times_the_levels_left(tmp_path: Path) -> None:
    db = _job(tmp_path, [0.0, 10.0, 20.0])  # 10 s per level; level 2 of 0..8 open
    assert _eta(db, 20.0) == pytest.approx(70.0)  # levels 2..8 left
    assert _eta(db, 24.0) == pytest.approx(66.0)


def test_a_level_that_overruns_keeps_the_levels_after_it_in_the_eta(tmp_path: Path) -> None:
    db = _job(tmp_path, [0.0, 10.0, 20.0])
    assert _eta(db, 30.0) == pytest.approx(60.0)  # level 2 took its 10 s: levels 3..8 left
    # level 2 waits for a stalled site for 100 s: the six levels after it are still ahead
    assert _eta(db, 120.0) == pytest.approx(60.0)


def test_a_job_without_a_depth_limit_has_no_eta(tmp_path: Path) -> None:
    db = _job(tmp_path, [0.0, 10.0, 20.0], max_depth=0)  # trees grow until no node splits
    assert _eta(db, 24.0) is None
