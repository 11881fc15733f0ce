"""What a site's operator reads: plain log lines off a terminal, and clear transport failures
(no server yet, no client certificate for a mutual-TLS server)."""

from __future__ import annotations

import http.server
import io
import re
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port

from client_app.log import SiteLog
from client_app.runner import _Watch
from client_app.transport import Transport, TransportFailed
from fedforest_cli.site_cli import format_status
from fedforest_secure.pki import DevPKI
from fedforest_secure.protocol.api import JobStatus

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ fedforest-client (.*)$")


def test_off_a_terminal_every_event_is_one_plain_line() -> None:
    out = io.StringIO()
    log = SiteLog(stream=out)
    assert log.plain
    log.info("level 2 of 4 [round 7]")
    log.warn("site b was dropped")
    lines = out.getvalue().splitlines()
    assert [LINE.match(x).group(1) for x in lines] == [  # type: ignore[union-attr]
        "level 2 of 4 [round 7]", "warning: site b was dropped"]


def test_the_watch_names_the_sites_not_joined_yet_and_each_dropped_site_once() -> None:
    out = io.StringIO()
    watch = _Watch("j", SiteLog(stream=out), me=0)

    def status(job_status: str, *states: str) -> JobStatus:
        return JobStatus.model_validate({
            "job_id": "j", "status": job_status, "min_clients": 2, "n_clients": 3,
            "active_clients": sum(s == "active" for s in states),
            "members": [{"name": n, "index": k, "state": s, "dropped_round": 4}
                        for k, (n, s) in enumerate(zip("abc", states, strict=True))]})

    watch.observe(status("waiting", "active", "invited", "invited"))
    watch.observe(status("waiting", "active", "invited", "invited"))  # no news: no line
    watch.observe(status("waiting", "active", "active", "invited"))
    watch.observe(status("running", "active", "active", "dropped"))
    watch.observe(status("running", "active", "active", "dropped"))
    msgs = [LINE.match(x).group(1) for x in out.getvalue().splitlines()]  # type: ignore[union-attr]
    assert msgs == ["job j: waiting for sites b and c to join",
                    "job j: waiting for site c to join",
                    "warning: job j: site c was dropped at round 4; the job continues with 2 "
                    "sites (at least 2 needed)"]


def test_a_client_started_before_the_server_says_it_waits_and_then_why_it_gave_up() -> None:
    told: list[str] = []
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    tr = Transport(url, "t", None, retry_budget_s=0.5, insecure_dev=True, on_wait=told.append)
    with pytest.raises(TransportFailed) as err:
        tr.request("GET", "/v1/jobs")
    assert len(told) == 1 and told[0].startswith(f"waiting for the server at {url} "
                                                 "(connection refused")
    assert "did not answer for 0s (connection refused: the server is not running yet" in str(
        err.value)
    assert "is it running" in str(err.value)


def _json_handler(status: int, body: bytes) -> type[http.server.BaseHTTPRequestHandler]:
    """A request handler answering every GET with ``status`` and the JSON ``body``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture(scope="module")
def mtls_server(dev_pki: DevPKI) -> Iterator[str]:
    """A TLS server on 127.0.0.1 that requires a client certificate signed by the dev CA."""

    Ok = _json_handler(200, b"[]")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(dev_pki.ca_cert))
    ctx.load_cert_chain(str(dev_pki.server_cert), str(dev_pki.server_key))
    ctx.verify_mode = ssl.CERT_REQUIRED
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_client_without_certificate_is_told_the_server_wants_one(
        mtls_server: str, dev_pki: DevPKI) -> None:
    tr = Transport(mtls_server, "t", dev_pki.ca_cert, retry_budget_s=30.0)
    with pytest.raises(TransportFailed, match=r"requires a client certificate \(mutual TLS\)\. "
                                              r"Pass --cert client\.pem --key client\.key"):
        tr.request("GET", "/v1/jobs")
    tr.close()
    ok = Transport(mtls_server, "t", dev_pki.ca_cert, dev_pki.client_certs[0],
                   dev_pki.client_keys[0], retry_budget_s=5.0)
    assert ok.get_json("/v1/jobs") == []
    ok.close()


def test_a_wrong_ca_is_a_verification_failure_not_a_retry(dev_pki: DevPKI,
                                                           mtls_server: str,
                                                           tmp_path: Path) -> None:
    from fedforest_secure.pki import init_dev_pki

    other = init_dev_pki(tmp_path / "other", 0)
    tr = Transport(mtls_server, "t", other.ca_cert, dev_pki.client_certs[0],
                   dev_pki.client_keys[0], retry_budget_s=30.0)
    with pytest.raises(TransportFailed, match="not signed by --ca"):
        tr.request("GET", "/v1/jobs")
    tr.close()


def test_status_lines_show_members_level_round_phase_and_eta() -> None:
    st = JobStatus.model_validate({
        "job_id": "heart", "status": "running", "profile": "secure", "round_id": 12,
        "client_index": 1, "min_clients": 3, "n_clients": 4, "joined_clients": 4,
        "active_clients": 3, "dropped_clients": 1, "level": 2, "max_depth": 4,
        "phase": "upload", "rounds_done": 11, "eta_s": 130.0,
        "members": [{"name": "a", "index": 0, "state": "active"},
                    {"name": "b", "index": 1, "state": "active"},
                    {"name": "c", "index": 2, "state": "dropped", "dropped_round": 9},
                    {"name": "d", "index": 3, "state": "active"}]})
    text = format_status(st)
    assert "job heart: running, profile secure" in text
    assert "members: 4 of 4 joined, 3 active, 1 dropped (training needs at least 3)" in text
    assert re.search(r"1  b +active  \(you\)", text)
    assert re.search(r"2  c +dropped at round 9", text)
    assert "progress: level 2 of 4, round 12, phase upload, 11 rounds done" in text
    assert "ETA: about 2 min" in text


def test_a_server_error_reaches_the_client_with_its_reason_not_a_bare_500() -> None:
    """The server answers 500 with a JSON reason (the app's error handler); the client's
    waiting line and its final failure quote that reason and point at the server's log."""

    Failing = _json_handler(500, b'{"error": "server_error", "detail": "the server failed: '
                                 b'FedForestError: disk full (its log has the traceback)"}')
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    told: list[str] = []
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    tr = Transport(url, "t", None, retry_budget_s=0.5, insecure_dev=True, on_wait=told.append)
    try:
        with pytest.raises(TransportFailed) as err:
            tr.request("GET", "/v1/jobs")
    finally:
        tr.close()
        httpd.shutdown()
        httpd.server_close()
    reason = "HTTP 500: the server failed: FedForestError: disk full"
    assert len(told) == 1 and reason in told[0]
    assert reason in str(err.value) and "its log says why" in str(err.value)
