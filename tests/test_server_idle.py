"""A connection that asks the server nothing is closed; one whose request is being served is
not, nor one whose client reads its answer, however slowly; one whose answers its client does
not read is dropped (server_app/idle.py), on a real uvicorn server on 127.0.0.1 (for answers:
with the server's HTTP protocol and event loop, over TLS and over plain HTTP)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from ports import free_port
from threaded_server import serving

from fedforest_secure.pki import DevPKI

LIMIT = 0.6  # seconds without a request in progress
MB = 1 << 20
#: seconds within which a connection due to be closed or dropped is, on a loaded machine (on a
#: quiet one, between LIMIT and 4/3 of it): a connection held for good fails after it
WITHIN = 10.0


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
        assert _closed_within(sock, WITHIN)


def test_request_headers_that_stop_half_way_are_closed_however_slowly_they_trickle(
        port: int) -> None:
    with _connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        sock.settimeout(0.2)
        closed = False
        while time.monotonic() - started < WITHIN and not closed:
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
        assert _closed_within(sock, WITHIN)


def test_a_connection_busy_with_one_short_request_after_another_stays_open(port: int) -> None:
    """Requests every tenth of the limit on one connection, for three times the limit: the
    server answers every one and never closes it between them."""
    with _connect(port) as sock:
        sock.settimeout(WITHIN)
        started = time.monotonic()
        answered = 0
        # for three times the limit, and 15 requests at least (a loaded machine answers slowly)
        while time.monotonic() - started < 3 * LIMIT or answered < 15:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200"), "the server closed it"
            answered += 1
            time.sleep(LIMIT / 10)


# ---------------------------------------------------------- answers read slowly, or not at all
#: seconds a closed TLS connection waits for its client before it is ended: the event loop's
#: 30 s scaled down as LIMIT is, so that an answer cut by it is cut within the test
TLS_SHUTDOWN_S = LIMIT


def _server_loop() -> asyncio.AbstractEventLoop:
    """The server's event loop (server_app/event_loop.py), its TLS shutdown timeout
    :data:`TLS_SHUTDOWN_S`."""
    from server_app.event_loop import new_event_loop

    loop = new_event_loop()
    create_server = loop.create_server

    async def create_server_with_short_shutdown(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("ssl") is not None:
            kwargs["ssl_shutdown_timeout"] = TLS_SHUTDOWN_S
        return await create_server(*args, **kwargs)

    loop.create_server = create_server_with_short_shutdown  # type: ignore[method-assign]
    return loop


@dataclass
class Served:
    """A server with the server's HTTP protocol and event loop, over TLS or plain HTTP."""

    server: Any  # uvicorn's
    port: int
    tls: ssl.SSLContext | None  # a client's TLS context; None over plain HTTP

    def connect(self, receive_buffer: int) -> socket.socket:
        """A connection whose client takes at most ``receive_buffer`` bytes it has not read."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", self.port))
        if self.tls is None:
            return sock
        return self.tls.wrap_socket(sock, server_hostname="127.0.0.1")

    def connections(self) -> int:
        """The connections the server holds (uvicorn's count: made and not lost)."""
        return len(self.server.server_state.connections)

    def wait_for_connection(self) -> None:
        """Until the server has the connection (over TLS, its handshake ends on its side)."""
        deadline = time.monotonic() + WITHIN
        while not self.connections():
            assert time.monotonic() < deadline, "the server never had the connection"
            time.sleep(0.01)


@pytest.fixture(params=["tls", "plain"])
def served(request: pytest.FixtureRequest, dev_pki: DevPKI) -> Iterator[Served]:
    """The server's HTTP protocol (head limit, idle limit), event loop and keep-alive timeout
    (the idle limit), over TLS or over plain HTTP (as with --insecure-dev)."""
    import uvicorn

    from server_app.head_limit import http_protocol
    from server_app.idle import protocol_with_idle_limit

    over_tls = request.param == "tls"
    chosen = free_port()
    config = uvicorn.Config(_app, host="127.0.0.1", port=chosen, log_level="warning",
                            http=protocol_with_idle_limit(http_protocol(), LIMIT),
                            timeout_keep_alive=LIMIT, lifespan="off", loop=_server_loop,
                            ssl_certfile=str(dev_pki.server_cert) if over_tls else None,
                            ssl_keyfile=str(dev_pki.server_key) if over_tls else None)
    ctx = ssl.create_default_context(cafile=str(dev_pki.ca_cert)) if over_tls else None
    with serving(config) as server:
        yield Served(server, chosen, ctx)


def _read_all(sock: socket.socket) -> int:
    """The bytes ``sock`` receives until the server ends or drops the connection."""
    got = 0
    try:
        while part := sock.recv(1 << 16):
            got += len(part)
    except (ConnectionResetError, ssl.SSLError):
        pass
    return got


def _read_body_slowly(sock: socket.socket, size: int, seconds: float) -> int:
    """The body bytes of an answer of ``size`` bytes that ``sock`` receives, read at a steady
    rate that takes about ``seconds`` for the whole, until the server ends or drops the
    connection."""
    head = b""
    while b"\r\n\r\n" not in head:
        part = sock.recv(4096)
        assert part, "the server closed the connection before its answer"
        head += part
    head, body = head.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200"), head
    got = len(body)
    try:
        while got < size and (part := sock.recv(1 << 16)):
            got += len(part)
            time.sleep(seconds * len(part) / size)
    except (ConnectionResetError, ssl.SSLError):
        pass
    return got


def _ask(sock: socket.socket) -> bytes:
    """The start of the answer to ``GET /`` on ``sock``; b"" if the server closed it."""
    try:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        return sock.recv(4096)
    except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
        return b""


def test_a_large_answer_read_slowly_arrives_whole_and_its_connection_serves_on(
        served: Served) -> None:
    """A client that reads an answer of 16 MiB steadily over about five times the limit (its
    receive buffer small: the server has most of the answer still to send when the idle limit,
    and uvicorn's keep-alive timeout, pass after the answer was written) gets all of it, and
    the answer to its next request on the connection: its client reading is not idling, nor
    stalling."""
    size = 16 * MB
    with served.connect(receive_buffer=1 << 16) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /big?16 HTTP/1.1\r\nHost: x\r\n\r\n")
        got = _read_body_slowly(sock, size, 5 * LIMIT)
        assert got == size, f"the server ended the connection after {got} of {size} bytes"
        assert time.monotonic() - started > 3 * LIMIT, "read faster than the test means to"
        assert _ask(sock).startswith(b"HTTP/1.1 200"), "the server closed the connection"


@pytest.mark.parametrize("connection", [b"keep-alive", b"close"])
def test_a_connection_whose_answer_is_not_read_is_dropped_after_the_limit(
        served: Served, connection: bytes) -> None:
    """A client that asks for 16 MiB and reads nothing: its peer takes no byte once the buffers
    are full, and the server drops the connection after the limit, not before (between the
    limit and about 4/3 of it on a quiet machine; the test waits up to WITHIN for a loaded
    one: without the drop, the connection would be held as long as its client keeps it), closing
    after the answer (``Connection: close``: over plain HTTP the transport's close waits for
    its buffer to be sent) or not."""
    with served.connect(receive_buffer=4096) as sock:
        served.wait_for_connection()
        asked = time.monotonic()
        sock.sendall(b"GET /big?16 HTTP/1.1\r\nHost: x\r\nConnection: " + connection
                     + b"\r\n\r\n")
        while served.connections() and time.monotonic() < asked + WITHIN:
            time.sleep(0.01)
        took = time.monotonic() - asked
        assert served.connections() == 0, f"the server still holds the connection ({took:.1f} s)"
        assert took > 0.9 * LIMIT, f"dropped after {took:.2f} s, before the limit"
        assert _read_all(sock) < 16 * MB  # what was not sent is dropped


def test_a_connection_whose_pipelined_answers_are_not_read_is_dropped(served: Served) -> None:
    """Three answers of 4 MiB asked at once, none read: the server's writes wait behind the
    first, the third request stays in progress, and the server drops the connection after the
    limit all the same."""
    with served.connect(receive_buffer=4096) as sock:
        served.wait_for_connection()
        asked = time.monotonic()
        sock.sendall(b"GET /big?4 HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        while served.connections() and time.monotonic() < asked + WITHIN:
            time.sleep(0.01)
        took = time.monotonic() - asked
        assert served.connections() == 0, f"the server still holds the connection ({took:.1f} s)"
        assert _read_all(sock) < 3 * 4 * MB  # what was not sent is dropped
