"""A request's line and headers take at most :data:`MAX_HEAD_BYTES`, and so do a chunked body's
trailer fields and the framing between two of its chunks; at most :data:`MAX_PIPELINED` requests
wait on one connection.

uvicorn's httptools protocol bounds none of them, and it (with httptools) builds the URL and
each header or trailer field by appending every piece it receives, on the server's only event
loop: one connection sending a long request line, header or trailer field, and never ending it,
would cost time that grows with the square of its size while every other site waits. The
protocol :func:`http_protocol` gives counts, for each request:

* its **head**: the bytes received before its headers are complete. Past the limit it answers
  431 ``head_too_large`` and closes the connection without parsing the rest. A complete head is
  measured itself, by the bytes its request line and header fields take on the wire
  (``name:value`` and CRLF each: the spaces before a value, which the parser drops, are not
  counted), so one that arrived in a single read is refused too;
* its **tail**: the bytes received after its headers that are not body (a chunk's size line and
  the CRLF after its data, the trailer fields), counted afresh from each chunk's start: an
  honest chunked body's framing is a few bytes per chunk, however many chunks it has. Past the
  limit it answers 431 ``trailer_too_large`` (unless the app has begun answering the request:
  then its answer ends the connection) and closes the connection; the app, if it is still
  reading the body, sees the client leave.

It also bounds the requests that wait on one connection (pipelined: sent before the answer to
the one in progress): uvicorn queues each one, with its headers, and reads on after every
answer, so a client that sends request after request and reads no answer would make the server
hold them without limit. Once :data:`MAX_PIPELINED` wait, the next is answered 429
``too_many_pipelined`` (after the answers to those before it) and the connection closed:
nothing after it is served. No site's client pipelines: it sends a request when the previous
one on the connection has its answer.

Both are counted by reads: a read that holds nothing but the current request's head (or tail
and body) counts whole (its body bytes left out); of a read that also holds another request,
or the end of the head and the start of the tail, the request's bytes are left out. So a head
or tail that never ends is refused at most one read past the limit. A refusal waits for the
responses to the requests before it on the connection, which are served; nothing after it is
parsed (under TLS the closing connection discards what still arrives, until the peer ends it or
for 30 s, the event loop's TLS shutdown timeout). No request is upgraded (to a WebSocket): the
server runs without WebSocket support (server_app/serve.py), and a request asking for an
upgrade is answered as any other, without a warning in the log.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

__all__ = ["MAX_HEAD_BYTES", "MAX_PIPELINED", "http_protocol"]

#: the most bytes a request's line and headers may take (h11 allows 16 KiB, nginx 8 KiB per
#: line); a site's requests send a few hundred. Also the most a chunked body's trailer fields,
#: or its framing between two chunks, may take.
MAX_HEAD_BYTES = 64 << 10

#: the most requests that may wait on one connection behind the one in progress (a site's
#: client sends none: it waits for each answer)
MAX_PIPELINED = 8

#: a refusal's status line and JSON body
_Refusal = tuple[bytes, bytes]


def _refusal(status: bytes, error: str, detail: str) -> _Refusal:
    body = json.dumps({"error": error, "detail": detail}).encode()
    return b"HTTP/1.1 " + status + b"\r\n", body


_HEADER_FIELDS_TOO_LARGE = b"431 Request Header Fields Too Large"
_HEAD_TOO_LARGE = _refusal(
    _HEADER_FIELDS_TOO_LARGE, "head_too_large",
    f"the request line and headers take more than {MAX_HEAD_BYTES} bytes, the most this server "
    "reads: send a shorter URL and fewer or shorter headers")
_TRAILER_TOO_LARGE = _refusal(
    _HEADER_FIELDS_TOO_LARGE, "trailer_too_large",
    f"the chunked body's trailer fields, or its framing between two chunks, take more than "
    f"{MAX_HEAD_BYTES} bytes, the most this server reads: send fewer or shorter trailer fields "
    "and no chunk extensions, or the body with a Content-Length")
_TOO_MANY_PIPELINED = _refusal(
    b"429 Too Many Requests", "too_many_pipelined",
    f"more than {MAX_PIPELINED} requests waited on this connection for the answer to the one "
    "before them, the most this server queues: send each request once the previous one has "
    "its answer, or use more connections")


def http_protocol() -> type[asyncio.Protocol]:
    """The HTTP protocol class the server runs: uvicorn's httptools protocol with the limit;
    uvicorn's h11 protocol where httptools is not installed, whose limit the server's
    ``uvicorn.Config(h11_max_incomplete_event_size=MAX_HEAD_BYTES)`` sets (h11 counts a
    trailer section like a head; it stops reading while a request is in progress, so queues
    none)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn[standard] brings httptools: only a hand-made install lacks it
        from uvicorn.protocols.http.h11_impl import H11Protocol
        return type("H11Protocol", (_NoUpgradeWarning, H11Protocol), {})
    return head_limited(HttpToolsProtocol)


class _NoUpgradeWarning:
    """Before uvicorn's HTTP protocol: a request asking for an upgrade logs nothing. The server
    upgrades no connection (``ws="none"``: server_app/serve.py) and answers such a request as
    any other; uvicorn's warnings (the second one about WebSocket libraries to install) would
    be lines that any client adds to the server's log, one per request."""

    def _unsupported_upgrade_warning(self) -> None:
        pass


