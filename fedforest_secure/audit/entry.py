"""One audit entry and the exact byte format its hash covers.

The hash chain (format version 1)
---------------------------------
Every job has its own chain. Its entries are numbered ``seq = 1, 2, ..., n`` without gaps. Entry
``seq`` stores ``prev_hash``, the ``hash`` of entry ``seq - 1``; entry 1 stores the *genesis*
value, 64 ASCII zeros (``"0" * 64``). The *head* of a job is the ``hash`` of its last entry (the
genesis value while the job has no entry).

An entry's ``hash`` is the lowercase hex SHA-256 of::

    bytes.fromhex(prev_hash)  ||  utf8(body)

i.e. the 32 raw bytes of the previous hash followed by the *body*, the canonical JSON text of::

    {"arrays": A, "job_id": J, "kind": K, "payload": P, "seq": S, "timestamp": T, "version": 1}

*Canonical JSON* is what ``json.dumps(obj, sort_keys=True, separators=(",", ":"),
ensure_ascii=False, allow_nan=False)`` writes: keys sorted, no whitespace, non-ASCII characters
as UTF-8, no NaN or infinities, floats in Python's shortest round-trip ``repr``. Because the
keys are sorted, the body is simply the concatenation::

    '{"arrays":' A ',"job_id":' J ',"kind":' K ',"payload":' P ',"seq":' S
    ',"timestamp":' T ',"version":1}'

where ``J``, ``K``, ``T`` are JSON strings, ``S`` a decimal integer, and ``P`` and ``A`` are the
canonical JSON texts stored *verbatim* in the ``payload`` and ``arrays`` columns of the database
(and the same-named fields of an export). A verifier in any language can therefore rebuild the body
from the stored text without re-serialising floats.

* ``K`` is an :class:`~fedforest_secure.audit.kinds.EntryKind` value, e.g. ``"round"``.
* ``T`` is the UTC time of the append in ISO 8601 with microseconds,
  e.g. ``"2024-05-01T12:00:00.000000+00:00"``.
* ``A`` maps each stored array's name to ``{"dtype": D, "encoding": "npy", "sha256": H,
  "shape": [...]}``: the array is stored as the bytes of a NumPy ``.npy`` file (format 1.0,
  little-endian, C order, no pickles) and ``H`` is the hex SHA-256 *of those stored bytes*, so an
  array is checked by hashing the stored blob; ``D`` (``"<f8"``, ``"<i8"``, ``"|b1"``, ...) and
  the shape let it be shown without parsing the blob. ``A`` is ``{}`` when there are no arrays.

Changing any field of an entry changes its hash; deleting or reordering entries breaks the
``seq`` numbering and the ``prev_hash`` links; changing a stored array breaks its ``sha256``.
A rewrite of a whole chain tail (every hash recomputed) is caught by client receipts, which pin
the hash a client saw at a given ``seq`` (see :mod:`fedforest_secure.audit.receipts`).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

__all__ = [
    "FORMAT_VERSION",
    "GENESIS",
    "ArrayInfo",
    "Entry",
    "canonical_json",
    "decode_array",
    "encode_array",
    "format_timestamp",
    "is_hex_digest",
    "jsonable",
    "load_json",
]

#: ``prev_hash`` of the first entry of every job.
GENESIS = "0" * 64
#: The ``version`` field of every body this module writes.
FORMAT_VERSION = 1

_ARRAY_KINDS = frozenset("biuf")  # bool, signed, unsigned, float: no objects, no strings
_HEX = frozenset("0123456789abcdef")


def is_hex_digest(value: object) -> bool:
    """Whether ``value`` is a SHA-256 digest in lowercase hex (64 characters)."""
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def canonical_json(obj: Any) -> str:
    """The canonical JSON text of a JSON-able value (see the module docstring)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def load_json(text: str | bytes) -> Any:
    """``json.loads``, with text nested too deeply to parse a ``ValueError`` like any other bad
    JSON (Python's parser raises ``RecursionError``): what a verifier reads may be hostile."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


class _NotPlain(Exception):
    """A value :func:`_plain` does not convert: :func:`jsonable` says what and where."""


def _plain(obj: Any) -> Any:
    """:func:`jsonable` without the location bookkeeping (the common case of a valid
    payload, e.g. the thousands of split decisions of a level); :class:`_NotPlain` on anything
    it would reject."""
    cls = type(obj)
    if cls is str or cls is bool or obj is None:
        return obj
    if cls is int:
        return obj
    if cls is float:
        if not math.isfinite(obj):
            raise _NotPlain
        return obj
    if cls is list or cls is tuple:
        return [_plain(v) for v in obj]
    if cls is dict:
        out: dict[str, Any] = {}
        for key, value in obj.items():
            if type(key) is not str and (type(key) is not int):
                raise _NotPlain
            out[str(key)] = _plain(value)
        return out
    if isinstance(obj, bool | str | int | float | list | tuple | Mapping | np.ndarray
                  | enum.Enum | np.generic):
        return _located(obj, "")  # subclasses, numpy scalars, enums: the full rules
    raise _NotPlain


def jsonable(obj: Any, *, where: str = "payload") -> Any:
    """Convert a payload to plain JSON types (numpy scalars, tuples and enums included).

    Raises ``TypeError`` for values with no faithful JSON form (arrays, bytes, objects) and
    ``ValueError`` for NaN or infinite floats. Arrays belong in the ``arrays`` argument.
    """
    try:
        return _plain(obj)
    except (_NotPlain, TypeError, ValueError):
        return _located(obj, where)  # the same conversion, naming where it fails


def _located(obj: Any, where: str) -> Any:
    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, enum.Enum):
        return _located(obj.value, where)
    if isinstance(obj, int | np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        value = float(obj)
        if not math.isfinite(value):
            raise ValueError(f"{where}: non-finite float {value!r}")
        return value
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            if isinstance(key, bool) or not isinstance(key, str | int):
                raise TypeError(f"{where}: key {key!r} is not a string")
            out[str(key)] = _located(value, f"{where}.{key}")
        return out
    if isinstance(obj, list | tuple):
        return [_located(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, np.ndarray):
        raise TypeError(f"{where}: numpy arrays go in `arrays=`, not in the payload")
    raise TypeError(f"{where}: {type(obj).__name__} is not JSON-able")


def format_timestamp(moment: datetime) -> str:
    """The canonical text of a time: UTC, ISO 8601, microseconds. Naive times are refused."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("audit clock must return timezone-aware datetimes")
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class ArrayInfo:
    """The hashed description of one stored array."""

    dtype: str
    shape: tuple[int, ...]
    sha256: str
    encoding: str = "npy"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "encoding": self.encoding, "sha256": self.sha256,
                "shape": list(self.shape)}

    @classmethod
    def from_json(cls, obj: Any) -> ArrayInfo:
        if not isinstance(obj, Mapping) or set(obj) != {"dtype", "encoding", "sha256", "shape"}:
            raise ValueError("array descriptor must have exactly dtype, encoding, sha256, shape")
        shape = obj["shape"]
        if not isinstance(shape, list) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise ValueError("array descriptor has a bad shape")
        digest = obj["sha256"]
        if not is_hex_digest(digest):
            raise ValueError("array descriptor has a bad sha256")
        return cls(dtype=str(obj["dtype"]), shape=tuple(shape), sha256=digest,
                   encoding=str(obj["encoding"]))


