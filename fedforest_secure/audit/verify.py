"""Check an audit log: its hash chains, its stored arrays, and the clients' receipts.

Every problem is one line naming what it concerns — ``job 'j' seq 3 (round): ...`` for entries,
``receipt alice.jsonl:2 (client 'alice', job 'j', round 4): ...`` for receipts — and verification
never stops at the first problem. Per job it checks that

* every entry's stored ``hash`` equals the recomputed one (a changed field, payload included);
* ``seq`` runs 1, 2, ..., n without gaps or duplicates (a deleted entry);
* entry 1 links to the genesis value and each later entry to its predecessor's hash;
* rows were inserted in ``seq`` order (entries moved around);
* the chain holds one job: a single ``job_created`` entry (a job id created again on the same
  log appends a second);
* nothing follows the job's end: its model, or its failure (``job_failed``, or a round's
  ``round_aborted`` with at most the job's ``job_failed`` right after it), a model included;
* a site joins once, and a dropped site is among the clients of no later round;
* each ``round`` entry's round id is above the previous ``round`` entry's (a round logged
  twice, or an older round logged after a newer one);
* payloads are canonical JSON of a known kind with the required keys;
* each stored array is present and its bytes hash to the digest in the entry (an array the
  database cannot return is named, and the others are still checked; a site's copy of its
  job's log, read with ``arrays_held=False``, holds the digests only: a note says so);
* the ``round_id`` column holds the payload's ``round_id`` as an integer, or nothing;

and, given a receipts directory, that every receipt agrees with the log
(see :mod:`fedforest_secure.audit.receipts`) and that the receipts cover each receipted job's
tail: some receipt pins a chain head at or after the job's last round entry and after its model
entry (a model receipt does), a model receipt's digest is the logged model's, and a log that lost
its model entry is named; a site the log says joined the job or took part in its rounds and of
which no receipt is given is named in a note (its part is the server's word only; of one
dropped before any round listed its upload, which keeps no receipt, that it joined). A failure
receipt (the server told a site its job failed) needs the log's entry of the failure
(``round_aborted`` or ``job_failed``) within the chain head it pins, and no model entry. A
job whose chain has not ended (no ``model``, ``job_failed`` or
``round_aborted`` entry: it was running when the log was read) and of which no receipt is a
model or failure receipt (a site that holds one knows it ended) is checked as far as the log
goes: its sites' receipts of later rounds and its last round not receipted yet are notes, and
the report names the job in ``running``. A client's record of an upload it sent (written
before the request) that no receipt of the upload follows (the client stopped before the server
answered) is checked like a receipt when the log's round entry lists that upload for the
client, is a note when the entry does not list the client (or the round has none), and a
problem when it lists another upload of the client that none of the client's records holds.
A receipts file's last line cut short (a client that stopped while writing it) is a note and
is ignored; a damaged line that other lines follow is a problem. A log whose entries the
database cannot return (a value changed behind the log's back: text that is not UTF-8, a
``seq`` that is not an integer) is one problem naming it.
With ``replay=True`` it also replays each job through the coordinator
(:mod:`fedforest_secure.audit.replay`): every logged task digest must be the task that follows
from the logged configuration and aggregates, and the model digest the model they yield.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from ..errors import AuditError
from ._receipt_checks import check_receipts, not_ended
from .entry import (
    GENESIS,
    ArrayInfo,
    Entry,
    canonical_json,
    decode_array,
    is_hex_digest,
    load_json,
)
from .kinds import EntryKind, check_payload
from .log import AuditLog

if TYPE_CHECKING:
    from ._sql import Engine

__all__ = ["VerifyReport", "unreadable", "verify_entries", "verify_log"]


@dataclass
class VerifyReport:
    """The outcome of a verification: ``ok`` only if no problem was found."""

    problems: list[str] = field(default_factory=list)
    #: what the check could not vouch for without it being a problem (e.g. the last round of
    #: a job that failed before any site kept a receipt after it)
    notes: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    #: the jobs that have not ended in this log, each as ``job 'j' has not ended in this log
    #: (...; checked up to seq n, round r)``: verified only as far as the log goes
    running: list[str] = field(default_factory=list)
    entries_checked: int = 0
    receipts_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_for_problems(self) -> None:
        """Raise :class:`AuditError` listing every problem, if there is any."""
        if self.problems:
            raise AuditError("audit log does not verify:\n" + "\n".join(self.problems))


def _check_entry(entry: Entry) -> list[str]:
    """Problems with one entry taken alone: hash, encoding, kind and payload."""
    out: list[str] = []
    where = entry.label
    if not is_hex_digest(entry.prev_hash):
        out.append(f"{where}: prev_hash is not a sha256 hex digest")
    elif entry.computed_hash() != entry.hash:
        out.append(f"{where}: hash mismatch, the entry was changed "
                   f"(stored {entry.hash[:16]}..., recomputed {entry.computed_hash()[:16]}...)")
    try:
        payload = entry.payload
        arrays = entry.arrays
        canonical = canonical_json(payload) == entry.payload_json
    except RecursionError:  # parsed, but too deep to write again
        return [*out, f"{where}: unreadable payload or arrays (JSON nested too deeply)"]
    except ValueError as exc:
        return [*out, f"{where}: unreadable payload or arrays ({exc})"]
    if not canonical:
        out.append(f"{where}: payload text is not canonical JSON")
    if canonical_json({k: v.to_json() for k, v in arrays.items()}) != entry.arrays_json:
        out.append(f"{where}: arrays text is not canonical JSON")
    try:
        check_payload(EntryKind(entry.kind), payload, set(arrays))
    except ValueError as exc:
        out.append(f"{where}: {exc}")
    return out


def _check_chain(entries: Sequence[Entry]) -> list[str]:
    """Problems with one job's entries, given in ``seq`` order."""
    out: list[str] = []
    prev: Entry | None = None
    for entry in entries:
        out.extend(_check_entry(entry))
        expected_seq = 1 if prev is None else prev.seq + 1
        if entry.seq < expected_seq:
            out.append(f"{entry.label}: duplicate or out-of-range seq")
        elif entry.seq > expected_seq:
            missing = (f"seq {expected_seq}" if entry.seq == expected_seq + 1
                       else f"seq {expected_seq}..{entry.seq - 1}")
            out.append(f"job {entry.job_id!r}: {missing} missing (deleted?) before "
                       f"{entry.label}")
        expected_prev = GENESIS if prev is None else prev.hash
        if entry.prev_hash != expected_prev:
            target = "the genesis value" if prev is None else f"the hash of seq {prev.seq}"
            out.append(f"{entry.label}: prev_hash does not link to {target}")
        if prev is not None and prev.row_id is not None and entry.row_id is not None \
                and entry.row_id < prev.row_id:
            out.append(f"{entry.label}: stored before seq {prev.seq} (entries reordered)")
        prev = entry
    created = [e for e in entries if e.kind == EntryKind.JOB_CREATED.value]
    out.extend(f"{e.label}: a second job_created entry in the chain (the first is seq "
               f"{created[0].seq}): a chain holds one job, so the job id was created again "
               "on this audit log" for e in created[1:])
    model = next((e for e in entries if e.kind == EntryKind.MODEL.value), None)
    after_model: list[Entry] = []
    if model is not None:  # a finished job: the server writes nothing after its model
        after_model = [e for e in entries if e.seq > model.seq]
        out.extend(f"job {e.job_id!r}: seq {e.seq} ({e.kind}) comes after the job's model "
                   f"entry (seq {model.seq}): nothing follows a finished job's model "
                   "(appended?)" for e in after_model)
    failed = next((e for e in entries if e.kind in (EntryKind.ROUND_ABORTED.value,
                                                     EntryKind.JOB_FAILED.value)), None)
    if failed is not None:
        # a failed job: the server writes nothing after its failure but the job's failure
        # right after the open round's abort (a job stopped in a round, e.g. cancelled); a
        # round or a model after it is a problem too (the log says no sum of that round was
        # released, and the job had stopped)
        ends = 2 if failed.kind == EntryKind.ROUND_ABORTED.value else 1
        tail = [e for e in entries if e.seq > failed.seq]
        allowed = [e for e in tail[:ends - 1] if e.seq == failed.seq + 1
                   and e.kind == EntryKind.JOB_FAILED.value]
        out.extend(f"job {e.job_id!r}: seq {e.seq} ({e.kind}) comes after the job's failure "
                   f"({failed.label}): nothing follows a failed job's end (appended?)"
                   for e in tail if e not in allowed and e not in after_model)
    out.extend(_after_drop(entries))
    out.extend(_rounds_in_order(entries))
    return out


