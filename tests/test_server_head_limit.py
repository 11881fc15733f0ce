"""A request line and headers past MAX_HEAD_BYTES get a 431 and the connection is closed before
the rest is read (server_app/head_limit.py): on the real server (a process on 127.0.0.1, TLS
with client certificates), and on uvicorn in this process for bodies and pipelining."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from ports import free_port

from fedforest_cli.simulate import start_server, wait_healthy, write_server_config
from fedforest_secure.pki import init_dev_pki
from server_app.head_limit import MAX_HEAD_BYTES

pytestmark = pytest.mark.integration

MB = 1 << 20
Server = tuple[int, ssl.SSLContext]  # the real server's port, a site's TLS context
Opened = list[socket.socket]  # the sockets a test opened
REFUSAL = {"error": "head_too_large",
           "detail": f"the request line and headers take more than {MAX_HEAD_BYTES} bytes, the "
                     "most this server reads: send a shorter URL and fewer or shorter headers"}


class Conn:
    """A raw connection to a server that reads whole responses."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(20)  # how long a server that answers nothing is waited for
        self.buf = b""

    def send(self, data: bytes) -> None:
        """Send ``data``; a server that closed the connection meanwhile ends the sending."""
        try:
            for at in range(0, len(data), 1 << 14):
                self.sock.sendall(data[at:at + (1 << 14)])
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):
            pass

    def _more(self) -> bool:
        try:
            got = self.sock.recv(1 << 16)
        except (ConnectionResetError, ssl.SSLEOFError):
            got = b""
        except TimeoutError:
            raise AssertionError("the server answered nothing") from None
        self.buf += got
        return bool(got)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        """The next response: status, headers (lower-case names), body."""
        while b"\r\n\r\n" not in self.buf:
            assert self._more(), f"the connection closed after {self.buf[:200]!r}"
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = dict((k.lower(), v.strip()) for k, v in (ln.split(":", 1) for ln in lines[1:]))
        size = int(headers.get("content-length", "0"))
        while len(self.buf) < size:
            assert self._more(), "the connection closed in a response body"
        body, self.buf = self.buf[:size], self.buf[size:]
        return int(lines[0].split()[1]), headers, body

    def closed(self) -> bool:
        """Whether the server closes the connection (nothing more comes)."""
        return not self.buf and not self._more()


@pytest.fixture()
def opened() -> Iterator[Opened]:
    """The sockets a test opens, closed after it."""
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


def _refused(conn: Conn) -> None:
    status, headers, body = conn.response()
    assert (status, headers["connection"], json.loads(body)) == (431, "close", REFUSAL)
    assert conn.closed()


# ------------------------------------------------------------------ the real server
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``fedforest server`` with mutual TLS; yields its port and a site's TLS context."""
    root = tmp_path_factory.mktemp("head-limit")
    certs = root / "certs"
    init_dev_pki(certs, 1, client_names=["client-0"])
    port = free_port()
    proc = start_server(write_server_config(root, port, certs), root / "server.log")
    try:
        wait_healthy(f"https://127.0.0.1:{port}", certs / "ca.pem", proc, timeout=120.0,
                     cert=certs / "client-0.pem", key=certs / "client-0.key")
        ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        ctx.load_cert_chain(str(certs / "client-0.pem"), str(certs / "client-0.key"))
        yield port, ctx
    finally:
        proc.terminate()
        proc.wait(10)


def _tls(server: Server, opened: Opened) -> Conn:
    port, ctx = server
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    opened.append(sock)
    wrapped = ctx.wrap_socket(sock, server_hostname="127.0.0.1")
    opened.append(wrapped)
    return Conn(wrapped)


def test_a_request_line_of_a_mebibyte_is_refused_before_it_ends(
        server: Server, opened: Opened) -> None:
    conn = _tls(server, opened)
    conn.send(b"GET /health?q=" + b"a" * MB)  # the line never ends: only a 431 can come
    _refused(conn)


def test_a_header_of_a_mebibyte_is_refused_before_it_ends(
        server: Server, opened: Opened) -> None:
    conn = _tls(server, opened)
    conn.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * MB)
    _refused(conn)


def test_complete_headers_past_the_limit_are_refused(
        server: Server, opened: Opened) -> None:
    conn = _tls(server, opened)
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(100))  # ~100 KiB
    conn.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + many + b"\r\n")
    _refused(conn)


