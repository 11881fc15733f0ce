"""The server and client processes of ``fedforest simulate``, the integration tests and the
benchmarks, and how the simulation reports a client that did not end done."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ports import free_port

from fedforest_cli.sim_processes import client_ends, one_site_server, stop, trained_over
from fedforest_secure.errors import FedForestError
from fedforest_secure.protocol.api import JobStatus


@pytest.mark.integration
def test_a_server_that_cannot_start_is_reported_with_the_end_of_its_log(tmp_path: Path) -> None:
    """The port is taken: the server exits at start-up, and the error carries the reason from
    its log (which lives in a directory the caller may delete)."""
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(FedForestError) as err:
            with one_site_server(tmp_path, port, timeout=60.0):
                pytest.fail("the server started on a port that is taken")
    assert "the server exited with code" in str(err.value)
    assert f"cannot listen on 127.0.0.1 port {port}: Address already in use" in str(err.value)
    log = (tmp_path / "server.log").read_text()
    assert "event=startup" not in log  # it never served
    assert "Traceback" not in log


#: the smallest simulation that starts a server and three client processes
TINY_RUN = ["--dataset", "breast_cancer", "--trees", "2", "--depth", "2", "--clients", "3",
            "--max-rows", "200"]


def _simulate(args: list[str], cwd: Path, stdout: Path) -> subprocess.Popen[bytes]:
    from fedforest_cli.sim_processes import child_env

    env = {**child_env(), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    with stdout.open("wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "fedforest_cli", "simulate", *args],
                                cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=env)


def _processes_naming(text: str) -> list[int]:
    """The processes whose command line contains ``text`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(int(entry.name))
    return found


def _no_processes_left(text: str) -> bool:
    """True if no process names ``text``; any that does (the test's own) is killed."""
    left = _processes_naming(text)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return not left


@pytest.mark.integration
def test_sigterm_stops_the_simulation_its_server_and_its_clients(tmp_path: Path) -> None:
    """A SIGTERM (``timeout``, a CI job cancel) ends simulate as Ctrl-C does: its server and
    client processes are stopped, and it exits with 143."""
    out = tmp_path / "run"
    sim = _simulate([*TINY_RUN, "--out", str(out)], tmp_path, tmp_path / "stdout.txt")
    try:
        log = out / "logs" / "server.log"
        deadline = time.monotonic() + 120
        while not (log.is_file() and "event=startup" in log.read_text()
                   and "client processes started" in (tmp_path / "stdout.txt").read_text()):
            assert sim.poll() is None, (tmp_path / "stdout.txt").read_text()
            assert time.monotonic() < deadline, "the simulation did not start its clients"
            time.sleep(0.1)
        server_pid = int(re.search(r"event=startup .* pid=(\d+)", log.read_text())[1])  # type: ignore[index]
        sim.send_signal(signal.SIGTERM)
        code = sim.wait(60)
    finally:
        stop(sim)  # a run that overran its wait: stopped as a user would stop it
    said = (tmp_path / "stdout.txt").read_text()
    assert code == 143, said
    assert "terminated" in said
    assert _no_processes_left(str(out))
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)


@pytest.mark.integration
def test_a_relative_profile_path_is_read_from_the_current_directory(tmp_path: Path) -> None:
    """``--profile ours.toml`` is the file in the directory simulate runs in (not one in
    --out); the result table says what that profile lets the server see, whatever its
    name."""
    from test_simulate_options import SECURE_FILE

    (tmp_path / "ours.toml").write_text(SECURE_FILE)
    sim = _simulate([*TINY_RUN, "--profile", "ours.toml", "--out", "run"], tmp_path,
                    tmp_path / "stdout.txt")
    try:
        code = sim.wait(300)
    finally:
        stop(sim)  # a run that overran its wait: stopped as a user would stop it
    said = (tmp_path / "stdout.txt").read_text()
    assert code == 0, said
    assert "the server sees only masked vectors" in said
    assert _no_processes_left(str(tmp_path / "run"))


def _status(**dropped: int) -> JobStatus:
    """A finished job of five sites, ``dropped`` mapping a site to its round."""
    names = [f"client-{k}" for k in range(5)]
    return JobStatus.model_validate({
        "job_id": "sim", "status": "done", "n_clients": 5, "min_clients": 3,
        "active_clients": 5 - len(dropped), "dropped_clients": len(dropped),
        "members": [{"name": n, "index": k, "state": "dropped" if n in dropped else "active",
                     "dropped_round": dropped.get(n)} for k, n in enumerate(names)]})


def test_each_client_that_did_not_end_done_is_named_with_how_it_ended() -> None:
    """client-2 was killed (SIGKILL) and dropped at round 4, client-4 was dropped and ended
    with the client's exit code 3: both are named, the others are not."""
    names = [f"client-{k}" for k in range(5)]
    status = _status(**{"client-2": 4, "client-4": 6})
    ends = client_ends(names, [0, 0, -signal.SIGKILL, 0, 3], status)
    failed = [e for e in ends if not e.ok]
    assert [e.name for e in failed] == ["client-2", "client-4"]
    assert failed[0].describe() == ("client-2: killed by SIGKILL (exit code -9); dropped from "
                                    "the job at round 4")
    assert failed[1].describe() == ("client-4: ended without taking part to the end (exit code "
                                    "3); dropped from the job at round 6")
    assert [e.describe() for e in client_ends(["a"], [2], None)] == [
        "a: stopped on an error (exit code 2)"]
    assert [e.describe() for e in client_ends(["a"], [143], None)] == [
        "a: terminated (exit code 143)"]


def test_the_sites_a_model_was_trained_over_count_the_dropped_ones_apart() -> None:
    assert trained_over(_status(), 5) == "5 sites"
    assert trained_over(None, 5) == "5 sites"
    assert trained_over(_status(**{"client-2": 4}), 5) == (
        "5 sites, 4 of them to the end (client-2 dropped at round 4)")
    assert trained_over(_status(**{"client-2": 4, "client-0": 7}), 5) == (
        "5 sites, 3 of them to the end (client-0 dropped at round 7, client-2 at round 4)")


def test_a_simulation_whose_clients_all_stopped_while_the_job_ran_says_so(
        tmp_path: Path) -> None:
    from fedforest_cli.simulate import not_done

    ends = client_ends(["client-0", "client-1"], [2, 2], None)
    running = {"status": "running", "reason": "", "round": 3}
    assert not_done(running, ends, tmp_path / "logs") == (
        "every site's client stopped before the job ended (it is still running at round 3); "
        "client-0: stopped on an error (exit code 2); client-1: stopped on an error (exit "
        f"code 2); see their logs in {tmp_path / 'logs'}")
    first = {"status": "running", "reason": "", "round": 0}
    assert not_done(first, ends[:1], tmp_path / "logs") == (
        "every site's client stopped before the job ended (it is still running at round 0); "
        f"client-0: stopped on an error (exit code 2); see their logs in {tmp_path / 'logs'}")
    waiting = {"status": "waiting", "reason": "", "round": -1}
    assert not_done(waiting, ends[:1], tmp_path / "logs") == (
        "every site's client stopped before the job ended (it is still waiting); client-0: "
        f"stopped on an error (exit code 2); see their logs in {tmp_path / 'logs'}")
    failed = {"status": "failed", "reason": "round 2: too few sites", "round": 2}
    assert not_done(failed, ends[:1], tmp_path / "logs") == (
        "the job ended failed: round 2: too few sites; client-0: stopped on an error (exit "
        f"code 2) (logs in {tmp_path / 'logs'})")
