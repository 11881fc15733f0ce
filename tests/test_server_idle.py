"""A connection that asks the server nothing is closed; one whose request is being served is
not; one whose answers its client does not read is dropped (server_app/idle.py), on a real
uvicorn server on 127.0.0.1 (over TLS, with the server's HTTP protocol and event loop, where
answers go unread)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest
from ports import free_port
from threaded_server import serving

from fedforest_secure.pki import DevPKI

LIMIT = 0.6  # seconds without a request in progress
MB = 1 << 20


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":  # a handler that takes longer than the limit
        await asyncio.sleep(3 * LIMIT)
    body = b"b" * (int(scope["query_string"] or 0) * MB) if scope["path"] == "/big" else b"ok"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def port() -> Iterator[int]:
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from server_app.idle import protocol_with_idle_limit

    chosen = free_port()
    config = uvicorn.Config(_app, host="127.0.0.1", port=chosen, log_level="warning",
                            http=protocol_with_idle_limit(AutoHTTPProtocol, LIMIT),
                            timeout_keep_alive=60, lifespan="off")
    with serving(config):
        yield chosen


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` (an EOF) within ``seconds``."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass  # a response first, then the close
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def test_a_connection_that_never_sends_a_request_is_closed(port: int) -> None:
    with _connect(port) as sock:
        assert _closed_within(sock, 4 * LIMIT)


def test_request_headers_that_stop_half_way_are_closed_however_slowly_they_trickle(
        port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        sock.settimeout(0.2)
        closed = False
        while time.monotonic() - started < 4 * LIMIT and not closed:
            try:
                sock.sendall(b"X-a: b\r\n")  # a byte now and then: not a request yet
                closed = sock.recv(4096) == b""
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        assert closed


def test_a_request_served_for_longer_than_the_limit_is_answered(port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        # and the connection, idle after its response, is closed in its turn
        assert _closed_within(sock, 4 * LIMIT)


def test_a_connection_busy_with_one_short_request_after_another_stays_open(port: int) -> None:
    """Requests every tenth of the limit on one connection, for three times the limit: the
    server answers every one and never closes it between them."""
    with _connect(port) as sock:
        sock.settimeout(5)
        started = time.monotonic()
        answered = 0
        while time.monotonic() - started < 3 * LIMIT:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200"), "the server closed it"
            answered += 1
            time.sleep(LIMIT / 10)
        assert answered >= 15


# ------------------------------------------------------------ answers the client does not read
Tls = tuple[Any, int, ssl.SSLContext]  # the uvicorn server, its port, a client's TLS context


@pytest.fixture
def tls(dev_pki: DevPKI) -> Iterator[Tls]:
    """The server's HTTP protocol (head limit, idle limit) and event loop over TLS."""
    import uvicorn

    from server_app.event_loop import LOOP
    from server_app.head_limit import http_protocol
    from server_app.idle import protocol_with_idle_limit

    chosen = free_port()
    config = uvicorn.Config(_app, host="127.0.0.1", port=chosen, log_level="warning",
                            http=protocol_with_idle_limit(http_protocol(), LIMIT),
                            timeout_keep_alive=60, lifespan="off", loop=LOOP,
                            ssl_certfile=str(dev_pki.server_cert),
                            ssl_keyfile=str(dev_pki.server_key))
    ctx = ssl.create_default_context(cafile=str(dev_pki.ca_cert))
    with serving(config) as server:
        yield server, chosen, ctx


def _tls_connect(tls: Tls, receive_buffer: int | None = None) -> ssl.SSLSocket:
    _, port, ctx = tls
    sock = socket.socket()
    if receive_buffer is not None:  # a client that reads little fills its buffer soon
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return ctx.wrap_socket(sock, server_hostname="127.0.0.1")


def _read_all(sock: ssl.SSLSocket) -> int:
    """The bytes ``sock`` receives until the server ends or drops the connection."""
    got = 0
    try:
        while part := sock.recv(1 << 16):
            got += len(part)
    except (ConnectionResetError, ssl.SSLError):
        pass
    return got


def _connections(server: Any) -> int:
    """The connections the server holds (uvicorn's count: made and not lost)."""
    return len(server.server_state.connections)


def test_a_connection_whose_answers_are_not_read_is_dropped(tls: Tls) -> None:
    """Three answers of 4 MiB asked at once, none read: the writes pause behind the first, the
    third request stays in progress, and the server drops the connection after the limit
    (without it, the connection would be held as long as its client keeps it)."""
    server = tls[0]
    with _tls_connect(tls, receive_buffer=4096) as sock:
        sock.sendall(b"GET /big?4 HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        deadline = time.monotonic() + 5
        while not _connections(server):  # its handshake ends on the server's side
            assert time.monotonic() < deadline, "the server never had the connection"
            time.sleep(0.01)
        deadline = time.monotonic() + 6 * LIMIT
        while _connections(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _connections(server) == 0, "the server still holds the connection"
        assert _read_all(sock) < 3 * 4 * MB  # what was not sent is dropped


def test_a_large_answer_read_slowly_for_longer_than_the_limit_arrives_whole(tls: Tls) -> None:
    """A client that reads an answer of 8 MiB over about four times the limit gets all of it:
    reading, however slowly, is not stalling."""
    server = tls[0]
    with _tls_connect(tls, receive_buffer=1 << 16) as sock:
        sock.sendall(b"GET /big?8 HTTP/1.1\r\nHost: x\r\n\r\n")
        started, got = time.monotonic(), b""
        while b"\r\n\r\n" not in got:
            got += sock.recv(4096)
        head, body = got.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200")
        size = len(body)
        while size < 8 * MB:
            part = sock.recv(1 << 16)
            assert part, f"the server dropped the connection after {size} bytes"
            size += len(part)
            time.sleep(4 * LIMIT * len(part) / (8 * MB))  # about 4 LIMIT for the whole answer
        assert time.monotonic() - started > 2 * LIMIT
        assert _connections(server) == 1  # kept: the client may ask again
