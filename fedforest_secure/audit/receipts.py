"""Client receipts: what a client keeps so it can later hold the server's audit log to account.

For every upload a client writes one :class:`Receipt` as a JSON line to a file in its receipts
directory (``<dir>/<client>.jsonl`` by default), once the server has answered the upload. A
receipt pins two facts:

* ``upload_digest``: SHA-256 hex of the exact bytes uploaded (masked or not) for
  ``(job_id, round_id)``. The log's round entry must list this digest for this client.
* ``chain_head_seen`` at ``seq_seen``: the chain head the server announced to the client (with the
  task). The log's entry ``seq_seen`` of the job must have exactly this hash (``seq_seen = 0``
  means the genesis value). Since every hash covers all earlier entries, a log rewritten before
  ``seq_seen`` — even with all hashes recomputed — disagrees with the receipt, and a log cut
  short before ``seq_seen`` lacks the entry.

A round receipt pins the chain as it was *before* its round's entry, so the tail of a job (its
last round and the model) needs one more: when a client downloads the final model it writes a
:class:`ModelReceipt` (``kind = "model"``) with the model file's SHA-256 and the chain head the
server announced with it, which covers the model entry and everything before it. ``verify``
holds the log to both (see :mod:`fedforest_secure.audit.verify`). A job that fails instead
has no model: when the server tells a client that its job failed, the client writes a
:class:`FailedReceipt` (``kind = "failed"``) with the chain head the server announced then, which
covers the entry of the failure (``round_aborted`` or ``job_failed``) and everything before it.
A client that refuses a round (a privacy rule, a peer's message that does not authenticate)
leaves the job: it writes a :class:`RefusedReceipt` (``kind = "refused"``) with the chain head the
server answered the refusal with, which covers the client's ``client_dropped`` entry (and the
peer it accused).

An upload's answer can take a while (the server counts the upload first; a secure upload's answer
then waits up to 10 s for the next step of secure aggregation, and a large body takes its time
on a slow link), and a client stopped meanwhile would keep no record of an upload the server
may have counted.
So before it sends an upload the client writes a :class:`SentReceipt` (``kind = "sent"``): the
same facts plus the task's digest, flushed to disk before the request goes. A sent record that
the upload's :class:`Receipt` follows says nothing more; one that none follows is checked against
the log's round entry if it lists that upload, and is a note if it does not (the server may
never have received it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..files import append_line
from .entry import GENESIS, is_hex_digest, load_json

__all__ = ["FailedReceipt", "ModelReceipt", "Receipt", "RefusedReceipt", "SentReceipt",
           "read_receipts", "upload_digest", "write_receipt"]

_FIELDS = ("job_id", "round_id", "client", "upload_digest", "chain_head_seen", "seq_seen")
_SENT_FIELDS = ("kind", "job_id", "round_id", "client", "task_digest", "upload_digest",
                "chain_head_seen", "seq_seen")
_MODEL_FIELDS = ("kind", "job_id", "client", "model_digest", "chain_head_seen", "seq_seen")
_FAILED_FIELDS = ("kind", "job_id", "client", "chain_head_seen", "seq_seen")
_REFUSED_FIELDS = ("kind", "job_id", "round_id", "client", "chain_head_seen", "seq_seen")


def _fields_of(obj: Any, fields: tuple[str, ...], what: str, kind: str | None = None
               ) -> dict[str, Any]:
    """The record's fields but ``kind``, if ``obj`` has exactly ``fields`` (and the ``kind``
    given); ``ValueError`` naming ``what`` otherwise."""
    if not isinstance(obj, dict) or set(obj) != set(fields) or obj.get("kind") != kind:
        raise ValueError(f"{what} has exactly the fields {', '.join(fields)}")
    return {name: obj[name] for name in fields if name != "kind"}


def upload_digest(data: bytes) -> str:
    """SHA-256 hex of the exact bytes of one upload (what receipts and round entries hold)."""
    return hashlib.sha256(bytes(data)).hexdigest()


@dataclass(frozen=True)
class Receipt:
    """A client's record of one upload and of the chain head it saw."""

    job_id: str
    round_id: int
    client: str
    upload_digest: str
    chain_head_seen: str
    seq_seen: int

    def __post_init__(self) -> None:
        for name in ("job_id", "client"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"receipt {name} must be a non-empty string")
        for name in ("round_id", "seq_seen"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"receipt {name} must be a non-negative integer")
        for name in ("upload_digest", "chain_head_seen"):
            if not is_hex_digest(getattr(self, name)):
                raise ValueError(f"receipt {name} must be a sha256 hex digest")
        if (self.seq_seen == 0) != (self.chain_head_seen == GENESIS):
            raise ValueError("receipt: seq_seen 0 goes with the genesis head, and only with it")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> Receipt:
        """Parse a receipt; ``ValueError`` on missing, extra or mistyped fields."""
        return cls(**_fields_of(obj, _FIELDS, "a receipt"))

    @property
    def label(self) -> str:
        return f"client {self.client!r}, job {self.job_id!r}, round {self.round_id}"


