"""The FastAPI application: routes, authentication, error mapping, the deadline ticker.

Routes (all under ``/v1`` need ``Authorization: Bearer <token>``):

=======  ===========================================  ==========================================
GET      /health                                      liveness and database (503 if down)
GET      /v1/me                                       who the token belongs to
GET      /v1/jobs                                     the jobs this client is invited to
POST     /v1/jobs/{job}/decline                       {"reason": code}: an invited site will not
                                                      join (its table, schema, pins), until it does
POST     /v1/jobs/{job}/join                          join ({"identity_key": hex}, kept for
                                                      the job; secure jobs need one);
                                                      returns the JobConfig and index
GET      /v1/jobs/{job}                               status, round, members, audit head
GET      /v1/jobs/{job}/directory                     clients' Ed25519 identity keys (relayed)
GET      /v1/jobs/{job}/task?wait=s                   the current task (octet-stream) or 204
GET      /v1/jobs/{job}/secagg?wait=s                 secure rounds: what to send now (JSON)
POST     /v1/jobs/{job}/rounds/{r}/secagg/advert      KeyAdvert (JSON)
POST     /v1/jobs/{job}/rounds/{r}/secagg/shares      ShareBundle (JSON)
POST     /v1/jobs/{job}/rounds/{r}/secagg/signature   SurvivorSignature (JSON): signs U3
POST     /v1/jobs/{job}/rounds/{r}/secagg/unmask      UnmaskResponse (JSON)
POST     /v1/jobs/{job}/rounds/{r}/secagg/refuse      {"reason": code}: a round member refuses
GET      /v1/jobs/{job}/rounds                        every issued round (for client replay)
GET      /v1/jobs/{job}/rounds/{r}/task               the task of round r (octet-stream)
POST     /v1/jobs/{job}/rounds/{r}/upload             the client's vector (octet-stream)
GET      /v1/jobs/{job}/model                         the final model (JSON), members only, with
                                                      the audit tip (X-FedForest-Audit-Seq/Head)
GET      /v1/jobs/{job}/audit                         the job's audit log (JSON lines), members
                                                      only, without the arrays' bytes (their
                                                      digests kept) unless
                                                      audit_arrays_for_sites
=======  ===========================================  ==========================================

``?wait=s`` long-polls: the request returns as soon as something changes for the client (at
most ``s`` <= 30 seconds later), so clients need not poll in a tight loop. The secure-aggregation
POSTs and the upload take ``?next_wait=s``: the response then also carries, under ``"next"``,
what ``GET /secagg?wait=s`` would have answered, which saves a request per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path as FsPath
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from fedforest_secure.errors import InvalidMessage
from fedforest_secure.protocol.api import (
    MAX_WAIT_S,
    NAME_PATTERN,
    DeclineBody,
    Health,
    JoinBody,
    Me,
    RefuseBody,
)
from fedforest_secure.protocol.steps import join_step
from fedforest_secure.secagg.directory import Certification

from . import __version__
from .app_errors import add_error_handlers
from .audit_hook import AuditSink, NullAudit
from .auth import TokenCache, refusal
from .db import ClientRow, Database
from .errors import ApiError
from .lease import LeaseLost, ServerLease
from .limits import (
    BodyLimits,
    NotServing,
    TransportLimits,
)
from .logs import event
from .runtime import ServerState
from .store import running_job_ids
from .tls_identity import PeerNames
from .ui import add_ui

__all__ = ["create_app"]

_T = TypeVar("_T")

OCTET = "application/octet-stream"
JobId = Annotated[str, Path(pattern=NAME_PATTERN)]
RoundId = Annotated[int, Path(ge=0, le=10_000_000)]
Wait = Annotated[float, Query(ge=0.0, le=MAX_WAIT_S)]
JSON_MAX = 4 << 20
#: A long poll re-checks for news (and for a shutdown) at least this often, in seconds.
_POLL_SLICE = 0.5  # secure-aggregation messages are small; bound them


_bearer = HTTPBearer(auto_error=False)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _header_text(text: str) -> str:
    """``text`` as a response header can carry it: control characters (a newline, which
    uvicorn refuses to send) become spaces, and the rest goes as UTF-8, which httpx reads
    back (Starlette writes a header's characters as latin-1 bytes, and fails on any other)."""
    return _CONTROL.sub(" ", text).encode("utf-8").decode("latin-1")


async def _client(request: Request,
                  creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
                  ) -> ClientRow:
    if creds is None or creds.scheme.lower() != "bearer":
        raise ApiError(401, "unauthenticated", "send 'Authorization: Bearer <token>'")
    tokens: TokenCache = request.app.state.tokens
    known, row = tokens.lookup(creds.credentials)  # no I/O: on the event loop
    if not known:
        row = await run_in_threadpool(tokens, creds.credentials)
    if row is None:
        raise ApiError(401, "unauthenticated", refusal(creds.credentials))
    return row


Client = Annotated[ClientRow, Depends(_client)]


def _database_answers(db: Database) -> bool:
    try:
        with db.connect() as conn:
            conn.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        event("database_unavailable", logging.WARNING, error=type(exc).__name__)
        return False
    return True


async def _read_body(request: Request, length: int | None, limit: int) -> bytearray:
    """The request body in one buffer, each chunk copied into it once.

    Uploads run to tens of MB in chunks of 64 KB. Each chunk is appended to one buffer as it
    arrives (no zero-filled buffer allocated ahead, no per-chunk objects kept: a client that
    sends its body a few bytes at a time makes the server hold what it sent and the buffer's
    growth room), so a client that states a length but stalls holds only about what it sent:
    nothing is allocated on the word of a header. A body longer than its
    Content-Length is refused as soon as it is; without a Content-Length, one longer than
    ``limit`` bytes. A client whose connection closes before its body is complete is refused
    (logged as a client's failure, not a server error)."""
    try:
        return await _read_body_chunks(request, length, limit)
    except ClientDisconnect:
        raise _gone() from None


def _gone() -> ApiError:
    """A client whose connection closed before its body was complete: refused, and logged
    by the transport layer as the client's failure (``client_gone``: a warning, no
    traceback). A body that layer refused (stalled, too large) reads as a disconnect too:
    it logged why (``body_refused``)."""
    return ApiError(400, "client_disconnected", "the connection closed before the body was "
                    "complete")


async def _read_body_chunks(request: Request, length: int | None, limit: int) -> bytearray:
    most, too_long = ((limit, ApiError(413, "too_large", f"uploads are at most {limit} bytes"))
                      if length is None else
                      (length, ApiError(400, "malformed_upload", "the body is longer than its "
                                        "Content-Length")))
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > most:
            raise too_long
        body += chunk
    if length is not None and len(body) != length:
        raise ApiError(400, "malformed_upload", "the body is shorter than its Content-Length")
    return body


def create_app(db: Database, audit: AuditSink | None = None, *, tick_seconds: float = 0.5,
               max_upload_bytes: int = 1 << 30, state: ServerState | None = None,
               spool: FsPath | None = None, body_timeout_s: float = 30.0,
               peer_names: PeerNames | None = None,
               stopping: Callable[[], bool] = lambda: False,
               lease: ServerLease | None = None) -> FastAPI:
    """Build the app around a database (and an audit sink); ``spool`` is where masked
    uploads of open secure rounds are kept (default: in the database). ``stopping`` says
    that the server is shutting down: long polls then answer at once. Once another server
    took ``lease`` (the serving process's claim on the database), every request is answered
    503 ``not_serving`` and the deadline ticker stops.

    Every request passes :class:`~server_app.limits.TransportLimits` first: a known token
    before any body is read, a body limit per route (uploads ``max_upload_bytes``), a
    ``body_timeout_s`` between body chunks and, with ``peer_names`` (mutual TLS), the token's
    client bound to the name in the connection's certificate. The upload route then checks
    the member's seat, open round and phase, and caps the body at what that round's upload
    can be (:meth:`~server_app.core.Core.upload_limit`), before it reads the body."""
    st = state or ServerState(db, audit or NullAudit(), spool=spool)

    def lost() -> bool:
        return lease is not None and lease.lost is not None

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async def heartbeat() -> None:
            # on the event loop, apart from the ticks (which may take long): a gap between
            # two beats is time this process did not run (Deadlines.beat)
            while True:
                st.core.deadlines.beat(tick_seconds)
                await asyncio.sleep(tick_seconds)

        async def ticker() -> None:
            while not lost():
                await asyncio.sleep(tick_seconds)
                if lost():
                    return
                try:
                    await run_in_threadpool(st.tick)
                except LeaseLost:  # said once, by the lease; the server is stopping
                    return
                except Exception as exc:  # keep ticking; the failure is logged
                    # an outage of the database (not a bug) was logged in one line when it
                    # began (Deadlines.database_unreachable), not a traceback every tick
                    # (the probe connects: off the event loop)
                    if not await run_in_threadpool(db.unreachable, exc):
                        event("error", logging.ERROR, exc=exc, where="deadline tick",
                              error=f"{type(exc).__name__}: {exc}")

        tasks = [asyncio.create_task(heartbeat()), asyncio.create_task(ticker())]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            try:
                with db.session() as sess:
                    running: int | None = len(running_job_ids(sess))
            except SQLAlchemyError as exc:  # the count is for the log only: stop all the same
                if not db.unreachable(exc):
                    raise
                running = None
            event("shutdown", jobs_running=running,
                  database=None if running is not None else "unreachable")

    # no /docs or /redoc: they load scripts from a CDN into /ui's origin, where the operator's
    # token is kept (sessionStorage); /openapi.json, plain JSON, stays
    app = FastAPI(title="FedForest Secure server", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.server = st
    app.state.db = db
    app.state.tokens = TokenCache(db)
    app.add_middleware(TransportLimits, tokens=app.state.tokens,
                       limits=BodyLimits(upload=max_upload_bytes, secagg=JSON_MAX),
                       body_timeout_s=body_timeout_s, peer_names=peer_names)
    if lease is not None:
        app.add_middleware(NotServing, lease=lease)  # outermost: before anything is read

    add_error_handlers(app, db)

    add_ui(app, db, st, st.core.audit)

    @app.get("/health", response_model=Health, tags=["meta"],
             responses={503: {"model": Health}})
    async def health() -> Response:
        """Liveness with the database: 503 "database unavailable" while it cannot be
        reached (a load balancer or a monitor sees the server cannot serve)."""
        ok = await run_in_threadpool(_database_answers, db)
        return JSONResponse(Health(status="ok" if ok else "database unavailable",
                                   version=__version__).model_dump(),
                            status_code=200 if ok else 503)

    @app.get("/v1/me", response_model=Me, tags=["meta"])
    async def me(c: Client) -> Me:
        return Me(name=c.name)

    @app.get("/v1/jobs", tags=["jobs"])
    async def jobs(c: Client) -> list[dict[str, Any]]:
        return await run_in_threadpool(st.jobs_of, c)

    @app.get("/v1/jobs/{job_id}/offer", tags=["jobs"])
    async def job_offer(job_id: JobId, c: Client) -> dict[str, Any]:
        return await run_in_threadpool(st.job_offer, c, job_id)

    @app.post("/v1/jobs/{job_id}/join", tags=["jobs"])
    async def join(job_id: JobId, c: Client, body: JoinBody | None = None) -> dict[str, Any]:
        key: bytes | None = None
        if body is not None and body.identity_key is not None:
            try:
                key = bytes.fromhex(body.identity_key)
            except ValueError as exc:
                raise ApiError(400, "invalid_identity", "identity_key must be hex") from exc
            if len(key) != 32:
                raise ApiError(400, "invalid_identity", "identity_key must be 32 bytes")
        cert: str | None = None
        if body is not None and body.identity_cert is not None:
            try:
                cert = json.dumps(Certification.from_json(body.identity_cert).to_json())
            except InvalidMessage as exc:
                raise ApiError(400, "invalid_identity", str(exc)) from exc
        def join_if_held() -> dict[str, Any]:
            # the token in the database, not the cache's row: a site revoked (or given a new
            # token) a moment ago joins no job, as `server status` and /ui tell the operator
            if not app.state.tokens.still_holds(c):
                raise ApiError(401, "unauthenticated", "unknown or revoked token")
            return st.join(c, job_id, key, cert)

        return await run_in_threadpool(join_if_held)

    @app.post("/v1/jobs/{job_id}/decline", tags=["jobs"])
    async def decline(job_id: JobId, body: DeclineBody, c: Client) -> dict[str, Any]:
        return await run_in_threadpool(st.decline, c, job_id, body.reason)

    @app.get("/v1/jobs/{job_id}/directory", tags=["secagg"])
    async def directory(job_id: JobId, c: Client) -> dict[str, Any]:
        return await run_in_threadpool(st.directory, c, job_id)

    async def _long_poll(c: ClientRow, fn: Callable[[], _T], is_wait: Callable[[_T], bool],
                         wait: float, surely_waits: Callable[[], bool] | None = None) -> _T:
        """``fn()`` once it is not a wait, or after ``wait`` seconds. ``surely_waits`` (read
        from memory, no query) skips asking ``fn`` while it holds: the generation is taken
        first, so a change after it ends the wait at once. An answer given after waiting
        goes to ``c`` only if it still holds the token its request came with (revoked while
        it waited: 401, as its next request would be)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        waited = False
        while True:
            gen = st.generation
            left = deadline - loop.time()
            if surely_waits is not None and left > 0 and not stopping() and surely_waits():
                waited = True
                await st.wait_change_async(gen, min(left, _POLL_SLICE))
                continue
            out = await run_in_threadpool(fn)
            left = deadline - loop.time()
            if not is_wait(out) or left <= 0 or stopping():
                if waited and not is_wait(out) and not await run_in_threadpool(
                        app.state.tokens.still_holds, c):
                    raise ApiError(401, "unauthenticated", "unknown or revoked token")
                return out  # on shutdown at once: a cancelled request would be a 500
            waited = True
            await st.wait_change_async(gen, min(left, _POLL_SLICE))

    async def _secagg_offer(c: ClientRow, job_id: str, wait: float) -> dict[str, Any]:
        return await _long_poll(c, lambda: st.secagg_offer(c, job_id),
                                lambda o: o.get("status") == "wait", wait,
                                lambda: st.secagg_answered(c, job_id))

    @app.get("/v1/jobs/{job_id}/secagg", tags=["secagg"])
    async def secagg_next(job_id: JobId, c: Client, wait: Wait = 0.0) -> dict[str, Any]:
        return await _secagg_offer(c, job_id, wait)

    async def _json_body(request: Request) -> bytes:
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > JSON_MAX:
                    raise ApiError(413, "too_large", f"messages are at most {JSON_MAX} bytes")
        except ClientDisconnect:
            raise _gone() from None
        return bytes(body)

    for _kind in ("advert", "shares", "signature", "unmask"):
        def _make(kind: str) -> Callable[..., Awaitable[dict[str, Any] | Response]]:
            async def post_secagg(job_id: JobId, round_id: RoundId, request: Request,
                                  c: Client, next_wait: Wait = 0.0, with_task: bool = False
                                  ) -> dict[str, Any] | Response:
                body = await _json_body(request)
                out: dict[str, Any] = await run_in_threadpool(st.secagg_message, c, job_id,
                                                              round_id, kind, body)
                if next_wait > 0:  # answer with the next step too: one request less
                    out["next"] = await _secagg_offer(c, job_id, next_wait)
                return _with_task(out, job_id, round_id) if with_task else out
            post_secagg.__name__ = f"post_secagg_{kind}"
            return post_secagg
        app.post(f"/v1/jobs/{{job_id}}/rounds/{{round_id}}/secagg/{_kind}",
                 tags=["secagg"], response_model=None)(_make(_kind))

    def _with_task(out: dict[str, Any], job_id: str, round_id: int) -> dict[str, Any] | Response:
        """``out`` (a step POST's answer) with the task of its next step after its JSON
        (:mod:`fedforest_secure.protocol.steps`) when that step is a task of another round
        than ``round_id``, the open round's (held in memory); ``out`` as is otherwise."""
        nxt = out.get("next")
        if not isinstance(nxt, dict) or nxt.get("status") != "task" \
                or not isinstance(nxt.get("round_id"), int) or nxt["round_id"] == round_id:
            return out
        task = st.open_task_bytes(job_id, nxt["round_id"])
        if task is None:
            return out
        text = json.dumps(jsonable_encoder(out), ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode()
        content, headers = join_step(text, task)
        return Response(content=content, media_type=OCTET, headers=headers)

    @app.post("/v1/jobs/{job_id}/rounds/{round_id}/secagg/refuse", tags=["secagg"])
    async def refuse(job_id: JobId, round_id: RoundId, body: RefuseBody,
                     c: Client) -> dict[str, Any]:
        return await run_in_threadpool(st.secagg_refuse, c, job_id, round_id, body.reason,
                                       body.accused)

    @app.get("/v1/jobs/{job_id}", tags=["jobs"])
    async def status(job_id: JobId, c: Client) -> dict[str, Any]:
        return await run_in_threadpool(st.status, c, job_id)

    @app.get("/v1/jobs/{job_id}/task", tags=["rounds"],
             responses={200: {"content": {OCTET: {}}}, 204: {"description": "nothing to do"}})
    async def task(job_id: JobId, c: Client, wait: Wait = 0.0) -> Response:
        offer = await _long_poll(c, lambda: st.offer(c, job_id), lambda o: o.status == "wait",
                                 wait)
        headers = {"X-FedForest-Status": offer.status}
        if offer.detail:
            headers["X-FedForest-Detail"] = _header_text(offer.detail[:200])
        if offer.status != "task" or offer.body is None:
            return Response(status_code=204, headers=headers)
        headers.update({
            "X-FedForest-Round": str(offer.round_id),
            "X-FedForest-Task-Digest": str(offer.digest),
            "X-FedForest-Deadline-In": f"{offer.deadline_in:.3f}",
            "X-FedForest-Audit-Head": str(offer.audit_head),
            "X-FedForest-Audit-Seq": str(offer.audit_seq),
            "X-FedForest-Phase": str(offer.phase),
        })
        return Response(content=offer.body, media_type=OCTET, headers=headers)

    @app.get("/v1/jobs/{job_id}/rounds", tags=["rounds"])
    async def rounds(job_id: JobId, c: Client) -> list[dict[str, Any]]:
        return await run_in_threadpool(st.rounds, c, job_id)

    @app.get("/v1/jobs/{job_id}/rounds/{round_id}/task", tags=["rounds"],
             responses={200: {"content": {OCTET: {}}}})
    async def round_task(job_id: JobId, round_id: RoundId, c: Client) -> Response:
        body = await run_in_threadpool(st.task_bytes, c, job_id, round_id)
        return Response(content=body, media_type=OCTET)

    @app.post("/v1/jobs/{job_id}/rounds/{round_id}/upload", tags=["rounds"], response_model=None,
              openapi_extra={"requestBody": {"required": True, "content": {OCTET: {
                  "schema": {"type": "string", "format": "binary"}}}}})
    async def upload(job_id: JobId, round_id: RoundId, request: Request, c: Client,
                     next_wait: Wait = 0.0, with_task: bool = False
                     ) -> dict[str, Any] | Response:
        ctype = request.headers.get("content-type", "")
        if ctype.split(";")[0].strip() != OCTET:
            raise ApiError(415, "unsupported_media_type", f"uploads are {OCTET}")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_upload_bytes):
            raise ApiError(413, "too_large", f"uploads are at most {max_upload_bytes} bytes")
        # before a byte of the body is read: the seat, the open round and its phase, and the
        # size this round's upload can reach (a member cannot make the server buffer more)
        limit = await run_in_threadpool(st.upload_limit, c, job_id, round_id, max_upload_bytes)
        if length is not None and int(length) > limit:
            raise ApiError(413, "too_large", f"an upload for round {round_id} is at most "
                           f"{limit} bytes (its task's vector and disclosures)")
        body = await _read_body(request, None if length is None else int(length), limit)
        out: dict[str, Any] = await run_in_threadpool(st.upload, c, job_id, round_id, body)
        if next_wait > 0:  # secure jobs: the next step of secure aggregation, long-polled
            try:
                out["next"] = await _secagg_offer(c, job_id, next_wait)
            except ApiError:
                pass  # not a secure job: the client asks GET /task as usual
        return _with_task(out, job_id, round_id) if with_task else out

    @app.get("/v1/jobs/{job_id}/audit", tags=["jobs"],
             responses={200: {"content": {"application/x-ndjson": {}}}})
    async def audit_log(job_id: JobId, c: Client) -> Response:
        """The job's audit log for a member: every entry, without the arrays' bytes (each
        entry's digests of them kept, so the chain and the receipts verify), or with them
        where the server sets ``audit_arrays_for_sites``."""
        text = await run_in_threadpool(st.audit_log, c, job_id)
        return Response(content=text, media_type="application/x-ndjson")

    @app.get("/v1/jobs/{job_id}/model", tags=["jobs"])
    async def model(job_id: JobId, c: Client) -> Response:
        text, seq, head = await run_in_threadpool(st.model_and_tip, c, job_id)
        return Response(content=text, media_type="application/json",
                        headers={"X-FedForest-Audit-Seq": str(seq),
                                 "X-FedForest-Audit-Head": head})

    return app