def encode_array(name: str, array: np.ndarray) -> tuple[ArrayInfo, bytes]:
    """Encode one array as ``.npy`` bytes (little-endian, C order) and describe it."""
    if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable():
        raise ValueError(f"bad array name {name!r}")
    arr = np.asarray(array)
    if arr.dtype.kind not in _ARRAY_KINDS:
        raise TypeError(f"array {name!r}: dtype {arr.dtype} cannot be stored (numbers only)")
    arr = arr.astype(arr.dtype.newbyteorder("<"), order="C", copy=False)  # keeps 0-d shape
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=(1, 0), allow_pickle=False)
    blob = buf.getvalue()
    info = ArrayInfo(dtype=arr.dtype.str, shape=tuple(int(s) for s in arr.shape),
                     sha256=hashlib.sha256(blob).hexdigest())
    return info, blob


def decode_array(info: ArrayInfo, blob: bytes) -> np.ndarray:
    """Decode stored bytes; ``ValueError`` unless they match ``info`` exactly (digest included)."""
    if hashlib.sha256(blob).hexdigest() != info.sha256:
        raise ValueError("stored bytes do not match their sha256")
    if info.encoding != "npy":
        raise ValueError(f"unknown array encoding {info.encoding!r}")
    try:
        arr: np.ndarray = np.lib.format.read_array(io.BytesIO(blob), allow_pickle=False)
    except (OSError, EOFError, ValueError) as exc:
        raise ValueError(f"stored bytes are not a .npy array ({exc})") from exc
    if arr.dtype.str != info.dtype or tuple(arr.shape) != info.shape:
        raise ValueError("stored array does not match its dtype or shape")
    return arr


