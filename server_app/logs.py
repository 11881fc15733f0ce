"""The server's log: one line per event, ``key=value`` fields, UTC timestamps::

    2024-05-01T12:00:00Z INFO fedforest-server event=join job=heart-2024 client=cleveland index=0

Events: ``startup``, ``shutdown``, ``job_started``, ``join``, ``round`` (a round closed),
``drop``, ``job_done``, ``job_failed``, ``resume``, ``error``. Values with spaces are quoted.

A ``round`` line counts the clients whose answers the sum holds (``clients``) and the clients
dropped during the round (``dropped``; one dropped after its masked upload is in both), and
says where the round's time went: ``seconds`` from its issue to its close,
``phase_s`` (secure rounds) how long each phase stayed open, e.g.
``phase_s=advertise:0.002,share:0.420,upload:0.650,sign:0.201,unmask:0.094`` (a phase waits
for its slowest client), and ``close_s`` the server's own step after the last phase: the sum,
the coordinator's next level and the audit records.
"""

from __future__ import annotations

import logging
import time

__all__ = ["configure", "event", "fields"]

LOGGER = "fedforest.server"
_log = logging.getLogger(LOGGER)


def _value(v: object) -> str:
    if isinstance(v, float):
        text = f"{v:.3f}".rstrip("0").rstrip(".")
    else:
        text = str(v)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'
    return text


def fields(**kv: object) -> str:
    """``k1=v1 k2=v2`` (None values left out)."""
    return " ".join(f"{k}={_value(v)}" for k, v in kv.items() if v is not None)


def event(name: str, severity: int = logging.INFO, /, *, exc: BaseException | None = None,
          **kv: object) -> None:
    """Log one event line (with ``exc``'s traceback on the same line, ``|``-separated); the
    fields may use any name (``level=`` is the tree level, not a logging level)."""
    _log.log(severity, "%s", fields(event=name, **kv), exc_info=exc)


class _Formatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s fedforest-server %(message)s")

    def formatTime(self, record: logging.LogRecord,  # noqa: N802 (logging's name)
                   datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        # one line per event: a traceback stays with its event, its lines joined
        return text.replace("\n", " | ")


def configure(level: int = logging.INFO) -> None:
    """Send the server's events (and uvicorn's warnings) to stderr, one line each."""
    handler = logging.StreamHandler()
    handler.setFormatter(_Formatter())
    for name in (LOGGER, "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level if name == LOGGER else logging.WARNING)
        logger.propagate = False
