"""The server serves no WebSocket: a request asking for an upgrade (``Upgrade: websocket``) is an
ordinary HTTP request, authenticated like any other, and its connection is forgotten when it
closes (the connection bookkeeping of server_app.tls_identity and server_app.idle)."""

from __future__ import annotations

import io
import ssl
import threading
import time
from pathlib import Path
from socket import create_connection

import pytest
import uvicorn
from ports import free_port

from fedforest_secure.pki import DevPKI
from server_app import serve
from server_app.serve import run_server
from server_app.settings import ServerSettings, TLSSettings
from server_app.tls_identity import PeerNames

pytestmark = pytest.mark.integration

UPGRADE = (b"GET /v1/me HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer made-up\r\n"
           b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")


def test_an_upgrade_request_is_answered_over_http_and_leaves_no_connection_behind(
        tmp_path: Path, dev_pki: DevPKI, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real server (run_server, mutual TLS, on 127.0.0.1) answers a WebSocket upgrade
    with a made-up token 401, as any request, not 101 or a WebSocket's 403; the connections'
    certificate names (PeerNames) are gone once they close, and the log says nothing of it."""
    names: list[PeerNames] = []

    class Recorded(PeerNames):
        def __init__(self) -> None:
            super().__init__()
            names.append(self)

    servers: list[uvicorn.Server] = []
    real_run = uvicorn.Server.run

    def run(self: uvicorn.Server, sockets: object = None) -> None:
        servers.append(self)
        real_run(self, sockets=sockets)  # type: ignore[arg-type]

    monkeypatch.setattr(serve, "PeerNames", Recorded)
    monkeypatch.setattr(uvicorn.Server, "run", run)
    log = io.StringIO()
    monkeypatch.setattr("sys.stderr", log)
    settings = ServerSettings(host="127.0.0.1", database=f"sqlite:///{tmp_path / 's.db'}",
                              tls=TLSSettings(cert=dev_pki.server_cert, key=dev_pki.server_key,
                                              client_ca=dev_pki.ca_cert))
    port = free_port()
    thread = threading.Thread(target=run_server, args=(settings,), kwargs={"port": port},
                              daemon=True)
    thread.start()
    ctx = ssl.create_default_context(cafile=str(dev_pki.ca_cert))
    ctx.load_cert_chain(dev_pki.client_certs[0], dev_pki.client_keys[0])
    answers: list[bytes] = []
    try:
        deadline = time.monotonic() + 60
        while not (servers and servers[0].started):
            assert thread.is_alive() and time.monotonic() < deadline, log.getvalue()
            time.sleep(0.05)
        for _ in range(5):
            with ctx.wrap_socket(create_connection(("127.0.0.1", port), timeout=10),
                                 server_hostname="127.0.0.1") as sock:
                sock.sendall(UPGRADE)
                answer = b""
                while b"\r\n\r\n" not in answer and (part := sock.recv(4096)):
                    answer += part
                answers.append(answer)
        deadline = time.monotonic() + 10
        while len(names[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if servers:
            servers[0].should_exit = True
        thread.join(30)
    assert all(a.startswith(b"HTTP/1.1 401 ") for a in answers), answers
    assert len(names[0]) == 0
    # one auth_refused line (the next are left out for a minute), no warning of uvicorn's
    events = [line.split(" fedforest-server ", 1)[1].split(" ", 1)[0]
              for line in log.getvalue().splitlines()]
    assert events == ["event=startup", "event=auth_refused", "event=shutdown"], log.getvalue()
