"""Export a log to JSON lines or CSV, and read exports back.

JSON lines (complete, re-importable): one object per entry, in job and ``seq`` order::

    {"format": "fedforest-audit/1", "job_id": ..., "seq": ..., "kind": ..., "timestamp": ...,
     "payload": {...}, "arrays": {name: {"dtype", "encoding", "sha256", "shape"}},
     "prev_hash": ..., "hash": ..., "data": {name: base64 of the stored .npy bytes}}

``payload`` and ``arrays`` are JSON objects whose canonical encoding is what the hash covers (see
:mod:`fedforest_secure.audit.entry`); ``data`` is omitted with ``include_arrays=False`` (what a
server serves a job's members: each entry's ``arrays`` keeps the digests, so the chain and the
receipts verify without the bytes, but such an export cannot be imported or replayed).

CSV (for spreadsheets, no array bytes): columns ``job_id, seq, kind, round_id, timestamp,
payload, arrays, prev_hash, hash`` with ``payload`` and ``arrays`` as their canonical JSON text,
so the chain can be re-checked from the CSV alone (:func:`read_csv` + ``verify_entries``).
"""

from __future__ import annotations

import base64
import binascii
import csv
import json
from collections.abc import Iterable
from typing import IO, Any

from ..errors import AuditError
from .entry import Entry, canonical_json, load_json
from .log import AuditLog

__all__ = ["export_csv", "export_jsonl", "import_jsonl", "read_csv", "read_jsonl"]

FORMAT = "fedforest-audit/1"
CSV_COLUMNS = ("job_id", "seq", "kind", "round_id", "timestamp", "payload", "arrays",
               "prev_hash", "hash")


def export_jsonl(log: AuditLog, fp: IO[str], job_id: str | None = None, *,
                 include_arrays: bool = True) -> int:
    """Write every entry (of ``job_id``) as one JSON line; return how many were written."""
    count = 0
    for entry in log.entries(job_id=job_id):
        try:
            obj: dict[str, Any] = {"format": FORMAT, **entry.to_json()}
        except ValueError as exc:  # a damaged entry: the CSV keeps its stored texts as they are
            raise AuditError(f"{entry.label} cannot be written as JSON lines ({exc}): `audit "
                             "verify` names the damage; `--format csv` exports the stored "
                             "texts as they are") from None
        if include_arrays:
            blobs = log.stored_arrays(entry.job_id, entry.seq)
            obj["data"] = {name: base64.b64encode(blob).decode("ascii")
                           for name, blob in sorted(blobs.items())}
        fp.write(json.dumps(obj, sort_keys=True, ensure_ascii=False) + "\n")
        count += 1
    return count


def read_jsonl(lines: Iterable[str]) -> list[tuple[Entry, dict[str, bytes] | None]]:
    """Parse a JSON-lines export into entries and their array bytes (:class:`AuditError` if
    bad); ``None`` for a line without ``data`` (an export written without arrays)."""
    out = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = load_json(line)
            if not isinstance(obj, dict) or obj.get("format") != FORMAT:
                raise ValueError(f"not a {FORMAT} line")
            entry = Entry(
                job_id=str(obj["job_id"]), seq=int(obj["seq"]), kind=str(obj["kind"]),
                timestamp=str(obj["timestamp"]), payload_json=canonical_json(obj["payload"]),
                arrays_json=canonical_json(obj["arrays"]), prev_hash=str(obj["prev_hash"]),
                hash=str(obj["hash"]))
            data = obj.get("data")
            if data is not None and not isinstance(data, dict):
                raise ValueError("data must be an object")
            blobs = None if data is None else {
                str(k): base64.b64decode(v, validate=True) for k, v in data.items()}
        except RecursionError:  # parsed, but too deep to write canonically
            raise AuditError(f"export line {lineno}: malformed (JSON nested too deeply)"
                             ) from None
        # OverflowError: a "seq" of 1e400
        except (ValueError, KeyError, TypeError, OverflowError, binascii.Error) as exc:
            raise AuditError(f"export line {lineno}: malformed ({exc})") from exc
        out.append((entry, blobs))
    return out


def import_jsonl(log: AuditLog, lines: Iterable[str]) -> int:
    """Append a complete JSON-lines export to ``log``, checking every hash and link on the way.

    Entries are inserted verbatim (same hashes), so the target must not already hold those jobs'
    entries. Raises :class:`AuditError` at the first entry that does not extend its chain, or
    that comes without its arrays' bytes.
    """
    count = 0
    for entry, blobs in read_jsonl(lines):
        if blobs is None:
            raise AuditError(f"{entry.label}: cannot import: the export holds no array data "
                             "(written without arrays, as a server serves its sites their "
                             "job's log); import the complete export `fedforest audit export "
                             "--format jsonl` writes from the audit database")
        log.import_entry(entry, blobs)
        count += 1
    return count


def export_csv(log: AuditLog, fp: IO[str], job_id: str | None = None) -> int:
    """Write every entry (of ``job_id``) as a CSV row; return how many were written."""
    writer = csv.writer(fp, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    count = 0
    for entry in log.entries(job_id=job_id):
        writer.writerow([entry.job_id, entry.seq, entry.kind,
                         "" if entry.round_id is None else entry.round_id, entry.timestamp,
                         entry.payload_json, entry.arrays_json, entry.prev_hash, entry.hash])
        count += 1
    return count


def read_csv(fp: IO[str]) -> list[Entry]:
    """Parse a CSV export back into entries (payload and arrays texts kept verbatim)."""
    reader = csv.DictReader(fp)
    if tuple(reader.fieldnames or ()) != CSV_COLUMNS:
        raise AuditError(f"CSV export must have the columns {', '.join(CSV_COLUMNS)}")
    out = []
    for row in reader:
        try:
            out.append(Entry(job_id=row["job_id"], seq=int(row["seq"]), kind=row["kind"],
                             timestamp=row["timestamp"], payload_json=row["payload"],
                             arrays_json=row["arrays"], prev_hash=row["prev_hash"],
                             hash=row["hash"]))
        except (ValueError, TypeError) as exc:
            raise AuditError(f"CSV line {reader.line_num}: malformed ({exc})") from exc
    return out
