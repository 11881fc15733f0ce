"""Messages between the coordinator (server side) and the workers (client side).

One training job is a sequence of *rounds*. In each round the coordinator issues one :class:`Task`
to every participating client and every client answers with one :class:`Reply`:

* ``Reply.summable`` is a flat float64 vector laid out as ``Task.layout`` says (blocks of
  statistics such as node totals or per-bin histograms). The server may only ever learn the sum
  of these vectors over clients; under secure aggregation they travel masked.
* ``Reply.disclosed`` holds per-client items the task asked for in the clear (``Task.disclose``),
  such as the paper's per-client quantile sketches. A profile must allow each of them.

The same objects travel in process and over HTTPS: :func:`pack` / :func:`unpack` give a compact,
bounded binary form (a JSON header describing typed arrays, then the raw little-endian arrays).
This module holds no network code.
"""

from __future__ import annotations

import enum
import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from .errors import InvalidMessage

__all__ = [
    "Block",
    "Reply",
    "SealedTask",
    "StatKind",
    "Task",
    "TaskKind",
    "kind_code",
    "kinds_vector",
    "layout_size",
    "pack",
    "seal",
    "split_blocks",
    "unpack",
]

_MAGIC = b"FFS1"
_MAX_HEADER = 1 << 20  # 1 MiB of JSON header at most
_MAX_BODY = 1 << 31  # 2 GiB of array data at most
_DTYPES = {
    "float64": np.dtype("<f8"),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "uint64": np.dtype("<u8"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("?"),
}


class TaskKind(enum.StrEnum):
    """What a round asks of the clients."""

    #: Route rows through the previous level's splits, send node totals (summable) and, if asked,
    #: per-client sketches (disclosed).
    SKETCH = "sketch"
    #: Per node and feature slot, a histogram of statistics over bins cut by the given thresholds.
    HISTOGRAM = "histogram"


class StatKind(enum.StrEnum):
    """The meaning of one column of a statistics block; fixes its fixed-point encoding."""

    COUNT = "count"  # weighted row counts (integers)
    SUM = "sum"  # sum of y
    SUMSQ = "sumsq"  # sum of y^2
    GAIN = "gain"  # n-weighted local impurity gains (AvgImp)


@dataclass(frozen=True)
class Block:
    """One block of the summable vector: ``shape`` whose last axis has one kind per column."""

    name: str
    shape: tuple[int, ...]
    kinds: tuple[StatKind, ...]

    def __post_init__(self) -> None:
        if not self.shape or self.shape[-1] != len(self.kinds):
            raise ValueError(f"block {self.name!r}: last axis must have one kind per column")
        if any(s < 0 for s in self.shape):
            raise ValueError(f"block {self.name!r}: negative dimension")

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape),
                "kinds": [k.value for k in self.kinds]}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Block:
        return cls(
            name=str(obj["name"]),
            shape=tuple(int(s) for s in obj["shape"]),
            kinds=tuple(StatKind(k) for k in obj["kinds"]),
        )


def layout_size(layout: tuple[Block, ...]) -> int:
    """Length of the flat summable vector for ``layout``."""
    return sum(b.size for b in layout)


def split_blocks(vector: np.ndarray, layout: tuple[Block, ...]) -> dict[str, np.ndarray]:
    """Cut a flat vector into the named, shaped blocks of ``layout`` (views, no copy)."""
    if vector.shape != (layout_size(layout),):
        raise InvalidMessage("vector does not match the layout")
    out: dict[str, np.ndarray] = {}
    start = 0
    for b in layout:
        out[b.name] = vector[start : start + b.size].reshape(b.shape)
        start += b.size
    return out


_KIND_ORDER = tuple(StatKind)

#: Task parameters a client reads, per task kind; anything else is refused (a server must not
#: dress up a repeated question as a new one with an unused parameter).
TASK_PARAMS: dict[TaskKind, frozenset[str]] = {
    TaskKind.SKETCH: frozenset({"n_nodes", "n_points", "top_l", "totals", "dp"}),
    TaskKind.HISTOGRAM: frozenset({"stats", "purpose", "dp"}),
}
TASK_ARRAYS: dict[TaskKind, frozenset[str]] = {
    # "nodes": a sketch of some of the level's nodes only, after its routing round (a
    # coordinator that evaluates a level in groups; optional, absent by default)
    TaskKind.SKETCH: frozenset({"features", "route_kind", "route_feature", "route_threshold",
                                "route_left", "route_right", "route_set_ptr",
                                "route_set_vals", "nodes"}),
    TaskKind.HISTOGRAM: frozenset({"nodes", "features", "thresholds"}),
}
#: Parameters published for transparency only (clients recompute them): not part of a question.
_INFORMATIONAL = frozenset({"dp", "purpose"})


