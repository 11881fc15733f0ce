"""The event loop the server runs: uvloop's (asyncio's where uvloop is not installed), whose TLS
listeners give each connection :data:`TLS_HANDSHAKE_S` seconds to finish its handshake.

Until its handshake ends a connection is not HTTP yet: the server's idle limit
(:mod:`server_app.idle`) does not watch it, and the event loops' default handshake timeout is
60 s, which uvicorn does not let a server set. A party that opens connections and sends nothing
(or half a ClientHello), without a certificate or any TLS work, would hold a descriptor per
connection for that long. uvicorn creates its listeners with ``loop.create_server(...,
ssl=...)``; this loop adds the timeout to every such call that gives ``ssl``.
``uvicorn.Config(loop=LOOP)`` makes uvicorn (0.36 and later) run it: a ``loop`` that names none
of its own is imported and called, without arguments, to make the loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["LOOP", "TLS_HANDSHAKE_S", "new_event_loop"]

#: seconds a connection has to finish its TLS handshake (a site's takes milliseconds; a slow
#: link's a few round trips); then it is closed
TLS_HANDSHAKE_S = 10.0

#: ``uvicorn.Config(loop=...)``: the import string of :func:`new_event_loop`
LOOP = f"{__name__}:new_event_loop"


def _base() -> type[asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:  # uvicorn[standard] brings uvloop: a hand-made install may lack it
        return asyncio.SelectorEventLoop
    return uvloop.Loop


def _handshake_limited(base: type[Any]) -> type[asyncio.AbstractEventLoop]:
    """A subclass of the event loop class ``base`` whose ``create_server`` with ``ssl`` gives
    handshakes :data:`TLS_HANDSHAKE_S` seconds (unless the caller says otherwise)."""

    class HandshakeLimitedLoop(base):  # type: ignore[misc]
        async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
            if kwargs.get("ssl") is not None:
                kwargs.setdefault("ssl_handshake_timeout", TLS_HANDSHAKE_S)
            server: asyncio.Server = await super().create_server(*args, **kwargs)
            return server

    HandshakeLimitedLoop.__name__ = f"HandshakeLimited{base.__name__}"
    return HandshakeLimitedLoop


_LOOP_CLASS = _handshake_limited(_base())


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of the server's kind (module docstring)."""
    return _LOOP_CLASS()