def head_limited(base: type[Any]) -> type[Any]:
    """A subclass of uvicorn's httptools protocol ``base`` that answers 431 to a request whose
    line and headers, or whose trailer fields or framing between two chunks, take more than
    :data:`MAX_HEAD_BYTES`, and 429 to one that would wait behind :data:`MAX_PIPELINED` others,
    and closes its connection."""

    class HeadLimitProtocol(_NoUpgradeWarning, base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            #: bytes of the current request's head counted so far; None outside a head
            self._head: int | None = None
            #: bytes of the current request's tail counted since its headers or its last
            #: chunk began; None outside a request's body (its body is the app's:
            #: TransportLimits bounds it)
            self._tail: int | None = None
            self._fields = 0  # wire bytes of the current head's complete header fields
            self._begun = 0  # requests begun during the current read
            self._body_read = 0  # body bytes given to the app during the current read
            self._chunk_began = False  # a chunk began during the current read
            self._refused = False  # a request is refused: its refusal is sent or waits its turn
            self._answer: _Refusal | None = None  # the refusal; None: the close alone

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # nothing after a refused request is parsed
            in_head, in_tail = self._head is not None, self._tail is not None
            self._begun, self._body_read, self._chunk_began = 0, 0, False
            super().data_received(data)
            if self._refused or self.transport.is_closing():
                return
            if self._head is not None:  # a head still in progress
                if self._begun == 0 or (self._begun == 1 and not (in_head or in_tail)):
                    self._head += len(data)  # all of this read is the current head's
                if self._head > MAX_HEAD_BYTES:
                    self._refuse(_HEAD_TOO_LARGE)
            elif self._tail is not None and in_tail and self._begun == 0:
                if self._chunk_began:
                    self._tail = 0  # counted afresh: this read's framing and what follows
                self._tail += len(data) - self._body_read  # the rest is the current tail's
                if self._tail > MAX_HEAD_BYTES:
                    self._refuse_request_in_body()

        # parser callbacks: once a request is refused, no request starts and no body is taken
        # (the parser goes on to the end of the read it refused the request in; a pipelined
        # request after it there is not served)
        def on_message_begin(self) -> None:
            if self._refused:
                return
            self._head, self._tail, self._fields = 0, None, 0
            self._begun += 1
            super().on_message_begin()

        def on_header(self, name: bytes, value: bytes) -> None:
            # a field as the parser gives it: the spaces after the colon dropped, those after
            # the value kept. After the headers it is a trailer field, which the tail counts.
            self._fields += len(name) + 1 + len(value) + 2  # ":" and CRLF
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self._refused:
                return
            self._head = None
            # request line ("GET /x HTTP/1.1" and CRLF), header fields, the empty line
            size = (len(self.parser.get_method()) + len(self.url)
                    + len(self.parser.get_http_version()) + 9 + self._fields + 2)
            if size > MAX_HEAD_BYTES:
                self._refuse(_HEAD_TOO_LARGE)
                return
            if len(self.pipeline) >= MAX_PIPELINED:  # this one would wait behind as many
                self._refuse(_TOO_MANY_PIPELINED)
                return
            self._tail = 0
            super().on_headers_complete()

        def on_chunk_header(self) -> None:
            self._chunk_began = True

        def on_body(self, body: bytes) -> None:
            if self._refused:
                return
            self._body_read += len(body)
            super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused:
                return
            self._tail = None
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._refused and not self._responses_pending():
                self._send_refusal()

        def _should_upgrade(self) -> bool:
            return not self._refused and bool(super()._should_upgrade())

        def _responses_pending(self) -> bool:
            """Whether a request before the refused one waits for (the end of) its response
            (a refused request's own app was told that its client left)."""
            cycle = self.cycle
            return bool(self.pipeline) or (cycle is not None and not cycle.response_complete
                                           and not cycle.disconnected)

        def _refuse_request_in_body(self) -> None:
            """Refuse the current request, whose headers were served: its app sees the client
            leave, unless it has begun its answer, which then ends the connection."""
            cycle = self.cycle
            if cycle is None or cycle.response_started:
                self._refuse(None)
                return
            cycle.disconnected = True
            cycle.message_event.set()  # a read of the body waiting for more returns
            self._refuse(_TRAILER_TOO_LARGE)

        def _refuse(self, answer: _Refusal | None) -> None:
            self._refused, self._head, self._tail, self._answer = True, None, None, answer
            if self._responses_pending():
                self.flow.pause_reading()  # the refusal follows the responses before it
            else:
                self._send_refusal()

        def _send_refusal(self) -> None:
            if self.transport.is_closing():
                return
            if self._answer is not None:
                status, body = self._answer
                head = [status]
                head += [name + b": " + value + b"\r\n"
                         for name, value in self.server_state.default_headers]
                head += [b"content-type: application/json\r\n",
                         b"content-length: %d\r\n" % len(body),
                         b"connection: close\r\n\r\n"]
                self.transport.write(b"".join(head) + body)
            self.transport.close()

    HeadLimitProtocol.__name__ = f"HeadLimit{base.__name__}"
    return HeadLimitProtocol
