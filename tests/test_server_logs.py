"""The server's log: one key=value line per event; SIGTERM ends it cleanly."""

from __future__ import annotations

import io
import logging
import re
import signal
import socket
import ssl
import time
from pathlib import Path

import pytest
from test_integration_https import launch_client, launch_server, setup_fed, stop, stop_all

from server_app.logs import configure, event, fields

pytestmark = pytest.mark.integration

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (INFO|WARNING|ERROR) fedforest-server "
                  r'event=\w+( \w+=("(?:[^"\\]|\\.)*"|[^\s"]+))*$')


def _logged_error(monkeypatch: pytest.MonkeyPatch, message: str, **extra: object) -> str:
    """What the server's log writes for an ``error`` event carrying a ValueError(``message``)
    raised and caught, with the fields ``extra``."""
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    configure()
    try:
        raise ValueError(message)
    except ValueError as exc:
        event("error", logging.ERROR, exc=exc, **extra)
    return out.getvalue()


def test_fields_quote_what_has_spaces_and_an_error_keeps_its_traceback_on_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert fields(event="drop", job="j", reason="missed the deadline", round=3, x=None,
                  seconds=1.23456) == 'event=drop job=j reason="missed the deadline" round=3 ' \
                                      "seconds=1.235"
    (line,) = _logged_error(monkeypatch, "boom\nsecond line", where="test").splitlines()
    assert "event=error where=test" in line and "Traceback" in line and "| ValueError" in line


#: a field of a line: ``key=value`` or ``key="value"`` (``\\"`` and ``\\\\`` inside the quotes)
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s"]+)(?: |$)')
_UNESCAPE = re.compile(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|[trn\\\"])")


def parsed(line: str) -> dict[str, str]:
    """The fields of an event line, its quoted values unescaped: as a log reader takes them
    (an assertion fails if the line does not split into fields from its ``event=`` on)."""
    body = line.split(" fedforest-server ", 1)[1]
    found = list(FIELD.finditer(body))
    assert "".join(m.group(0) for m in found) == body, line
    out = {}
    for m in found:
        key, value = m.group(1), m.group(2)
        if value.startswith('"'):
            value = _UNESCAPE.sub(lambda e: {"t": "\t", "r": "\r", "n": "\n"}.get(
                e.group(1), e.group(1) if len(e.group(1)) == 1 else chr(int(e.group(1)[1:], 16))),
                value[1:-1])
        assert key not in out, line
        out[key] = value
    return out


#: what a client can send in a request's path (uvicorn decodes it): a carriage return, an
#: ANSI erase-line and a terminal-title sequence, a BEL, NEL and Unicode line and paragraph
#: separators, a right-to-left override, a tab, a quote, a backslash and a made-up field
HOSTILE = ('/v1/jobs/x\r2026-12-07T09:00:00Z INFO fedforest-server event=job_done job=job-x'
           '\x1b[2K\x1b]0;pwned\x07\x85\u2028\u2029\u202e\t"\\ event=lease_lost\x00\x7f')


def test_every_character_a_reader_could_take_as_a_line_or_field_boundary_is_escaped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    line = fields(event="auth_refused", path=HOSTILE, reason="unknown or revoked token")
    assert line.isprintable() and len(line.splitlines()) == 1, line
    assert "\\x1b[2K" in line and "\\r2026" in line and "\\u2028" in line, line
    assert parsed("t INFO fedforest-server " + line) == {
        "event": "auth_refused", "path": HOSTILE, "reason": "unknown or revoked token"}
    # printable text, accents included, stays as it was
    assert fields(event="join", client="zürich-1", job="j") == "event=join client=zürich-1 job=j"
    assert fields(event="drop", reason="", x="a=b") == 'event=drop reason="" x="a=b"'
    # a traceback's text too: the exception's message came from anywhere
    text = _logged_error(monkeypatch, "bad\rforged\x1b[2K\u2028line", path=HOSTILE)
    assert text.endswith("\n") and text[:-1].isprintable(), repr(text)
    assert "ValueError: bad\\rforged\\x1b[2K\\u2028line" in text, text


def test_a_request_path_with_control_characters_is_one_escaped_line_in_the_log(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """Anyone who reaches the port (here: with a site's certificate, a made-up token) has the
    server log the path of a refused request: its control characters are escaped, and no line
    is forged."""
    from urllib.parse import quote

    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=2)
    try:
        launch_server(fed)
        ctx = ssl.create_default_context(cafile=str(fed.certs / "ca.pem"))
        ctx.load_cert_chain(fed.certs / "client-0.pem", fed.certs / "client-0.key")
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", fed.server.port)),
                             server_hostname="127.0.0.1") as sock:
            sock.sendall(f"GET {quote(HOSTILE, safe='/')} HTTP/1.1\r\nHost: x\r\n"
                         "Authorization: Bearer made-up\r\nConnection: close\r\n\r\n".encode())
            answer = sock.recv(200)
        assert answer.startswith(b"HTTP/1.1 401 "), answer
        time.sleep(0.5)
    finally:
        stop_all(fed)
    raw = (fed.root / "server.log").read_bytes()
    for byte in (b"\r", b"\x1b", b"\x07", b"\x00", b"\x7f", b"\t"):
        assert byte not in raw, raw
    text = raw.decode()
    lines = text.splitlines()  # universal newlines: NEL, U+2028 and U+2029 end a line too
    assert lines == text.split("\n")[:-1], lines
    assert all(LINE.match(x) for x in lines), text
    (refused,) = [x for x in lines if "event=auth_refused" in x]
    assert parsed(refused) == {"event": "auth_refused", "path": HOSTILE,
                               "reason": "unknown or revoked token", "peer": "client-0"}, refused
    events = [parsed(x)["event"] for x in lines]
    assert "job_done" not in events and "lease_lost" not in events, events


