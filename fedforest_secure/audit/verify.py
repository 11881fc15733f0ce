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
* payloads are canonical JSON of a known kind with the required keys;
* each stored array is present and its bytes hash to the digest in the entry;

and, given a receipts directory, that every receipt agrees with the log
(see :mod:`fedforest_secure.audit.receipts`) and that the receipts cover each receipted job's
tail: some receipt pins a chain head at or after the job's last round entry and after its model
entry (a model receipt does), a model receipt's digest is the logged model's, and a log that lost
its model entry is named. A job whose chain has not ended (no ``model``, ``job_failed`` or
``round_aborted`` entry: it was running when the log was read) and of which no receipt is a model
receipt (a site that holds the model knows it ended) is checked as far as the log goes: its sites'
receipts of later rounds and its last round not receipted yet are notes, and the report names the
job in ``running``. A client's record of an upload it sent (written before the request) that no
receipt of the upload follows (the client stopped before the server answered) is checked like a
receipt when the log's round entry lists that upload for the client, is a note when the entry
does not list the client (or the round has none), and a problem when it lists another upload of
the client that none of the client's records holds. With ``replay=True`` it also replays each job
through the coordinator (:mod:`fedforest_secure.audit.replay`): every logged task digest must be
the task that follows from the logged configuration and aggregates, and the model digest the
model they yield.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from ..errors import AuditError
from .entry import GENESIS, ArrayInfo, Entry, canonical_json, decode_array, is_hex_digest
from .kinds import EntryKind, check_payload
from .log import AuditLog
from .receipts import AnyReceipt, ModelReceipt, Receipt, SentReceipt, read_receipts

if TYPE_CHECKING:
    from ._sql import Engine

__all__ = ["VerifyReport", "verify_entries", "verify_log"]


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
    except ValueError as exc:
        return [*out, f"{where}: unreadable payload or arrays ({exc})"]
    if canonical_json(payload) != entry.payload_json:
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
    if model is not None:  # a finished job: the server writes nothing after its model
        out.extend(f"job {e.job_id!r}: seq {e.seq} ({e.kind}) comes after the job's model entry "
                   f"(seq {model.seq}): nothing follows a finished job's model (appended?)"
                   for e in entries if e.seq > model.seq)
    return out


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


def _check_arrays(log: AuditLog, entries: Sequence[Entry], job_id: str | None) -> list[str]:
    """Stream the stored arrays (one blob in memory at a time) against the entries' digests."""
    out: list[str] = []
    expected: dict[tuple[str, int], tuple[Entry, dict[str, ArrayInfo]]] = {}
    for entry in entries:
        try:
            expected.setdefault((entry.job_id, entry.seq), (entry, entry.arrays))
        except ValueError:
            continue  # already reported as unreadable
    found: set[tuple[str, int, str]] = set()
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
            elif hashlib.sha256(blob).hexdigest() != info.sha256:
                out.append(f"{entry.label}: stored array {name!r} does not match its digest "
                           "(array changed)")
            else:
                try:
                    decode_array(info, blob)
                except ValueError as exc:
                    out.append(f"{entry.label}: stored array {name!r}: {exc}")
    except DBAPIError as exc:  # a blob rewritten as text, say: the database cannot return it
        out.append(f"the stored arrays cannot be read ({type(exc).__name__}: "
                   f"{str(getattr(exc, 'orig', exc))[:200]}): an array was rewritten")
    for (job, seq), (entry, infos) in sorted(expected.items()):
        for name in sorted(infos):
            if (job, seq, name) not in found:
                out.append(f"{entry.label}: stored array {name!r} is missing")
    return out


def _check_round_column(log: AuditLog, job_id: str | None) -> list[str]:
    out: list[str] = []
    for row in log.store.scan_index(job_id):
        try:
            value = json.loads(row.payload).get("round_id")
        except (ValueError, AttributeError):
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            value = None
        if row.round_id != value:
            out.append(f"job {row.job_id!r} seq {row.seq} ({row.kind}): round_id column "
                       "disagrees with the payload")
    return out


