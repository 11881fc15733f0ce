"""A small adapter between the server and :mod:`fedforest_secure.audit`.

The server records job creation, joins, drops, every round, disclosures and the model digest,
and sends the chain tip (seq and hash) with every task, which clients keep in their
receipts. If the audit module is not installed (or no audit
database is configured) a :class:`NullAudit` keeps the same interface and a genesis head.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

__all__ = ["AuditSink", "NullAudit", "open_audit"]

GENESIS = "0" * 64
_log = logging.getLogger("fedforest.server.audit")


class AuditSink(Protocol):
    def append(self, job_id: str, kind: str, payload: Mapping[str, Any],
               arrays: Mapping[str, np.ndarray] | None = None) -> None: ...

    def head(self, job_id: str) -> str: ...

    def tip(self, job_id: str) -> tuple[int, str]: ...

    def export(self, job_id: str) -> str: ...


class NullAudit:
    """Records nothing; the head stays at genesis."""

    enabled = False

    def append(self, job_id: str, kind: str, payload: Mapping[str, Any],
               arrays: Mapping[str, np.ndarray] | None = None) -> None:
        return None

    def head(self, job_id: str) -> str:
        return GENESIS

    def tip(self, job_id: str) -> tuple[int, str]:
        return 0, GENESIS

    def export(self, job_id: str) -> str:
        return ""

    def close(self) -> None:
        return None


class _AuditLogSink:
    """The server is the only writer of its audit log, so each job's tip is kept in memory
    after the first read and replaced on every append (every task offer sends it)."""

    enabled = True

    def __init__(self, log: Any) -> None:
        self._log = log
        self._tips: dict[str, tuple[int, str]] = {}
        self._mu = threading.Lock()  # an append and a tip read never interleave

    def append(self, job_id: str, kind: str, payload: Mapping[str, Any],
               arrays: Mapping[str, np.ndarray] | None = None) -> None:
        with self._mu:
            self._tips.pop(job_id, None)
            self._log.append(job_id, kind, dict(payload), dict(arrays or {}))

    def head(self, job_id: str) -> str:
        return self.tip(job_id)[1]

    def tip(self, job_id: str) -> tuple[int, str]:
        """``(seq, hash)`` of the job's last entry: sent with every task for client receipts."""
        with self._mu:
            cached = self._tips.get(job_id)
            if cached is None:
                seq, head = self._log.tip(job_id)
                cached = self._tips[job_id] = (int(seq), str(head))
            return cached

    def export(self, job_id: str) -> str:
        """The job's entries as JSON lines (arrays included), as ``fedforest audit export``."""
        import io

        from fedforest_secure.audit import export_jsonl

        buf = io.StringIO()
        export_jsonl(self._log, buf, job_id=job_id)
        return buf.getvalue()

    def close(self) -> None:
        self._log.close()


def open_audit(url: str | None) -> AuditSink:
    """The audit log at ``url`` (SQLAlchemy URL or SQLite path), or a :class:`NullAudit`."""
    if not url:
        return NullAudit()
    try:
        from fedforest_secure.audit import AuditLog
    except ImportError:
        _log.warning("fedforest_secure.audit is not available: audit logging disabled")
        return NullAudit()
    opener = getattr(AuditLog, "open", None)
    log = opener(url) if callable(opener) else AuditLog(url)
    return _AuditLogSink(log)
