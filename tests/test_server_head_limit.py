"""A request line and headers past MAX_HEAD_BYTES, and a chunked body's trailer fields or framing
between two chunks past it, get a 431 and the connection is closed before the rest is read; a
request that would wait behind MAX_PIPELINED others on its connection gets a 429 and the
connection is closed (server_app/head_limit.py): on the real server (a process on 127.0.0.1,
TLS with client certificates), and on uvicorn in this process for bodies and pipelining."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from ports import free_port
from threaded_server import serving

from fedforest_cli.simulate import start_server, wait_healthy, write_server_config
from fedforest_secure.pki import init_dev_pki
from server_app.head_limit import MAX_HEAD_BYTES, MAX_PIPELINED

pytestmark = pytest.mark.integration

MB = 1 << 20
Server = tuple[int, ssl.SSLContext]  # the real server's port, a site's TLS context
Opened = list[socket.socket]  # the sockets a test opened
REFUSAL = {"error": "head_too_large",
           "detail": f"the request line and headers take more than {MAX_HEAD_BYTES} bytes, the "
                     "most this server reads: send a shorter URL and fewer or shorter headers"}
TRAILER_REFUSAL = {
    "error": "trailer_too_large",
    "detail": "the chunked body's trailer fields, or its framing between two chunks, take more "
              f"than {MAX_HEAD_BYTES} bytes, the most this server reads: send fewer or shorter "
              "trailer fields and no chunk extensions, or the body with a Content-Length"}
PIPELINE_REFUSAL = {
    "error": "too_many_pipelined",
    "detail": f"more than {MAX_PIPELINED} requests waited on this connection for the answer to "
              "the one before them, the most this server queues: send each request once the "
              "previous one has its answer, or use more connections"}
#: a request for a WebSocket with ~80 KiB of complete headers
BIG_UPGRADE = (b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
               b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(80)) + b"\r\n")


def _chunked(size: int, count: int) -> bytes:
    """A chunked body of ``count`` chunks of ``size`` bytes and a short trailer field."""
    return b"%x\r\n%s\r\n" % (size, b"c" * size) * count + b"0\r\nX-Sum: 1\r\n\r\n"


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


def _refused(conn: Conn, refusal: dict[str, str] = REFUSAL) -> None:
    status, headers, body = conn.response()
    assert (status, headers["connection"], json.loads(body)) == (431, "close", refusal)
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


def test_requests_pipelined_past_the_cap_are_refused_429_and_the_connection_closed(
        server: Server, opened: Opened) -> None:
    """A client with a certificate and no token sends 200 requests at once and reads nothing
    until it has sent them: the one in progress and the MAX_PIPELINED waiting behind it are
    answered, the next one 429, and nothing after it (the server queues no more)."""
    conn = _tls(server, opened)
    conn.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 200)
    for _ in range(1 + MAX_PIPELINED):
        status, _, body = conn.response()
        assert (status, json.loads(body)["status"]) == (200, "ok")
    status, headers, body = conn.response()
    assert (status, headers.get("connection"), json.loads(body)) == (429, "close",
                                                                  PIPELINE_REFUSAL)
    assert conn.closed()


def test_requests_pipelined_up_to_the_cap_are_all_answered_and_the_connection_kept(
        server: Server, opened: Opened) -> None:
    conn = _tls(server, opened)
    for _ in range(2):
        conn.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * (1 + MAX_PIPELINED))
        for _ in range(1 + MAX_PIPELINED):
            status, headers, body = conn.response()
            assert (status, json.loads(body)["status"]) == (200, "ok")
            assert headers.get("connection") != "close"


def test_a_never_ending_trailer_field_ends_the_connection(
        server: Server, opened: Opened) -> None:
    """The 405 to a chunked POST /health comes at once; its trailer field, never ended, ends the
    connection as it passes the limit (the request has its answer: no 431 follows)."""
    conn = _tls(server, opened)
    conn.send(b"POST /health HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"0\r\nX-T: ")
    assert conn.response()[0] == 405
    conn.send(b"a" * MB)
    assert conn.closed()


def test_a_chunked_body_of_many_chunks_and_a_trailer_field_is_read_and_the_connection_kept(
        server: Server, opened: Opened) -> None:
    """20 000 chunks of 100 bytes: their framing (120 000 bytes) is more than the limit, but
    only a few bytes of it lie between two chunks."""
    conn = _tls(server, opened)
    conn.send(b"POST /health HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
              + _chunked(100, 20_000) + b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert conn.response()[0] == 405
    status, _, body = conn.response()
    assert (status, json.loads(body)["status"]) == (200, "ok")


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
    with serving(config):
        yield port


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


def _head_of(size: int) -> bytes:
    """A head of exactly ``size`` bytes: its request line, header fields of 8 bytes with no
    value (``00001:`` and CRLF) and one that takes the rest, the empty line."""
    line, count = b"GET / HTTP/1.1\r\n", (size - 16 - 2 - 9) // 8
    fields = b"".join(b"%05d:\r\n" % i for i in range(count))
    last = b"x:" + b"p" * (size - len(line) - len(fields) - 2 - 4) + b"\r\n"
    head = line + fields + last + b"\r\n"
    assert len(head) == size
    return head


def test_a_head_of_many_fields_is_measured_by_its_bytes(local: int, opened: Opened) -> None:
    conn = _plain(local, opened)
    conn.send(_head_of(MAX_HEAD_BYTES))
    assert conn.response()[::2] == (200, b"0")
    conn = _plain(local, opened)
    conn.send(_head_of(MAX_HEAD_BYTES + 1))
    _refused(conn)


def test_a_never_ending_trailer_field_is_refused_while_the_body_is_read(
        local: int, opened: Opened) -> None:
    conn = _plain(local, opened)
    conn.send(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nhello\r\n0\r\nX-T: " + b"a" * MB)
    _refused(conn, TRAILER_REFUSAL)


def test_a_never_ending_chunk_extension_is_refused(local: int, opened: Opened) -> None:
    conn = _plain(local, opened)
    conn.send(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"5\r\nhello\r\n5;x=" + b"a" * MB)
    _refused(conn, TRAILER_REFUSAL)


def test_chunked_bodies_of_many_chunks_are_read_whole(local: int, opened: Opened) -> None:
    conn = _plain(local, opened)
    for size, count in ((100, 20_000), (64 << 10, 40)):
        conn.send(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                  + _chunked(size, count))
        assert conn.response()[::2] == (200, str(size * count).encode())


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


def _fed(*reads: bytes, until_closed: bool = False) -> _Transport:
    """What the server's protocol, on a transport of its own, writes for ``reads`` received in
    turn, once the apps have run (``until_closed``: and the protocol has closed the transport,
    30 s at most: an app that pauses, on a loaded machine); the protocol reads on even where it
    paused reading (as when an app waits for its client to leave)."""
    import uvicorn
    from uvicorn.server import ServerState

    from server_app.head_limit import http_protocol

    async def run() -> _Transport:
        config = uvicorn.Config(_app, log_level="warning", lifespan="off", log_config=None)
        config.load()
        protocol = http_protocol()(config, ServerState(), {})
        transport = _Transport()
        protocol.connection_made(transport)
        for data in reads:
            protocol.data_received(data)
        for _ in range(10):  # the apps' tasks run, and their responses complete
            await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while until_closed and not transport.closed and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return transport

    return asyncio.run(run())


def _answered_then_refused(transport: _Transport, refusal: dict[str, str]) -> None:
    """``transport`` got a 200 with body ``0``, then the 431 with ``refusal``, and closed."""
    assert transport.closed
    first, refused = transport.out.split(b"HTTP/1.1 431 ", 1)
    assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b"\r\n\r\n0")
    assert json.loads(refused.split(b"\r\n\r\n", 1)[1]) == refusal


def test_headers_past_the_limit_in_one_read_are_refused_in_their_turn() -> None:
    """A request, one whose ~100 KiB of headers and body come in the same read, and one more:
    the first is answered, the second refused, the third not served."""
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(100))
    transport = _fed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n" + many
                     + b"\r\nhelloGET / HTTP/1.1\r\nHost: x\r\n\r\n")
    _answered_then_refused(transport, REFUSAL)


def test_a_websocket_request_with_headers_past_the_limit_is_refused_in_its_turn(
        caplog: pytest.LogCaptureFixture) -> None:
    """A request, then one for a WebSocket whose ~80 KiB of headers come in the same read: the
    first is answered, the second refused (not upgraded), and nothing is logged."""
    uvicorn_log = logging.getLogger("uvicorn.error")  # it does not reach the root logger
    uvicorn_log.addHandler(caplog.handler)
    try:
        transport = _fed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + BIG_UPGRADE)
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    _answered_then_refused(transport, REFUSAL)
    assert not caplog.records


def test_a_refused_trailer_of_a_pipelined_request_waits_for_the_response_before_it() -> None:
    """A request in progress (``/slow``), then a chunked one queued behind it whose trailer
    field passes the limit: the first is answered, then the 431, and the second's app, when it
    runs, finds its client gone."""
    transport = _fed(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\r\nhello\r\n0\r\nX-T: ", *[b"a" * (16 << 10)] * 5, until_closed=True)
    _answered_then_refused(transport, TRAILER_REFUSAL)
