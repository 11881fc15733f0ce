"""What one run of the client loop shares between its steps: the site's options, the run's
result, its context (transport, state, worker, progress bar, log) and the watch that tells the
operator about the other sites."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError
from rich.progress import Progress, TaskID

from fedforest_secure.audit import Receipt, RefusedReceipt, SentReceipt, write_receipt
from fedforest_secure.audit.entry import is_hex_digest
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError, ProtocolError
from fedforest_secure.printable import printable
from fedforest_secure.privacy.profile import with_profile_defaults
from fedforest_secure.protocol import Reply, Task
from fedforest_secure.protocol.api import JobStatus
from fedforest_secure.secure_sum import encode_contribution

from .evaluation import SiteWorker
from .log import SiteLog
from .state import ClientState
from .transport import Transport

__all__ = ["LONG_POLL_S", "RESTARTED_SECURE", "ClientOptions", "ClientResult", "RunContext",
           "Watch", "dropped_detail", "ended", "job_status_briefly", "kept_receipt", "left_detail",
           "parse_as", "uploaded_before_detail"]

#: What a restarted client of a secure job is told when it took part in a round before: in the
#: middle of a round (its round keys were in the memory of the process that died, so it cannot
#: answer that round's steps), or after uploading in the job (its record of the questions it
#: answered and of the DP releases it made died too, so it answers no question of the job
#: again).
RESTARTED_SECURE = ("a restarted site cannot rejoin a secure job once it has taken part in a "
                    "round (its round keys, and its record of the questions it answered, died "
                    "with the process that stopped)")


def uploaded_before_detail(job: str, receipts: Path) -> str:
    """What a client of the secure job ``job`` is told when this site's receipts (in the
    folder ``receipts``) record an upload of a job of that name from before this process: a
    restart of its client in the job, or an earlier job of the same name (the receipts know a
    job by its name only)."""
    return (f"this site's receipts in {receipts} record an upload in job {job}, and a site "
            "answers no round of a secure job it uploaded in: its client was restarted in "
            "this job, or took part in an earlier job of that name, and every job needs a "
            "name of its own")

_M = TypeVar("_M", bound=BaseModel)


@dataclass
class ClientOptions:
    server: str
    token: str = field(repr=False)  # a logged repr never holds the site's token
    job: str
    data: Path | None
    schema: Path
    ca: Path | None
    cert: Path | None = None
    key: Path | None = None
    state_dir: Path = Path(".fedforest-client")
    model_out: Path | None = None
    poll_s: float = 0.2
    retry_budget_s: float = 300.0
    quiet: bool = False
    #: The privacy profile this site accepts (a shipped name or a TOML path): the job's profile
    #: must match it, or the client refuses right after the join response (``--profile``).
    profile: str | None = None
    #: Allow plain ``http://`` to a loopback server (``--insecure-dev``); never anything else.
    insecure_dev: bool = False
    #: The number of clients this site knows the job has (``--clients``): the job's
    #: configuration must say the same (it sets the DP noise's ``K_min`` and the roster).
    n_clients: int | None = None
    #: The site's held-out rows (same schema), scored by evaluation jobs (``--eval-data``).
    eval_data: Path | None = None
    #: Take part in another evaluation job on held-out rows this site already answered one
    #: on (``--evaluate-again``); a model it already scored on them is still refused.
    evaluate_again: bool = False


@dataclass
class ClientResult:
    status: str  # "done" | "failed" | "dropped" | "refused"
    detail: str = ""
    model_path: Path | None = None
    rounds: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    receipts: list[dict[str, Any]] = field(default_factory=list)


#: Seconds a long-polling request may wait on the server for something new.
LONG_POLL_S = 10.0


@dataclass
class RunContext:
    """What one run of the client loop shares between its steps."""

    opts: ClientOptions
    tr: Transport
    state: ClientState
    config: JobConfig
    job: str
    index: int
    name: str
    worker: SiteWorker
    result: ClientResult
    progress: Progress
    bar: TaskID
    log: SiteLog
    watch: Watch
    #: This site's receipts recorded an upload of the job before this process started (a
    #: restart, or an earlier job of that name): under a secure profile it answers no round of
    #: the job (under the open profile it resumes)
    uploaded_before: bool

    def show(self, task: Task, what: str = "") -> None:
        self.progress.update(self.bar, completed=task.level,
                             description=f"job {self.job} · level {task.level} · round "
                                         f"{task.round_id} ({task.kind.value}){what}")
        if self.watch.level != task.level:
            self.watch.level = task.level
            where = ("" if self.config.evaluation is not None  # one round, no tree levels
                     else f"level {task.level} of {self.config.max_depth} ")
            self.log.info(f"job {self.job}: {where}(round {task.round_id}, "
                          f"{task.kind.value})")
            # at most every few seconds: a status request per level and client is a server
            # request per round and client; the end of the job polls once more
            self.watch.poll(self.tr)

    def waiting(self) -> None:
        """Nothing to do yet: say whom the job is waiting for (at most every few seconds)."""
        self.watch.poll(self.tr)


    def contribution(self, task: Task, reply: Reply) -> np.ndarray:
        prof = with_profile_defaults(self.config.profile)  # PrivacyProfile's defaults
        ring = bool(prof["fixed_point"] or prof.get("secure_aggregation"))
        if ring:
            return np.asarray(encode_contribution(self.config, task, reply))
        return np.asarray(reply.summable, dtype=np.float64)

    def receipt_sent(self, task: Task, body: bytes, seq: int | str, head: str) -> None:
        """Record the upload ``body`` before it is sent (on disk when this returns): a site
        stopped while the upload's request waits for its answer keeps a record of what it
        sent, which ``audit verify --receipts`` checks against the log's round entry."""
        try:
            rec = SentReceipt(job_id=self.job, round_id=task.round_id, client=self.name,
                              task_digest=task.digest().hex(),
                              upload_digest=hashlib.sha256(body).hexdigest(),
                              chain_head_seen=str(head), seq_seen=int(seq))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"the server announced a malformed audit tip: {exc}") from exc
        write_receipt(self.state.root / "receipts", rec)

    def receipt(self, task: Task, body: bytes, seq: int | str, head: str,
                server_receipt: dict[str, Any] | None) -> None:
        """Record the upload ``body`` once the server has answered it (its receipt follows the
        record :meth:`receipt_sent` wrote; of the server's answer ``server_receipt``, what
        :func:`kept_receipt` keeps goes to ``receipts.jsonl``). The site's own receipt (the
        digest of the body it sent, the chain tip it was told) is written first: a server
        answer that names another upload is refused after it, and the receipt is what
        ``audit verify --receipts`` holds that server's log to."""
        try:
            rec = Receipt(job_id=self.job, round_id=task.round_id, client=self.name,
                          upload_digest=hashlib.sha256(body).hexdigest(),
                          chain_head_seen=str(head), seq_seen=int(seq))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"the server announced a malformed audit tip: {exc}") from exc
        write_receipt(self.state.root / "receipts", rec)
        if server_receipt is not None:
            kept = kept_receipt(self.job, task.round_id, self.index, body, server_receipt)
            self.state.add_receipt(kept)
            self.result.receipts.append(kept)

    def refusal_receipt(self, round_id: int, answer: dict[str, Any]) -> None:
        """Record this site's refusal of round ``round_id`` with the chain head the server
        answered it with (it covers the site's ``client_dropped`` entry and the peer it
        accused): the site leaves the job, and ``audit verify --receipts`` holds the log to
        what it was told. A server that keeps no audit log (sequence 0), or an older one that
        answers without the head, leaves nothing to record."""
        seq, head = answer.get("audit_seq"), answer.get("audit_head")
        if not seq:
            return
        try:
            if isinstance(seq, bool) or not isinstance(seq, int):
                raise ValueError(f"audit_seq {seq!r} is not a whole number")
            rec = RefusedReceipt(job_id=self.job, round_id=round_id, client=self.name,
                                 chain_head_seen=str(head), seq_seen=seq)
        except ValueError as exc:  # the refusal itself was recorded
            self.log.warn(f"job {self.job}: the server answered this site's refusal with a "
                          f"malformed audit tip ({exc}): no receipt of it kept")
            return
        try:
            write_receipt(self.state.root / "receipts", rec)
        except OSError as exc:  # the server has the refusal: only the site's record is lost
            self.log.warn(f"job {self.job}: the server recorded this site's refusal of round "
                          f"{round_id}, but its receipt could not be written ({exc})")


