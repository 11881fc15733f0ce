"""What the real server (run_server: mutual TLS, on 127.0.0.1) does with connections that
hold it or flood its log: a connection that does not finish its TLS handshake is closed after
TLS_HANDSHAKE_S (server_app/event_loop.py); a body refused or cut short by its client, repeated,
is logged once per LOG_EVERY_S with the site's name and the count left out
(server_app/limits.py), and so is a refused TLS handshake, per reason (server_app/tls_identity.py).
The limits are shortened for the tests."""

from __future__ import annotations

import io
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from ports import free_port

from fedforest_secure.pki import DevPKI
from server_app import event_loop, limits
from server_app.auth import add_client
from server_app.db import Database
from server_app.serve import run_server
from server_app.settings import ServerSettings, TLSSettings

pytestmark = pytest.mark.integration

HANDSHAKE_S = 1.0  # the handshake timeout the tests' server runs with
#: seconds within which a connection due to be closed is, on a loaded machine (on a quiet one,
#: HANDSHAKE_S): less than the server's own 10 s, so a server that kept its own timeout, or
#: none (the event loop's 60 s), fails
CLOSED_WITHIN = 8.0
#: seconds within which the server finishes what the test sent it, on a loaded machine
SETTLE_S = 30.0


class Server:
    """The server of the tests: uvicorn's, its port, a site's token and TLS context, its log."""

    def __init__(self, uv: uvicorn.Server, port: int, token: str, ctx: ssl.SSLContext,
                 log: io.StringIO) -> None:
        self.uv, self.port, self.token, self.ctx, self.log = uv, port, token, ctx, log

    def settle(self) -> None:
        """Wait until the server holds no connection and runs no request (SETTLE_S at most)."""
        deadline = time.monotonic() + SETTLE_S
        while self.uv.server_state.connections or self.uv.server_state.tasks:
            assert time.monotonic() < deadline, "the server still serves the test's requests"
            time.sleep(0.02)

    def lines(self, name: str) -> list[str]:
        """The log's ``event=<name>`` lines."""
        return [line for line in self.log.getvalue().splitlines() if f" event={name} " in line]

    def wait_lines(self, name: str, count: int) -> list[str]:
        """The log's ``event=<name>`` lines once there are ``count`` (SETTLE_S at most)."""
        deadline = time.monotonic() + SETTLE_S
        while len(self.lines(name)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.lines(name)

    def post(self, path: str, head: bytes, body: bytes, *, cut: bool = False) -> bytes:
        """Send a POST with ``head`` (its header fields) and ``body`` on a new connection, and
        close it after the first bytes of its answer; or (``cut``) send ``body`` once the
        server reads it (``Expect: 100-continue``) and close the connection then."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as raw, \
                self.ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                         f"{self.token}\r\n".encode() + head
                         + (b"Expect: 100-continue\r\n\r\n" if cut else b"\r\n" + body))
            answer = sock.recv(4096)
            if cut:
                assert answer.startswith(b"HTTP/1.1 100 "), answer
                sock.sendall(body)
            return answer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, dev_pki: DevPKI) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("connection-limits")
    database = f"sqlite:///{tmp / 's.db'}"
    db = Database(database)
    token = add_client(db, "client-0")  # the name of dev_pki's first site certificate
    db.dispose()
    servers: list[uvicorn.Server] = []
    real_run = uvicorn.Server.run

    def run(self: uvicorn.Server, sockets: Any = None) -> None:
        servers.append(self)
        real_run(self, sockets=sockets)

    log = io.StringIO()
    port = free_port()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(event_loop, "TLS_HANDSHAKE_S", HANDSHAKE_S)
        patch.setattr(uvicorn.Server, "run", run)
        patch.setattr("sys.stderr", log)  # the server's log (configured when it starts)
        settings = ServerSettings(
            host="127.0.0.1", database=database,
            tls=TLSSettings(cert=dev_pki.server_cert, key=dev_pki.server_key,
                            client_ca=dev_pki.ca_cert))
        thread = threading.Thread(target=run_server, args=(settings,), kwargs={"port": port},
                                  daemon=True)
        thread.start()
        ctx = ssl.create_default_context(cafile=str(dev_pki.ca_cert))
        ctx.load_cert_chain(dev_pki.client_certs[0], dev_pki.client_keys[0])
        try:
            deadline = time.monotonic() + 60
            while not (servers and servers[0].started):
                assert thread.is_alive() and time.monotonic() < deadline, log.getvalue()
                time.sleep(0.05)
            yield Server(servers[0], port, token, ctx, log)
        finally:
            if servers:
                servers[0].should_exit = True
            thread.join(30)


def _closed_after(sock: socket.socket, most: float) -> float | None:
    """Seconds until the server closes ``sock`` (an EOF or a reset), or None if it has not
    within ``most``."""
    started = time.monotonic()
    sock.settimeout(most)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


@pytest.mark.parametrize("sent", [b"", b"\x16\x03\x01\x02\x00"], ids=["nothing", "half-hello"])
def test_a_connection_that_does_not_finish_its_tls_handshake_is_closed_after_the_timeout(
        server: Server, sent: bytes) -> None:
    """No certificate needed: a TCP connection that sends nothing, or the first bytes of a
    ClientHello, is closed once the handshake timeout passes (not the event loop's 60 s)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(sent)
        waited = _closed_after(sock, CLOSED_WITHIN)
    assert waited is not None, "the server kept the connection"
    assert waited > 0.8 * HANDSHAKE_S  # and not before


def test_a_site_whose_bodies_are_cut_short_again_and_again_is_logged_once_a_minute(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five POSTs whose connections close half-way through their bodies: one client_gone line
    naming the site; the next, a minute later, says how many were left out."""
    path = "/v1/jobs/job-a/rounds/0/secagg/advert"
    head = b"Content-Type: application/json\r\nContent-Length: 400\r\n"
    for _ in range(5):
        server.post(path, head, b'{"sender": 0, "keys', cut=True)
    server.settle()  # each of the five was read until its client left
    said = server.wait_lines("client_gone", 1)
    assert len(said) == 1, said
    assert re.search(rf"event=client_gone path={path} client=client-0 method=POST reason=", said[0])
    assert "repeated" not in said[0]
    monkeypatch.setattr(limits, "LOG_EVERY_S", 0.0)  # a minute later
    server.post(path, head, b"{", cut=True)
    said = server.wait_lines("client_gone", 2)
    assert len(said) == 2 and said[1].endswith(" repeated=4"), said


def test_a_site_whose_bodies_are_refused_again_and_again_is_logged_once_a_minute(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three chunked bodies past the 64 KiB of /join: each answered 413, one body_refused line
    naming the site; the next, a minute later, says how many were left out."""
    chunked = b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    body = b"10000\r\n" + b" " * 0x10000 + b"\r\n1\r\n \r\n0\r\n\r\n"  # 64 KiB + 1
    path = "/v1/jobs/job-a/join"
    for _ in range(3):
        assert server.post(path, chunked, body).startswith(b"HTTP/1.1 413 ")
    server.settle()
    said = server.wait_lines("body_refused", 1)
    assert len(said) == 1, said
    assert re.search(rf"event=body_refused path={path} client=client-0 method=POST status=413 "
                     "code=too_large reason=", said[0]), said
    monkeypatch.setattr(limits, "LOG_EVERY_S", 0.0)  # a minute later
    assert server.post(path, chunked, body).startswith(b"HTTP/1.1 413 ")
    said = server.wait_lines("body_refused", 2)
    assert len(said) == 2 and said[1].endswith(" repeated=2"), said



def _refused_handshake(server: Server, ctx: ssl.SSLContext | None) -> None:
    """One connection the server's TLS refuses: a handshake with ``ctx`` (a context without a
    client certificate), read until the server's alert; or (None) plain HTTP on the TLS port."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        if ctx is None:
            raw.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            _closed_after(raw, CLOSED_WITHIN)
            return
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
                sock.recv(100)  # TLS 1.3: the refusal arrives after the client's handshake
        except (ssl.SSLError, ConnectionError):
            pass


def test_handshakes_refused_again_and_again_are_logged_once_a_minute(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone who reaches the port can be refused by TLS, without a credential: 150 handshakes
    without a client certificate and 50 plain HTTP requests are one tls_refused line each; the
    next of the same, a minute later, says how many were left out."""
    from server_app import tls_identity

    nocert = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    nocert.check_hostname, nocert.verify_mode = False, ssl.CERT_NONE
    for _ in range(150):
        _refused_handshake(server, nocert)
    for _ in range(50):
        _refused_handshake(server, None)
    server.wait_lines("tls_refused", 2)  # the server's loop logs what it refused
    server.settle()  # and ends what the test sent it: no other line comes
    said = server.lines("tls_refused")
    assert len(said) == 2, said[:5]
    assert "reason=PEER_DID_NOT_RETURN_A_CERTIFICATE" in said[0] and "repeated" not in said[0]
    assert "reason=HTTP_REQUEST" in said[1] and "repeated" not in said[1], said
    monkeypatch.setattr(tls_identity, "LOG_EVERY_S", 0.0)  # a minute later
    _refused_handshake(server, nocert)
    said = server.wait_lines("tls_refused", 3)
    assert len(said) == 3 and "reason=PEER_DID_NOT_RETURN_A_CERTIFICATE" in said[2], said
    assert said[2].endswith(" repeated=149"), said
