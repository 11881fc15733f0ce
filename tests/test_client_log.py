"""What a site's operator reads: plain log lines off a terminal, and clear transport failures
(no server yet, no client certificate for a mutual-TLS server)."""

from __future__ import annotations

import errno
import http.server
import io
import re
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port
from typer.testing import CliRunner

from client_app.context import Watch
from client_app.log import SiteLog
from client_app.transport import ServerUnreachable, Transport, TransportFailed
from fedforest_cli.cli import app
from fedforest_cli.sim_processes import one_site_server
from fedforest_cli.site_cli import format_status
from fedforest_secure.pki import DevPKI, init_dev_pki
from fedforest_secure.protocol.api import JobStatus

#: seconds within which a client that meets a refused certificate gives up, on a loaded machine:
#: a client that retried would wait out its retry budget (300 s)
GIVES_UP_WITHIN = 60.0
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
    watch = Watch("j", SiteLog(stream=out), me=0)

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
    watch.observe(status("running", "active", "dropped", "dropped"))  # 1 left of 2 needed
    msgs = [LINE.match(x).group(1) for x in out.getvalue().splitlines()]  # type: ignore[union-attr]
    assert msgs == ["job j: waiting for sites b and c to join",
                    "job j: waiting for site c to join",
                    "warning: job j: site c was dropped at round 4; the job continues with 2 "
                    "sites (at least 2 needed)",
                    "warning: job j: site b was dropped at round 4; the job cannot go on with "
                    "1 site (at least 2 needed)"]


def test_the_watch_logs_a_server_given_site_name_clipped_to_a_line_and_once() -> None:
    """Site names come from the server: each is shown as at most 64 printable characters,
    a list as at most 10 names, and a status whose shown names did not change adds no line
    (a server that pads names to megabytes, or changes them every poll past what is shown,
    fills no disk)."""
    out = io.StringIO()
    watch = Watch("j", SiteLog(stream=out), me=0)

    def status(tail: str, n_invited: int = 1) -> JobStatus:
        return JobStatus.model_validate({
            "job_id": "j", "status": "waiting", "min_clients": 2, "n_clients": 2,
            "members": [{"name": "a", "index": 0, "state": "active"},
                        *({"name": f"site{k}-\n" + "n" * (5 << 20) + tail, "index": k + 1,
                           "state": "invited"} for k in range(n_invited))]})

    for poll in range(8):
        watch.observe(status(str(poll)))
    watch.observe(status("", 12))
    lines = out.getvalue().splitlines()
    msgs = [LINE.match(x).group(1) for x in lines]  # type: ignore[union-attr]
    shown = "site0-\\n" + "n" * 57 + "..."  # the newline shown escaped
    assert msgs[0] == f"job j: waiting for site {shown} to join"
    names = ", ".join(f"site{k}-\\n" + "n" * 57 + "..." for k in range(10))
    assert msgs[1:] == [f"job j: waiting for sites {names} and 2 more to join"]
    assert len(out.getvalue()) < 2000


@pytest.mark.parametrize(("job_status", "active", "says"), [
    ("done", 3, "the job finished with 3 sites"),
    ("failed", 1, "the job failed with 1 site left (at least 2 needed)"),
    ("running", 1, "the job cannot go on with 1 site (at least 2 needed)"),
])
def test_the_watch_says_what_became_of_the_job_a_site_was_dropped_from(
        job_status: str, active: int, says: str) -> None:
    """Seen at the end of the job (its last status poll), a dropped site is told in words:
    "the job finished with 3 sites", not "the job done with 3 sites"."""
    out = io.StringIO()
    watch = Watch("j", SiteLog(stream=out), me=0)
    watch.observe(JobStatus.model_validate({
        "job_id": "j", "status": job_status, "min_clients": 2, "n_clients": 4,
        "active_clients": active,
        "members": [{"name": "a", "index": 0, "state": "active"},
                    {"name": "b", "index": 1, "state": "dropped", "dropped_round": 4}]}))
    msgs = [LINE.match(x).group(1) for x in out.getvalue().splitlines()]  # type: ignore[union-attr]
    assert msgs == [f"warning: job j: site b was dropped at round 4; {says}"]


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
    # what a secure client that gave up says in its own words: the failure without the advice
    assert isinstance(err.value, ServerUnreachable)
    assert err.value.failure == (f"GET /v1/jobs: the server at {url} did not answer for 0s "
                                 "(connection refused: the server is not running yet, or the "
                                 "port is wrong)")


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
    other = init_dev_pki(tmp_path / "other", 0)
    tr = Transport(mtls_server, "t", other.ca_cert, dev_pki.client_certs[0],
                   dev_pki.client_keys[0], retry_budget_s=30.0)
    with pytest.raises(TransportFailed, match="not signed by --ca"):
        tr.request("GET", "/v1/jobs")
    tr.close()