def _rounds_in_order(entries: Sequence[Entry]) -> list[str]:
    """The server logs each round once, when it closes, and rounds close in the order of their
    ids: a ``round`` entry whose round id is not above the previous one's logs a round twice
    or goes back (a server that resumed from an older copy of its database)."""
    out: list[str] = []
    last: tuple[int, Entry] | None = None
    for e in entries:
        if e.kind != EntryKind.ROUND.value:
            continue
        try:
            round_id = e.payload.get("round_id")
        except ValueError:  # unreadable: named by the entry's own check
            continue
        if not isinstance(round_id, int) or isinstance(round_id, bool):
            continue  # named by the payload's check
        if last is not None and round_id <= last[0]:
            again = "again" if round_id == last[0] else "after round " + str(last[0])
            out.append(f"{e.label}: round {round_id} is logged {again} ({last[1].label}): "
                       "each round is logged once, in order (a server that resumed from an "
                       "older copy of its database?)")
        last = (round_id, e)
    return out


def _after_drop(entries: Sequence[Entry]) -> list[str]:
    """A site leaves a job when the log drops it: a ``round`` entry of a later round that
    lists it among its clients, or a second ``client_joined`` entry of a site, is a problem
    (a site dropped in a round may still be among that round's clients: a secure round's sum
    holds the masked upload of a site dropped after it)."""
    out: list[str] = []
    dropped: dict[str, Entry] = {}
    joined: dict[str, Entry] = {}
    for e in entries:
        try:
            payload = e.payload
        except ValueError:  # unreadable: named by the entry's own check
            continue
        client = payload.get("client")
        if e.kind == EntryKind.CLIENT_DROPPED.value and isinstance(client, str):
            dropped.setdefault(client, e)
        elif e.kind == EntryKind.CLIENT_JOINED.value and isinstance(client, str):
            first = joined.setdefault(client, e)
            if first is not e:
                out.append(f"{e.label}: site {client!r} joined already ({first.label}): a "
                           "site joins a job once")
        elif e.kind == EntryKind.ROUND.value and isinstance(payload.get("clients"), list):
            for name in payload["clients"]:
                gone = dropped.get(name) if isinstance(name, str) else None
                if gone is not None and _earlier_round(gone, e):
                    out.append(f"{e.label}: lists site {name!r}, which the log dropped in an "
                               f"earlier round ({gone.label}): a dropped site takes no part "
                               "in later rounds")
    return out


