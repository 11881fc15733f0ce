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
import numbers
import struct
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ..errors import InvalidMessage, ProtocolError
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
    "CLASS_TOTALS_BLOCK",
    "TASK_ARRAYS",
    "TASK_ARRAY_DTYPES",
    "TASK_PARAMS",
    "Reply",
    "SealedTask",
    "Task",
    "TaskKind",
    "canonical_thresholds",
    "check_task_form",
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

#: The dtype a client reads each task array as (it casts what it receives): thresholds as
#: float64, where rows missing a value go as bool, every other array (indices, kinds) as int64.
#: The question digest hashes every array in its dtype, so an int32 copy of an int64 array is
#: the same question; an array of another kind (floats for indices) is refused.
TASK_ARRAY_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype("<f8") if name.endswith("threshold") or name.endswith("thresholds")
    else np.dtype("?") if name == "route_missing_left" else np.dtype("<i8")
    for names in TASK_ARRAYS.values() for name in names}
#: The dtype kinds a client reads as each of those dtypes.
_READS = {"i": "iu", "f": "f", "b": "b"}
#: Parameters a client reads as this default when the task leaves them out: the question is
#: the same either way.
_DEFAULTS: dict[TaskKind, dict[str, Any]] = {
    TaskKind.SKETCH: {"totals": True},
    TaskKind.HISTOGRAM: {"stats": "full"},
}
#: The one block name a client reads (:func:`fedforest_secure._layouts.class_totals_block`:
#: the classes' row totals are appended to the answer); the rest of the layout says how the
#: answer is cut and encoded (shapes, statistic kinds), not what it is.
CLASS_TOTALS_BLOCK = "class_totals"
#: Integer parameters (never bool), and the disclosures that make a client read them.
_INT_PARAMS = ("n_nodes", "n_points", "top_l")
_READ_WITH = {"n_points": {"sketch_points", "top_l"}, "top_l": {"top_l"}}


def _question_header(task: Task) -> dict[str, Any]:
    """The task's header as a question: what a client computes, in one canonical form.

    Round id 0; informational parameters left out and defaults spelled out; the disclosures as
    a sorted set; of the layout only the class-totals block a client reads.
    """
    head = task.header()
    head["round_id"] = 0
    params = {**_DEFAULTS.get(task.kind, {}), **task.params}
    head["params"] = {k: v for k, v in params.items() if k not in _INFORMATIONAL}
    head["layout"] = [b.name for b in task.layout if b.name == CLASS_TOTALS_BLOCK]
    head["disclose"] = sorted(set(task.disclose))
    return head


def _question_array(name: str, arr: np.ndarray) -> np.ndarray:
    """``arr`` in the dtype a client reads it as (unchanged if it would refuse it); histogram
    thresholds in the canonical form of :func:`canonical_thresholds`."""
    want = TASK_ARRAY_DTYPES.get(name)
    if want is None or arr.dtype.kind not in _READS[want.kind]:
        return arr
    out = arr if arr.dtype == want else arr.astype(want)
    if name in _THRESHOLD_GRIDS:
        out = canonical_thresholds(out)
    same = out is arr or (out.shape == arr.shape and out.dtype == arr.dtype
                          and np.array_equal(out, arr)
                          and not (np.signbit(arr) & (arr == 0)).any())  # no -0.0
    return arr if same else out


#: The task arrays of a histogram's thresholds, (nodes, slots, thresholds) per slot.
_THRESHOLD_GRIDS = frozenset({"thresholds", "grid_thresholds"})


def canonical_thresholds(thr: np.ndarray) -> np.ndarray:
    """Histogram thresholds (float64) as the cuts they make: per (node, slot), its distinct
    finite thresholds, ascending (-0.0 as 0.0), +inf padded to the widest row's count (no
    column at all when no row has one). An infinite or repeated threshold cuts nothing (its
    bin is empty), so the same non-empty bins are the same question whatever is appended."""
    if thr.ndim != 3 or np.isnan(thr).any():
        return thr  # refused by the client (histogram_arrays)
    fin = np.isfinite(thr)
    width = int(fin.sum(axis=2).max()) if thr.size else 0
    a, b = thr[:, :, :-1], thr[:, :, 1:]
    if (not (thr == -np.inf).any() and not (np.signbit(thr) & (thr == 0)).any()
            and (fin[:, :, :-1] | ~fin[:, :, 1:]).all() and ((a < b) | ~fin[:, :, 1:]).all()):
        # the coordinator's form: increasing finite thresholds, then +inf (no sort needed)
        return thr if width == thr.shape[2] else np.ascontiguousarray(thr[:, :, :width])
    t = np.sort(np.where(np.isfinite(thr), thr + 0.0, np.inf), axis=2)
    if t.shape[2] > 1:
        t[:, :, 1:][t[:, :, 1:] == t[:, :, :-1]] = np.inf
        t = np.sort(t, axis=2)
    width = int(np.isfinite(t).sum(axis=2).max()) if t.size else 0
    return np.ascontiguousarray(t[:, :, :width])


