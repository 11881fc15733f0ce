"""Read-only views of a log: what the server saw, and whether any of it was per-client plaintext."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import AuditError
from .entry import Entry
from .kinds import EntryKind
from .log import AuditLog

__all__ = ["ArraySummary", "contains_per_client_plaintext", "summarize_array"]


@dataclass(frozen=True)
class ArraySummary:
    """Size and range of one stored array (``None`` statistics for an empty array)."""

    size: int
    minimum: float | None
    maximum: float | None
    total: float | None

    def __str__(self) -> str:
        if self.size == 0 or self.minimum is None:
            return "size=0"
        return (f"size={self.size} min={self.minimum:.6g} max={self.maximum:.6g} "
                f"sum={self.total:.6g}")


def summarize_array(array: np.ndarray) -> ArraySummary:
    """Summarise an array by its size, minimum, maximum and sum."""
    arr = np.asarray(array, dtype=np.float64)
    if arr.size == 0:
        return ArraySummary(0, None, None, None)
    return ArraySummary(int(arr.size), float(arr.min()), float(arr.max()), float(arr.sum()))


def is_per_client_plaintext(entry: Entry) -> bool:
    """Whether ``entry`` records something one client revealed in the clear.

    That is a ``disclosure`` entry, or a ``round`` whose uploads were not masked (the server then
    saw each listed client's vector, not only their sum).
    """
    if entry.kind == EntryKind.DISCLOSURE.value:
        return True
    if entry.kind == EntryKind.ROUND.value:
        try:
            return entry.payload.get("masked") is not True
        except ValueError:
            return True  # unreadable: do not claim it was safe
    return False


def contains_per_client_plaintext(log: AuditLog, job_id: str) -> list[Entry]:
    """The entries of ``job_id`` through which the server saw a client's data in the clear.

    Empty for a secure job, where the log holds only masked-upload digests and sums.
    """
    if job_id not in log.jobs():
        raise AuditError(f"job {job_id!r} is not in the log")
    return [e for e in log.entries(job_id=job_id) if is_per_client_plaintext(e)]