def _earlier_round(drop: Entry, round_entry: Entry) -> bool:
    """Whether ``drop`` names a round before ``round_entry``'s."""
    when, then = drop.round_id, round_entry.round_id
    return when is not None and then is not None and when < then


def verify_entries(entries: Iterable[Entry]) -> VerifyReport:
    """Check the chains of entries read from anywhere (e.g. an export); arrays are not checked."""
    by_job: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        by_job[entry.job_id].append(entry)
    report = VerifyReport(jobs=sorted(by_job))
    for job in report.jobs:
        chain = sorted(by_job[job], key=lambda e: (e.seq, e.row_id or 0))
        report.problems.extend(_check_chain(chain))
        report.entries_checked += len(chain)
    return report


def _check_arrays(log: AuditLog, entries: Sequence[Entry], job_id: str | None,
                  missing: dict[str, int] | None = None) -> list[str]:
    """Stream the stored arrays (one blob in memory at a time) against the entries' digests.
    With ``missing`` (a log that holds some entries without their arrays' bytes), an absent
    array is no problem: ``missing`` counts, per job, the entries that lack theirs."""
    out: list[str] = []
    expected: dict[tuple[str, int], tuple[Entry, dict[str, ArrayInfo]]] = {}
    for entry in entries:
        try:
            expected.setdefault((entry.job_id, entry.seq), (entry, entry.arrays))
        except ValueError:
            continue  # already reported as unreadable
    found: set[tuple[str, int, str]] = set()
    stopped: str | None = None
    try:
        for stored in log.store.scan_arrays(job_id):
            key, name, blob = (stored.job_id, stored.seq), stored.name, stored.data
            found.add((*key, name))
            if key not in expected:
                out.append(f"job {key[0]!r} seq {key[1]}: stored array {name!r} belongs to "
                           "no entry")
                continue
            entry, infos = expected[key]
            info = infos.get(name)
            if info is None:
                out.append(f"{entry.label}: stored array {name!r} is not listed in the entry")
            elif stored.error is not None:
                out.append(f"{entry.label}: stored array {name!r} cannot be read "
                           f"({stored.error}): the array was rewritten")
            elif hashlib.sha256(blob).hexdigest() != info.sha256:
                out.append(f"{entry.label}: stored array {name!r} does not match its digest "
                           "(array changed)")
            else:
                try:
                    decode_array(info, blob)
                except ValueError as exc:
                    out.append(f"{entry.label}: stored array {name!r}: {exc}")
    except (DBAPIError, AuditError) as exc:  # the arrays' keys cannot be read
        stopped = unreadable("stored arrays", exc)
    unseen = [f"{entry.label}: stored array {name!r}"
              for (job, seq), (entry, infos) in sorted(expected.items())
              for name in sorted(infos) if (job, seq, name) not in found]
    if stopped is None and missing is not None:
        for (job, seq), (_entry, infos) in expected.items():
            if any((job, seq, name) not in found for name in infos):
                missing[job] = missing.get(job, 0) + 1
    elif stopped is None:
        out.extend(f"{what} is missing" for what in unseen)
    else:  # what the scan did not reach may be there
        out.append(stopped + (f"; {len(unseen)} array(s) were not checked (first: {unseen[0]})"
                              if unseen else ""))
    return out