def check_task_form(task: Task) -> None:
    """Refuse a task in a form the coordinator never sends, whose question key would not be
    what the client computes: a parameter or array the client does not use for this kind of
    task (``n_points`` / ``top_l`` without the sketch disclosures that read them, disclosures
    in a histogram task, which discloses nothing), an array of
    the wrong kind of numbers, or a parameter of the wrong type (``totals: 1`` for ``true``).

    Raises
    ------
    ProtocolError
        The task carries such a field.
    """
    memo = task.derived if isinstance(task, SealedTask) else None
    if memo is not None and "task_form" in memo:
        return  # checked once for every reader of the sealed task (a refused one never is)
    _check_task_form(task)
    if memo is not None:
        memo["task_form"] = True


def _check_task_form(task: Task) -> None:
    unused = (set(task.params) - TASK_PARAMS[task.kind]) | (
        set(task.arrays) - TASK_ARRAYS[task.kind]) | {
        k for k, read_with in _READ_WITH.items()
        if k in task.params and not read_with & set(task.disclose)}
    if unused:
        raise ProtocolError(f"task carries fields this client does not use: {sorted(unused)}")
    if task.kind is TaskKind.HISTOGRAM and task.disclose:
        # the question key hashes the disclosures: ignored ones would make a question "new"
        raise ProtocolError(f"a histogram task discloses nothing; this one asks to disclose "
                            f"{sorted(set(task.disclose))}")
    for name, arr in task.arrays.items():
        want = TASK_ARRAY_DTYPES[name]
        if arr.dtype.kind not in _READS[want.kind]:
            raise ProtocolError(f"task array {name!r} holds {arr.dtype} values; this client "
                                f"reads it as {want.name}")
    p = task.params
    wrong = [k for k in _INT_PARAMS if k in p
             and (not isinstance(p[k], numbers.Integral) or isinstance(p[k], bool | np.bool_))]
    wrong += [k for k, t in (("totals", bool), ("stats", str)) if k in p
              and not isinstance(p[k], t)]
    if wrong:
        raise ProtocolError(f"task parameters of the wrong type: {sorted(wrong)} (integers "
                            "n_nodes, n_points, top_l; boolean totals; a string stats)")


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
        subtract the sums (differencing). The digest is of what a client computes: the task
        in one canonical form (:func:`_question_header`; arrays in the dtypes a client reads
        them as, :data:`TASK_ARRAY_DTYPES`; histogram thresholds as the cuts they make,
        :func:`canonical_thresholds`), so no cosmetic change a client ignores makes the
        question "new" (a form :func:`check_task_form` refuses may change it).
        """
        return pack_digest(_question_header(self), {
            k: _question_array(k, v) for k, v in self.arrays.items()})


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
# is, byte for byte, what ``pack`` writes). Then the body's SHA-256 is the task digest, and,
# when every array is in the dtype a client reads it as, the question digest (the question's
# header over the same arrays) is one hash over the new ``meta`` and the body's data section,
# without packing the arrays again. Any other body (valid but not canonical, or with arrays to
# cast, such as the routing's int32 arrays) takes the slow path of :class:`Task`, with the same
# results.
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
        #: what a reader derives from the task once for all its readers (an in-process
        #: federation hands the one sealed task to every client), by the reader's key
        self.derived: dict[object, object] = {}

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
            arrays = {k: _question_array(k, v) for k, v in self.arrays.items()}
            fast = self._fast_question(arrays) if self._bytes is not None else None
            self._question = fast or pack_digest(_question_header(self), arrays)
        return self._question

    def _fast_question(self, arrays: dict[str, np.ndarray] | None = None) -> bytes | None:
        """:meth:`Task.question_digest` from the canonical bytes: the question's header
        over the same array data, when every array is already in its question form
        (``arrays``, computed if not given: the dtype a client reads it as, canonical
        thresholds), else None (the slow path hashes ``arrays``)."""
        if arrays is None:
            arrays = {k: _question_array(k, v) for k, v in self.arrays.items()}
        if any(arrays[k] is not v for k, v in self.arrays.items()):
            return None
        body = self.to_bytes()
        table = self._table if self._table is not None else canonical_table(body)
        if table is None:
            return None
        meta = canonical_meta(_question_header(self), table)
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
