"""Append-only, hash-chained audit log of every aggregate exchanged in a federated job.

::

    from fedforest_secure.audit import AuditLog, EntryKind, verify_log

    log = AuditLog("sqlite:///audit.db")            # or a path, engine=..., store=..., in_memory()
    head = log.append("job-1", EntryKind.ROUND, payload, {"aggregate": total})
    rec = log.job("job-1"); rec.round(task, uploads=digests, aggregate=total, masked=True)
    report = verify_log(log, receipts_dir="receipts/")   # report.ok, report.problems

Each job is its own chain of entries ``seq = 1..n``; entry hashes are
``SHA-256(prev_hash (32 raw bytes) || canonical JSON body)`` with a genesis ``prev_hash`` of 64
zeros. :mod:`fedforest_secure.audit.entry` fixes the byte format precisely, so anyone can verify a
log (or an export) independently; :mod:`~fedforest_secure.audit.kinds` lists each kind's payload;
:mod:`~fedforest_secure.audit.receipts` describes what clients keep to detect a rewritten log.
The log stores through an :class:`~fedforest_secure.audit.store.AuditStore`; SQLAlchemy is used
only by its default store, :mod:`fedforest_secure.audit._sql`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .entry import GENESIS, ArrayInfo, Entry
from .kinds import EntryKind
from .receipts import (
    FailedReceipt,
    ModelReceipt,
    Receipt,
    RefusedReceipt,
    SentReceipt,
    read_receipts,
    upload_digest,
    write_receipt,
)
from .recorder import JobRecorder
from .store import AuditStore

if TYPE_CHECKING:
    from .export import export_csv, export_jsonl, import_jsonl, read_csv, read_jsonl
    from .log import AuditLog
    from .show import render_tables
    from .verify import VerifyReport, verify_entries, verify_log
    from .views import contains_per_client_plaintext, summarize_array

#: The names whose modules open the SQL store (SQLAlchemy), imported on first use: a client
#: writes receipts and records entries without loading SQLAlchemy.
_LAZY = {
    "AuditLog": "log", "export_csv": "export", "export_jsonl": "export",
    "import_jsonl": "export", "read_csv": "export", "read_jsonl": "export",
    "render_tables": "show", "VerifyReport": "verify", "verify_entries": "verify",
    "verify_log": "verify", "contains_per_client_plaintext": "views",
    "summarize_array": "views",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "GENESIS",
    "ArrayInfo",
    "AuditLog",
    "AuditStore",
    "Entry",
    "EntryKind",
    "FailedReceipt",
    "JobRecorder",
    "ModelReceipt",
    "Receipt",
    "RefusedReceipt",
    "SentReceipt",
    "VerifyReport",
    "contains_per_client_plaintext",
    "export_csv",
    "export_jsonl",
    "import_jsonl",
    "read_csv",
    "read_jsonl",
    "read_receipts",
    "render_tables",
    "summarize_array",
    "upload_digest",
    "verify_entries",
    "verify_log",
    "write_receipt",
]