def test_a_client_certificate_the_server_does_not_trust_is_named_not_retried(
        mtls_server: str, dev_pki: DevPKI, tmp_path: Path) -> None:
    """The server answers the certificate of another CA with an ``unknown ca`` alert: the
    client says so at once, naming --cert, instead of waiting for the server for minutes."""
    other = init_dev_pki(tmp_path / "other", 1)
    tr = Transport(mtls_server, "t", dev_pki.ca_cert, other.client_certs[0],
                   other.client_keys[0], retry_budget_s=300.0)
    start = time.monotonic()
    with pytest.raises(TransportFailed) as err:
        tr.request("GET", "/v1/jobs")
    tr.close()
    assert time.monotonic() - start < GIVES_UP_WITHIN
    assert tr.requests == 1  # the alert is not retried
    text = str(err.value)
    assert f"refuses the client certificate --cert {other.client_certs[0]}" in text, text
    assert "unknown ca" in text and "signed by a CA the server does not trust" in text


def test_a_client_certificate_not_valid_yet_on_the_servers_clock_names_the_clocks(
        mtls_server: str, dev_pki: DevPKI, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's clock is 10 min ahead of the server's, and the site's certificate was
    issued here (`pki issue --renew` on this machine): it starts 5 min before this clock's
    now, 5 min after the server's, which refuses it. The client names that possibility and
    the dates, beside the CA, revocation and expiry."""
    import datetime as dt
    import types

    import fedforest_secure._pem_files as pem_files
    from fedforest_secure.pki import issue_certificate, load_ca

    ahead = dt.timedelta(minutes=10)
    here = dt.datetime.now(dt.UTC).replace(microsecond=0) + ahead

    class Here(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Here:  # type: ignore[override]
            return cls.fromtimestamp(here.timestamp(), tz)

    monkeypatch.setattr(pem_files, "_dt", types.SimpleNamespace(
        datetime=Here, UTC=dt.UTC, timedelta=dt.timedelta))
    import client_app.tls_files as tls_files
    monkeypatch.setattr(tls_files, "_utcnow", lambda: here)
    made = issue_certificate(load_ca(dev_pki.ca_cert, dev_pki.ca_key),
                             "client-0", server=False, now=here)
    made.write(tmp_path / "c.pem", tmp_path / "c.key")
    tr = Transport(mtls_server, "t", dev_pki.ca_cert, tmp_path / "c.pem", tmp_path / "c.key",
                   retry_budget_s=30.0)
    with pytest.raises(TransportFailed) as err:
        tr.request("GET", "/v1/jobs")
    tr.close()
    start = here - dt.timedelta(minutes=5)
    end = made.cert.not_valid_after_utc
    assert str(err.value).endswith(
        "Is it signed by a CA the server does not trust (its [tls] client_ca), revoked, "
        "expired, or not valid yet on the server's clock? Check that --cert and --key are "
        "this site's key and the certificate signed for it, and that the CA that signed "
        f"it is the server's client_ca (`openssl verify -CAfile <that CA> {tmp_path / 'c.pem'}`)"
        "; the server's operator can tell which CA it trusts. This certificate is valid from "
        f"{start:%Y-%m-%d %H:%M:%S} to {end:%Y-%m-%d %H:%M:%S} UTC, and this machine's clock "
        f"says {here:%Y-%m-%d %H:%M:%S} UTC: a server whose clock is more than 5 min behind "
        "this one takes it for not valid yet (its log says `certificate is not yet valid`); "
        "compare the server's clock with this machine's (NTP), or wait until the server's "
        "clock has passed its start"), str(err.value)


def test_a_server_that_drops_requests_after_the_handshake_is_still_waited_for(
        dev_pki: DevPKI) -> None:
    """A server that accepts the certificate but closes connections without answering a
    request is not taken for one that refuses the certificate: the client keeps trying."""

    class Hangup(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            self.close_connection = True  # no response at all

        def log_message(self, *args: object) -> None:
            pass

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(dev_pki.ca_cert))
    ctx.load_cert_chain(str(dev_pki.server_cert), str(dev_pki.server_key))
    ctx.verify_mode = ssl.CERT_REQUIRED
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hangup)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    tr = Transport(f"https://127.0.0.1:{httpd.server_address[1]}", "t", dev_pki.ca_cert,
                   dev_pki.client_certs[0], dev_pki.client_keys[0], retry_budget_s=4.0)
    try:
        with pytest.raises(TransportFailed, match=r"did not answer for 4s \(RemoteProtocol"):
            tr.request("GET", "/v1/jobs")
        assert tr.requests > 3  # more than the hang-ups that make the client look closer
    finally:
        tr.close()
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def real_mtls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path,
                                                                                 str]]:
    """``fedforest server`` (uvicorn) on 127.0.0.1 with mutual TLS, no jobs: its URL, its
    certificate directory (``ca.pem``, ``client-0.pem``/``.key``) and client-0's token."""
    with one_site_server(tmp_path_factory.mktemp("mtls"), free_port()) as srv:
        yield srv.url, srv.certs, srv.token


@pytest.mark.integration
def test_the_real_server_hanging_up_on_a_foreign_client_certificate_is_explained(
        real_mtls_server: tuple[str, Path, str], tmp_path: Path) -> None:
    """uvicorn closes the connection without a TLS alert when it refuses a certificate (TLS
    1.3: after the client's side of the handshake is done): the client finds that out within
    a few tries and says what to check, instead of "is it running?" after its retry budget."""
    url, certs, token = real_mtls_server
    other = init_dev_pki(tmp_path / "other", 1)
    tr = Transport(url, token, certs / "ca.pem", other.client_certs[0], other.client_keys[0],
                   retry_budget_s=300.0)
    start = time.monotonic()
    with pytest.raises(TransportFailed) as err:
        tr.request("GET", "/v1/jobs")
    tr.close()
    assert time.monotonic() - start < GIVES_UP_WITHIN
    text = str(err.value)
    assert f"may refuse the client certificate --cert {other.client_certs[0]}" in text, text
    assert "signed by a CA the server does not trust" in text and "is it running" not in text
    # the command a site runs says the same in one line, and exits 2
    res = CliRunner().invoke(app, ["jobs", "--server", url, "--ca", str(certs / "ca.pem"),
                                   "--cert", str(other.client_certs[0]),
                                   "--key", str(other.client_keys[0])],
                             env={"FEDFOREST_TOKEN": token})
    assert res.exit_code == 2
    assert "may refuse the client certificate" in res.output.replace("\n", "")
    # the federation's own certificate still gets through
    ok = Transport(url, token, certs / "ca.pem", certs / "client-0.pem", certs / "client-0.key",
                   retry_budget_s=5.0)
    assert ok.get_json("/v1/jobs") == []
    ok.close()


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
    # an evaluation job: one round, no tree levels, a result rather than a model
    ev = format_status(st.model_copy(update={
        "kind": "evaluate", "level": None, "max_depth": None, "status": "done", "round_id": 1,
        "phase": None, "rounds_done": 1, "model_digest": "ab" * 32}))
    assert "(the evaluation needs at least 3)" in ev and "progress: round 1, 1 rounds done" in ev
    assert "level" not in ev and f"result sha256 {'ab' * 32}" in ev


def test_status_of_a_stalled_level_says_it_overran_and_when_the_phase_deadline_is() -> None:
    """Not "ETA: about 1 s" while a site stalls the round: the level has overrun, the server
    waits for the sites that have not answered the phase until its deadline."""
    st = JobStatus.model_validate({
        "job_id": "heart", "status": "running", "round_id": 12, "min_clients": 3,
        "n_clients": 4, "level": 2, "max_depth": 4, "phase": "upload", "rounds_done": 11,
        "eta_s": None, "overrun_s": 40.2, "deadline_in_s": 19.6})
    lines = format_status(st).splitlines()
    assert "ETA: none while level 2 waits: it has run 40 s longer than the levels before it " \
           "took each" in lines
    assert "deadline: phase upload closes in about 20 s at the latest; the sites that have not " \
           "answered it by then are dropped" in lines
    passed = format_status(st.model_copy(update={"deadline_in_s": 0.0}))
    assert "deadline: phase upload's deadline has passed; the sites that have not answered " \
           "it are dropped at the server's next step" in passed.splitlines()
    # a server that sends neither field (an older one): the ETA line as before
    old = format_status(JobStatus.model_validate({**st.model_dump(), "overrun_s": None,
                                                  "deadline_in_s": None, "eta_s": 130.0}))
    assert "ETA: about 2 min" in old and "deadline" not in old


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


@pytest.mark.parametrize(("status", "detail", "line"), [
    ("dropped", "this site was dropped from job spaceL (this client was dropped at round 8); "
                "the job went on without it",
     "job ended: this site was dropped from job spaceL (this client was dropped at round 8); "
     "the job went on without it"),
    ("failed", "round 6: secure aggregation aborted",
     "job ended: failed: round 6: secure aggregation aborted"),
])
def test_the_client_commands_last_line_says_how_the_job_ended_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str, detail: str,
        line: str) -> None:
    """A dropped site's last line says it was dropped once, not the status and then a detail
    that starts with the same words; a failed job's line keeps its status and reason."""
    from client_app import runner
    from client_app.context import ClientResult

    monkeypatch.setattr(runner, "run_client",
                        lambda opts, *rest: ClientResult(status=status, detail=detail))
    res = CliRunner().invoke(app, [
        "client", "--server", "https://127.0.0.1:9", "--token", "t", "--job", "spaceL",
        "--data", str(tmp_path / "d.csv"), "--schema", str(tmp_path / "s.toml")])
    assert res.exit_code == 3, res.output
    assert res.output.splitlines()[-1] == line


