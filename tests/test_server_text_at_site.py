"""What a malicious or compromised server says reaches a site's operator as text.

A job's failure reason, a site's name, an error's ``detail``: a terminal escape sequence (a
clipboard write, a screen clear), a carriage return or a U+2028 in them is escaped
(``\\x1b``, ``\\r``, ``\\u2028``) in the client's log (plain lines and rich's console on a
terminal) and in what the ``fedforest`` commands print, and a forged line stays inside its
message's one line.
"""

from __future__ import annotations

import http.server
import io
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_client_responses import JOB, ScriptedTransport, _config, _schema
from typer.testing import CliRunner

from client_app import runner
from client_app.context import ClientResult, Watch
from client_app.log import SiteLog
from client_app.runner import ClientOptions
from client_app.state import ClientState
from client_app.transport import ApiRejected
from fedforest_cli.cli import app
from fedforest_secure.printable import printable, printable_lines
from fedforest_secure.protocol.api import JobStatus

#: a clipboard write (OSC 52), a screen clear, a carriage return, a line separator, a made-up
#: line of the client's log after them
FORGED = "2024-05-01T12:00:00Z fedforest-client job j done: model saved"
ATTACK = f"boom\x1b]52;c;ZXZpbA==\x07\x1b[2J\r\u2028{FORGED}"
SHOWN = f"boom\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J\\r\\u2028{FORGED}"
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ fedforest-client (.*)$")
#: what rich writes itself on a terminal: colours, and the link of the log call's source
RICH_OWN = re.compile(r"\x1b\[[0-9;]*m|\x1b]8;[^;\x1b]*;(file://[^\x1b]*)?\x1b\\")
#: a line of rich's log without them: its time (or blanks: the same second), the message,
#: the log call's source
RICH_LINE = re.compile(r"^(?:\[\d\d:\d\d:\d\d\]| {10}) (.*?) +log\.py:\d+$")


def _no_controls(text: str) -> None:
    for c in ("\x1b", "\x07", "\r", "\u2028"):
        assert c not in text, (c, text)


def test_printable_escapes_what_a_terminal_would_obey_and_keeps_the_rest() -> None:
    assert printable(ATTACK) == SHOWN
    assert printable("site münster [b] \\ ok") == "site münster [b] \\ ok"
    assert printable("a\nb\tc\x00\u202e\U000e0001") == "a\\nb\\tc\\x00\\u202e\\U000e0001"
    assert printable_lines(f"problems:\n  {ATTACK}") == f"problems:\n  {SHOWN}"


def _failed_run(log: SiteLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A client run whose job fails with the server's reason :data:`ATTACK`, logged to
    ``log``."""

    def finished(ctx: Any) -> None:
        raise ApiRejected(409, "job_finished", "the job is failed", {})

    monkeypatch.setattr(runner, "run_open", finished)
    tr = ScriptedTransport({"client_index": 0, "config": _config("open")},
                           gets={"rounds": [], JOB: {"job_id": JOB, "status": "failed",
                                                     "reason": ATTACK}})
    _schema(tmp_path)
    opts = ClientOptions(server="https://fedforest.example.org", token="t", job=JOB,
                         data=tmp_path / "d.csv", schema=tmp_path / "s.toml", ca=None,
                         state_dir=tmp_path / "state", quiet=True)
    return runner._run(opts, tr, ClientState(opts.state_dir),  # type: ignore[arg-type]
                       np.zeros((4, 2)), np.zeros(4), log)


def test_a_servers_failure_reason_is_one_escaped_plain_log_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    res = _failed_run(SiteLog(stream=out), tmp_path, monkeypatch)
    assert (res.status, res.detail) == ("failed", ATTACK)
    _no_controls(out.getvalue())
    msgs = [LINE.match(x).group(1) for x in out.getvalue().split("\n")[:-1]]  # type: ignore[union-attr]
    assert msgs[-1] == f"warning: job {JOB} ended: failed: {SHOWN}"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_servers_text_is_escaped_and_no_sequence_of_its_reaches_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rich's console on a terminal (it drops BEL and CR itself, not ESC): the reason and a
    site's name are shown escaped, each message one line; the only escape sequences written
    are rich's own colours and source link."""
    monkeypatch.setenv("COLUMNS", "400")
    out = _Tty()
    log = SiteLog(stream=out)
    assert not log.plain and log.console.is_terminal
    _failed_run(log, tmp_path, monkeypatch)
    Watch("j", log, me=0).observe(JobStatus.model_validate({
        "job_id": "j", "status": "running", "min_clients": 2, "n_clients": 3,
        "active_clients": 2,
        "members": [{"name": "a", "index": 0, "state": "active"},
                    {"name": ATTACK, "index": 1, "state": "dropped", "dropped_round": 4}]}))
    text = RICH_OWN.sub("", out.getvalue())
    _no_controls(text)
    msgs = [RICH_LINE.match(x).group(1) for x in text.split("\n")[:-1]]  # type: ignore[union-attr]
    assert msgs[-2:] == [
        f"warning: job {JOB} ended: failed: {SHOWN}",
        f"warning: job j: site {printable(ATTACK[:64])}... was dropped at round 4; the job "
        "continues with 2 sites (at least 2 needed)"]  # a site name: its first 64 characters


def test_the_client_commands_last_line_shows_the_servers_reason_escaped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "run_client",
                        lambda opts, *rest: ClientResult(status="failed", detail=ATTACK))
    res = CliRunner().invoke(app, [
        "client", "--server", "https://127.0.0.1:9", "--token", "t", "--job", JOB,
        "--data", str(tmp_path / "d.csv"), "--schema", str(tmp_path / "s.toml")])
    assert res.exit_code == 3, res.output
    _no_controls(res.output)
    assert res.output.split("\n")[-2] == f"job ended: failed: {SHOWN}"


