"""The client command's signals and its last line: SIGTERM and SIGHUP stop it as Ctrl-C does,
except that a client started under ``nohup`` (SIGHUP ignored) keeps ignoring SIGHUP; a client
stopped in the middle of a secure round says it left the job and what became of the job; the
way a job ended is said once."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from client_app import runner
from client_app.context import ClientResult
from fedforest_cli import cli, interrupts


@pytest.mark.parametrize("nohup", [False, True])
def test_sighup_stops_the_client_unless_it_runs_under_nohup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nohup: bool) -> None:
    seen: dict[str, Any] = {}

    def fake_run(opts: Any, log: Any = None) -> ClientResult:
        seen["hup"] = signal.getsignal(signal.SIGHUP)
        return ClientResult(status="done")

    monkeypatch.setattr(runner, "run_client", fake_run)
    hup = signal.signal(signal.SIGHUP, signal.SIG_IGN if nohup else signal.SIG_DFL)
    term = signal.getsignal(signal.SIGTERM)
    try:
        res = CliRunner().invoke(cli.app, [
            "client", "--server", "https://127.0.0.1:9", "--token", "t", "--job", "j",
            "--data", str(tmp_path / "d.csv"), "--schema", str(tmp_path / "s.toml")])
    finally:
        signal.signal(signal.SIGHUP, hup)
        signal.signal(signal.SIGTERM, term)
    assert res.exit_code == 0, res.output
    assert seen["hup"] is (signal.SIG_IGN if nohup else interrupts.terminated)


def _invoke_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                   fake_run: Callable[..., ClientResult]) -> tuple[int, str]:
    monkeypatch.setattr(runner, "run_client", fake_run)
    hup, term = signal.getsignal(signal.SIGHUP), signal.getsignal(signal.SIGTERM)
    try:
        res = CliRunner().invoke(cli.app, [
            "client", "--server", "https://127.0.0.1:9", "--token", "t", "--job", "j",
            "--data", str(tmp_path / "d.csv"), "--schema", str(tmp_path / "s.toml")],
            env={"COLUMNS": "1000"})
    finally:
        signal.signal(signal.SIGHUP, hup)
        signal.signal(signal.SIGTERM, term)
    return res.exit_code, res.output


LEFT = ("this site has left job j (it stopped in the middle of secure round 4; the server was "
        "told): its round keys die with this process, so running the client again cannot "
        "rejoin the job; the job goes on without it with 4 sites (at least 3 needed)")


def test_a_client_terminated_in_a_secure_round_says_it_left_the_job_and_how_the_job_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not "the same command resumes it, unless ...": the client knows it left (it told the
    server) and what became of the job, and says that last."""
    def fake_run(opts: Any, log: Any = None) -> ClientResult:
        exc = cli.Terminated(signal.SIGTERM)
        exc.add_note(LEFT)  # what the secure loop adds on its way out
        raise exc

    code, out = _invoke_client(tmp_path, monkeypatch, fake_run)
    assert code == 143
    assert out.strip() == f"terminated: {LEFT}"


def test_a_client_interrupted_outside_a_secure_round_is_told_the_same_command_resumes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(opts: Any, log: Any = None) -> ClientResult:
        raise KeyboardInterrupt

    code, out = _invoke_client(tmp_path, monkeypatch, fake_run)
    assert code == 130
    assert out.strip() == ("interrupted: this site stopped taking part in job j. The same "
                           "command resumes it")


DROPPED = ("this site was dropped from job j (this client was dropped at round 8); the job is "
           "done: `fedforest model download --job j` fetches its model")


@pytest.mark.parametrize("logged", [True, False])
def test_the_way_a_job_ended_is_said_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          logged: bool) -> None:
    """A dropped site's last words were printed twice (the client's log line, then the
    command's own): once now, whether the client's log said it or not."""
    def fake_run(opts: Any, log: Any = None) -> ClientResult:
        if logged:  # how the client ends a job it took part in
            log.warn(f"job j ended: dropped {DROPPED}")
        return ClientResult(status="dropped", detail=DROPPED)

    code, out = _invoke_client(tmp_path, monkeypatch, fake_run)
    assert code == 3
    assert out.count("this site was dropped from job j") == 1, out