#: entry kinds a client keeps a receipt of: a job holding one needs a receipt to be checked
_RECEIPTED = (EntryKind.ROUND.value, EntryKind.MODEL.value)

#: the entries that end a job without a model: a round's abort, or a failure between rounds
_FAILED = frozenset({EntryKind.ROUND_ABORTED.value, EntryKind.JOB_FAILED.value})
#: the entries that end a job: the server appends nothing to its chain after one
_ENDED = _FAILED | {EntryKind.MODEL.value}


def _running(chain: Mapping[int, Entry]) -> str | None:
    """``None`` for a chain that ends its job; else what a verification of it covers, as
    ``has not ended in this log (...; checked up to seq n, round r)``."""
    if not chain or any(e.kind in _ENDED for e in chain.values()):
        return None
    last = _last(chain, EntryKind.ROUND)
    where = "before any round" if last is None else f"round {last.round_id}"
    return (f"has not ended in this log (no model, job_failed or round_aborted entry; "
            f"checked up to seq {max(chain)}, {where})")


@dataclass
class _ReceiptsCheck:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    count: int = 0
    #: the jobs checked as running: not ended in the log, and no model receipt of them
    running: set[str] = field(default_factory=set)


def _check_receipts(entries: Sequence[Entry], receipts_dir: Path, job_id: str | None
                    ) -> _ReceiptsCheck:
    """Problems, notes, the number of receipts checked, and the jobs checked as running."""
    if not receipts_dir.is_dir():
        what = ("is a file: give the directory that holds the sites' receipts files"
                if receipts_dir.exists() else "does not exist")
        return _ReceiptsCheck(problems=[f"receipts directory {receipts_dir} {what}"])
    chains: dict[str, dict[int, Entry]] = defaultdict(dict)
    rounds: dict[tuple[str, int], list[Entry]] = defaultdict(list)
    aborted: set[tuple[str, int]] = set()
    for entry in entries:
        chains[entry.job_id].setdefault(entry.seq, entry)
        if entry.kind == EntryKind.ROUND.value and entry.round_id is not None:
            rounds[(entry.job_id, entry.round_id)].append(entry)
        if entry.kind == EntryKind.ROUND_ABORTED.value and entry.round_id is not None:
            aborted.add((entry.job_id, entry.round_id))
    out: list[str] = []
    notes: list[str] = []
    count = 0
    covered: dict[str, int] = {}  # job -> the furthest seq a receipt pins
    receipted_by: dict[str, set[str]] = defaultdict(set)  # job -> the sites of its receipts
    elsewhere: dict[str, list[str]] = defaultdict(list)  # receipts of jobs not in the log
    uploaded_to_aborted: dict[tuple[str, int], list[str]] = defaultdict(list)
    received = [(where, r) for where, r in read_receipts(receipts_dir)
                if isinstance(r, ValueError) or job_id is None or r.job_id == job_id]
    confirmed = _confirmed_later(received)
    sent_or_receipted = _uploads_held(received)
    # a job not ended in its chain is running unless a site holds its model (then the end
    # is missing: its model receipt names that)
    modelled = {r.job_id for _, r in received if isinstance(r, ModelReceipt)}
    running: dict[str, str] = {}
    for job, chain in chains.items():
        reach = _running(chain)
        if reach is not None and job not in modelled:
            running[job] = reach
    last_round = {job: max((r for j, r in rounds if j == job), default=-1) for job in running}
    beyond: dict[str, list[str]] = defaultdict(list)  # running jobs' receipts of later rounds
    for i, (where, receipt) in enumerate(received):
        if isinstance(receipt, ValueError):
            out.append(f"receipt {where}: malformed ({receipt})")
            continue
        if i in confirmed:  # the receipt of the same upload follows: it is checked instead
            continue
        if receipt.job_id not in chains:
            elsewhere[receipt.job_id].append(where)
            continue
        covered[receipt.job_id] = max(covered.get(receipt.job_id, 0), receipt.seq_seen)
        receipted_by[receipt.job_id].add(receipt.client)
        later = (isinstance(receipt, Receipt | SentReceipt) and receipt.job_id in running
                 and receipt.round_id > last_round[receipt.job_id])
        if later:  # an upload to a round the log does not hold yet
            # (a receipt pinning a chain head past the log's end is still checked below, a
            # problem: the server announced more of the chain than this log holds)
            beyond[receipt.job_id].append(where)
        count += 1
        if isinstance(receipt, Receipt) and (receipt.job_id, receipt.round_id) in aborted \
                and not rounds.get((receipt.job_id, receipt.round_id)):
            uploaded_to_aborted[(receipt.job_id, receipt.round_id)].append(where)
        if isinstance(receipt, ModelReceipt):
            found = _model_receipt_problems(receipt, chains)
        elif isinstance(receipt, SentReceipt):
            found, note = _sent_problems(receipt, chains, rounds, aborted, sent_or_receipted,
                                         open_round=later)
            if note is not None:
                notes.append(f"receipt {where} ({receipt.label}): {note}")
        else:
            found = _receipt_problems(receipt, chains, rounds, aborted, open_round=later)
        out.extend(f"receipt {where} ({receipt.label}): {p}" for p in found)
    if (receipts_dir / "receipts").is_dir() and (
            not count or any(p.startswith("receipt ") for p in out)):
        out.append(f"{receipts_dir} looks like a client's --state-dir: its receipts are in "
                   f"{receipts_dir / 'receipts'}")
    for job, wheres in sorted(beyond.items()):
        notes.append(f"job {job!r} {running[job]}: {len(wheres)} receipt(s) of later rounds "
                     f"(first {wheres[0]}) go beyond it: the job is still running, or was when "
                     "the log was downloaded")
    for (job, r), wheres in sorted(uploaded_to_aborted.items()):
        notes.append(f"job {job!r} round {r}: {len(wheres)} receipt(s) of uploads (first "
                     f"{wheres[0]}), and the log says the round was aborted: that no sum of "
                     "it was released is the server's word only")
    held = ", ".join(repr(j) for j in sorted(chains)) or "no job"
    for job, wheres in sorted(elsewhere.items()):
        hint = ("" if job_id is not None else f"; the log holds {held}: to check the log of "
                "one job against a site's receipts of several, give --job")
        out.append(f"job {job!r} is not in the log ({len(wheres)} receipt(s) of it, first "
                   f"{wheres[0]}){hint}")
    for job in sorted(covered):
        problems, noted = _tail_problems(job, chains.get(job, {}), covered[job],
                                         receipted_by[job], running.get(job))
        out.extend(problems)
        notes.extend(noted)
    for job in sorted(set(chains) - set(covered)):
        if any(e.kind in _RECEIPTED for e in chains[job].values()):
            out.append(f"job {job!r}: no receipt in {receipts_dir} is of this job, so its "
                       "rounds and model are unreceipted (a rewritten chain would verify)")
    return _ReceiptsCheck(out, notes, count, set(running))