def _check_round_column(log: AuditLog, job_id: str | None) -> list[str]:
    out: list[str] = []
    try:
        for row in log.store.scan_index(job_id):
            try:
                value = load_json(row.payload).get("round_id")
            except (ValueError, AttributeError):
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                value = None
            # the column as stored: 3.5 or "three" is not the payload's 3 (a query for
            # round 3 would not find the entry)
            column = row.round_id
            if not (column is None and value is None or type(column) is int and column == value):
                out.append(f"job {row.job_id!r} seq {row.seq} ({row.kind}): round_id column "
                           f"({column!r}) disagrees with the payload ({value!r})")
    except (DBAPIError, AuditError) as exc:
        out.append(unreadable("entries", exc))
    return out


def _without_arrays(job: str, count: int) -> str:
    """The note of a job whose log holds ``count`` entries without their arrays' bytes."""
    return (f"job {job!r}: the arrays of {count} entr{'y' if count == 1 else 'ies'} (the "
            "rounds' aggregates, the sites' disclosures) are not in this log, as the server "
            "serves its sites the log: their SHA-256 digests are in the entries, so the chain "
            "and the receipts verify; the arrays themselves are not checked")


def _no_replay(job: str) -> str:
    """The problem of a replay asked of a job whose arrays the log does not hold."""
    return (f"job {job!r} replay: this log holds no arrays to replay (the server serves its "
            "sites the log without the rounds' aggregates and disclosures, unless its "
            "server.toml sets audit_arrays_for_sites = true); replay the whole log, which the "
            "server's operator exports with `fedforest audit export --db <audit database> "
            f"--format jsonl --job {job} --out {job}.jsonl`, or verify this one without "
            "--replay")


