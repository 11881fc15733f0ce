"""Connections that hold the server without asking it anything, or without taking its answers,
are closed.

uvicorn closes a keep-alive connection that stays idle after a response, but not one that
never sends a request, nor one whose request headers stop half-way: a site could hold as many
of either as the process has file descriptors, and lock the other sites out. The protocol
:func:`protocol_with_idle_limit` closes a connection on which no request has begun or
been in progress for ``seconds`` (none since it was made, or headers stopped half-way), however
slowly its bytes trickle in; a connection busy with one short request after another stays. A
request whose headers are complete is the app's: its body has the transport layer's body
timeout (:class:`~server_app.limits.TransportLimits`), its handler as long as it needs.

An answer is handed to the transport in one write: the request counts as complete at once,
while its bytes may take minutes to reach a slow client. So a connection that still has bytes
to send (in the transport's buffer, and, on Linux, in the socket's kernel send queue, sent or
not: ``TIOCOUTQ``) counts by its peer's progress, not by its requests: it is busy, and neither
this limit nor uvicorn's keep-alive timeout closes it, while its peer acknowledges bytes (on
Linux, ``tcpi_bytes_acked`` of ``TCP_INFO``); it is aborted, what it has not sent dropped,
once it has had bytes to send and none has been acknowledged for ``seconds``: a client that
asks and never reads the answers cannot hold it, its request in progress or not. Once it has
sent everything, the idle limit counts from then. A client that keeps its connection alive
and reads, however slowly, gets the whole answer, over TLS as over plain HTTP. An answer whose
connection closes after it (the request said ``Connection: close``, or HTTP/1.0) is cut over
TLS if it is still being read 30 s after the close began (the event loop's TLS shutdown
timeout).

Where the kernel does not tell (not Linux: no ``TCP_INFO`` or ``TIOCOUTQ``), the bytes to send
are the transport's buffer and progress is that buffer's size changing: over plain HTTP the
same holds; over TLS the buffer of the TCP transport under the TLS layer is not seen, so an
answer counts as sent once the TLS layer has encrypted it: its connection is closed ``seconds``
after it, and its TLS shutdown ends it at most 30 s later (the event loop's shutdown timeout),
the answer cut if it is still being read. A connection whose client reads nothing is dropped
as on Linux over plain HTTP; over TLS its close may wait up to 30 s more.
"""

from __future__ import annotations

import array
import asyncio
import socket
import sys
from typing import Any

__all__ = ["protocol_with_idle_limit"]

try:
    import fcntl
    import termios

    _TIOCOUTQ: int | None = termios.TIOCOUTQ  # bytes in a TCP socket's send queue, not acked
except (ImportError, AttributeError):  # not Linux (or a Unix without it)
    _TIOCOUTQ = None

_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None)
#: where ``tcpi_bytes_acked`` (u64, Linux 4.1 and later) lies in Linux's ``struct tcp_info``
_BYTES_ACKED = slice(120, 128)


def _outgoing(transport: Any) -> tuple[int, int]:
    """The bytes ``transport`` has still to deliver to its peer, and a count that changes as the
    peer takes them: the bytes it has acknowledged (Linux), else the transport's buffer size."""
    buffered: int = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if _TCP_INFO is None or _TIOCOUTQ is None or sock is None:
        return buffered, buffered
    queued = array.array("i", [0])
    try:
        info: bytes = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 192)
        fcntl.ioctl(sock.fileno(), _TIOCOUTQ, queued)
    except (OSError, ValueError):  # not a TCP socket, or already closed
        return buffered, buffered
    if len(info) < _BYTES_ACKED.stop:  # a kernel older than 4.1
        return buffered, buffered
    return buffered + queued[0], int.from_bytes(info[_BYTES_ACKED], sys.byteorder)


def protocol_with_idle_limit(base: type[Any], seconds: float) -> type[Any]:
    """A subclass of uvicorn's HTTP protocol ``base`` (httptools or h11) that closes a
    connection on which no request has begun or been in progress for ``seconds``, and aborts
    one that has had bytes to send and seen none of them taken by its peer for ``seconds``
    (module docstring). It looks every third of ``seconds``: a connection is closed between
    ``seconds`` and 4/3 of it after its last request ended (or its last byte was acknowledged),
    aborted between ``seconds`` and 4/3 of it after its peer last took a byte."""

    class IdleLimitProtocol(base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            now = asyncio.get_running_loop().time()
            #: since when no request has been seen in progress or begun, nor bytes to send
            #: (each request is a new cycle object)
            self._quiet_since = now
            self._seen_cycle: Any = None
            #: the progress count (:func:`_outgoing`) at the last look, and since when it has
            #: not changed while bytes were waiting to be sent
            self._progress: int | None = None
            self._progress_since = now
            self._watch_handle: asyncio.TimerHandle | None = None
            self._schedule_watch()

        def _schedule_watch(self) -> None:
            self._watch_handle = asyncio.get_running_loop().call_later(seconds / 3, self._watch)

        def _watch(self) -> None:
            transport = self.transport
            if transport is None:
                return
            now = asyncio.get_running_loop().time()
            unsent, progress = _outgoing(transport)
            if progress != self._progress or not unsent:
                self._progress, self._progress_since = progress, now
            if unsent:
                if now - self._progress_since >= seconds:
                    transport.abort()  # its client takes nothing: what is unsent is dropped
                    return
                self._quiet_since = now  # sending, its client taking: busy, closing or not
                self._schedule_watch()
                return
            if transport.is_closing():
                return  # everything sent: its close ends it
            cycle: Any = getattr(self, "cycle", None)
            if cycle is not self._seen_cycle or (cycle is not None
                                                 and not cycle.response_complete):
                # a request began since the last look, or one is in progress: the app's
                self._seen_cycle = cycle
                self._quiet_since = now
            elif now - self._quiet_since >= seconds:
                transport.close()  # nothing asked: connection_lost follows
                return
            self._schedule_watch()

        def timeout_keep_alive_handler(self) -> None:
            transport = self.transport
            if transport is not None and _outgoing(transport)[0]:
                return  # still sending its last answer: the watch closes it once it is idle
            super().timeout_keep_alive_handler()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._watch_handle is not None:
                self._watch_handle.cancel()
            super().connection_lost(exc)

    IdleLimitProtocol.__name__ = f"IdleLimit{base.__name__}"
    return IdleLimitProtocol