def _upload_key(r: Receipt | SentReceipt) -> tuple[str, int, str]:
    return r.job_id, r.round_id, r.client


def _confirmed_later(received: Sequence[tuple[str, AnyReceipt | ValueError]]) -> set[int]:
    """The positions of the sent records a receipt of the same upload follows: the client
    recorded the upload before it sent it, then the server's answer."""
    out: set[int] = set()
    receipted: set[tuple[tuple[str, int, str], str]] = set()
    for i in range(len(received) - 1, -1, -1):
        r = received[i][1]
        if isinstance(r, Receipt):
            receipted.add((_upload_key(r), r.upload_digest))
        elif isinstance(r, SentReceipt) and (_upload_key(r), r.upload_digest) in receipted:
            out.add(i)
    return out


def _uploads_held(received: Sequence[tuple[str, AnyReceipt | ValueError]]
                  ) -> dict[tuple[str, int, str], set[str]]:
    """(job, round, client) -> the digests of the uploads the records (sent or receipted)
    hold."""
    out: dict[tuple[str, int, str], set[str]] = defaultdict(set)
    for _, r in received:
        if isinstance(r, Receipt | SentReceipt):
            out[_upload_key(r)].add(r.upload_digest)
    return out


def _dropped_at(chain: Mapping[int, Entry]) -> dict[str, int]:
    """The sites a chain records as dropped, with the seq of that entry."""
    out: dict[str, int] = {}
    for e in chain.values():
        if e.kind == EntryKind.CLIENT_DROPPED.value:
            try:
                out.setdefault(str(e.payload.get("client")), e.seq)
            except ValueError:  # unreadable: named by the chain's own check
                continue
    return out


