"""A step of the server's wall clock (NTP correcting it, a date set by hand, a VM restored from a
snapshot) while a round is open: the round deadlines run on the process's monotonic time, so
a silent site is dropped a full round deadline (30 s here) after its phase opened, whichever
way the wall clock stepped, and after a restart too."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_server_secagg_api import (
    Clock,
    K,
    _env,
    all_but_last_uploaded,
    h,
    offer,
    restart,
)

from server_app.logs import LOGGER


@pytest.fixture()
def env(tmp_path: Path, tiny_parts, job_dir, db_url: str) -> Iterator[dict]:
    """A secure job whose server has a wall clock (``env["wall"]``) of its own, which a test
    steps, beside its monotonic clock (``env["clock"]``)."""
    yield from _env(tmp_path, tiny_parts, job_dir, db_url, "secure", wall=Clock())


def _run(env: dict, seconds: int) -> None:
    """``seconds`` of real time, the server beating every second, then its deadline tick."""
    for _ in range(seconds):
        env["clock"].now += 1
        env["wall"].now += 1
        env["state"].core.deadlines.beat(0.5)
    env["state"].tick()


def _deadline_in(env: dict) -> float:
    return float(env["http"].get("/v1/jobs/job-a", headers=h(env, 0)).json()["deadline_in_s"])


@pytest.mark.parametrize("step", [-3600, 3600], ids=["back_1h", "forward_1h"])
def test_a_wall_clock_step_moves_no_round_deadline(env: dict, step: int,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The wall clock steps an hour back (or forward) 1 s into the upload phase: the sites
    are still told the deadline left on the monotonic clock, no stall is logged, the silent
    site is not dropped 29 s later, and is 30 s later."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    all_but_last_uploaded(env)
    env["state"].core.deadlines.beat(0.5)
    _run(env, 1)
    env["wall"].now += step
    _run(env, 28)
    assert offer(env, K - 1)["action"] == "upload"
    assert _deadline_in(env) == pytest.approx(1.0)
    _run(env, 2)
    assert offer(env, K - 1)["status"] == "dropped"
    assert "server_stalled" not in caplog.text


def test_a_server_restarted_after_a_backward_step_gives_the_phase_a_full_deadline(
        env: dict) -> None:
    """The stored deadline was set before the wall clock stepped an hour back; the server is
    restarted after the step: the open phase gets a full round deadline from the restart, as
    any restart gives it, not the hour the stored value says."""
    all_but_last_uploaded(env)
    _run(env, 10)
    env["wall"].now -= 3600
    restart(env)
    assert _deadline_in(env) == pytest.approx(30.0)
    _run(env, 29)
    assert offer(env, K - 1)["action"] == "upload"
    _run(env, 2)
    assert offer(env, K - 1)["status"] == "dropped"


def test_a_phase_opened_long_after_the_server_started_keeps_its_full_deadline(
        env: dict) -> None:
    """A phase this server opened 100 s after it started runs its own full round deadline
    (30 s), not one re-armed from the start as an earlier process's would be."""
    env["clock"].now += 100.0
    env["wall"].now += 100.0
    all_but_last_uploaded(env)
    env["clock"].now += 5.0
    env["wall"].now += 5.0
    env["state"].tick()
    assert offer(env, K - 1)["action"] == "upload"
    assert _deadline_in(env) == pytest.approx(25.0)


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux's CLOCK_BOOTTIME")
def test_the_deadlines_count_the_time_the_host_spent_suspended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadlines' clock is CLOCK_BOOTTIME, which goes on while the machine is suspended
    (CLOCK_MONOTONIC stops): a host that wakes up sees the gap as a stall, and the open
    round's deadline runs again from then, as after a pause of the process."""
    import inspect

    from server_app import deadlines
    from server_app.core import Core
    from server_app.runtime import ServerState

    def clock_gettime(which: int) -> float:
        return 1e6 if which == time.CLOCK_BOOTTIME else 0.0

    monkeypatch.setattr(deadlines.time, "clock_gettime", clock_gettime)
    assert deadlines.steady_clock() == 1e6
    for made in (deadlines.Deadlines.__init__, Core.build, ServerState.__init__):
        assert inspect.signature(made).parameters["monotonic"].default \
            is deadlines.steady_clock, made
