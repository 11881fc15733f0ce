"""How a client reads its server's answers (:mod:`client_app.answers`), against a hostile or
broken server on 127.0.0.1: it asks for them uncompressed and refuses a compressed one (a 1 MB
gzip answer decodes to gigabytes), refuses one longer than its route's limit before reading it
whole (but reads a job's offer and join as long as an evaluation job's models make them), takes
an answer whose bytes have stopped moving for lost within its retry budget (and one not whole
within :meth:`~client_app.transport.Transport.brief`'s seconds) while it reads a slow but
steady one to its end, and says that an answer nested too deeply is malformed instead of
crashing."""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from in_thread import in_thread

from client_app import answers, transport
from client_app.answers import JSON_MAX, AnswerTooLarge
from client_app.transport import ApiRejected, ServerUnreachable, Transport
from fedforest_secure.errors import ProtocolError

#: the tests' margin, in seconds, in place of the client's own
MARGIN = 1.0
#: seconds a test waits for the client before it takes it for hung
HUNG = 30.0

Answer = Callable[[socket.socket, threading.Event], None]


@contextmanager
def _serving(answer: Answer) -> Iterator[tuple[str, list[bytes]]]:
    """An HTTP server on 127.0.0.1 that reads each request's head (recorded in the list it
    yields with its URL) and lets ``answer(conn, closing)`` write the answer's raw bytes."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    heads: list[bytes] = []
    closing = threading.Event()
    conns: list[socket.socket] = []

    def serve(conn: socket.socket) -> None:
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            heads.append(data.split(b"\r\n\r\n", 1)[0])
            answer(conn, closing)
        except OSError:
            return

    def accept() -> None:
        while not closing.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", heads
    finally:
        closing.set()
        for s in [sock, *conns]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def _head(status: str = "200 OK", **headers: str | int) -> bytes:
    lines = [f"HTTP/1.1 {status}", "Content-Type: application/json",
             *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _body(data: bytes, status: str = "200 OK", **headers: str | int) -> Answer:
    def answer(conn: socket.socket, closing: threading.Event) -> None:
        conn.sendall(_head(status, Content_Length=len(data), **headers) + data)
    return answer


def _in_thread(fn: Callable[[], Any], limit: float = HUNG) -> dict[str, Any]:
    return in_thread(fn, limit)


@pytest.fixture
def margin(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(transport, "ANSWER_MARGIN_S", MARGIN, raising=False)
    return MARGIN


def _transport(url: str, budget: float = 300.0) -> Transport:
    return Transport(url, "t", None, insecure_dev=True, retry_budget_s=budget)


def _scaled(tr: Transport) -> Transport:
    """``tr`` whose answers must bring 1 KiB in every second (the client's 60 KiB a minute,
    in a test's seconds)."""
    tr.window_s, tr.window_bytes = 1.0, 1024
    return tr


def test_the_client_asks_for_answers_uncompressed_and_refuses_a_compressed_one() -> None:
    """A gzip answer of 100 KiB that decodes to 100 MiB: the client asked for ``identity``,
    so it refuses the answer undecoded, once (not sent again)."""
    bomb = gzip.compress(bytes(100 << 20))
    with _serving(_body(bomb, Content_Encoding="gzip")) as (url, heads):
        tr = _transport(url)
        try:
            with pytest.raises(AnswerTooLarge) as err:
                tr.get_json("/v1/jobs/job-a/offer")
        finally:
            tr.close()
    assert b"\r\naccept-encoding: identity" in heads[0].lower()
    assert len(heads) == 1
    assert str(err.value) == (
        "GET /v1/jobs/job-a/offer: the server answered with Content-Encoding 'gzip', which "
        "this client does not accept (it asks for identity): refused, not decoded; the "
        "server, or a proxy on the way, compresses answers it was asked not to")


def test_an_answer_that_announces_more_than_its_route_takes_is_refused_unread() -> None:
    with _serving(_body(b" " * (JSON_MAX + 1))) as (url, heads):
        tr = _transport(url)
        try:
            with pytest.raises(AnswerTooLarge) as err:
                tr.get_json("/v1/jobs/job-a")
        finally:
            tr.close()
    assert len(heads) == 1
    assert str(err.value) == (
        f"GET /v1/jobs/job-a: the server's answer announces {JSON_MAX + 1} bytes; this client "
        "reads at most 16 MiB of it: refused (a server that sends more is broken or hostile; "
        "its operator can tell which)")


def test_an_answer_of_no_announced_length_is_cut_at_its_route_limit() -> None:
    """A chunked answer (no Content-Length) goes on past the limit: the client stops reading
    it there. A task may be larger than a JSON answer: its route reads it whole."""
    part = b" " * (1 << 20)

    def chunked(conn: socket.socket, closing: threading.Event) -> None:
        conn.sendall(_head(Transfer_Encoding="chunked"))
        for _ in range(20):
            conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        conn.sendall(b"0\r\n\r\n")

    with _serving(chunked) as (url, heads):
        tr = _transport(url)
        try:
            with pytest.raises(AnswerTooLarge, match=r"^GET /v1/jobs/job-a: the server's "
                               r"answer goes on past it; this client reads at most 16 MiB"):
                tr.get_json("/v1/jobs/job-a")
            task = tr.request("GET", "/v1/jobs/job-a/task", limit=32 << 20)
        finally:
            tr.close()
    assert len(task.content) == 20 << 20


@pytest.mark.parametrize(("method", "route"), [("GET", "offer"), ("POST", "join")])
def test_an_evaluation_jobs_offer_and_join_are_read_beyond_the_json_limit(
        method: str, route: str) -> None:
    """An evaluation job's offer and join carry the text of every model it scores: 17 MiB
    of them are read (up to 16 models of a model download's limit each)."""
    text = "n" * (17 << 20)
    answer = b'{"config": {"evaluation": {"model_texts": ["%s"]}}}' % text.encode()
    with _serving(_body(answer)) as (url, heads):
        tr = _transport(url)
        try:
            path = f"/v1/jobs/job-a/{route}"
            got = tr.get_json(path) if method == "GET" else tr.post_json(path, {})
        finally:
            tr.close()
    assert got["config"]["evaluation"]["model_texts"] == [text]
    assert len(heads) == 1
    assert answers.OFFER_MAX == (16 << 20) + 16 * 2 * (1 << 31)


def _drip(every: float) -> Answer:
    """An answer that announces 1,000 bytes and sends one every ``every`` seconds."""
    def answer(conn: socket.socket, closing: threading.Event) -> None:
        conn.sendall(_head(Content_Length=1000))
        while not closing.wait(every):
            conn.sendall(b" ")
    return answer


def test_an_answer_whose_bytes_trickle_in_is_taken_for_lost_within_the_retry_budget(
        margin: float) -> None:
    """Each byte comes well within the read timeout, so the connection is never silent for
    long; the body as a whole comes far slower than the client waits for: the attempt is
    lost, the request goes again, and the budget ends it with what happened."""
    with _serving(_drip(0.3)) as (url, heads):
        tr = _scaled(_transport(url, budget=2.0))
        try:
            out = _in_thread(lambda: tr.get_json("/v1/jobs/job-a/offer"))
        finally:
            tr.close()
    err = out.get("error")
    assert isinstance(err, ServerUnreachable), out
    assert err.failure.startswith(
        f"GET /v1/jobs/job-a/offer: no answer from the server at {url} reached this client "
        "within 2s (the answer stopped moving: ")
    assert len(heads) >= 2  # sent again after the first was taken for lost
    assert out["took"] < 2.0 + 2 * (MARGIN + 1.0) + 5.0  # a loaded machine's seconds


def test_a_brief_request_whose_answer_trickles_in_gives_up_within_its_seconds() -> None:
    with _serving(_drip(0.3)) as (url, _):
        tr = _transport(url)
        try:
            def ask() -> Any:
                with tr.brief(1.0):
                    return tr.get_json("/v1/jobs/job-a")
            out = _in_thread(ask)
        finally:
            tr.close()
    assert isinstance(out.get("error"), ServerUnreachable), out
    assert out["took"] < 10.0


def test_an_answer_that_comes_slowly_but_steadily_is_read_to_its_end(margin: float) -> None:
    """8 KiB a second for 5 s, far slower than an upload's floor (32 KiB/s) and past the
    attempt's silent time: the body never stops moving, so it is read whole, in one
    request."""
    data = b" " * (40 << 10)

    def steady(conn: socket.socket, closing: threading.Event) -> None:
        conn.sendall(_head(Content_Length=len(data)))
        for i in range(0, len(data), 512):
            if closing.wait(1 / 16):
                return
            conn.sendall(data[i:i + 512])

    with _serving(steady) as (url, heads):
        tr = _scaled(_transport(url, budget=2.0))
        try:
            out = _in_thread(lambda: tr.request("GET", "/v1/jobs/job-a/task"))
        finally:
            tr.close()
    assert "value" in out, out
    assert out["value"].content == data
    assert len(heads) == 1


@pytest.mark.parametrize("status", ["200 OK", "400 Bad Request"])
def test_an_answer_nested_too_deeply_is_a_malformed_answer_not_a_crash(status: str) -> None:
    nested = b"[" * 200_000 + b"]" * 200_000
    with _serving(_body(nested, status)) as (url, _):
        tr = _transport(url)
        try:
            with pytest.raises((ProtocolError, ApiRejected)) as err:
                tr.get_json("/v1/jobs/job-a/offer")
        finally:
            tr.close()
    if status.startswith("200"):
        assert str(err.value) == "malformed answer to GET /v1/jobs/job-a/offer: nested too deeply"
    else:  # an error answer's body is read as text
        assert isinstance(err.value, ApiRejected)
        assert str(err.value) == f"400 http_error: {'[' * 200}"