def _last(chain: Mapping[int, Entry], kind: EntryKind) -> Entry | None:
    return max((e for e in chain.values() if e.kind == kind.value), key=lambda e: e.seq,
               default=None)


def _tail_problems(job: str, chain: Mapping[int, Entry], covered: int,
                   sites: Set[str] = frozenset(), running: str | None = None
                   ) -> tuple[list[str], list[str]]:
    """A job's last round and its model entry must lie within a chain head some client
    receipted: otherwise they could be rewritten (with every hash after them) unnoticed. A
    job that failed before any site kept a receipt after its last round cannot have one:
    that is a note (no model came out of it), not a problem. So is a job still running in
    this log (``running`` says how far it goes): the sites receipt its last round with their
    next uploads. So is the tail after the drop of every site whose receipts are checked
    (``sites``): a dropped site checking its own receipts cannot vouch for what came after
    it; the other sites' receipts can."""
    out: list[str] = []
    gone = _dropped_at(chain)
    if sites and sites <= set(gone):
        tail = [e for e in (_last(chain, EntryKind.ROUND), _last(chain, EntryKind.MODEL))
                if e is not None and covered < e.seq]
        if tail:
            names = ", ".join(f"{s} (seq {gone[s]})" for s in sorted(sites))
            return out, [f"job {job!r}: these receipts are of sites the log says were dropped "
                         f"({names}): the entries after seq {covered}, "
                         f"{' and '.join(e.label for e in tail)} among them, are vouched for "
                         "by the other sites' receipts only: add theirs to check them"]
    last_round = max((e for e in chain.values() if e.kind == EntryKind.ROUND.value),
                     key=lambda e: e.seq, default=None)
    if last_round is not None and covered < last_round.seq:
        failed = next((e for e in chain.values() if e.kind in _FAILED
                       and e.seq > last_round.seq), None)
        if failed is not None:
            return out, [f"job {job!r} failed ({failed.label}) before any site kept a receipt "
                         f"after its last round ({last_round.label}): that round's aggregate "
                         "is vouched for by the chain only"]  # the server's word
        if running is not None:
            return out, [f"job {job!r} {running}: its last round ({last_round.label}) is "
                         f"covered by no receipt yet (the receipts pin the chain up to seq "
                         f"{covered}): the sites' next uploads or their model receipts "
                         "cover it"]
        out.append(f"job {job!r}: the last round ({last_round.label}) is covered by no receipt "
                   f"(the receipts pin the chain up to seq {covered}): its aggregate and "
                   "everything after it are unreceipted")
    model = next((e for e in chain.values() if e.kind == EntryKind.MODEL.value), None)
    if model is not None and covered < model.seq:
        out.append(f"job {job!r}: the model entry ({model.label}) is covered by no receipt "
                   "(none of these receipts pins the chain up to it)")
    return out, []