def kinds_vector(layout: tuple[Block, ...]) -> np.ndarray:
    """The :class:`StatKind` of every entry of the flat vector, as small integer codes
    (indices into ``tuple(StatKind)``)."""
    parts = [np.tile(np.array([_KIND_ORDER.index(k) for k in b.kinds], dtype=np.int8),
                     b.size // max(len(b.kinds), 1)) for b in layout]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int8)


def kind_code(kind: StatKind) -> int:
    """The integer code :func:`kinds_vector` uses for ``kind``."""
    return _KIND_ORDER.index(kind)


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
        return hashlib.sha256(self.to_bytes()).digest()

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
        return hashlib.sha256(pack(head, self.arrays)).digest()


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


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj


def pack(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """Encode a JSON-able header and named arrays as ``MAGIC | len | header | data``."""
    descr = []
    chunks = []
    offset = 0
    for name in sorted(arrays):
        arr = np.asarray(arrays[name])
        dname = next((k for k, dt in _DTYPES.items() if arr.dtype == dt
                      or (arr.dtype.kind == dt.kind and arr.dtype.itemsize == dt.itemsize)), None)
        if dname is None:
            raise TypeError(f"array {name!r} has unsupported dtype {arr.dtype}")
        raw = np.ascontiguousarray(arr, dtype=_DTYPES[dname]).tobytes()
        descr.append({"name": name, "dtype": dname, "shape": list(arr.shape),
                      "offset": offset, "nbytes": len(raw)})
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps({"header": _jsonable(dict(header)), "arrays": descr},
                      sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    if len(head) > _MAX_HEADER:
        raise ValueError("header too large")
    return _MAGIC + struct.pack("<I", len(head)) + head + b"".join(chunks)


def unpack(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Inverse of :func:`pack`. Any defect raises the same opaque :class:`InvalidMessage`."""
    try:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidMessage("not bytes")
        view = memoryview(data)
        if len(view) < 8 or bytes(view[:4]) != _MAGIC:
            raise InvalidMessage("bad magic")
        (hlen,) = struct.unpack("<I", view[4:8])
        if hlen > _MAX_HEADER or 8 + hlen > len(view):
            raise InvalidMessage("bad header length")
        meta = json.loads(bytes(view[8 : 8 + hlen]))
        if not isinstance(meta, dict) or set(meta) != {"header", "arrays"}:
            raise InvalidMessage("bad header")
        body = view[8 + hlen :]
        if len(body) > _MAX_BODY:
            raise InvalidMessage("body too large")
        arrays: dict[str, np.ndarray] = {}
        expected = 0
        if not isinstance(meta["arrays"], list):
            raise InvalidMessage("bad array table")
        for d in meta["arrays"]:
            dt = _DTYPES[d["dtype"]]
            if not isinstance(d["shape"], list) or str(d["name"]) in arrays:
                raise InvalidMessage("bad array entry")
            shape = tuple(int(s) for s in d["shape"])
            if any(s < 0 for s in shape):
                raise InvalidMessage("negative shape")
            count = int(np.prod(shape, dtype=np.int64))
            nbytes = int(d["nbytes"])
            off = int(d["offset"])
            if nbytes != count * dt.itemsize or off != expected or off + nbytes > len(body):
                raise InvalidMessage("array bounds")
            arrays[str(d["name"])] = np.frombuffer(
                body[off : off + nbytes], dtype=dt).reshape(shape).copy()
            expected = off + nbytes
        if expected != len(body):
            raise InvalidMessage("trailing bytes")
        header = meta["header"]
        if not isinstance(header, dict):
            raise InvalidMessage("bad header")
        return header, arrays
    except InvalidMessage:
        raise
    except (ValueError, KeyError, TypeError, struct.error, OverflowError, RecursionError) as exc:
        raise InvalidMessage("malformed message") from exc


# ---------------------------------------------------------------------- sealed tasks
# A task whose wire bytes and digests are computed once: :class:`SealedTask`.
#
# :class:`~fedforest_secure.protocol.Task` computes :meth:`~Task.to_bytes`, :meth:`~Task.digest`
# and :meth:`~Task.question_digest` afresh on every call (the task is a mutable dataclass), and
# each is a pass over arrays as large as the round's summable vector. One round used to pack
# and hash its task seven times on the server (store, digest, question, round setup) and six
# times on every client (the announced digest, the worker's own checks, the round setup check,
# the upload header). A sealed task does it once: the server seals the coordinator's task when
# it issues the round and serves the same bytes to every client; a client seals the bytes it
# downloaded.
#
# Canonical bytes. ``pack(header, arrays)`` is ``MAGIC | len | meta | data`` where ``meta`` is
# the canonical JSON of ``{"arrays": descr, "header": header}`` (keys sorted: the array table
# first) and ``data`` the arrays' raw bytes in name order. Downloaded bytes are the task's
# canonical encoding exactly when their array table lists the arrays in name order and their
# ``meta`` equals the canonical text; both are checked on the small ``meta`` alone (the array
# data of a parsed body is, byte for byte, what ``pack`` writes). Then the body's SHA-256 is the
# task digest, and the question digest (the same bytes with the question's header) is one hash
# over the new ``meta`` and the body's data section, without packing the arrays again. Any other
# body (valid but not canonical) takes the slow path of :class:`Task`, with the same results.
#
# A sealed task must not be mutated; nothing in the library mutates a task it received.

_HEAD = len(_MAGIC) + 4  # MAGIC and the meta length (uint32, little-endian), as pack writes
_EMPTY_TABLE = b'{"arrays":[],'  # how pack(header, {}) starts its meta


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
            self._digest = hashlib.sha256(self.to_bytes()).digest()
        return self._digest

    def question_digest(self) -> bytes:
        if self._question is None:
            self._question = self._fast_question() or super().question_digest()
        return self._question

    def _fast_question(self) -> bytes | None:
        """:meth:`Task.question_digest` from the canonical bytes: the question's header
        (round id 0, informational parameters left out) over the same array data."""
        body = self.to_bytes()
        table = self._table if self._table is not None else _table_of(body)
        if table is None:
            return None
        head = self.header()
        head["round_id"] = 0
        head["params"] = {k: v for k, v in self.params.items() if k not in _INFORMATIONAL}
        meta = _meta(head, table)
        if meta is None:
            return None
        hlen = struct.unpack("<I", body[4:_HEAD])[0]
        h = hashlib.sha256(body[:4] + struct.pack("<I", len(meta)) + meta)
        h.update(memoryview(body)[_HEAD + hlen:])
        return h.digest()

    @classmethod
    def from_wire(cls, body: bytes, sha256: bytes | None = None) -> SealedTask:
        """Parse downloaded task bytes (:class:`InvalidMessage` if malformed).

        ``sha256`` is the body's SHA-256 if the caller already computed it. When the body is
        the canonical encoding of the task it parses to, that is the task's digest and the
        body is what :meth:`to_bytes` returns; a valid but non-canonical body is parsed all the
        same and its digest computed from the canonical bytes, as :meth:`Task.digest` would
        (so a digest check against it fails as before).
        """
        task = seal(Task.from_bytes(body))
        table = _table_of(body)
        meta = _meta(task.header(), table) if table is not None else None
        hlen = struct.unpack("<I", body[4:_HEAD])[0]
        if meta is not None and meta == body[_HEAD:_HEAD + hlen]:
            task._bytes = bytes(body)
            task._digest = sha256 if sha256 is not None else hashlib.sha256(body).digest()
            task._table = table
        return task


def _table_of(body: bytes) -> bytes | None:
    """The array table pack would write for the arrays a (parsed, valid) body holds, as
    canonical JSON; None unless the body lists them in name order, as pack does.

    Each entry is rebuilt from the fields the parser reads (name, dtype, shape, offset,
    nbytes; extra keys dropped, numbers as integers), so a body whose table differs from it in
    any byte fails the comparison of the whole meta text and takes the slow path."""
    hlen = struct.unpack("<I", body[4:_HEAD])[0]
    descr = json.loads(body[_HEAD:_HEAD + hlen])["arrays"]
    table = [{"dtype": str(d["dtype"]), "name": str(d["name"]),
              "nbytes": int(d["nbytes"]), "offset": int(d["offset"]),
              "shape": [int(s) for s in d["shape"]]} for d in descr]
    names = [str(d["name"]) for d in descr]
    if names != sorted(names):
        return None
    return json.dumps(table, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _meta(header: dict[str, Any], table: bytes) -> bytes | None:
    """The canonical meta text of ``pack(header, arrays)`` for arrays whose table is
    ``table``: pack's own text for the header (``pack(header, {})``), the table spliced in."""
    empty = pack(header, {})[_HEAD:]
    if not empty.startswith(_EMPTY_TABLE):
        return None  # pack's layout changed: take the slow path
    return b'{"arrays":' + table + b"," + empty[len(_EMPTY_TABLE):]


def seal(task: Task) -> SealedTask:
    """``task`` as a :class:`SealedTask` (the same field values, arrays not copied)."""
    if isinstance(task, SealedTask):
        return task
    if type(task) is not Task:
        raise InvalidMessage("only plain tasks can be sealed")
    return SealedTask(**{f.name: getattr(task, f.name) for f in fields(Task)})
