"""The receipts half of :func:`~fedforest_secure.audit.verify.verify_log`: the clients'
receipts against the log's chains (:mod:`fedforest_secure.audit.receipts` says what each record
holds), the cover of each receipted job's tail, and what a chain that has not ended (a job still
running when the log was read) leaves to notes. The module docstring of
:mod:`~fedforest_secure.audit.verify` states the rules."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path

from .entry import Entry
from .kinds import EntryKind
from .receipts import (
    AnyReceipt,
    FailedReceipt,
    ModelReceipt,
    Receipt,
    RefusedReceipt,
    SentReceipt,
    TornLine,
    read_receipts,
)

__all__ = ["check_receipts", "not_ended"]


#: entry kinds a client keeps a receipt of: a job holding one needs a receipt to be checked
_RECEIPTED = (EntryKind.ROUND.value, EntryKind.MODEL.value)

#: the entries that end a job without a model: a round's abort, or a failure between rounds
_FAILED = frozenset({EntryKind.ROUND_ABORTED.value, EntryKind.JOB_FAILED.value})
#: the entries that end a job: the server appends nothing to its chain after one
_ENDED = _FAILED | {EntryKind.MODEL.value}


def not_ended(chain: Mapping[int, Entry]) -> str | None:
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
    #: the jobs checked as running: not ended in the log, and no model or failure receipt
    #: of them
    running: set[str] = field(default_factory=set)


def check_receipts(entries: Sequence[Entry], receipts_dir: Path, job_id: str | None
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
    # a job not ended in its chain is running unless a site holds its model or was told it
    # failed (then the end is missing: that receipt names it)
    modelled = {r.job_id for _, r in received if isinstance(r, ModelReceipt | FailedReceipt)}
    running: dict[str, str] = {}
    for job, chain in chains.items():
        reach = not_ended(chain)
        if reach is not None and job not in modelled:
            running[job] = reach
    last_round = {job: max((r for j, r in rounds if j == job), default=-1) for job in running}
    beyond: dict[str, list[str]] = defaultdict(list)  # running jobs' receipts of later rounds
    for i, (where, receipt) in enumerate(received):
        if isinstance(receipt, TornLine):  # no receipt: as if the crash came before it
            notes.append(f"receipt {where}: the file's last line is cut short ({receipt}), as "
                         "a client that stopped while writing it leaves it: it is ignored "
                         "(the client's next receipt takes its place)")
            continue
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
        elif isinstance(receipt, FailedReceipt):
            found = _failed_receipt_problems(receipt, chains)
        elif isinstance(receipt, RefusedReceipt):
            found = _refused_receipt_problems(receipt, chains)
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
        chain = chains.get(job, {})
        left = _dropped_before_uploading(chain)
        unsent = sorted(set(left) & (_took_part(chain) - receipted_by[job]))
        if unsent:  # no receipt can be of them: the server's word that they joined at all
            whom, sites = (
                (f"a member the log says joined and was dropped (seq {left[unsent[0]]}) "
                 "before any round listed its upload", "a site that uploaded nothing keeps "
                 "no receipt of the job, so that it joined") if len(unsent) == 1 else
                ("members the log says joined and were dropped ("
                 + ", ".join(f"seq {left[s]}" for s in unsent) + ") before any round listed "
                 "their uploads", "sites that uploaded nothing keep no receipt of the job, so "
                 "that they joined"))
            notes.append(f"job {job!r}: no receipt in {receipts_dir} is of "
                         f"{', '.join(unsent)}, {whom}: {sites} is the server's word only")
        unvouched = sorted(_took_part(chain) - receipted_by[job] - set(unsent))
        if unvouched:  # the log's word alone for them: the server may have played them
            whom, sites, files = (("a member", "that site", "that site's receipts file")
                                  if len(unvouched) == 1 else
                                  ("members", "those sites", "those sites' receipts files"))
            notes.append(f"job {job!r}: no receipt in {receipts_dir} is of "
                         f"{', '.join(unvouched)}, {whom} the log says joined or took part "
                         f"in its rounds: what the log says {sites} sent and received is the "
                         f"server's word only (add {files} to check it)")
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


def _roster(chain: Mapping[int, Entry], covered: int) -> set[str]:
    """The job's sites as the entries the receipts pin (``seq <= covered``) name them: the
    ``clients`` of its ``job_created`` entry (a server logs them), the sites that joined, were
    dropped or took part in a round. An entry after ``covered`` is the server's word only (a
    site it says joined late could be one of its own)."""
    return _sites_of(chain, _ROSTER_KINDS, covered)


_ROSTER_KINDS = frozenset({EntryKind.JOB_CREATED.value, EntryKind.CLIENT_JOINED.value,
                           EntryKind.CLIENT_DROPPED.value, EntryKind.ROUND.value})
_LISTING = frozenset({EntryKind.JOB_CREATED.value, EntryKind.ROUND.value})  # "clients": [...]


def _sites_of(chain: Mapping[int, Entry], kinds: frozenset[str],
              covered: int | None = None) -> set[str]:
    """The sites the entries of ``kinds`` name (up to seq ``covered`` if given): the
    ``clients`` a ``job_created`` or ``round`` entry lists, the ``client`` of another."""
    out: set[str] = set()
    for e in chain.values():
        if covered is not None and e.seq > covered:
            continue
        try:
            if e.kind not in kinds:
                continue
            if e.kind in _LISTING:
                listed = e.payload.get("clients")
                if isinstance(listed, list):
                    out.update(str(c) for c in listed)
            else:
                out.add(str(e.payload.get("client")))
        except ValueError:  # unreadable: named by the chain's own check
            continue
    return out


def _dropped_before_uploading(chain: Mapping[int, Entry]) -> dict[str, int]:
    """The sites a chain records as dropped that no ``round`` entry lists as uploading, with
    the seq of the drop."""
    listed = _sites_of(chain, frozenset({EntryKind.ROUND.value}))
    return {s: seq for s, seq in _dropped_at(chain).items() if s not in listed}


def _took_part(chain: Mapping[int, Entry]) -> set[str]:
    """The sites the chain says joined the job or took part in a round (a site invited that
    never joined has no part to vouch for)."""
    return _sites_of(chain, frozenset({EntryKind.CLIENT_JOINED.value,
                                      EntryKind.ROUND.value}))


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
    it; the other sites' receipts can. But a tail after the drop of every site of the job is
    a problem: no site's receipt can cover it."""
    out: list[str] = []
    gone = _dropped_at(chain)
    tail = [e for e in (_last(chain, EntryKind.ROUND), _last(chain, EntryKind.MODEL))
            if e is not None and covered < e.seq]
    # the sites the log says left before the unreceipted tail began (one dropped later
    # took part in it, and its receipts must cover it)
    left = {s for s, seq in gone.items() if tail and seq < tail[0].seq}
    if tail and sites and sites <= left:
        roster = _roster(chain, covered) | set(sites)
        if roster <= left:
            # no site was left to take part, nor to keep a receipt: nobody can vouch for it
            return [f"job {job!r}: the log says every site of the job was dropped "
                    f"({', '.join(sorted(roster))}) before {tail[0].label}: "
                    f"{' and '.join(e.label for e in tail)} came after the last site left, "
                    "so no site's receipt can cover them (a server that drops every site "
                    "can write any ending)"], []
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


