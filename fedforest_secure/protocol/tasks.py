"""Rounds: the :class:`Task` the coordinator issues and the :class:`Reply` each client sends.

One training job is a sequence of *rounds*. In each round the coordinator issues one :class:`Task`
to every participating client and every client answers with one :class:`Reply`:

* ``Reply.summable`` is a flat float64 vector laid out as ``Task.layout`` says (blocks of
  statistics such as node totals or per-bin histograms). The server may only ever learn the sum
  of these vectors over clients; under secure aggregation they travel masked.
* ``Reply.disclosed`` holds per-client items the task asked for in the clear (``Task.disclose``),
  such as the paper's per-client quantile sketches. A profile must allow each of them.

The same objects travel in process and over HTTPS, encoded by :func:`~.wire.pack`.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ..errors import InvalidMessage
from .wire import (
    HEAD_SIZE,
    Block,
    canonical_meta,
    canonical_table,
    meta_length,
    pack,
    pack_digest,
    unpack,
)

__all__ = [
    "TASK_ARRAYS",
    "TASK_PARAMS",
    "Reply",
    "SealedTask",
    "Task",
    "TaskKind",
    "seal",
]


class TaskKind(enum.StrEnum):
    """What a round asks of the clients."""

    #: Route rows through the previous level's splits, send node totals (summable) and, if asked,
    #: per-client sketches (disclosed) or the level's first histogram (summable, ``grid_*``).
    SKETCH = "sketch"
    #: Per node and feature slot, a histogram of statistics over bins cut by the given thresholds.
    HISTOGRAM = "histogram"
    #: Score the evaluation job's models on the site's held-out rows and send the additive
    #: statistics of :mod:`fedforest_secure.evaluation` (no arrays: the models are in the job).
    EVALUATE = "evaluate"


#: Task parameters a client reads, per task kind; anything else is refused (a server must not
#: dress up a repeated question as a new one with an unused parameter).
TASK_PARAMS: dict[TaskKind, frozenset[str]] = {
    TaskKind.SKETCH: frozenset({"n_nodes", "n_points", "top_l", "totals", "stats", "dp",
                                "pack"}),
    TaskKind.HISTOGRAM: frozenset({"stats", "purpose", "dp", "pack"}),
    TaskKind.EVALUATE: frozenset({"dp"}),
}
TASK_ARRAYS: dict[TaskKind, frozenset[str]] = {
    # "nodes": a sketch of some of the level's nodes only, after its routing round (a
    # coordinator that evaluates a level in groups; optional, absent by default)
    # "grid_nodes", "grid_features", "grid_thresholds" (with the parameter "stats"): the
    # level's first histogram, asked in the same round, after routing and node totals (the
    # secure pooled-CDF sketch, whose grids need no sketch of the level)
    TaskKind.SKETCH: frozenset({"features", "route_kind", "route_feature", "route_threshold",
                                "route_left", "route_right", "route_set_ptr",
                                "route_set_vals", "route_missing_left", "nodes", "grid_nodes",
                                "grid_features", "grid_thresholds"}),
    TaskKind.HISTOGRAM: frozenset({"nodes", "features", "thresholds"}),
    TaskKind.EVALUATE: frozenset(),
}
#: Parameters not part of a question: published for transparency only (clients recompute them),
#: or saying how the answer is encoded, not what it is ("pack": the count lane of packed grid
#: cells, fedforest_secure._packing), so a server cannot make a question "new" with them.
_INFORMATIONAL = frozenset({"dp", "purpose", "pack"})


@dataclass
class Task:
    """One round's request, identical for every client of the round."""

    job_id: str
    round_id: int
    kind: TaskKind
    level: int
    params: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    layout: tuple[Block, ...] = ()
    disclose: tuple[str, ...] = ()

    def header(self) -> dict[str, Any]:
        return {
            "type": "task",
            "job_id": self.job_id,
            "round_id": self.round_id,
            "kind": self.kind.value,
            "level": self.level,
            "params": self.params,
            "layout": [b.to_json() for b in self.layout],
            "disclose": list(self.disclose),
        }

    def to_bytes(self) -> bytes:
        return pack(self.header(), self.arrays)

    @classmethod
    def from_bytes(cls, data: bytes) -> Task:
        header, arrays = unpack(data)
        try:
            if header.get("type") != "task":
                raise InvalidMessage("not a task")
            return cls(
                job_id=str(header["job_id"]),
                round_id=int(header["round_id"]),
                kind=TaskKind(header["kind"]),
                level=int(header["level"]),
                params=dict(header["params"]),
                arrays=arrays,
                layout=tuple(Block.from_json(b) for b in header["layout"]),
                disclose=tuple(str(d) for d in header["disclose"]),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise InvalidMessage("malformed task") from exc

    def digest(self) -> bytes:
        """SHA-256 of the canonical encoding: binds masks to exactly this question."""
        return pack_digest(self.header(), self.arrays)

    def question_digest(self) -> bytes:
        """SHA-256 of the task with its round id blanked: the *question* it asks.

        Two rounds that ask the same question have the same question digest; a client answers
        a question once, so a server cannot re-ask it over a smaller set of clients and
        subtract the sums (differencing).
        """
        head = self.header()
        head["round_id"] = 0
        # informational parameters the client does not act on cannot make a question "new"
        head["params"] = {k: v for k, v in self.params.items() if k not in _INFORMATIONAL}
        return pack_digest(head, self.arrays)


@dataclass
class Reply:
    """One client's answer to one :class:`Task`."""

    round_id: int
    summable: np.ndarray
    disclosed: dict[str, np.ndarray] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        arrays = {"__summable__": self.summable, **self.disclosed}
        return pack({"type": "reply", "round_id": self.round_id}, arrays)

    @classmethod
    def from_bytes(cls, data: bytes) -> Reply:
        header, arrays = unpack(data)
        if header.get("type") != "reply" or "__summable__" not in arrays:
            raise InvalidMessage("not a reply")
        try:
            round_id = int(header["round_id"])
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise InvalidMessage("malformed reply") from exc
        summable = arrays.pop("__summable__")
        return cls(round_id=round_id, summable=summable, disclosed=arrays)


# ---------------------------------------------------------------------- sealed tasks
# A task whose wire bytes and digests are computed once: :class:`SealedTask`.
#
# :class:`Task` computes :meth:`~Task.to_bytes`, :meth:`~Task.digest` and
# :meth:`~Task.question_digest` afresh on every call (the task is a mutable dataclass), and each
# is a pass over arrays as large as the round's summable vector (the digests hash the arrays in
# place, :func:`~.wire.pack_digest`, without building the bytes). A sealed task computes each
# once: the server seals the coordinator's task when it issues the round and serves the same
# bytes to every client; a client seals the bytes it downloaded; an in-process federation seals
# the task it hands to every client (its digests are then computed once, and no bytes at all).
#
# Canonical bytes. Downloaded bytes are the task's canonical encoding (what ``pack`` writes)
# exactly when their array table lists the arrays in name order and their ``meta`` equals the
# canonical text; both are checked on the small ``meta`` alone (the array data of a parsed body
# is, byte for byte, what ``pack`` writes). Then the body's SHA-256 is the task digest, and the
# question digest (the same bytes with the question's header) is one hash over the new ``meta``
# and the body's data section, without packing the arrays again. Any other body (valid but not
# canonical) takes the slow path of :class:`Task`, with the same results.
#
# A sealed task must not be mutated; nothing in the library mutates a task it received.


@dataclass(eq=False)
class SealedTask(Task):
    """A :class:`Task` with its canonical bytes and digests memoized (read-only by contract)."""

    def __post_init__(self) -> None:
        self._bytes: bytes | None = None
        self._digest: bytes | None = None
        self._question: bytes | None = None
        self._table: bytes | None = None  # canonical JSON of the array table, when known

    def to_bytes(self) -> bytes:
        if self._bytes is None:
            self._bytes = super().to_bytes()
        return self._bytes

    def digest(self) -> bytes:
        if self._digest is None:
            # from the bytes if they were packed already, else hashed without packing
            self._digest = (hashlib.sha256(self._bytes).digest() if self._bytes is not None
                            else super().digest())
        return self._digest

    def question_digest(self) -> bytes:
        if self._question is None:
            fast = self._fast_question() if self._bytes is not None else None
            self._question = fast or super().question_digest()
        return self._question

    def _fast_question(self) -> bytes | None:
        """:meth:`Task.question_digest` from the canonical bytes: the question's header
        (round id 0, informational parameters left out) over the same array data."""
        body = self.to_bytes()
        table = self._table if self._table is not None else canonical_table(body)
        if table is None:
            return None
        head = self.header()
        head["round_id"] = 0
        head["params"] = {k: v for k, v in self.params.items() if k not in _INFORMATIONAL}
        meta = canonical_meta(head, table)
        if meta is None:
            return None
        hlen = meta_length(body)
        h = hashlib.sha256(body[:4] + struct.pack("<I", len(meta)) + meta)
        h.update(memoryview(body)[HEAD_SIZE + hlen:])
        return h.digest()

    @classmethod
    def from_wire(cls, body: bytes, sha256: bytes | None = None) -> SealedTask:
        """Parse downloaded task bytes (:class:`InvalidMessage` if malformed).

        ``sha256`` is the body's SHA-256 if the caller already computed it. When the body is
        the canonical encoding of the task it parses to, that is the task's digest and the
        body is what :meth:`to_bytes` returns; a valid but non-canonical body is parsed all the
        same and its digest computed from the canonical bytes, as :meth:`Task.digest` would
        (so a digest check of the non-canonical body against it fails).
        """
        task = seal(Task.from_bytes(body))
        table = canonical_table(body)
        meta = canonical_meta(task.header(), table) if table is not None else None
        hlen = meta_length(body)
        if meta is not None and meta == body[HEAD_SIZE:HEAD_SIZE + hlen]:
            task._bytes = bytes(body)
            task._digest = sha256 if sha256 is not None else hashlib.sha256(body).digest()
            task._table = table
        return task


def seal(task: Task) -> SealedTask:
    """``task`` as a :class:`SealedTask` (the same field values, arrays not copied)."""
    if isinstance(task, SealedTask):
        return task
    if type(task) is not Task:
        raise InvalidMessage("only plain tasks can be sealed")
    return SealedTask(**{f.name: getattr(task, f.name) for f in fields(Task)})