@dataclass(frozen=True)
class SentReceipt:
    """A client's record of an upload it is about to send, written before the request: what the
    client knows before the server answers (the upload's :class:`Receipt` follows the answer).
    """

    job_id: str
    round_id: int
    client: str
    task_digest: str
    upload_digest: str
    chain_head_seen: str
    seq_seen: int

    def __post_init__(self) -> None:
        Receipt(self.job_id, self.round_id, self.client, self.upload_digest,
                self.chain_head_seen, self.seq_seen)  # the same checks
        if not is_hex_digest(self.task_digest):
            raise ValueError("receipt task_digest must be a sha256 hex digest")

    def to_json(self) -> dict[str, Any]:
        return {"kind": "sent", **asdict(self)}

    @classmethod
    def from_json(cls, obj: Any) -> SentReceipt:
        """Parse a sent record; ``ValueError`` on missing, extra or mistyped fields."""
        return cls(**_fields_of(obj, _SENT_FIELDS, "a sent record", kind="sent"))

    def confirmed_by(self, receipt: Receipt) -> bool:
        """Whether ``receipt`` is the receipt of this very upload."""
        return (receipt.job_id, receipt.round_id, receipt.client, receipt.upload_digest) == \
            (self.job_id, self.round_id, self.client, self.upload_digest)

    @property
    def label(self) -> str:
        return f"client {self.client!r}, job {self.job_id!r}, round {self.round_id}, sent"


def _check_end_receipt(receipt: ModelReceipt | FailedReceipt | RefusedReceipt, what: str,
                       digests: tuple[str, ...]) -> None:
    """The checks of a receipt of a job's end for a site (its model, its failure, or the site's
    refusal): non-empty job and client, a positive ``seq_seen`` (the end is an entry), and the
    ``digests`` fields SHA-256 hex; ``ValueError`` naming ``what`` otherwise."""
    for name in ("job_id", "client"):
        if not isinstance(getattr(receipt, name), str) or not getattr(receipt, name):
            raise ValueError(f"receipt {name} must be a non-empty string")
    seq = receipt.seq_seen
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError(f"{what}'s seq_seen must be a positive integer")
    for name in digests:
        if not is_hex_digest(getattr(receipt, name)):
            raise ValueError(f"receipt {name} must be a sha256 hex digest")


@dataclass(frozen=True)
class ModelReceipt:
    """A client's record of the final model it received and of the chain head announced with it."""

    job_id: str
    client: str
    model_digest: str
    chain_head_seen: str
    seq_seen: int

    def __post_init__(self) -> None:
        _check_end_receipt(self, "a model receipt", ("model_digest", "chain_head_seen"))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "model", **asdict(self)}

    @classmethod
    def from_json(cls, obj: Any) -> ModelReceipt:
        """Parse a model receipt; ``ValueError`` on missing, extra or mistyped fields."""
        return cls(**_fields_of(obj, _MODEL_FIELDS, "a model receipt", kind="model"))

    @property
    def label(self) -> str:
        return f"client {self.client!r}, job {self.job_id!r}, model"


@dataclass(frozen=True)
class FailedReceipt:
    """A client's record that the server told it its job failed, and of the chain head the
    server announced then (it covers the entry of the failure)."""

    job_id: str
    client: str
    chain_head_seen: str
    seq_seen: int

    def __post_init__(self) -> None:
        _check_end_receipt(self, "a failure receipt", ("chain_head_seen",))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "failed", **asdict(self)}

    @classmethod
    def from_json(cls, obj: Any) -> FailedReceipt:
        """Parse a failure receipt; ``ValueError`` on missing, extra or mistyped fields."""
        return cls(**_fields_of(obj, _FAILED_FIELDS, "a failure receipt", kind="failed"))

    @property
    def label(self) -> str:
        return f"client {self.client!r}, job {self.job_id!r}, failed"


