"""Connections that hold the server without asking it anything are closed.

uvicorn closes a keep-alive connection that stays idle after a response, but not one that
never sends a request, nor one whose request headers stop half-way: a site could hold as many
of either as the process has file descriptors, and lock the other sites out. The protocol
:func:`protocol_with_idle_limit` makes closes a connection that has had no request in progress
(its headers not yet complete, or no request at all) for ``seconds`` since it was made or since
its last response, however slowly its bytes trickle in. A request whose headers are complete
is the app's: its body has the transport layer's body timeout
(:class:`~server_app.limits.TransportLimits`), its handler as long as it needs.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["protocol_with_idle_limit"]


def protocol_with_idle_limit(base: type[Any], seconds: float) -> type[Any]:
    """A subclass of uvicorn's HTTP protocol ``base`` (httptools or h11) that closes a
    connection with no request in progress for ``seconds`` (checked every third of it)."""

    class IdleLimitProtocol(base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._waiting_since: float | None = asyncio.get_running_loop().time()
            self._watch_handle: asyncio.TimerHandle | None = None
            self._schedule_watch()

        def _schedule_watch(self) -> None:
            self._watch_handle = asyncio.get_running_loop().call_later(seconds / 3, self._watch)

        def _watch(self) -> None:
            transport = self.transport
            if transport is None or transport.is_closing():
                return
            cycle = getattr(self, "cycle", None)
            now = asyncio.get_running_loop().time()
            if cycle is not None and not cycle.response_complete:
                self._waiting_since = None  # a request in progress: the app's
            elif self._waiting_since is None:
                self._waiting_since = now  # its response went out since the last look
            elif now - self._waiting_since >= seconds:
                transport.close()  # nothing asked: connection_lost follows
                return
            self._schedule_watch()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._watch_handle is not None:
                self._watch_handle.cancel()
            super().connection_lost(exc)

    IdleLimitProtocol.__name__ = f"IdleLimit{base.__name__}"
    return IdleLimitProtocol
