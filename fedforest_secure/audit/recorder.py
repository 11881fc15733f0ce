"""Typed helpers that write each kind of entry for one job (what the server and runner call).

``rec = log.job("job-1")`` then ``rec.round(task, uploads=..., aggregate=..., masked=True)``:
each method builds the payload :mod:`~fedforest_secure.audit.kinds` documents and returns the new
chain head. Everything else a method accepts as ``**extra`` is added to the payload and hashed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..protocol import Task
from .entry import is_hex_digest
from .kinds import EntryKind

__all__ = ["Chains", "JobRecorder"]


class Chains(Protocol):
    """What a recorder writes to: the jobs' hash chains of an
    :class:`~fedforest_secure.audit.log.AuditLog`."""

    def append(self, job_id: str, kind: EntryKind | str, payload: Mapping[str, Any],
               arrays: Mapping[str, np.ndarray] | None = None, *,
               expected_head: str | None = None) -> str: ...

    def head(self, job_id: str) -> str: ...


class JobRecorder:
    """Writes the entries of one job to an :class:`~fedforest_secure.audit.log.AuditLog`."""

    def __init__(self, log: Chains, job_id: str) -> None:
        self.log = log
        self.job_id = job_id

    def head(self) -> str:
        return self.log.head(self.job_id)

    def job_created(self, *, schema: Mapping[str, Any], hyperparameters: Mapping[str, Any],
                    profile: Mapping[str, Any] | str, **extra: Any) -> str:
        """The job's schema, hyper-parameters and privacy profile, before any round."""
        return self.log.append(self.job_id, EntryKind.JOB_CREATED, {
            **extra, "schema": schema, "hyperparameters": hyperparameters, "profile": profile})

    def client_joined(self, client: str, **extra: Any) -> str:
        return self.log.append(self.job_id, EntryKind.CLIENT_JOINED, {**extra, "client": client})

    def client_dropped(self, client: str, *, round_id: int | None = None, reason: str = "",
                       **extra: Any) -> str:
        return self.log.append(self.job_id, EntryKind.CLIENT_DROPPED, {
            **extra, "client": client, "round_id": round_id, "reason": reason})

    def abstained(self, *, count: int, round_id: int | None = None, **extra: Any) -> str:
        """How many clients abstained (e.g. minimum-leaf rule) — a count, never who."""
        return self.log.append(self.job_id, EntryKind.ABSTAINED, {
            **extra, "count": count, "round_id": round_id})

    def round(self, task: Task, *, uploads: Mapping[str, str], aggregate: np.ndarray,
              masked: bool, dropped: Sequence[str] = (), **extra: Any) -> str:
        """One completed aggregation round.

        Parameters
        ----------
        task:
            The round's task (its kind, level, layout, params and arrays are recorded).
        uploads:
            ``{client: sha256 hex of the exact upload bytes}`` for every client whose upload
            entered the sum (see :func:`~fedforest_secure.audit.receipts.upload_digest`).
        aggregate:
            The flat sum the server obtained, shape ``(layout_size(task.layout),)``.
        masked:
            Whether the uploads were masked (secure aggregation). ``False`` means the server
            saw every upload in the clear.
        dropped:
            Clients whose masks were removed by dropout recovery.
        """
        for client, digest in uploads.items():
            if not is_hex_digest(digest):
                raise ValueError(f"upload digest of {client!r} is not a sha256 hex digest")
        arrays = {"aggregate": np.asarray(aggregate)}
        arrays.update({f"task/{name}": np.asarray(a) for name, a in task.arrays.items()})
        payload = {
            **extra,
            "round_id": task.round_id,
            "task_kind": task.kind.value,
            "level": task.level,
            "task_digest": task.digest().hex(),
            "layout": [b.to_json() for b in task.layout],
            "params": task.params,
            "disclose": list(task.disclose),
            "clients": sorted(uploads),
            "uploads": dict(sorted(uploads.items())),
            "masked": bool(masked),
            "dropped": sorted(dropped),
        }
        return self.log.append(self.job_id, EntryKind.ROUND, payload, arrays)

    def round_aborted(self, round_id: int, *, reason: str, clients: Sequence[str] = (),
                      **extra: Any) -> str:
        return self.log.append(self.job_id, EntryKind.ROUND_ABORTED, {
            **extra, "round_id": round_id, "reason": reason, "clients": sorted(clients)})

    def job_failed(self, *, reason: str, **extra: Any) -> str:
        """The job stopped between rounds (no round of it was aborted): no model follows."""
        return self.log.append(self.job_id, EntryKind.JOB_FAILED, {**extra, "reason": reason})

    def disclosure(self, *, client: str, item: str, data: np.ndarray,
                   round_id: int | None = None, **extra: Any) -> str:
        """A per-client plaintext item beyond sums (e.g. the paper's quantile sketch)."""
        return self.log.append(self.job_id, EntryKind.DISCLOSURE, {
            **extra, "client": client, "item": item, "round_id": round_id},
            {"data": np.asarray(data)})

    def dp_spend(self, *, epsilon: float, delta: float, mechanism: str, total_epsilon: float,
                 total_delta: float, round_id: int | None = None, **extra: Any) -> str:
        return self.log.append(self.job_id, EntryKind.DP_SPEND, {
            **extra, "epsilon": epsilon, "delta": delta, "mechanism": mechanism,
            "total_epsilon": total_epsilon, "total_delta": total_delta, "round_id": round_id})

    def split(self, splits: Sequence[Mapping[str, Any]], *, round_id: int | None = None,
              **extra: Any) -> str:
        """Split decisions, e.g. ``[{"tree": 0, "node": 3, "feature": "age", "threshold": 4.5}]``.

        The list is recorded as given.
        """
        return self.log.append(self.job_id, EntryKind.SPLIT, {
            **extra, "splits": list(splits), "round_id": round_id})

    def model(self, *, digest: str, **extra: Any) -> str:
        """The final model: ``digest`` is the SHA-256 hex of the saved model file."""
        if not is_hex_digest(digest):
            raise ValueError("model digest must be a sha256 hex digest")
        return self.log.append(self.job_id, EntryKind.MODEL, {**extra, "digest": digest})