def _model_receipt_problems(receipt: ModelReceipt, chains: Mapping[str, Mapping[int, Entry]]
                            ) -> list[str]:
    chain = chains.get(receipt.job_id)
    if chain is None:
        return ["the job is not in the log"]
    out: list[str] = []
    seen = chain.get(receipt.seq_seen)
    if seen is None:
        out.append(f"the log has no entry seq {receipt.seq_seen} (deleted or truncated)")
    elif seen.hash != receipt.chain_head_seen:
        out.append(f"chain head seen at seq {receipt.seq_seen} differs from the log's "
                   f"{seen.label} (log rewritten)")
    model = next((e for e in chain.values() if e.kind == EntryKind.MODEL.value), None)
    if model is None:
        why = ("deleted? or this log was read before the job ended: fetch it again"
               if receipt.seq_seen > max(chain, default=0) else "deleted?")
        out.append(f"the log has no model entry ({why}), yet the client received model "
                   f"{receipt.model_digest[:16]}...")
        return out
    try:
        logged = model.payload.get("digest")
    except ValueError:  # named as unreadable by the chain's own check
        logged = None
    if logged != receipt.model_digest:
        out.append(f"the client received model {receipt.model_digest[:16]}..., the log's "
                   f"{model.label} says {str(logged)[:16]}...")
    if model.seq > receipt.seq_seen:
        out.append(f"the chain head announced with the model (seq {receipt.seq_seen}) does not "
                   f"cover the log's {model.label}")
    return out


def _receipt_problems(receipt: Receipt, chains: Mapping[str, Mapping[int, Entry]],
                      rounds: Mapping[tuple[str, int], Sequence[Entry]],
                      aborted: Set[tuple[str, int]], *, open_round: bool = False) -> list[str]:
    """``open_round``: the receipt's round is after every round of a job still running in
    this log, so the log holds no round entry for it yet (its chain head is still checked)."""
    chain = chains.get(receipt.job_id)
    if chain is None:
        return ["the job is not in the log"]
    out = _head_problems(receipt, chain)
    candidates = rounds.get((receipt.job_id, receipt.round_id), [])
    if not candidates:
        if (receipt.job_id, receipt.round_id) not in aborted and not open_round:
            out.append("the log has no round entry for this round")  # aborted: no sum to list
        return out
    listed = _listed(receipt, candidates)
    if not listed:
        seqs = ", ".join(str(e.seq) for e in candidates)
        out.append(f"round entry seq {seqs} does not list this client's upload")
    elif not any(digest == receipt.upload_digest for _, digest in listed):
        seqs = ", ".join(str(e.seq) for e, _ in listed)
        out.append(f"upload digest differs from the one in round entry seq {seqs}")
    return out


def _head_problems(receipt: Receipt | SentReceipt, chain: Mapping[int, Entry]) -> list[str]:
    """The chain head the client saw must be the log's entry ``seq_seen``."""
    if receipt.seq_seen == 0:
        return []
    seen = chain.get(receipt.seq_seen)
    if seen is None:
        return [f"the log has no entry seq {receipt.seq_seen} (deleted or truncated; or the "
                "log was fetched before the site saw that entry: fetch it again)"]
    if seen.hash != receipt.chain_head_seen:
        return [f"chain head seen at seq {receipt.seq_seen} differs from the log's "
                f"{seen.label} (log rewritten)"]
    return []


def _listed(receipt: Receipt | SentReceipt, candidates: Sequence[Entry]
            ) -> list[tuple[Entry, object]]:
    """The round entries that list an upload of the receipt's client, with its digest."""
    listed: list[tuple[Entry, object]] = []
    for entry in candidates:
        uploads = entry.payload.get("uploads")
        if isinstance(uploads, dict) and receipt.client in uploads:
            listed.append((entry, uploads[receipt.client]))
    return listed


