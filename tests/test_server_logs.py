"""The server's log: one key=value line per event; SIGTERM ends it cleanly."""

from __future__ import annotations

import io
import logging
import re
import signal
import time
from pathlib import Path

import pytest
from test_integration_https import launch_client, launch_server, setup_fed, stop

from server_app.logs import configure, event, fields

pytestmark = pytest.mark.integration

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (INFO|WARNING|ERROR) fedforest-server "
                  r"event=\w+( \w+=(\"[^\"]*\"|\S+))*$")


def test_fields_quote_what_has_spaces_and_an_error_keeps_its_traceback_on_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert fields(event="drop", job="j", reason="missed the deadline", round=3, x=None,
                  seconds=1.23456) == 'event=drop job=j reason="missed the deadline" round=3 ' \
                                      "seconds=1.235"
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    configure()
    try:
        raise ValueError("boom\nsecond line")
    except ValueError as exc:
        event("error", logging.ERROR, exc=exc, where="test")
    (line,) = out.getvalue().splitlines()
    assert "event=error where=test" in line and "Traceback" in line and "| ValueError" in line


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