def test_a_fresh_certificate_of_another_ca_is_told_of_the_ca_not_of_the_clocks(
        mtls_server: str, dev_pki: DevPKI, tmp_path: Path) -> None:
    """A certificate issued a moment ago by another CA: the server's alert says `unknown ca`,
    and the client's message names the CA, without the clock hint that a certificate the
    server takes for not valid yet gets."""
    from fedforest_secure.pki import init_dev_pki

    other = init_dev_pki(tmp_path / "other", 1)
    tr = Transport(mtls_server, "t", dev_pki.ca_cert, other.client_certs[0],
                   other.client_keys[0], retry_budget_s=30.0)
    with pytest.raises(TransportFailed) as err:
        tr.request("GET", "/v1/jobs")
    tr.close()
    said = str(err.value)
    assert "(TLS alert: unknown ca)" in said, said
    assert "signed by a CA the server does not trust" in said
    assert "clock" not in said.split("the server's operator can tell which CA it trusts")[1]


def test_the_clock_hint_names_an_expiry_within_the_hour_and_nothing_for_a_settled_certificate(
        dev_pki: DevPKI, monkeypatch: pytest.MonkeyPatch) -> None:
    """A certificate that ends within the hour by this machine's clock: a server ahead of it
    takes it for expired, and the message says by how much. One started a day ago and valid
    for months: nothing is added (the clocks are not the likely cause)."""
    import datetime as dt

    import client_app.tls_files as tls_files
    from fedforest_secure.pki import load_certificate

    cert = load_certificate(dev_pki.client_certs[0])
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    near_end = end - dt.timedelta(minutes=20, seconds=30)
    monkeypatch.setattr(tls_files, "_utcnow", lambda: near_end)
    assert tls_files.clock_hint(dev_pki.client_certs[0]) == (
        f". This certificate is valid from {start:%Y-%m-%d %H:%M:%S} to "
        f"{end:%Y-%m-%d %H:%M:%S} UTC, and this machine's clock says "
        f"{near_end:%Y-%m-%d %H:%M:%S} UTC: a server whose clock is more than 20 min ahead of "
        "this one takes it for expired: ask the federation's coordinator for a new one (a new "
        "key and request made here, `fedforest pki request --name client-0 --out <new "
        "directory>`, signed where the CA is kept, `fedforest pki sign --csr client-0.csr "
        "--ca-dir <CA directory> --renew`), and compare the server's clock with this "
        "machine's (NTP)")
    monkeypatch.setattr(tls_files, "_utcnow", lambda: start + dt.timedelta(days=1))
    assert tls_files.clock_hint(dev_pki.client_certs[0]) == ""


