"""The client named in the TLS certificate of each live connection (mutual TLS).

uvicorn does not put the peer certificate into the ASGI scope. :func:`protocol_with_peer_names`
wraps uvicorn's HTTP protocol class: when a connection is made it reads the verified peer
certificate from the TLS layer and records its subject common name under the connection's
remote address (the ``client`` of every request's scope on that connection); the record goes
when the connection is lost. :class:`~server_app.limits.TransportLimits` then requires the
bearer token's client to be that name.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from .logs import REPEAT_EVERY_S, OncePer

__all__ = ["PeerNames", "common_name", "log_refused_handshakes", "protocol_with_peer_names"]


#: seconds between two log lines of the same refused handshake (OpenSSL's reason and detail)
LOG_EVERY_S = REPEAT_EVERY_S


class _LoggedSSLObject(ssl.SSLObject):
    """An :class:`ssl.SSLObject` whose failed handshakes are logged (``event=tls_refused``,
    with OpenSSL's reason): the event loop drops them silently, and the operator needs to know
    that a site's certificate is refused (another CA's, expired, none at all). The same reason
    and detail is logged once per :data:`LOG_EVERY_S`, the next line counting those left out
    (``repeated``): anyone who can reach the port can be refused, as often as they like."""

    refused = OncePer()

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise  # the handshake goes on when more bytes arrive
        except ssl.SSLError as exc:
            self.refused("tls_refused", logging.WARNING, LOG_EVERY_S, same={
                "reason": exc.reason or type(exc).__name__,
                "detail": str(getattr(exc, "verify_message", "") or exc.strerror or exc)})
            raise


def log_refused_handshakes(ctx: ssl.SSLContext) -> None:
    """Make the server context ``ctx`` log the TLS handshakes it refuses (each reason once per
    :data:`LOG_EVERY_S`)."""
    ctx.sslobject_class = type("LoggedSSLObject", (_LoggedSSLObject,), {"refused": OncePer()})


class PeerNames:
    """``(host, port)`` of a live TLS connection -> the common name of its client certificate."""

    def __init__(self) -> None:
        self._names: dict[tuple[str, int], str | None] = {}

    def add(self, addr: tuple[str, int] | None, name: str | None) -> None:
        if addr is not None:
            self._names[addr] = name

    def remove(self, addr: tuple[str, int] | None) -> None:
        if addr is not None:
            self._names.pop(addr, None)

    def name_of(self, addr: tuple[Any, ...] | None) -> str | None:
        """The certificate's common name, or None (no such connection, or no certificate)."""
        if addr is None or len(addr) != 2:
            return None
        return self._names.get((str(addr[0]), int(addr[1])))

    def __len__(self) -> int:
        return len(self._names)


def common_name(cert: Any) -> str | None:
    """The subject common name of a certificate as :meth:`ssl.SSLSocket.getpeercert` gives it."""
    if not isinstance(cert, dict):
        return None
    names = [value for rdn in cert.get("subject", ()) for key, value in rdn
             if key == "commonName"]
    return str(names[0]) if len(names) == 1 else None


def _remote(transport: asyncio.BaseTransport) -> tuple[str, int] | None:
    info = transport.get_extra_info("peername")
    if isinstance(info, list | tuple) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


def protocol_with_peer_names(base: type[Any], names: PeerNames) -> type[Any]:
    """A subclass of uvicorn's HTTP protocol ``base`` that records each peer's certificate name
    in ``names`` for as long as its connection lives."""

    class PeerNameProtocol(base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            ssl_object = transport.get_extra_info("ssl_object")
            cert = ssl_object.getpeercert() if ssl_object is not None else None
            self._peer_addr = _remote(transport)
            names.add(self._peer_addr, common_name(cert))
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            names.remove(getattr(self, "_peer_addr", None))
            super().connection_lost(exc)

    PeerNameProtocol.__name__ = f"PeerName{base.__name__}"
    return PeerNameProtocol