def test_a_request_with_a_header_of_a_few_kib_is_served_and_the_connection_kept(
        server: Server, opened: Opened) -> None:
    conn = _tls(server, opened)
    for _ in range(2):
        conn.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Note: " + b"n" * 4000
                  + b"\r\n\r\n")
        status, headers, body = conn.response()
        assert (status, json.loads(body)["status"]) == (200, "ok")
        assert headers.get("connection") != "close"


def test_a_pipelined_request_before_a_refused_head_is_answered_first(
        server: Server, opened: Opened) -> None:
    conn = _tls(server, opened)
    conn.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
              b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * MB)
    status, _, body = conn.response()
    assert (status, json.loads(body)["status"]) == (200, "ok")
    _refused(conn)


# ------------------------------------------------------------------ uvicorn in this process
async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers the number of body bytes it read, after ``/slow`` a pause."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    if scope["path"] == "/slow":
        await asyncio.sleep(0.5)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def local() -> Iterator[int]:
    """uvicorn serving :func:`_app` over plain TCP with the server's HTTP protocol."""
    import uvicorn

    from server_app.head_limit import http_protocol
    from server_app.idle import protocol_with_idle_limit

    port = free_port()
    config = uvicorn.Config(_app, host="127.0.0.1", port=port, log_level="warning",
                            http=protocol_with_idle_limit(http_protocol(), 30), lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def _plain(port: int, opened: Opened) -> Conn:
    opened.append(socket.create_connection(("127.0.0.1", port), timeout=20))
    return Conn(opened[-1])


def test_a_body_sent_with_its_head_does_not_count_towards_the_limit(
        local: int, opened: Opened) -> None:
    conn = _plain(local, opened)
    for _ in range(2):  # the next request's head, after a body, is counted afresh
        conn.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % MB
                  + b"b" * MB)
        assert conn.response()[::2] == (200, str(MB).encode())


def test_pipelined_requests_after_a_body_are_served_in_order(
        local: int, opened: Opened) -> None:
    conn = _plain(local, opened)
    body = b"b" * (200 << 10)
    conn.send(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
              + body + b"GET / HTTP/1.1\r\nHost: x\r\nX-Note: " + b"n" * 4000 + b"\r\n\r\n")
    assert [conn.response()[::2] for _ in range(2)] == [(200, b"204800"), (200, b"0")]


def test_a_refused_head_after_a_request_in_progress_waits_for_its_response(
        local: int, opened: Opened) -> None:
    conn = _plain(local, opened)
    conn.send(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MB)
    assert conn.response()[::2] == (200, b"0")
    _refused(conn)


def test_headers_just_under_the_limit_are_served_and_just_over_it_refused(
        local: int, opened: Opened) -> None:
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: "
    conn = _plain(local, opened)
    conn.send(head + b"a" * (MAX_HEAD_BYTES - 1000) + b"\r\n\r\n")
    assert conn.response()[::2] == (200, b"0")
    conn = _plain(local, opened)
    conn.send(head + b"a" * (MAX_HEAD_BYTES + 1000) + b"\r\n\r\n")
    _refused(conn)


def test_a_refused_head_ends_the_connection_with_its_body_and_the_requests_after_it(
        local: int, opened: Opened) -> None:
    conn = _plain(local, opened)
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(100))  # ~100 KiB
    conn.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n" + many + b"\r\nhello"
              + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    _refused(conn)  # one 431, then the close: the GET after it is not answered


class _Transport(asyncio.Transport):
    """What the protocol writes, and whether it closed."""

    def __init__(self) -> None:
        super().__init__()
        self.out, self.closed = b"", False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_headers_past_the_limit_in_one_read_are_refused_in_their_turn() -> None:
    """A request, one whose ~100 KiB of headers and body come in the same read, and one more:
    the first is answered, the second refused, the third not served."""
    import uvicorn
    from uvicorn.server import ServerState

    from server_app.head_limit import http_protocol

    async def run() -> _Transport:
        config = uvicorn.Config(_app, log_level="warning", lifespan="off")
        config.load()
        protocol = http_protocol()(config, ServerState(), {})
        transport = _Transport()
        protocol.connection_made(transport)
        many = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(100))
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
                               b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n" + many
                               + b"\r\nhelloGET / HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(10):  # the first request's task runs, and its response completes
            await asyncio.sleep(0)
        return transport

    transport = asyncio.run(run())
    assert transport.closed
    first, refusal = transport.out.split(b"HTTP/1.1 431 ", 1)
    assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b"\r\n\r\n0")
    assert json.loads(refusal.split(b"\r\n\r\n", 1)[1]) == REFUSAL