class _FullDisk(io.StringIO):
    """A log file on a full disk: every write fails with ENOSPC."""

    name = "/var/log/fedforest/client.log"

    def write(self, s: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_log_on_a_full_disk_loses_its_lines_and_says_so_once_on_stdout(
        capsys: pytest.CaptureFixture[str]) -> None:
    for plain in (True, False):
        log = SiteLog(stream=_FullDisk(), plain=plain)
        log.info("level 2 of 4 [round 7]")
        log.warn("site b was dropped")
        log.info("level 3 of 4 [round 8]")
        assert log.last_warning == "site b was dropped"
        assert capsys.readouterr().out == (
            "fedforest-client warning: cannot write the log (/var/log/fedforest/client.log): "
            "the disk is full; the client goes on, and its log lines are lost until the write "
            "succeeds again\n")


class _FillingDisk(io.StringIO):
    """A log file whose disk fills: while ``full``, a write keeps its first ``room``
    characters and fails with ENOSPC (``room`` 0: nothing written)."""

    name = "/var/log/fedforest/client.log"

    def __init__(self) -> None:
        super().__init__()
        self.full, self.room = False, 0

    def write(self, s: str) -> int:
        if self.full:
            super().write(s[:self.room])
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(s)


def test_a_plain_log_line_cut_short_by_a_full_disk_never_runs_into_the_next_event(
        capsys: pytest.CaptureFixture[str]) -> None:
    disk = _FillingDisk()
    log = SiteLog(stream=disk, plain=True)
    log.info("level 1 of 4 [round 3]")
    disk.full, disk.room = True, 40
    log.info("level 2 of 4 [round 7]")
    disk.room = 0
    log.info("level 3 of 4 [round 8]")  # lost whole
    disk.full = False
    log.info("level 4 of 4 [round 9]")
    lines = disk.getvalue().split("\n")
    assert [line[len("2026-12-07T14:00:00Z "):] for line in lines] == [
        "fedforest-client level 1 of 4 [round 3]", "fedforest-client le",  # cut at 40
        "fedforest-client level 4 of 4 [round 9]", ""]
    assert "lost until the write succeeds again" in capsys.readouterr().out


def test_a_terminal_log_drops_the_lines_it_could_not_write(
        capsys: pytest.CaptureFixture[str]) -> None:
    """On a terminal (rich) a line that could not be written is dropped: never written later,
    nor kept (a terminal that fails for hours does not pile them up)."""
    disk = _FillingDisk()
    log = SiteLog(stream=disk, plain=False)
    disk.full = True
    for i in range(5):
        log.info(f"line {i} while full")
    assert log.console._buffer == []
    disk.full = False
    log.info("first line after space returns")
    written = disk.getvalue().splitlines()
    assert len(written) == 1 and "first line after space returns" in written[0]


def test_the_client_options_and_transport_reprs_hold_no_token(tmp_path: Path) -> None:
    """A library user who logs the client's options or its transport (their dataclass repr)
    does not log the site's token."""
    from client_app.context import ClientOptions

    token = "ffs_0123456789abcdef"
    opts = ClientOptions(server="https://127.0.0.1:1", token=token, job="j1", data=None,
                         schema=tmp_path / "schema.toml", ca=None)
    tr = Transport("http://127.0.0.1:1", token, None, insecure_dev=True)
    try:
        for shown in (repr(opts), str(opts), repr(tr)):
            assert "token" not in shown and token not in shown, shown
        assert "job='j1'" in repr(opts) and "base_url='http://127.0.0.1:1'" in repr(tr)
        assert tr.token == opts.token == token
    finally:
        tr.close()
