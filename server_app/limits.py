"""Transport limits, enforced before any route reads or parses a request (a pure ASGI layer).

* **Authentication first.** Every ``/v1`` request needs a known bearer token before a byte of
  its body is read: a request without one is a 401 at once, so an unauthenticated client can
  make the server neither read nor allocate anything (FastAPI would otherwise read and parse a
  JSON body before a route's dependencies run).
* **Body size.** Each route has a limit (:class:`BodyLimits`): a ``Content-Length`` above it is
  a 413 before the body is read; a body without one (chunked) is counted as it streams and cut
  off with a 413 as soon as it passes the limit. No buffer is sized from ``Content-Length``.
* **Body read timeout.** Each chunk of a body must arrive within ``body_timeout_s``; a client
  that stalls mid-body gets a 408 and the connection is closed, so a stalled upload holds a
  worker's memory for at most that long.
* **Certificate binding.** Under mutual TLS the token's client must be the client named in the
  TLS certificate of the connection (:mod:`server_app.tls_identity`): a 403 otherwise.
* **Not serving.** Once another server took the database's lease from this one
  (:mod:`server_app.lease`), every request is a 503 ``not_serving`` (:class:`NotServing`):
  this server stops, and the sites retry.

Every refusal is a JSON body ``{"error": code, "detail": ...}`` with ``Connection: close``. The
refusals of a token or of a site past its requests in progress, a body refused, and a body its
client cut short (its connection closed) are logged with the site's name, each once per
:data:`LOG_EVERY_S` for the same event and fields: a client cannot fill the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from .auth import TokenCache, refusal
from .db import ClientRow
from .lease import ServerLease
from .logs import REPEAT_EVERY_S, OncePer
from .tls_identity import PeerNames

__all__ = ["MAX_IN_FLIGHT", "NOT_SERVING", "BodyLimits", "NotServing", "TransportLimits"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_UPLOAD = re.compile(r"^/v1/jobs/[^/]+/rounds/[^/]+/upload$")
_SECAGG = re.compile(r"^/v1/jobs/[^/]+/rounds/[^/]+/secagg/(advert|shares|signature|unmask)$")


@dataclass(frozen=True)
class BodyLimits:
    """Largest request body per kind of route, in bytes."""

    upload: int = 1 << 30        # a masked or plain summable vector (the server setting)
    secagg: int = 4 << 20        # key adverts, share bundles, signatures, unmask responses
    other: int = 64 << 10        # join, refuse and every other route

    def for_path(self, path: str) -> int:
        if _UPLOAD.match(path):
            return self.upload
        if _SECAGG.match(path):
            return self.secagg
        return self.other


#: requests one site may have in progress at once (long polls included): a site runs a few
#: (its loop, its share sender, a second job); beyond this it could hold the server's
#: connections and descriptors for the other sites
MAX_IN_FLIGHT = 32

#: seconds between two log lines of the same refusal (a refused token, a site past its requests
#: in progress at once, a body refused or cut short by its client: the event and its fields)
LOG_EVERY_S = REPEAT_EVERY_S


#: what a request that meets an outage of the server's database is answered (503)
DATABASE_UNAVAILABLE = "the server's database cannot be reached; retry later"


class _Refused(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


async def _refuse(send: Send, status: int, code: str, detail: str) -> None:
    body = json.dumps({"error": code, "detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


#: the 503 of a server whose database another server took over
NOT_SERVING = ("this server no longer serves its database: another server took it over; "
               "retry, and ask the operator which server serves the job now if this goes on")


class NotServing:
    """503 ``not_serving`` to every request once another process took ``lease``."""

    def __init__(self, app: ASGIApp, lease: ServerLease) -> None:
        self.app, self.lease = app, lease

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.lease.lost is not None:
            await _refuse(send, 503, "not_serving", NOT_SERVING)
            return
        await self.app(scope, receive, send)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


class TransportLimits:
    """The ASGI layer in front of the app (module docstring)."""

    def __init__(self, app: ASGIApp, tokens: TokenCache, *, limits: BodyLimits,
                 body_timeout_s: float = 30.0, peer_names: PeerNames | None = None,
                 max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.app = app
        self.tokens = tokens
        self.limits = limits
        self.body_timeout_s = body_timeout_s
        self.peer_names = peer_names
        self.max_in_flight = max_in_flight
        #: requests in progress per site (client row id); on the event loop only
        self._in_flight: dict[int, int] = {}
        #: the refusals' lines: each event and fields once per LOG_EVERY_S
        self._logged = OncePer()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        site: int | None = None
        client: str | None = None  # the token's site; else the certificate's name, if any
        try:
            if path.startswith("/v1/"):
                row = await self._authenticate(scope)
                site, client = int(row.id), str(row.name)
                if self._in_flight.get(site, 0) >= self.max_in_flight:
                    self._log_limited("too_many_requests", scope, client=row.name,
                                      in_flight=str(self.max_in_flight))
                    raise _Refused(429, "too_many_requests", f"this site has "
                                   f"{self.max_in_flight} requests in progress, the most one "
                                   "site may have at once: retry when one has been answered")
            limit = self.limits.for_path(path)
            length = _header(scope, b"content-length")
            if length is not None:
                if not length.isdigit():
                    raise _Refused(400, "bad_request", "Content-Length must be a number")
                if int(length) > limit:
                    raise _Refused(413, "too_large", f"this route takes bodies of at most "
                                   f"{limit} bytes")
        except _Refused as exc:
            await _refuse(send, exc.status, exc.code, exc.detail)
            return
        if client is None:
            client = self._peer(scope)
        state = {"started": False, "refused": False}

        async def guarded_send(message: Message) -> None:
            if state["refused"]:
                return  # the client already has its 413/408: the app's answer is dropped
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        async def refuse_now(exc: _Refused) -> Message:
            # answer at once and tell the app the client is gone: no route parses a body that
            # was cut off (FastAPI would turn any error in its body read into a 400)
            if not state["started"] and not state["refused"]:
                state["refused"] = True
                # logged here with its reason; the route then sees a disconnect, which is not
                # logged again as a connection closed (client_gone)
                self._log_limited("body_refused", scope, client=client,
                                  method=scope.get("method"), status=str(exc.status),
                                  code=exc.code, reason=exc.detail)
                await _refuse(send, exc.status, exc.code, exc.detail)
            return {"type": "http.disconnect"}

        if site is not None:
            self._in_flight[site] = self._in_flight.get(site, 0) + 1
        try:
            await self.app(scope, self._counting(scope, client, receive, limit, refuse_now),
                           guarded_send)
        except Exception:
            if not state["refused"]:
                raise
        finally:
            if site is not None:
                left = self._in_flight.pop(site) - 1
                if left:
                    self._in_flight[site] = left

    def _counting(self, scope: Scope, client: str | None, receive: Receive, limit: int,
                  refuse_now: Callable[[_Refused], Awaitable[Message]]) -> Receive:
        """``receive``, its body's bytes counted against ``limit`` and each chunk's wait against
        the body timeout (a refusal: ``refuse_now``); a connection that closes before the
        body's end is logged (``client_gone``)."""
        seen = 0
        timeout = self.body_timeout_s
        cut = ended = False

        async def counted() -> Message:
            nonlocal seen, cut, ended
            if cut:
                return {"type": "http.disconnect"}
            try:
                async with asyncio.timeout(timeout):
                    message = await receive()
            except TimeoutError:
                cut = True
                return await refuse_now(_Refused(408, "body_timeout", f"no part of the request "
                                                 f"body arrived for {timeout:g} s"))
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                ended = not message.get("more_body", False)
                if seen > limit:
                    cut = True
                    return await refuse_now(_Refused(413, "too_large", f"this route takes "
                                                     f"bodies of at most {limit} bytes"))
            elif message["type"] == "http.disconnect" and not ended:
                ended = True  # the client's failure (a warning, no traceback): said once
                self._log_limited("client_gone", scope, client=client,
                                  method=scope.get("method"),
                                  reason="the connection closed before the body was complete")
            return message

        return counted

    def _log_limited(self, name: str, scope: Scope, **fields: str | None) -> None:
        """``event=<name>`` with the request's path and ``fields``, once per
        :data:`LOG_EVERY_S` for the same event and fields (whatever the path): a client
        repeating a refused request (a made-up token: anyone, without mutual TLS), or one cut
        short, does not fill the log; the next line says how many were left out
        (``repeated``)."""
        self._logged(name, logging.WARNING, LOG_EVERY_S, same=dict(fields),
                     path=scope.get("path"))

    def _peer(self, scope: Scope) -> str | None:
        """The name the connection's client certificate gives (mutual TLS), else None."""
        if self.peer_names is None:
            return None
        client = scope.get("client")
        return self.peer_names.name_of(tuple(client) if client else None)

    async def _authenticate(self, scope: Scope) -> ClientRow:
        """The site (client row) the request's token names; :class:`_Refused` if none does,
        or (mutual TLS) not the connection's certificate's."""
        auth = _header(scope, b"authorization")
        scheme, _, token = (auth or b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _Refused(401, "unauthenticated", "send 'Authorization: Bearer <token>'")
        known, row = self.tokens.lookup(token.strip())  # no I/O: on the event loop
        if not known:
            try:
                row = await run_in_threadpool(self.tokens, token.strip())
            except SQLAlchemyError as exc:
                # an outage (logged once, in one line, by Database.on_unreachable): a 503 the
                # client retries; any other database error is the server's (a 500 and its log)
                if await run_in_threadpool(self.tokens.db.unreachable, exc):
                    raise _Refused(503, "database_unavailable", DATABASE_UNAVAILABLE) from None
                raise
        if row is None:
            self._log_limited("auth_refused", scope, reason="unknown or revoked token",
                              peer=self._peer(scope))
            raise _Refused(401, "unauthenticated", refusal(token.strip()))
        if self.peer_names is not None:
            name = self._peer(scope)
            if name != row.name:
                # a token used over another site's certificate: a leaked token, or a site's
                # files mixed up; the operator reads both names
                self._log_limited("auth_refused", scope, reason="certificate_mismatch",
                                  token_of=row.name, certificate_of=name)
                raise _Refused(403, "certificate_mismatch",
                               "the token belongs to another client than the TLS certificate "
                               "of this connection")
        return row
