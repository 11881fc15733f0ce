"""The server's log: one line per event, ``key=value`` fields, UTC timestamps::

    2024-05-01T12:00:00Z INFO fedforest-server event=join job=heart-2024 client=cleveland index=0

Events: ``startup``, ``shutdown``, ``job_started``, ``join``, ``declined``, ``round`` (a round
closed), ``drop``, ``client_gone`` (a site's connection closed before its body was
complete), ``body_refused`` (a body that stalled past the body timeout, or too large), both
naming the site (``client``), ``too_many_requests`` (a site past its requests in progress at
once), ``auth_refused`` (a request with an unknown or revoked token, or a token over another
site's certificate: both names) (these four, repeated with the same fields, once a minute:
:class:`~server_app.limits.TransportLimits`), ``job_done``, ``job_failed``, ``resume``, ``error`` (a
request failed), ``close_error`` (closing a round failed: the job stops),
``database_unavailable`` and ``database_available`` (an outage of the server's database began;
it answers again, and the open rounds' deadlines run again from then), ``server_stalled``
(the process did not run for a while: the open rounds' deadlines run again from then),
``lease_lost`` (another server took the database over: this one stops),
``lease_not_returned`` (stopped while the database was down), ``tls_refused`` (the same OpenSSL
reason and detail once a minute: :mod:`server_app.tls_identity`), ``tls_warning`` (at start-up:
a ``[tls]`` file that may be wrong, e.g. a certificate that does not name the configured host),
``config_warning`` (at start-up: server.toml gives a database password and other users, or its
group, can read it), ``shutdown_timeout`` (uvicorn's graceful stop ran out of time),
``corrupt_shares`` (a secure round's unmasking routed around corrupt shares: ``report`` names
their senders), ``spool_write_failed`` (a masked upload could not be written to the spool:
``error`` names the file and the cause, e.g. a full disk; the site got a 503 and sends it
again), ``spool_stray`` (once per entry: something in the spool directory that is not a job's
folder, left alone).

Values holding a space, ``"`` or ``=``, or a character that is not printable, are quoted; inside
the quotes ``\\`` and ``"`` are escaped with a backslash, and each character that is not printable
is written as Python writes it in a string (``\\r``, ``\\n``, ``\\x1b``, ``\\u2028``). Every line
is so one event of plain text, whatever a client sent (a request's path, a reason): a line
break, a terminal escape sequence or a made-up field of a client stays inside its value.

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
import math
import threading
import time
from typing import Any

from fedforest_secure.printable import printable

__all__ = ["REPEAT_EVERY_S", "OncePer", "configure", "event", "fields"]

#: seconds between two log lines of the same event that anyone can repeat (:class:`OncePer`)
REPEAT_EVERY_S = 60.0

LOGGER = "fedforest.server"
_log = logging.getLogger(LOGGER)


def _value(v: object) -> str:
    """A field's value: as it is if it is printable and holds no space, ``"`` or ``=``; else
    quoted, with ``\\`` and ``"`` escaped by a backslash and the characters that are not
    printable by :func:`~fedforest_secure.printable.printable`."""
    if isinstance(v, float):
        text = f"{v:.3f}".rstrip("0").rstrip(".")
    else:
        text = str(v)
    if not text or not text.isprintable() or any(c in ' "=' for c in text):
        return '"' + printable(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'
    return text


def fields(**kv: object) -> str:
    """``k1=v1 k2=v2`` (None values left out)."""
    return " ".join(f"{k}={_value(v)}" for k, v in kv.items() if v is not None)


def event(name: str, severity: int = logging.INFO, /, *, exc: BaseException | None = None,
          **kv: object) -> None:
    """Log one event line (with ``exc``'s traceback on the same line, ``|``-separated); the
    fields may use any name (``level=`` is the tree level, not a logging level)."""
    _log.log(severity, "%s", fields(event=name, **kv), exc_info=exc)


class OncePer:
    """Log an event at most once per ``every_s`` seconds for the same event and fields (what
    anyone can repeat at will: a refused token, a refused TLS handshake); the next line of the
    same event and fields says how many were left out (``repeated``). It remembers at most
    ``most`` events and fields: past that, the half logged longest ago are forgotten."""

    def __init__(self, most: int = 1024) -> None:
        self.most = most
        self._lock = threading.Lock()
        #: when each event and fields was last logged, and how many since were not
        self._logged: dict[tuple[tuple[str, str], ...], tuple[float, int]] = {}

    def __call__(self, name: str, severity: int, every_s: float, /, *,
                 same: dict[str, object], **more: object) -> bool:
        """Log ``event=<name>`` with ``more`` then ``same`` (the fields that make two events
        the same), unless the same was logged less than ``every_s`` ago; True if logged."""
        key = (("", name), *sorted((k, str(v)) for k, v in same.items() if v is not None))
        now = time.monotonic()
        with self._lock:
            last, skipped = self._logged.get(key, (-math.inf, 0))
            if now - last < every_s:
                self._logged[key] = (last, skipped + 1)
                return False
            if len(self._logged) >= self.most:  # bounded whatever the fields: the oldest go
                for old in sorted(self._logged, key=lambda k: self._logged[k][0])[
                        :max(1, self.most // 2)]:
                    del self._logged[old]
            self._logged[key] = (now, 0)
        said: dict[str, Any] = {**more, **same}
        if skipped:
            said["repeated"] = skipped
        event(name, severity, **said)
        return True

    def __len__(self) -> int:
        return len(self._logged)


class _Formatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s fedforest-server %(message)s")

    def formatTime(self, record: logging.LogRecord,  # noqa: N802 (logging's name)
                   datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        # one line per event: a traceback stays with its event, its lines joined; what is
        # not printable in it (an exception's message, uvicorn's) escaped
        return printable(text.replace("\n", " | "))


class _ShutdownTimeout(logging.Filter):
    """uvicorn's ERROR ``Cancel N running task(s), timeout graceful shutdown exceeded`` on a
    SIGTERM whose 5 s ran out (a client that stopped reading kept its connection open): a
    warning event of the clean stop it still is, not an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and isinstance(record.msg, str) \
                and "timeout graceful shutdown exceeded" in record.msg:
            tasks = record.args[0] if isinstance(record.args, tuple) and record.args else None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = "%s", (fields(
                event="shutdown_timeout", requests_cut=tasks,
                detail="connections still open 5 s after SIGTERM were closed (a client that "
                       "stopped reading)"),)
        return True


def configure(level: int = logging.INFO) -> None:
    """Send the server's events (and uvicorn's warnings) to stderr, one line each."""
    handler = logging.StreamHandler()
    handler.setFormatter(_Formatter())
    for name in (LOGGER, "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level if name == LOGGER else logging.WARNING)
        logger.propagate = False
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _ShutdownTimeout) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(_ShutdownTimeout())
