"""The append-only audit log: a hash chain per job over an :class:`~.store.AuditStore`.

The API can append and read, never update or delete. An append reads the job's head and stores
the next entry (and its arrays) in one step of the store; a writer that loses a race for the
same ``seq`` to another (a process, another ``AuditLog``) re-reads the head and tries again, so
the chain never forks. The byte format is described in :mod:`fedforest_secure.audit.entry`.
``AuditLog(url)`` stores through SQLAlchemy (:mod:`fedforest_secure.audit._sql`); any other
:class:`~.store.AuditStore` can be given as ``store=``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import AuditError
from ._sql import Engine, SqlStore, to_url
from .entry import (
    GENESIS,
    Entry,
    canonical_json,
    decode_array,
    encode_array,
    format_timestamp,
    jsonable,
)
from .kinds import EntryKind, check_payload
from .store import AuditStore, ChainRace

if TYPE_CHECKING:
    from .recorder import JobRecorder

__all__ = ["AuditLog", "Clock", "to_url"]

Clock = Callable[[], datetime]

_MAX_ATTEMPTS = 50
_MAX_JOB_ID = 200


def _utc_now() -> datetime:
    return datetime.now(UTC)


class AuditLog:
    """An append-only, hash-chained log of every aggregate exchanged in federated jobs.

    Parameters
    ----------
    url:
        A SQLAlchemy URL or a file path (a SQLite file). Exactly one of ``url``, ``engine`` and
        ``store``.
    engine:
        An existing SQLAlchemy engine (e.g. the server's); the log only touches its own two
        tables.
    clock:
        Returns the timezone-aware time stamped on each entry (inject a fixed one in tests).
    create:
        Create the tables if absent. With ``False`` a missing log raises :class:`AuditError`.
    store:
        Any :class:`~.store.AuditStore`.
    """

    def __init__(self, url: str | Path | None = None, *, engine: Engine | None = None,
                 clock: Clock | None = None, create: bool = True,
                 store: AuditStore | None = None) -> None:
        if sum(x is not None for x in (url, engine, store)) != 1:
            raise TypeError("give exactly one of url, engine and store")
        self.store: AuditStore = store if store is not None else SqlStore(
            url, engine=engine, create=create)
        self._clock: Clock = clock or _utc_now

    @classmethod
    def in_memory(cls, *, clock: Clock | None = None) -> AuditLog:
        """A log in a private in-memory SQLite database (one connection shared by threads)."""
        return cls(store=SqlStore.in_memory(), clock=clock)

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine of a log stored through SQLAlchemy."""
        if not isinstance(self.store, SqlStore):
            raise AttributeError("this audit log is not stored through SQLAlchemy")
        return self.store.engine

    def close(self) -> None:
        """Release the connections of an engine this log created (a given engine is left open)."""
        self.store.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------

    def append(self, job_id: str, kind: EntryKind | str, payload: Mapping[str, Any],
               arrays: Mapping[str, np.ndarray] | None = None, *,
               expected_head: str | None = None) -> str:
        """Append one entry to ``job_id``'s chain and return the new head (hex SHA-256).

        ``payload`` must be JSON-able (numpy scalars, tuples and enums are converted) and carry
        the keys :mod:`~fedforest_secure.audit.kinds` lists for ``kind``; ``arrays`` are stored
        as bytes with their SHA-256 in the hashed entry. With ``expected_head`` the append is a
        compare-and-swap: :class:`AuditError` if the job's head has moved on.
        Bad input raises ``ValueError`` / ``TypeError`` and writes nothing.
        """
        if not isinstance(job_id, str) or not job_id or len(job_id) > _MAX_JOB_ID \
                or not job_id.isprintable():
            raise ValueError(f"bad job id {job_id!r}")
        entry_kind = EntryKind(kind)
        encoded = {name: encode_array(name, arr) for name, arr in (arrays or {}).items()}
        infos = {name: info for name, (info, _) in encoded.items()}
        plain = jsonable(payload)  # converted and serialised once per append
        draft = Entry(job_id=job_id, seq=1, kind=entry_kind.value,
                      timestamp=format_timestamp(self._clock()),
                      payload_json=canonical_json(plain),
                      arrays_json=canonical_json({k: v.to_json() for k, v in infos.items()}),
                      prev_hash=GENESIS, hash="")
        check_payload(entry_kind, plain, set(infos))
        blobs = {name: blob for name, (_, blob) in encoded.items()}

        def make(seq: int, prev: str) -> Entry:
            if expected_head is not None and expected_head != prev:
                raise AuditError(f"job {job_id!r}: head is {prev}, not {expected_head}")
            return draft.linked(seq=seq + 1, timestamp=format_timestamp(self._clock()),
                                prev_hash=prev)

        for attempt in range(_MAX_ATTEMPTS):
            try:
                return self.store.append_next(job_id, make, blobs).hash
            except ChainRace:
                time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
        raise AuditError(f"job {job_id!r}: could not append after {_MAX_ATTEMPTS} attempts "
                         "(concurrent writers)")

    def import_entry(self, entry: Entry, blobs: Mapping[str, bytes] | None) -> str:
        """Append an entry made elsewhere (an export), verbatim, if it extends the chain.

        The entry must be the next ``seq``, link to the current head, hash correctly, and come
        with exactly its arrays, each matching its digest; otherwise :class:`AuditError`.
        ``blobs=None`` takes the entry without its arrays' bytes (an export written without
        them, as a job's members get it): the entry and its digests are kept, no array is
        stored, and :meth:`array` says the array is missing.
        """
        try:
            infos = entry.arrays
            check_payload(EntryKind(entry.kind), entry.payload,
                          set(infos) if blobs is None else set(blobs))
            if blobs is not None:
                if set(infos) != set(blobs):
                    raise ValueError("arrays do not match their descriptors")
                for name, info in infos.items():
                    decode_array(info, blobs[name])
            if entry.computed_hash() != entry.hash:
                raise ValueError("hash does not match the entry")
        except ValueError as exc:
            raise AuditError(f"{entry.label}: cannot import: {exc}") from exc

        def extends(seq: int, head: str) -> Entry:
            if entry.seq != seq + 1 or entry.prev_hash != head:
                raise AuditError(f"{entry.label}: cannot import: does not extend the chain "
                                 f"(head is seq {seq})")
            return entry

        try:
            self.store.append_next(entry.job_id, extends, blobs or {})
        except ChainRace as exc:
            raise AuditError(f"{entry.label}: cannot import: another writer extended the "
                             "chain meanwhile") from exc
        return entry.hash

    def job(self, job_id: str) -> JobRecorder:
        """A recorder with one typed method per entry kind, bound to ``job_id``."""
        from .recorder import JobRecorder

        return JobRecorder(self, job_id)

    # -- reading -------------------------------------------------------------------------------

    def head(self, job_id: str) -> str:
        """The hash of the job's last entry; the genesis value (64 zeros) if it has none."""
        return self.store.last(job_id)[1]

    def tip(self, job_id: str) -> tuple[int, str]:
        """``(seq, hash)`` of the job's last entry, ``(0, genesis)`` if none: what a server
        announces with each task so that clients can write a :class:`~.receipts.Receipt`."""
        return self.store.last(job_id)

    def jobs(self) -> list[str]:
        """Every job id in the log, sorted."""
        return self.store.jobs()

    def entries(self, job_id: str | None = None, round_id: int | None = None,
                kind: EntryKind | str | None = None) -> list[Entry]:
        """Entries ordered by job and ``seq``, optionally of one job, round or kind."""
        return self.store.entries(job_id, round_id,
                                  None if kind is None else EntryKind(kind).value)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries())

    def stored_arrays(self, job_id: str, seq: int) -> dict[str, bytes]:
        """The raw stored bytes of one entry's arrays, by name (unchecked)."""
        return self.store.arrays_of(job_id, seq)

    def array(self, entry: Entry, name: str) -> np.ndarray:
        """One stored array of ``entry``, decoded; :class:`AuditError` if it was altered."""
        info = entry.arrays.get(name)
        if info is None:
            raise KeyError(f"{entry.label} has no array {name!r}")
        blob = self.stored_arrays(entry.job_id, entry.seq).get(name)
        if blob is None:
            raise AuditError(f"{entry.label}: stored array {name!r} is missing")
        try:
            return decode_array(info, blob)
        except ValueError as exc:
            raise AuditError(f"{entry.label}: stored array {name!r}: {exc}") from exc
