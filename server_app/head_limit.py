"""A request's line and headers take at most :data:`MAX_HEAD_BYTES`.

uvicorn's httptools protocol bounds neither, and it (with httptools) builds the URL and each
header by appending every piece it receives to what it holds, on the server's only event
loop: one connection sending a long request line or header, and never ending it, would cost
time that grows with the square of its size while every other site waits. The protocol
:func:`http_protocol` gives counts the bytes of each request received before its headers are
complete; past the limit it answers 431 and closes the connection without parsing the rest.

Each read that holds nothing but the current request's head counts whole; of a read that also
ends earlier requests (pipelined), the head's bytes are left out. So a head that never ends is
refused at most one read past the limit; a complete head is measured itself (its URL and
headers), so one that arrived in a single read is refused too. A 431 waits for the responses to
the requests before it on the connection, which are served; nothing after it is parsed (under
TLS the closing connection discards what still arrives, until the peer ends it or for 30 s,
the event loop's TLS shutdown timeout).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

__all__ = ["MAX_HEAD_BYTES", "http_protocol"]

#: the most bytes a request's line and headers may take (h11 allows 16 KiB, nginx 8 KiB per
#: line); a site's requests send a few hundred
MAX_HEAD_BYTES = 64 << 10

_BODY = json.dumps({
    "error": "head_too_large",
    "detail": f"the request line and headers take more than {MAX_HEAD_BYTES} bytes, the most "
              "this server reads: send a shorter URL and fewer or shorter headers"}).encode()


def http_protocol() -> type[asyncio.Protocol]:
    """The HTTP protocol class the server runs: uvicorn's httptools protocol with the limit;
    uvicorn's h11 protocol where httptools is not installed, whose limit the server's
    ``uvicorn.Config(h11_max_incomplete_event_size=MAX_HEAD_BYTES)`` sets."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn[standard] brings httptools: only a hand-made install lacks it
        from uvicorn.protocols.http.h11_impl import H11Protocol
        return H11Protocol
    return head_limited(HttpToolsProtocol)


def head_limited(base: type[Any]) -> type[Any]:
    """A subclass of uvicorn's httptools protocol ``base`` that answers 431 to a request whose
    line and headers take more than :data:`MAX_HEAD_BYTES`, and closes its connection."""

    class HeadLimitProtocol(base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            #: bytes of the current request's head counted so far; None when no head is
            #: being received (its body is the app's: TransportLimits bounds it)
            self._head: int | None = None
            self._in_request = False  # a request began and has not ended
            self._begun = 0  # requests begun during the current read
            self._refused = False  # a 431 is sent, or waits for the responses before it

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # nothing after a refused head is parsed
            was_in_request, self._begun = self._in_request, 0
            super().data_received(data)
            if self._head is None or self._refused or self.transport.is_closing():
                return
            if self._begun == 0 or (self._begun == 1 and not was_in_request):
                self._head += len(data)  # all of this read is the current head's
            if self._head > MAX_HEAD_BYTES:
                self._refuse()

        # parser callbacks: once a head is refused, no request starts and no body is taken
        # (the parser goes on to the end of the read it refused the head in; a pipelined
        # request after it there is not served)
        def on_message_begin(self) -> None:
            if self._refused:
                return
            self._in_request, self._head = True, 0
            self._begun += 1
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            if self._refused:
                return
            self._head = None
            size = len(self.url) + sum(len(name) + len(value) + 4  # ": " and CRLF
                                       for name, value in self.headers)
            if size > MAX_HEAD_BYTES:
                self._refuse()
                return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused:
                return
            self._in_request = False
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._refused and not self._responses_pending():
                self._send_refusal()

        def _responses_pending(self) -> bool:
            cycle = self.cycle
            return bool(self.pipeline) or (cycle is not None and not cycle.response_complete)

        def _refuse(self) -> None:
            self._refused, self._head = True, None
            if self._responses_pending():
                self.flow.pause_reading()  # the 431 follows the responses before it
            else:
                self._send_refusal()

        def _send_refusal(self) -> None:
            if self.transport.is_closing():
                return
            head = [b"HTTP/1.1 431 Request Header Fields Too Large\r\n"]
            head += [name + b": " + value + b"\r\n"
                     for name, value in self.server_state.default_headers]
            head += [b"content-type: application/json\r\n",
                     b"content-length: %d\r\n" % len(_BODY), b"connection: close\r\n\r\n"]
            self.transport.write(b"".join(head) + _BODY)
            self.transport.close()

    HeadLimitProtocol.__name__ = f"HeadLimit{base.__name__}"
    return HeadLimitProtocol
