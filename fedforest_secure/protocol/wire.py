"""The binary wire format: typed statistics blocks and ``pack`` / ``unpack``.

A message is ``MAGIC | len | meta | data``: ``meta`` is the canonical JSON of
``{"arrays": <array table>, "header": <JSON-able header>}`` (keys sorted, so the array table comes
first) and ``data`` the arrays' raw little-endian bytes in name order. Sizes are bounded and any
defect in a received message is the same opaque :class:`~fedforest_secure.errors.InvalidMessage`.

The summable vector of a round is laid out as a tuple of :class:`Block` s, each a shaped array
whose last axis has one :class:`StatKind` per column (the kind fixes the fixed-point encoding).
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidMessage

__all__ = [
    "HEAD_SIZE",
    "Block",
    "StatKind",
    "canonical_meta",
    "canonical_table",
    "kind_code",
    "kinds_vector",
    "layout_size",
    "meta_length",
    "pack",
    "pack_digest",
    "split_blocks",
    "unpack",
]

_MAGIC = b"FFS1"
_MAX_HEADER = 1 << 20  # 1 MiB of JSON header at most
_MAX_BODY = 1 << 31  # 2 GiB of array data at most
_DTYPES: dict[str, np.dtype[Any]] = {
    "float64": np.dtype("<f8"),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "uint64": np.dtype("<u8"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("?"),
}


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
        # Python's product (exact, and much cheaper on a short tuple than numpy's); past
        # int64 numpy's wrapped product
        n = math.prod(map(int, self.shape))
        return n if n < 1 << 63 else int(np.prod(self.shape, dtype=np.int64))

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


def kinds_vector(layout: tuple[Block, ...]) -> np.ndarray:
    """The :class:`StatKind` of every entry of the flat vector, as small integer codes
    (indices into ``tuple(StatKind)``)."""
    parts = [np.tile(np.array([_KIND_ORDER.index(k) for k in b.kinds], dtype=np.int8),
                     b.size // max(len(b.kinds), 1)) for b in layout]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int8)


def kind_code(kind: StatKind) -> int:
    """The integer code :func:`kinds_vector` uses for ``kind``."""
    return _KIND_ORDER.index(kind)


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


def _parts(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
           ) -> tuple[bytes, list[np.ndarray]]:
    """The bytes before the data (``MAGIC | len | meta``) and the arrays as :func:`pack` lays
    them out (contiguous little-endian, in name order), without copying the data."""
    descr = []
    chunks = []
    offset = 0
    for name in sorted(arrays):
        arr = np.asarray(arrays[name])
        dname = next((k for k, dt in _DTYPES.items() if arr.dtype == dt
                      or (arr.dtype.kind == dt.kind and arr.dtype.itemsize == dt.itemsize)), None)
        if dname is None:
            raise TypeError(f"array {name!r} has unsupported dtype {arr.dtype}")
        raw = np.ascontiguousarray(arr, dtype=_DTYPES[dname])
        descr.append({"name": name, "dtype": dname, "shape": list(arr.shape),
                      "offset": offset, "nbytes": raw.nbytes})
        chunks.append(raw)
        offset += raw.nbytes
    head = json.dumps({"header": _jsonable(dict(header)), "arrays": descr},
                      sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    if len(head) > _MAX_HEADER:
        raise ValueError("header too large")
    return _MAGIC + struct.pack("<I", len(head)) + head, chunks


def pack(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """Encode a JSON-able header and named arrays as ``MAGIC | len | header | data``."""
    head, chunks = _parts(header, arrays)
    return head + b"".join(c.tobytes() for c in chunks)


def pack_digest(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """SHA-256 of ``pack(header, arrays)``, hashed array by array without building the
    message (no copy of the data)."""
    head, chunks = _parts(header, arrays)
    h = hashlib.sha256(head)
    for c in chunks:
        if c.nbytes:
            h.update(c.reshape(-1).view(np.uint8).data)
    return h.digest()


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


# ---------------------------------------------------------------------- canonical bytes
#: Bytes before the meta text: MAGIC and the meta length (uint32, little-endian).
HEAD_SIZE = len(_MAGIC) + 4
_EMPTY_TABLE = b'{"arrays":[],'  # how pack(header, {}) starts its meta


def meta_length(body: bytes) -> int:
    """Length of the meta text of a (parsed, valid) message ``body``."""
    return int(struct.unpack("<I", body[len(_MAGIC):HEAD_SIZE])[0])


def canonical_table(body: bytes) -> bytes | None:
    """The array table :func:`pack` would write for the arrays a (parsed, valid) body holds, as
    canonical JSON; None unless the body lists them in name order, as pack does.

    Each entry is rebuilt from the fields the parser reads (name, dtype, shape, offset,
    nbytes; extra keys dropped, numbers as integers), so a body whose table differs from it in
    any byte fails the comparison of the whole meta text and takes the slow path."""
    hlen = meta_length(body)
    descr = json.loads(body[HEAD_SIZE:HEAD_SIZE + hlen])["arrays"]
    table = [{"dtype": str(d["dtype"]), "name": str(d["name"]),
              "nbytes": int(d["nbytes"]), "offset": int(d["offset"]),
              "shape": [int(s) for s in d["shape"]]} for d in descr]
    names = [str(d["name"]) for d in descr]
    if names != sorted(names):
        return None
    return json.dumps(table, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def canonical_meta(header: dict[str, Any], table: bytes) -> bytes | None:
    """The canonical meta text of ``pack(header, arrays)`` for arrays whose table is
    ``table``: pack's own text for the header (``pack(header, {})``), the table spliced in."""
    empty = pack(header, {})[HEAD_SIZE:]
    if not empty.startswith(_EMPTY_TABLE):
        return None  # pack's layout changed: take the slow path
    return b'{"arrays":' + table + b"," + empty[len(_EMPTY_TABLE):]
