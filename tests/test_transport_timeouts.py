"""How long one request of a client waits for its server: an attempt waits for the long poll it
asks for plus :data:`~client_app.waits.ANSWER_MARGIN_S` (and for each part of its body to be
taken, as long), then takes the connection for lost and sends the request again, within the
retry budget; a body still moving over a slow link is never cut; a request that never gets an
answer says what happened (its connection went silent, or took none of its body; how often it
was sent)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from in_thread import in_thread

from client_app import transport
from client_app.transport import ServerUnreachable, Transport
from fedforest_secure.pki import DevPKI

#: the tests' margin, in seconds, in place of the client's own
MARGIN = 3.0
#: seconds past its long poll a server answers in time: well within the margin (a loaded
#: machine may be late by a second or two)
LATE = 0.5


@dataclass
class _Server:
    """An HTTP server on 127.0.0.1 that handles its n-th request as ``plan[n]`` says: "silent"
    (read, never answered, its connection kept open), a number (answered after that many
    seconds) or "ok" (answered at once); past the plan, "ok"."""

    plan: list[str | float]
    sock: socket.socket = field(default_factory=socket.socket)
    requests: list[str] = field(default_factory=list)
    conns: list[socket.socket] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def start(self) -> None:
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        while not self.closed.is_set():
            while b"\r\n\r\n" not in data:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                data += chunk
            head, data = data.split(b"\r\n\r\n", 1)
            self.requests.append(head.split(b"\r\n", 1)[0].decode())
            n = len(self.requests) - 1
            what = self.plan[n] if n < len(self.plan) else "ok"
            if what == "silent":
                self.closed.wait()
                return
            if isinstance(what, float):
                time.sleep(what)
            body = b'{"ok": true}'
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        for conn in [self.sock, *self.conns]:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()


@pytest.fixture
def margin(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(transport, "ANSWER_MARGIN_S", MARGIN, raising=False)
    return MARGIN


@contextlib.contextmanager
def _serve(plan: list[str | float]) -> Iterator[_Server]:
    server = _Server(plan)
    server.start()
    try:
        yield server
    finally:
        server.close()




def test_a_request_whose_connection_goes_silent_is_sent_again_after_its_long_poll_and_margin(
        margin: float) -> None:
    """The server took the request and its answer never came (lost on the way): after the
    long poll the request asked for plus the margin, the client sends it again, and the
    second answer is the request's. (The connection's loss costs seconds, not minutes.)"""
    told: list[str] = []
    with _serve(["silent"]) as server:
        tr = Transport(server.url, "t", None, insecure_dev=True, on_wait=told.append)
        try:
            out = in_thread(lambda: tr.request("GET", "/v1/jobs/job-a/task",
                                                params={"wait": 1.0}), 15.0)
        finally:
            tr.close()
        assert "value" in out, out
        assert out["value"].json() == {"ok": True}
        assert len(server.requests) == 2
        assert out["took"] >= 1.0 + margin  # the long poll was given its time
        assert told == [f"waiting for the server at {server.url} (no answer on the "
                        "connection for 4s); retrying for up to 300s",
                        f"the server at {server.url} answers"]


def test_a_long_poll_answered_within_its_wait_and_margin_is_sent_once(margin: float) -> None:
    with _serve([1.0 + LATE]) as server:
        tr = Transport(server.url, "t", None, insecure_dev=True)
        try:
            out = in_thread(lambda: tr.request("GET", "/v1/jobs/job-a/secagg",
                                                params={"wait": 1.0}), 15.0)
        finally:
            tr.close()
        assert "value" in out, out
        assert len(server.requests) == 1


def test_a_step_post_waits_for_its_next_step_and_the_margin(margin: float) -> None:
    """A secure-aggregation POST asks the server for the next step too (``?next_wait=``): its
    answer may take that long, plus the margin."""
    with _serve([1.0 + LATE]) as server:
        tr = Transport(server.url, "t", None, insecure_dev=True, step_wait=1.0)
        try:
            out = in_thread(lambda: tr.request(
                "POST", "/v1/jobs/job-a/rounds/2/secagg/shares", content=b"{}",
                content_type="application/json"), 15.0)
        finally:
            tr.close()
        assert "value" in out, out
        assert server.requests == ["POST /v1/jobs/job-a/rounds/2/secagg/shares?next_wait=1.0"
                                   "&with_task=true HTTP/1.1"]


def test_a_request_never_answered_says_its_connection_went_silent_and_how_often_it_went(
        margin: float) -> None:
    """Every attempt's connection goes silent (the server took each request): within the
    retry budget the request went twice, and the error says that no answer reached the
    client, not that the server did not answer, nor asks whether it runs."""
    with _serve(["silent"] * 10) as server:
        tr = Transport(server.url, "t", None, insecure_dev=True, retry_budget_s=5.0)
        try:
            out = in_thread(lambda: tr.request("POST", "/v1/jobs/job-a/rounds/2/upload",
                                                content=b"x"), 15.0)
        finally:
            tr.close()
        err = out.get("error")
        assert isinstance(err, ServerUnreachable), out
        assert len(server.requests) == 2
        failure = (f"POST /v1/jobs/job-a/rounds/2/upload: no answer from the server at "
                   f"{server.url} reached this client within 5s (no answer on the connection "
                   "for 3s; retried once)")
        assert err.failure == failure
        assert str(err) == (f"{failure}; the request or its answer was lost on the way: a "
                            "firewall, proxy or NAT between this site and the server may drop "
                            "connections, or the server is overloaded or hung (its log says "
                            "whether the request arrived)")


def test_a_body_the_connection_stops_taking_ends_its_attempt_and_the_error_says_so(
        margin: float) -> None:
    """The server takes the request's head and none of its body (more than the kernels at
    both ends queue): after the margin without a part of the body taken, the attempt gives up,
    and the error says that the connection took none of it."""
    with _serve(["silent"] * 10) as server:
        tr = Transport(server.url, "t", None, insecure_dev=True, retry_budget_s=1.0)
        try:
            out = in_thread(lambda: tr.request("POST", "/v1/jobs/job-a/rounds/2/upload",
                                                content=bytes(32 << 20)), 15.0)
        finally:
            tr.close()
        err = out.get("error")
        assert isinstance(err, ServerUnreachable), out
        assert err.failure == (f"POST /v1/jobs/job-a/rounds/2/upload: no answer from the server "
                               f"at {server.url} reached this client within 1s (the connection "
                               "took no part of the request body for 3s; not retried)")

class _SlowReader:
    """A TLS server on 127.0.0.1 that reads a request's body at ``rate`` bytes a second (a
    small receive buffer, so the pace is its own, not the kernel's), then answers 200; it
    records each body's bytes as they arrive (``bodies``, one entry a request)."""

    def __init__(self, pki: DevPKI, rate: int) -> None:
        self.rate, self.bodies = rate, list[int]()
        self._tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._tls.load_cert_chain(pki.server_cert, pki.server_key)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"https://127.0.0.1:{self.sock.getsockname()[1]}"
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        with contextlib.suppress(OSError), self._tls.wrap_socket(raw, server_side=True) as conn:
            data = b""
            while b"\r\n\r\n" not in data:
                part = conn.recv(4096)
                if not part:
                    return
                data += part
            head, data = data.split(b"\r\n\r\n", 1)
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            self.bodies.append(len(data))
            started = time.monotonic()
            while self.bodies[-1] < length and not self.closed.is_set():
                # what the pace allows by now (a TLS record, at most 16 KiB, per recv)
                due = int((time.monotonic() - started) * self.rate) - self.bodies[-1]
                if due <= 0:
                    time.sleep(0.02)
                    continue
                part = conn.recv(min(due, length - self.bodies[-1]))
                if not part:
                    return
                self.bodies[-1] += len(part)
            body = b'{"ok": true}'
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


#: the slow server's pace, and the body it is sent: about 4 s of reading, more than the
#: kernel queues (4 MiB on Linux) and the margin's worth at that pace
RATE, BODY = 4 << 20, 16 << 20


def test_an_upload_over_a_slow_link_is_never_cut_while_its_body_moves(dev_pki: DevPKI) -> None:
    """The server takes the body over TLS more slowly than the margin allows for all of it
    (4 s, the margin 2 s): every part of it still moves, so the attempt goes on until the
    body has arrived and the server has answered; the upload is sent once."""
    server = _SlowReader(dev_pki, RATE)
    tr = Transport(server.url, "t", dev_pki.ca_cert, retry_budget_s=2.0, answer_margin_s=2.0,
                   min_send_rate=RATE / 4)
    try:
        out = in_thread(lambda: tr.request("POST", "/v1/jobs/job-a/rounds/2/upload",
                                            content=b"x" * BODY), 20.0)
    finally:
        tr.close()
        server.close()
    assert "value" in out, out
    assert out["value"].json() == {"ok": True}
    assert server.bodies == [BODY]
