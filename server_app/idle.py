"""Connections that hold the server without asking it anything are closed.

uvicorn closes a keep-alive connection that stays idle after a response, but not one that
never sends a request, nor one whose request headers stop half-way: a site could hold as many
of either as the process has file descriptors, and lock the other sites out. The protocol
:func:`protocol_with_idle_limit` closes a connection on which no request has begun or
been in progress for ``seconds`` (none since it was made, or headers stopped half-way), however
slowly its bytes trickle in; a connection busy with one short request after another stays. A
request whose headers are complete is the app's: its body has the transport layer's body
timeout (:class:`~server_app.limits.TransportLimits`), its handler as long as it needs.

A client that asks and never reads the answers holds its connection too: the answer waits in
the transport's buffer, and the request stays in progress. So a connection whose writes stay
paused for ``seconds`` (the transport's buffer over its high-water mark, and not drained below
its low-water mark since: the transport's ``pause_writing`` and ``resume_writing`` calls) is
aborted, its unsent answers dropped. Under TLS a single large answer, which the TCP transport
takes whole, pauses nothing; an answer the client reads, however long, resumes the writes
each time the client has drained the buffer.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["protocol_with_idle_limit"]


def protocol_with_idle_limit(base: type[Any], seconds: float) -> type[Any]:
    """A subclass of uvicorn's HTTP protocol ``base`` (httptools or h11) that closes a
    connection on which no request has begun or been in progress for ``seconds``, and aborts
    one whose writes have stayed paused for ``seconds`` (looked at every third of it: closed
    between ``seconds`` and 4/3 of it after its last request, or after its writes paused)."""

    class IdleLimitProtocol(base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            #: since when no request has been seen in progress or begun (checked every
            #: third of ``seconds``; each request is a new cycle object)
            self._quiet_since = asyncio.get_running_loop().time()
            self._seen_cycle: Any = None
            #: since when the transport's writes are paused (the client reads nothing); None
            #: while they are not
            self._stalled_since: float | None = None
            self._watch_handle: asyncio.TimerHandle | None = None
            self._schedule_watch()

        def pause_writing(self) -> None:
            super().pause_writing()
            self._stalled_since = asyncio.get_running_loop().time()

        def resume_writing(self) -> None:
            super().resume_writing()
            self._stalled_since = None

        def _schedule_watch(self) -> None:
            self._watch_handle = asyncio.get_running_loop().call_later(seconds / 3, self._watch)

        def _watch(self) -> None:
            transport = self.transport
            if transport is None:
                return
            now = asyncio.get_running_loop().time()
            if self._stalled_since is not None and now - self._stalled_since >= seconds:
                transport.abort()  # its answers cannot be sent: dropped, the descriptor freed
                return
            if transport.is_closing():
                if self._stalled_since is not None:
                    self._schedule_watch()  # its close waits for answers the client may not read
                return
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

        def connection_lost(self, exc: Exception | None) -> None:
            if self._watch_handle is not None:
                self._watch_handle.cancel()
            super().connection_lost(exc)

    IdleLimitProtocol.__name__ = f"IdleLimit{base.__name__}"
    return IdleLimitProtocol