@dataclass
class Watch:
    """Follows ``GET /v1/jobs/{job}`` to tell the operator about the other sites: who has not
    joined yet, and who was dropped."""

    job: str
    log: SiteLog
    me: int
    every_s: float = 5.0
    level: int = -1
    _last: float = -1e9
    _waiting_for: tuple[str, ...] = ()
    _dropped: set[str] = field(default_factory=set)

    def poll(self, tr: Transport, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        # a courtesy question, asked briefly: a server slow to answer it must not hold the
        # site's steps past their deadline, nor fail training
        st = job_status_briefly(tr, self.job)
        if st is not None:
            self.observe(st)

    def observe(self, st: JobStatus) -> None:
        # the server's words, as a line of the log holds them (:func:`site_name`): a line is
        # written when what it says changes, never for a name's tail beyond what is shown
        invited = tuple(site_name(m.name) for m in st.members if m.state == "invited")
        if st.status == "waiting" and invited and invited != self._waiting_for:
            self.log.info(f"job {self.job}: waiting for site{'s' if len(invited) > 1 else ''} "
                          f"{_names(invited)} to join")
        self._waiting_for = invited
        for m in st.members:
            name = site_name(m.name)
            if m.state == "dropped" and name not in self._dropped and m.index != self.me:
                self._dropped.add(name)
                at = f" at round {m.dropped_round}" if m.dropped_round is not None else ""
                self.log.warn(f"job {self.job}: site {name} was dropped{at}; {_goes(st)}")


#: characters of a site name the server gives that the client's log shows (a site's name is
#: at most 64: :data:`~fedforest_secure.protocol.api.NAME_PATTERN`)
NAME_SHOWN = 64
#: site names a line of the client's log lists; the others are counted
NAMES_SHOWN = 10


def site_name(name: str) -> str:
    """A site name from the server as the client's log shows it: one line of printable text
    (:func:`~fedforest_secure.printable.printable`), its first :data:`NAME_SHOWN` characters
    and ``...`` if it is longer."""
    return printable(name[:NAME_SHOWN]) + ("..." if len(name) > NAME_SHOWN else "")


def kept_receipt(job: str, round_id: int, index: int, body: bytes,
                 answer: dict[str, Any]) -> dict[str, Any]:
    """What a site keeps of the server's answer ``answer`` to its upload ``body`` (client
    ``index`` of ``job``, round ``round_id``): the job, round, index and the upload's SHA-256
    as the client knows them, and of the server's words only the task's SHA-256 and the
    audit-chain head (each kept if it is a SHA-256 hex digest) and whether the upload was a
    duplicate: a few hundred bytes a round, whatever else the answer holds.

    Raises
    ------
    ProtocolError
        The answer names another upload digest than the body's.
    """
    digest = hashlib.sha256(body).hexdigest()
    said = answer.get("upload_sha256")
    if said is not None and said != digest:
        raise ProtocolError(f"round {round_id}: the server's receipt of this site's upload "
                            f"names another upload ({printable(str(said)[:80])}); the upload "
                            f"this site sent has SHA-256 {digest}")
    kept: dict[str, Any] = {"job_id": job, "round_id": round_id, "client_index": index,
                            "upload_sha256": digest}
    for name in ("task_sha256", "audit_head"):
        if is_hex_digest(answer.get(name)):
            kept[name] = answer[name]
    if isinstance(answer.get("duplicate"), bool):
        kept["duplicate"] = answer["duplicate"]
    return kept


def _goes(st: JobStatus) -> str:
    """What became of a job a site was dropped from, in words."""
    n, need = _sites(st.active_clients), f"(at least {st.min_clients} needed)"
    if st.status == "running":
        verb = "continues" if st.active_clients >= st.min_clients else "cannot go on"
        return f"the job {verb} with {n} {need}"
    if st.status == "done":
        return f"the job finished with {n}"
    if st.status == "failed":
        return f"the job failed with {n} left {need}"
    return f"the job is {st.status} with {n} {need}"


def _sites(n: int) -> str:
    """``1 site``, ``3 sites``."""
    return f"{n} site" if n == 1 else f"{n} sites"


def _names(names: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``; past :data:`NAMES_SHOWN` names, ``a, b, ... and
    N more``."""
    if len(names) > NAMES_SHOWN:
        return ", ".join(names[:NAMES_SHOWN]) + f" and {len(names) - NAMES_SHOWN} more"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def parse_as(model: type[_M], obj: object, what: str) -> _M:
    """``obj`` (parsed JSON from the server) as ``model``; a :class:`ProtocolError` if it
    does not validate."""
    try:
        return model.model_validate(obj)
    except ValidationError:
        raise ProtocolError(f"malformed {what}") from None


def job_status_briefly(tr: Transport, job: str) -> JobStatus | None:
    """The job's status, asked briefly (within about 5 s), or None if the server does not
    answer it in time or answers something else: for what a site says, never for what it
    does next."""
    try:
        with tr.brief():
            return JobStatus.model_validate(tr.get_json(f"/v1/jobs/{job}"))
    except (ValidationError, FedForestError, OSError, ValueError):
        return None


def ended(status: str, detail: str) -> str:
    """How a job ended for this site, in one phrase: its status and the detail, or the
    detail alone where it says the status itself ("this site was dropped from job ...")."""
    if detail.startswith(f"this site was {status}"):
        return detail
    return f"{status}: {detail}" if detail else status


def dropped_detail(job: str, why: str, tr: Transport | None = None) -> str:
    """What a site dropped from ``job`` is told: what happened and what it can still do. With
    ``tr`` the job's status is asked (best effort), so that a site dropped from a job that
    has failed since is not sent to download a model there will never be; a status not
    known (no ``tr``, or no answer) is said to be not known."""
    said = f"this site was dropped from job {job} ({why})"
    st = job_status_briefly(tr, job) if tr is not None else None  # said without it if none
    status = st.status if st is not None else None
    if st is not None and status == "running" and st.active_clients < st.min_clients:
        remain = "remains" if st.active_clients == 1 else "remain"
        return (f"{said}; the job cannot go on: {_sites(st.active_clients)} {remain}, fewer "
                f"than the {st.min_clients} it needs, so it stops without a model (`fedforest "
                f"status --job {job}` says when)")
    if status == "failed":
        return f"{said}; the job has failed since: there is no model (`fedforest status " \
               f"--job {job}` says why)"
    if status == "done":
        return f"{said}; the job is done: `fedforest model download --job {job}` fetches its model"
    if st is None:  # the server did not answer (stopped, unreachable): the job may have failed
        return (f"{said}; whether the job went on without it is not known: the server did not "
                f"answer when asked (`fedforest status --job {job}` asks again). Once the job "
                f"is done, `fedforest model download --job {job}` fetches its model")
    return (f"{said}; the job went on without it. Once the job is done, `fedforest model "
            f"download --job {job}` fetches its model")



def left_detail(job: str, how: str, *, told: bool, st: JobStatus | None) -> str:
    """What a site that stops in the middle of a secure round of ``job`` says last: that it
    left the job (``how``: why; ``told``: whether the server took its refusal), that running
    the client again cannot rejoin it, and what became of the job (``st``, asked after the
    refusal; None: not known). A job that had ended before is said as such."""
    if st is not None and st.status in ("done", "failed") and not told:
        return f"job {job} had ended before this site stopped: {_ended(job, st)}"
    server = ("the server was told" if told else
              "the server could not be told: it drops this site at the step's deadline")
    said = (f"this site has left job {job} ({how}; {server}): its round keys die with this "
            "process, so running the client again cannot rejoin the job")
    if st is not None and st.status in ("done", "failed"):
        return f"{said}; {_ended(job, st)}"
    if st is None or st.status != "running":
        return (f"{said}; the job goes on without it while enough sites remain (`fedforest "
                f"status --job {job}` says how it goes)")
    if st.active_clients >= st.min_clients:
        return (f"{said}; the job goes on without it with {_sites(st.active_clients)} (at "
                f"least {st.min_clients} needed)")
    remain = "remains" if st.active_clients == 1 else "remain"
    return (f"{said}; the job cannot go on: {_sites(st.active_clients)} {remain}, fewer than "
            f"the {st.min_clients} it needs, so it stops without a model")


def _ended(job: str, st: JobStatus) -> str:
    if st.status == "done":
        return f"the job is done: `fedforest model download --job {job}` fetches its model"
    return f"the job has failed{f' ({st.reason})' if st.reason else ''}: there is no model"