@dataclass(frozen=True)
class RefusedReceipt:
    """A client's record that it refused round ``round_id`` (and so left the job), and of the
    chain head the server answered the refusal with (it covers the client's ``client_dropped``
    entry, which names the peer it accused, if any)."""

    job_id: str
    round_id: int
    client: str
    chain_head_seen: str
    seq_seen: int

    def __post_init__(self) -> None:
        _check_end_receipt(self, "a refusal receipt", ("chain_head_seen",))
        if isinstance(self.round_id, bool) or not isinstance(self.round_id, int) \
                or self.round_id < 0:
            raise ValueError("receipt round_id must be a non-negative integer")

    def to_json(self) -> dict[str, Any]:
        return {"kind": "refused", **asdict(self)}

    @classmethod
    def from_json(cls, obj: Any) -> RefusedReceipt:
        """Parse a refusal receipt; ``ValueError`` on missing, extra or mistyped fields."""
        return cls(**_fields_of(obj, _REFUSED_FIELDS, "a refusal receipt", kind="refused"))

    @property
    def label(self) -> str:
        return f"client {self.client!r}, job {self.job_id!r}, round {self.round_id}, refused"


#: Any record of a receipts file.
AnyReceipt = Receipt | SentReceipt | ModelReceipt | FailedReceipt | RefusedReceipt


def parse_receipt(obj: Any) -> AnyReceipt:
    """A round receipt, a sent record (``"kind": "sent"``), a model receipt (``"kind":
    "model"``), a failure receipt (``"kind": "failed"``) or a refusal receipt (``"kind":
    "refused"``); ``ValueError`` otherwise."""
    if isinstance(obj, dict) and obj.get("kind") == "sent":
        return SentReceipt.from_json(obj)
    if isinstance(obj, dict) and obj.get("kind") == "failed":
        return FailedReceipt.from_json(obj)
    if isinstance(obj, dict) and obj.get("kind") == "refused":
        return RefusedReceipt.from_json(obj)
    if isinstance(obj, dict) and "kind" in obj:
        return ModelReceipt.from_json(obj)
    return Receipt.from_json(obj)


def write_receipt(directory: str | Path, receipt: AnyReceipt, *,
                  filename: str | None = None) -> Path:
    """Append ``receipt`` as one JSON line to ``directory/<client>.jsonl`` (or ``filename``),
    on disk when this returns: one ``write`` in append mode, then ``fsync`` (and of the
    directory when the file is new), so a client killed right after (e.g. while its upload's
    request waits) keeps the line whole. A last line a crash cut short (no newline) holds no
    receipt: this one takes its place, as if the crash had come before that write. A missing
    ``directory`` is made owner-only (0700)."""
    folder = Path(directory)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    name = filename or f"{receipt.client}.jsonl"
    if Path(name).name != name or not name.endswith(".jsonl"):
        raise ValueError(f"bad receipt file name {name!r}")
    path = folder / name
    # one file for all the site's jobs, whose clients may append at the same time; on disk
    # before the upload it records is sent
    append_line(path, json.dumps(receipt.to_json(), sort_keys=True), sync=True, drop_torn=True)
    return path


class TornLine(ValueError):
    """A file's last line that does not parse and has no newline: what a site's crash in the
    middle of :func:`write_receipt` leaves (the line and its newline are one write)."""


def read_receipts(directory: str | Path
                  ) -> Iterator[tuple[str, AnyReceipt | ValueError]]:
    """Yield ``("file.jsonl:line", receipt or the parse error)`` for every ``*.jsonl`` line;
    the error of a torn last line is a :class:`TornLine`."""
    for path in sorted(Path(directory).glob("*.jsonl")):
        if not path.is_file():
            yield path.name, ValueError("not a file")
            continue
        with path.open("rb") as fp:
            for lineno, raw in enumerate(fp, start=1):
                where = f"{path.name}:{lineno}"
                try:  # a damaged line (bytes that are not UTF-8, not JSON) is one problem
                    line = raw.decode("utf-8")
                    if not line.strip():
                        continue
                    yield where, parse_receipt(load_json(line))
                except (ValueError, TypeError) as exc:
                    # cut short: bytes or JSON that end too soon, and no newline (which only
                    # the last line can lack)
                    torn = isinstance(exc, UnicodeDecodeError | json.JSONDecodeError) \
                        and not raw.endswith(b"\n")
                    yield where, (TornLine if torn else ValueError)(str(exc))