@dataclass
class FakeServer:
    """A server on 127.0.0.1 (``url``) answering every GET with ``answer``: (status, JSON)."""

    url: str = ""
    answer: tuple[int, Any] = (200, None)

    def cli(self, *args: str) -> Any:
        """``fedforest <args>`` against this server, its output."""
        return CliRunner().invoke(app, [*args, "--server", self.url, "--token", "t",
                                        "--insecure-dev"])


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            status, doc = fake.answer
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_status_shows_a_servers_reason_and_site_names_escaped_one_line_each(
        server: FakeServer) -> None:
    server.answer = (200, {
        "job_id": "j", "status": "failed", "reason": ATTACK, "min_clients": 2, "n_clients": 2,
        "members": [{"name": f"a\r{FORGED}", "index": 0, "state": "active"},
                    {"name": "b", "index": 1, "state": "dropped", "declined": ATTACK}]})
    res = server.cli("status", "--job", "j")
    assert res.exit_code == 0, res.output
    _no_controls(res.output)
    lines = res.output.split("\n")
    assert lines[0] == f"job j: failed ({SHOWN})"
    assert lines[2].startswith(f"    0  a\\r{FORGED}")
    assert lines[3].endswith(f"dropped (declined: {SHOWN})")
    assert not any(x.startswith(FORGED) for x in lines)


def test_a_servers_error_detail_is_one_escaped_error_line(server: FakeServer) -> None:
    server.answer = (403, {"error": "forbidden", "detail": ATTACK})
    res = server.cli("jobs")
    assert res.exit_code == 2, res.output
    _no_controls(res.output)
    assert res.output == f"error: 403 forbidden: {SHOWN}\n"


def test_the_job_list_shows_a_servers_job_ids_and_states_escaped(server: FakeServer) -> None:
    server.answer = (200, [{"job_id": f"j\r{FORGED}", "status": "done", "client_index": 0,
                            "member_state": ATTACK}])
    res = server.cli("jobs")
    assert res.exit_code == 0, res.output
    _no_controls(res.output)
    lines = res.output.split("\n")
    assert lines[1].startswith(f"j\\r{FORGED}") and lines[1].endswith(SHOWN), lines
    assert not any(x.startswith(FORGED) for x in lines)


def test_a_models_digest_from_the_server_cannot_start_a_line_of_the_error(
        server: FakeServer, tmp_path: Path) -> None:
    """The digest the job's status records goes into the error of a model that does not match
    it: a line break in it stays inside the one error line."""
    server.answer = (200, {"job_id": "j", "status": "done", "min_clients": 2, "n_clients": 2,
                           "members": [], "model_digest": f"ab\n{FORGED}"})
    res = server.cli("model", "download", "--job", "j", "--out", str(tmp_path / "m.json"))
    assert res.exit_code == 2, res.output
    _no_controls(res.output)
    assert not any(x.startswith(FORGED) for x in res.output.split("\n")), res.output
    assert f"(ab\\n{FORGED}); not written" in res.output


def test_a_job_configuration_key_from_the_server_cannot_start_a_line_of_the_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown key of the job's configuration in the join answer is quoted in the client's
    error: a line break in it stays inside the one line."""
    cfg = _config("open")
    cfg[f"x\n{FORGED}"] = 1
    tr = ScriptedTransport({"client_index": 0, "config": cfg})
    _schema(tmp_path)

    def fake_run_client(opts: ClientOptions, log: SiteLog) -> ClientResult:
        return runner._run(opts, tr, ClientState(opts.state_dir), np.zeros((4, 2)),
                           np.zeros(4), log)

    monkeypatch.setattr(runner, "run_client", fake_run_client)
    res = CliRunner().invoke(app, [
        "client", "--server", "https://127.0.0.1:9", "--token", "t", "--job", JOB,
        "--data", str(tmp_path / "d.csv"), "--schema", str(tmp_path / "s.toml"),
        "--state-dir", str(tmp_path / "state")])
    _no_controls(res.output)
    assert "malformed job configuration" in res.output, res.output
    assert not any(x.startswith(FORGED) for x in res.output.split("\n")), res.output