def _sent_problems(receipt: SentReceipt, chains: Mapping[str, Mapping[int, Entry]],
                   rounds: Mapping[tuple[str, int], Sequence[Entry]],
                   aborted: Set[tuple[str, int]],
                   held: Mapping[tuple[str, int, str], Set[str]], *, open_round: bool = False
                   ) -> tuple[list[str], str | None]:
    """Problems and a note for an upload the client sent and no receipt confirms (the client
    stopped while it waited for the answer). The chain head it saw is checked as a receipt's;
    a round entry listing the upload for the client proves it was summed; one that lists
    the client with another upload none of its records holds is a problem; otherwise the
    server may never have received it: a note. ``open_round`` as for
    :func:`_receipt_problems` (the running job's note names it)."""
    chain = chains.get(receipt.job_id)
    if chain is None:
        return ["the job is not in the log"], None
    out = _head_problems(receipt, chain)
    if open_round:
        return out, None
    key = (receipt.job_id, receipt.round_id)
    candidates = rounds.get(key, [])
    listed = _listed(receipt, candidates)
    if any(digest == receipt.upload_digest for _, digest in listed):
        return out, None
    if listed and not any(d in held.get(_upload_key(receipt), set()) for _, d in listed):
        seqs = ", ".join(str(e.seq) for e, _ in listed)
        out.append(f"round entry seq {seqs} lists another upload of this client than the one "
                   "it sent, and none of its records is of that upload (log rewritten? or "
                   "the site also uploaded from another --state-dir)")
        return out, None
    if listed:
        why = (f"round entry seq {', '.join(str(e.seq) for e, _ in listed)} lists another "
               "upload of this client, which its records hold too")
    elif candidates:
        why = (f"round entry seq {', '.join(str(e.seq) for e in candidates)} does not list "
               "this client's upload")
    elif key in aborted:
        why = "the log says the round was aborted"
    else:
        why = "the log has no round entry for this round"
    return out, (f"an upload the site sent and the server never confirmed, not in the log "
                 f"({why}): the site stopped before the server received it, or the round went "
                 "on without it")


def verify_log(log_or_url: AuditLog | Engine | str | Path,
               receipts_dir: str | Path | None = None, *,
               job_id: str | None = None, replay: bool = False) -> VerifyReport:
    """Verify every job (or ``job_id``) of a log, and the receipts in ``receipts_dir`` if given;
    with ``replay``, replay each job's rounds through the coordinator (needs the engine).

    ``log_or_url`` is an :class:`AuditLog`, a SQLAlchemy engine, a SQLAlchemy URL or a SQLite
    file path; a database without an audit log is reported as a problem, not created.
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
        entries = log.entries(job_id=job_id)
        report = verify_entries(entries)
        report.problems.extend(_check_round_column(log, job_id))
        report.problems.extend(_check_arrays(log, entries, job_id))
        if job_id is not None and not entries:
            report.problems.append(f"job {job_id!r} is not in the log")
        chains: dict[str, dict[int, Entry]] = defaultdict(dict)
        for entry in entries:
            chains[entry.job_id].setdefault(entry.seq, entry)
        running = set(chains)
        if receipts_dir is not None:
            check = _check_receipts(entries, Path(receipts_dir), job_id)
            report.problems.extend(check.problems)
            report.notes.extend(check.notes)
            report.receipts_checked = check.count
            running = check.running
        report.running = [f"job {job!r} {what}" for job in sorted(running)
                          if (what := _running(chains[job])) is not None]
        if replay:
            from .replay import replay_job

            for job in report.jobs:
                try:
                    report.problems.extend(replay_job(log, job))
                except (ValueError, AuditError, DBAPIError) as exc:  # an entry it cannot read
                    report.problems.append(f"job {job!r} replay: stopped at an entry it cannot "
                                           f"read ({type(exc).__name__}: {exc})")
        return report
    finally:
        if owned is not None:
            owned.close()
