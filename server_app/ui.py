"""The operator page: ``/ui``, read-only, behind an operator token.

``GET /ui`` (and its script and style sheet) carry no data and need no token; the page asks for
the operator's token (``fedforest server add-operator``, an ``ffo_`` token that is never a
client's) and reads ``GET /ui/api/jobs`` with it: every job with its members and their states,
level, round, phase, ETA, and whether the job's audit chain verifies. Nothing on the page can
change anything. The page loads nothing from elsewhere (a strict Content-Security-Policy says
so) and writes every value as text.
"""

from __future__ import annotations

import json
import time
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool

from fedforest_secure.errors import AuditError

from . import __version__
from .audit_hook import AuditSink
from .auth import authenticate_operator
from .db import AuditedJobRow, Database, JobRow, OperatorRow
from .errors import ApiError
from .runtime import ServerState
from .status import job_status

__all__ = ["add_ui"]

_STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript",
           "app.css": "text/css"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src data:; form-action 'none'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_bearer = HTTPBearer(auto_error=False)


async def _operator(request: Request, creds: Annotated[
        HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> OperatorRow:
    if creds is None or creds.scheme.lower() != "bearer":
        raise ApiError(401, "unauthenticated", "send 'Authorization: Bearer <operator token>' "
                       "(fedforest server add-operator)")
    db: Database = request.app.state.db
    row = await run_in_threadpool(authenticate_operator, db, creds.credentials)
    if row is None:
        raise ApiError(401, "unauthenticated", "unknown operator token")
    return row


Operator = Annotated[OperatorRow, Depends(_operator)]


def _static(name: str) -> Response:
    text = resources.files(__package__).joinpath("ui_static", name).read_text(encoding="utf-8")
    return Response(content=text, media_type=_STATIC[name], headers=_HEADERS)


#: seconds a job's verified chain is shown before it is verified again (the page refreshes
#: every 3 s; an entry rewritten in the database leaves the chain's tip as it was)
RECHECK_S = 30.0


class _ChainCache:
    """Each job's chain is verified again when its audit tip moves, or when the last check is
    older than :data:`RECHECK_S`."""

    def __init__(self, audit: AuditSink) -> None:
        self.audit = audit
        self._seen: dict[str, tuple[tuple[int, str] | None, float, dict[str, Any]]] = {}

    def __call__(self, job_id: str, *, began_audited: bool = False,
                 model_digest: str | None = None) -> dict[str, Any]:
        if not self.audit.enabled:
            return {"kept": False, "ok": None, "entries": 0, "problems": []}
        try:
            tip: tuple[int, str] | None = self.audit.tip(job_id)
        except (AuditError, DBAPIError):  # a log changed behind its back: the check names it
            tip = None
        now = time.monotonic()
        hit = self._seen.get(job_id)
        if hit is not None and tip is not None and hit[0] == tip and now - hit[1] < RECHECK_S:
            return hit[2]
        ok, n, problems = self.audit.verify_chain(job_id, began_audited=began_audited,
                                                  model_digest=model_digest)
        out = {"kept": True, "ok": ok, "entries": n, "problems": problems[:5]}
        self._seen[job_id] = (tip, now, out)
        return out


def add_ui(app: FastAPI, db: Database, state: ServerState, audit: AuditSink) -> None:
    """Register ``/ui``, its static files and ``/ui/api/jobs`` on ``app``."""
    chains = _ChainCache(audit)

    def overview() -> dict[str, Any]:
        now = state.core.clock()
        with db.session() as sess:
            rows = list(sess.scalars(select(JobRow).order_by(JobRow.created_at)))
            jobs = [job_status(sess, j, None, now, deadline=state.core.deadlines.of)
                    for j in rows]
            audited = set(sess.scalars(select(AuditedJobRow.job_id)))
        for job, row in zip(jobs, rows, strict=True):
            job["audit"] = chains(job["job_id"], began_audited=row.id in audited,
                                  model_digest=row.model_digest)
        return {"version": __version__, "jobs": jobs}

    @app.get("/ui", include_in_schema=False)
    async def page() -> Response:
        return _static("index.html")

    @app.get("/ui/app.js", include_in_schema=False)
    async def script() -> Response:
        return _static("app.js")

    @app.get("/ui/app.css", include_in_schema=False)
    async def style() -> Response:
        return _static("app.css")

    @app.get("/ui/api/jobs", tags=["operator"])
    async def jobs(_op: Operator) -> Response:
        body = await run_in_threadpool(overview)
        return Response(content=json.dumps(body), media_type="application/json",
                        headers={"Cache-Control": "no-store"})
