"""A task whose wire bytes and digests are computed once: :class:`SealedTask`.

:class:`~fedforest_secure.protocol.Task` computes :meth:`~Task.to_bytes`, :meth:`~Task.digest`
and :meth:`~Task.question_digest` afresh on every call (the task is a mutable dataclass), and
each is a pass over arrays as large as the round's summable vector. One round used to pack
and hash its task seven times on the server (store, digest, question, round setup) and six
times on every client (the announced digest, the worker's own checks, the round setup check,
the upload header). A sealed task does it once: the server seals the coordinator's task when
it issues the round and serves the same bytes to every client; a client seals the bytes it
downloaded.

Canonical bytes. ``pack(header, arrays)`` is ``MAGIC | len | meta | data`` where ``meta`` is
the canonical JSON of ``{"arrays": descr, "header": header}`` (keys sorted: the array table
first) and ``data`` the arrays' raw bytes in name order. Downloaded bytes are the task's
canonical encoding exactly when their array table lists the arrays in name order and their
``meta`` equals the canonical text; both are checked on the small ``meta`` alone (the array
data of a parsed body is, byte for byte, what ``pack`` writes). Then the body's SHA-256 is the
task digest, and the question digest (the same bytes with the question's header) is one hash
over the new ``meta`` and the body's data section, without packing the arrays again. Any other
body (valid but not canonical) takes the slow path of :class:`Task`, with the same results.

A sealed task must not be mutated; nothing in the library mutates a task it received.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, fields
from typing import Any

from fedforest_secure.errors import InvalidMessage
from fedforest_secure.protocol import _INFORMATIONAL, Task, pack

__all__ = ["SealedTask", "seal"]

_HEAD = 8  # MAGIC (4 bytes) and the meta length (uint32, little-endian)
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