def _failed_receipt_problems(receipt: FailedReceipt,
                             chains: Mapping[str, Mapping[int, Entry]]) -> list[str]:
    """The server told the client its job failed, announcing the chain head ``seq_seen``: the
    log must hold that entry, the failure's entry within it, and no model."""
    chain = chains.get(receipt.job_id)
    if chain is None:
        return ["the job is not in the log"]
    out = _head_problems(receipt, chain)
    failed = min((e for e in chain.values() if e.kind in _FAILED), key=lambda e: e.seq,
                 default=None)
    if failed is None:
        out.append("the log has no round_aborted or job_failed entry (deleted?), yet the "
                   "server told the client the job failed")
    elif failed.seq > receipt.seq_seen:
        out.append(f"the chain head announced with the job's failure (seq {receipt.seq_seen}) "
                   f"does not cover the log's {failed.label}")
    model = next((e for e in chain.values() if e.kind == EntryKind.MODEL.value), None)
    if model is not None:
        out.append(f"the log has a model entry ({model.label}), yet the server told the "
                   "client the job failed")
    return out


def _refused_receipt_problems(receipt: RefusedReceipt,
                              chains: Mapping[str, Mapping[int, Entry]]) -> list[str]:
    """The server answered the client's refusal of a round with the chain head ``seq_seen``:
    the log must hold that entry and, within it, the client's ``client_dropped`` entry."""
    chain = chains.get(receipt.job_id)
    if chain is None:
        return ["the job is not in the log"]
    out = _head_problems(receipt, chain)
    gone = _dropped_at(chain).get(receipt.client)
    if gone is None or gone > receipt.seq_seen:
        out.append(f"the log has no client_dropped entry of this client up to seq "
                   f"{receipt.seq_seen}, yet the server answered its refusal of round "
                   f"{receipt.round_id} with that head")
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


def _head_problems(receipt: Receipt | SentReceipt | FailedReceipt | RefusedReceipt,
                   chain: Mapping[int, Entry]) -> list[str]:
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
