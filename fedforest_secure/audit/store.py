"""The storage interface of the audit log: what :class:`~fedforest_secure.audit.log.AuditLog`
needs from a database, and nothing about hashes or payloads.

A store keeps each job's entries (the canonical texts verbatim, in insertion order) and the
bytes of their arrays. It never updates or deletes. The hash chain, the payload rules and the
retry on a lost race are the log's; :mod:`fedforest_secure.audit._sql` is the SQLAlchemy store
(SQLite by default, any SQLAlchemy URL).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple, Protocol

from .entry import Entry

__all__ = ["AuditStore", "ChainRace", "IndexRow", "StoredArray"]


class ChainRace(Exception):
    """Another writer appended to the job between the store's read of its last entry and the
    insert: nothing was written; read the new head and try again."""


class StoredArray(NamedTuple):
    """One stored array's bytes; or, when the store could not read them (a value that is not
    bytes), empty ``data`` and the ``error`` saying why."""

    job_id: str
    seq: int
    name: str
    data: bytes
    error: str | None = None


class IndexRow(NamedTuple):
    """What a store indexes of an entry beside its texts: the ``round_id`` it copied from the
    payload (a query convenience, not hashed), as stored (a value rewritten behind the log's
    back need not be an integer), next to the stored payload text."""

    job_id: str
    seq: int
    kind: str
    round_id: object
    payload: str


class AuditStore(Protocol):
    """Append-only storage of audit entries and their arrays."""

    def last(self, job_id: str) -> tuple[int, str]:
        """``(seq, hash)`` of the job's last entry; ``(0, GENESIS)`` if it has none."""
        ...

    def append_next(self, job_id: str, make: Callable[[int, str], Entry],
                    blobs: Mapping[str, bytes]) -> Entry:
        """In one transaction: read the job's last ``(seq, hash)``, call ``make`` with them,
        and store the entry it returns with ``blobs`` (its arrays' bytes by name).

        Whatever ``make`` raises propagates and nothing is stored. :class:`ChainRace` if a
        concurrent writer stored the same ``seq`` first.
        """
        ...

    def jobs(self) -> list[str]:
        """Every job id with an entry, sorted."""
        ...

    def entries(self, job_id: str | None = None, round_id: int | None = None,
                kind: str | None = None) -> list[Entry]:
        """Entries (with ``row_id``, the insertion order) ordered by job, ``seq`` and
        ``row_id``, optionally of one job, round (the indexed ``round_id``) or kind."""
        ...

    def arrays_of(self, job_id: str, seq: int) -> dict[str, bytes]:
        """The stored bytes of one entry's arrays, by name (unchecked)."""
        ...

    def scan_arrays(self, job_id: str | None = None) -> Iterator[StoredArray]:
        """Every stored array (of one job), ordered by job, ``seq`` and name, one at a time;
        an array whose bytes cannot be read comes with its ``error``, and the others follow."""
        ...

    def scan_index(self, job_id: str | None = None) -> Iterator[IndexRow]:
        """The indexed columns of every entry (of one job)."""
        ...

    def close(self) -> None:
        """Release what the store opened (a database it was given is left open)."""
        ...
