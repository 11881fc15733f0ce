"""A connection that asks the server nothing is closed; one whose request is being served is
not (server_app/idle.py), on a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from ports import free_port
from threaded_server import serving

LIMIT = 0.6  # seconds without a request in progress


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":  # a handler that takes longer than the limit
        await asyncio.sleep(3 * LIMIT)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


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