def test_uvicorns_graceful_shutdown_timeout_is_a_warning_event_not_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM whose 5 s ran out because a client stopped reading: uvicorn's ERROR line
    ("Cancel 0 running task(s), ...") becomes one warning event; its other errors stay."""
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    configure()
    configure()  # configured twice (tests, restarts in one process): one line per record
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", 0)
    uvicorn_log.error("something else went wrong")
    first, second = out.getvalue().splitlines()
    assert LINE.match(first), first
    assert " WARNING fedforest-server event=shutdown_timeout requests_cut=0 " in first
    assert "ERROR" not in first
    assert second.endswith("ERROR fedforest-server something else went wrong")


def test_a_job_logs_startup_joins_rounds_and_the_end_and_sigterm_stops_cleanly(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3)
    server = launch_server(fed)
    try:
        clients = [launch_client(fed, k) for k in range(3)]
        codes = [c.wait(120) for c in clients]
        # a client of a second run waits on a long poll while the server is stopped
        waiting = launch_client(fed, 0)
        time.sleep(1.0)
        start = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        stopped_in = time.monotonic() - start
    finally:
        stop(server)
        stop(waiting)
    assert codes == [0, 0, 0]
    log = (fed.root / "server.log").read_text()
    lines = log.splitlines()
    assert lines and all(LINE.match(x) for x in lines), log
    events = [re.search(r"event=(\w+)", x).group(1) for x in lines]  # type: ignore[union-attr]
    assert events[0] == "startup" and events[-1] == "shutdown"
    assert "jobs_running=0" in lines[-1], lines[-1]  # the job finished before the shutdown
    assert events.count("join") == 3 and "job_started" in events and "job_done" in events
    assert events.count("round") >= 3
    # the end names as many rounds as the job closed (one "round" line each)
    done = next(x for x in lines if "event=job_done" in x)
    assert f" rounds={events.count('round')} " in done, done
    # an open job's rounds have one phase (the uploads): the line gives the close's seconds
    closed = [x for x in lines if "event=round " in x]
    assert all(re.search(r" close_s=[0-9.]+$", x) and "phase_s=" not in x for x in closed)
    assert "Traceback" not in log and "CancelledError" not in log
    assert stopped_in < 15


def test_the_log_module_names_every_event_the_server_logs() -> None:
    """An operator greps the log by event name: the list in server_app.logs is complete."""
    import re
    from pathlib import Path

    import server_app
    from server_app import logs

    root = Path(server_app.__file__).parent
    logged = {m for f in root.glob("*.py")
              for m in re.findall(r'event\("([a-z_]+)"', f.read_text())}
    listed = set(re.findall(r"``([a-z_]+)``", (logs.__doc__ or "").split("Values")[0]))
    assert logged <= listed, sorted(logged - listed)


def test_ctrl_c_stops_the_server_as_sigterm_does_without_an_interrupted_line(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """Ctrl-C (SIGINT) on `fedforest server`: it shuts down as on SIGTERM (its log's last
    line `event=shutdown`) and exits 130, without the "the command stopped before it
    finished" line other commands end with."""
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3)
    server = launch_server(fed)
    try:
        server.send_signal(signal.SIGINT)
        code = server.wait(30)
    finally:
        stop(server)
    log = (fed.root / "server.log").read_text()
    assert code == 130, log
    assert "event=shutdown" in log.splitlines()[-1], log
    assert "stopped before it finished" not in log and "Traceback" not in log