def unreadable(what: str, exc: DBAPIError | AuditError) -> str:
    """The problem of a part of the log (``what``) that cannot be read: a value the database
    cannot return (text that is not UTF-8), or a ``seq`` that is no integer (the store's
    :class:`AuditError` names its row)."""
    if isinstance(exc, AuditError):
        return str(exc)
    orig = exc.orig if exc.orig is not None else exc
    return (f"the audit log's {what} cannot be read ({type(orig).__name__}: "
            f"{str(orig)[:200]}): a value was changed behind the log's back, or the database "
            "failed")


def verify_log(log_or_url: AuditLog | Engine | str | Path,
               receipts_dir: str | Path | None = None, *,
               job_id: str | None = None, replay: bool = False,
               arrays_held: bool = True) -> VerifyReport:
    """Verify every job (or ``job_id``) of a log, and the receipts in ``receipts_dir`` if given;
    with ``replay``, replay each job's rounds through the coordinator (needs the engine).

    ``log_or_url`` is an :class:`AuditLog`, a SQLAlchemy engine, a SQLAlchemy URL or a SQLite
    file path; a database without an audit log is reported as a problem, not created.
    ``arrays_held=False``: the log holds entries without their arrays' bytes (a job's members
    get its log without them, unless the server sets ``audit_arrays_for_sites``): each job
    that lacks some is a note (the chain and the receipts verify on the digests), and its
    replay, which needs them, a problem saying where the whole log comes from.
    """
    owned: AuditLog | None = None
    if isinstance(log_or_url, AuditLog):
        log = log_or_url
    else:
        try:
            if isinstance(log_or_url, str | Path):
                log = owned = AuditLog(log_or_url, create=False)
            else:
                log = owned = AuditLog(engine=log_or_url, create=False)  # a given engine stays open
        except AuditError as exc:
            return VerifyReport(problems=[str(exc)])
    try:
        try:
            entries = log.entries(job_id=job_id)
        except (DBAPIError, AuditError) as exc:
            return VerifyReport(problems=[unreadable("entries", exc)])
        report = verify_entries(entries)
        report.problems.extend(_check_round_column(log, job_id))
        missing: dict[str, int] | None = None if arrays_held else {}
        report.problems.extend(_check_arrays(log, entries, job_id, missing))
        for job, count in sorted((missing or {}).items()):
            report.notes.append(_without_arrays(job, count))
        if job_id is not None and not entries:
            report.problems.append(f"job {job_id!r} is not in the log")
        chains: dict[str, dict[int, Entry]] = defaultdict(dict)
        for entry in entries:
            chains[entry.job_id].setdefault(entry.seq, entry)
        running = set(chains)
        if receipts_dir is not None:
            check = check_receipts(entries, Path(receipts_dir), job_id)
            report.problems.extend(check.problems)
            report.notes.extend(check.notes)
            report.receipts_checked = check.count
            running = check.running
        report.running = [f"job {job!r} {what}" for job in sorted(running)
                          if (what := not_ended(chains[job])) is not None]
        if replay:
            from .replay import replay_job

            for job in report.jobs:
                if missing and job in missing:
                    report.problems.append(_no_replay(job))
                    continue
                try:
                    report.problems.extend(replay_job(log, job))
                except (ValueError, AuditError, DBAPIError) as exc:  # an entry it cannot read
                    orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig else exc
                    report.problems.append(f"job {job!r} replay: stopped at an entry it cannot "
                                           f"read ({type(orig).__name__}: {str(orig)[:200]})")
        return report
    finally:
        if owned is not None:
            owned.close()
