"""The server processes of ``fedforest simulate``, the integration tests and the benchmarks."""

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

from fedforest_cli.sim_processes import one_site_server, stop
from fedforest_secure.errors import FedForestError


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
