"""The server's answers to errors: every error a request meets becomes one JSON body
(``{"error": <code>, "detail": <words>}``) with its status, and a bug or a broken deployment
an error line with its traceback in the server's log, never the traceback in the answer."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from fedforest_secure.dburl import sqlite_write_error
from fedforest_secure.errors import UploadRejected
from fedforest_secure.files import os_error_text

from .db import Database
from .errors import ApiError, upload_error
from .lease import LeaseLost
from .limits import DATABASE_UNAVAILABLE, NOT_SERVING
from .logs import event
from .spool import SpoolError

__all__ = ["add_error_handlers"]


def _failure_words(exc: Exception) -> str:
    """What a site reads of an unexpected error: its kind and words (a database error: that
    the database failed, that its disk is full, or an I/O error writing it); a file's error
    names the file."""
    if isinstance(exc, SQLAlchemyError):
        refused = sqlite_write_error(exc)
        if refused is None:
            return "the server's database failed"
        return ("the server's database cannot be written: its disk is full" if refused.full
                else refused.why("the server's database"))
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {os_error_text(exc)[:300]}"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def add_error_handlers(app: FastAPI, db: Database) -> None:
    """The answers of ``app`` (a server on ``db``) to the errors its requests meet."""

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(LeaseLost)
    async def _lease_lost(_req: Request, exc: LeaseLost) -> JSONResponse:
        # the step was rolled back; the lease logged why and stops the server
        return JSONResponse({"error": "not_serving", "detail": NOT_SERVING}, status_code=503)

    @app.exception_handler(SpoolError)
    async def _spool_error(req: Request, exc: SpoolError) -> JSONResponse:
        # the server's disk, not the upload: rolled back, logged (the file, the cause), and
        # the site retries; the spool's path stays in the log
        event("spool_write_failed", logging.ERROR, path=req.url.path, error=str(exc))
        return JSONResponse({"error": "upload_not_stored", "detail": "the server could not "
                             "store the upload (its disk is full, or a write failed); it was "
                             "not counted: send it again later"}, status_code=503)

    @app.exception_handler(UploadRejected)
    async def _upload_rejected(req: Request, exc: UploadRejected) -> JSONResponse:
        return await _api_error(req, upload_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        errs = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        return JSONResponse({"error": "invalid_request", "detail": "the request does not "
                             "validate", "errors": errs}, status_code=422)

    @app.exception_handler(SQLAlchemyError)
    async def _database_error(_req: Request, exc: SQLAlchemyError) -> JSONResponse:
        # an outage of the database (not a bug): the query that met it reported it to
        # Database.on_unreachable, which logs one line when the outage begins; the client
        # gets a 503 and retries, and the log no traceback per request (the probe connects:
        # off the event loop). Any other database error is unexpected: raised on to
        # _unexpected (an error line, the traceback, a 500)
        if await run_in_threadpool(db.unreachable, exc):
            return JSONResponse({"error": "database_unavailable",
                                 "detail": DATABASE_UNAVAILABLE}, status_code=503)
        raise exc

    @app.exception_handler(Exception)
    async def _unexpected(req: Request, exc: Exception) -> JSONResponse:
        # a bug or a broken deployment: the client gets the reason in words (and retries),
        # the server log the traceback; a database error's words (its SQL, the database's
        # address) stay in the log; a full disk is said, with the file where it is known
        said = _failure_words(exc)
        event("error", logging.ERROR, exc=exc, method=req.method, path=req.url.path,
              error=said if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}")
        return JSONResponse({"error": "server_error", "detail": f"the server failed: {said} "
                             "(its log has the traceback)"}, status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": "http_error", "detail": str(exc.detail)},
                            status_code=exc.status_code)
