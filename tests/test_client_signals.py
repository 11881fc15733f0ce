"""The client command's signals: SIGTERM and SIGHUP stop it as Ctrl-C does, except that a
client started under ``nohup`` (SIGHUP ignored) keeps ignoring SIGHUP."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from client_app import runner
from client_app.context import ClientResult
from fedforest_cli import cli


@pytest.mark.parametrize("nohup", [False, True])
def test_sighup_stops_the_client_unless_it_runs_under_nohup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nohup: bool) -> None:
    seen: dict[str, Any] = {}

    def fake_run(opts: Any) -> ClientResult:
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
    assert seen["hup"] is (signal.SIG_IGN if nohup else cli._terminated)