@dataclass(frozen=True)
class Entry:
    """One entry of a job's chain, as stored (texts verbatim, so that hashes can be checked).

    ``payload_json`` and ``arrays_json`` are the canonical JSON texts that the hash covers;
    :attr:`payload` and :attr:`arrays` parse them. ``row_id`` is the database row number (the
    insertion order), ``None`` for entries that were not read from a database.
    """

    job_id: str
    seq: int
    kind: str
    timestamp: str
    payload_json: str
    arrays_json: str
    prev_hash: str
    hash: str
    row_id: int | None = None

    @property
    def payload(self) -> dict[str, Any]:
        value = load_json(self.payload_json)
        if not isinstance(value, dict):
            raise ValueError("payload is not a JSON object")
        return value

    @property
    def arrays(self) -> dict[str, ArrayInfo]:
        value = load_json(self.arrays_json)
        if not isinstance(value, dict):
            raise ValueError("arrays is not a JSON object")
        return {str(k): ArrayInfo.from_json(v) for k, v in value.items()}

    @property
    def round_id(self) -> int | None:
        """The payload's ``round_id``, if it has an integer one."""
        try:
            value = self.payload.get("round_id")
        except ValueError:
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def label(self) -> str:
        """How problems name this entry: ``job 'j' seq 3 (round)``."""
        return f"job {self.job_id!r} seq {self.seq} ({self.kind})"

    def body(self) -> str:
        """The canonical body text the hash covers (built from the stored texts, verbatim)."""
        return (
            '{"arrays":' + self.arrays_json
            + ',"job_id":' + canonical_json(self.job_id)
            + ',"kind":' + canonical_json(self.kind)
            + ',"payload":' + self.payload_json
            + ',"seq":' + str(int(self.seq))
            + ',"timestamp":' + canonical_json(self.timestamp)
            + ',"version":' + str(FORMAT_VERSION) + "}"
        )

    def computed_hash(self) -> str:
        """SHA-256 of ``prev_hash`` (raw 32 bytes) followed by the UTF-8 body; hex."""
        if not is_hex_digest(self.prev_hash):
            raise ValueError("prev_hash is not 64 lowercase hex digits")
        prev = bytes.fromhex(self.prev_hash)
        return hashlib.sha256(prev + self.body().encode("utf-8")).hexdigest()

    def to_json(self) -> dict[str, Any]:
        """A plain dict of every stored field (payload and arrays parsed)."""
        return {
            "job_id": self.job_id, "seq": self.seq, "kind": self.kind,
            "timestamp": self.timestamp, "payload": self.payload,
            "arrays": {k: v.to_json() for k, v in self.arrays.items()},
            "prev_hash": self.prev_hash, "hash": self.hash,
        }

    @classmethod
    def build(cls, *, job_id: str, seq: int, kind: str, timestamp: str,
              payload: Mapping[str, Any], arrays: Mapping[str, ArrayInfo],
              prev_hash: str) -> Entry:
        """Make a new entry, computing its hash."""
        draft = cls(
            job_id=job_id, seq=seq, kind=kind, timestamp=timestamp,
            payload_json=canonical_json(jsonable(payload)),
            arrays_json=canonical_json({k: v.to_json() for k, v in arrays.items()}),
            prev_hash=prev_hash, hash="",
        )
        return dataclasses.replace(draft, hash=draft.computed_hash())

    def linked(self, *, seq: int, timestamp: str, prev_hash: str) -> Entry:
        """This entry's payload and arrays (their canonical texts as they are) at ``seq``
        after ``prev_hash``, with its hash computed: what :meth:`build` would make from the
        same payload, without converting and serialising it again."""
        draft = dataclasses.replace(self, seq=seq, timestamp=timestamp, prev_hash=prev_hash,
                                    hash="", row_id=None)
        return dataclasses.replace(draft, hash=draft.computed_hash())
