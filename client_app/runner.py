"""The client loop: join, replay after a restart, answer tasks, upload, download the model.

Only two kinds of things leave the site: the summable vector of each round (fixed-point encoded
by :func:`fedforest_secure.secure_sum.encode_contribution`, and masked under secure aggregation,
so the server can only learn the sum over clients) and the per-client items the job's privacy
profile discloses.

After every upload the client writes an audit :class:`~fedforest_secure.audit.Receipt` (the
upload's SHA-256 and the audit-chain tip the server announced with the task) to
``<state dir>/receipts/<client>.jsonl``; ``fedforest audit verify --receipts`` checks them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
from nacl.signing import SigningKey
from pydantic import BaseModel, ValidationError
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from fedforest_secure.audit import Receipt, write_receipt
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import (
    FedForestError,
    InvalidMessage,
    ProtocolError,
    RefusedRequest,
    SchemaError,
)
from fedforest_secure.files import write_atomic
from fedforest_secure.privacy import PrivacyProfile, load_profile
from fedforest_secure.protocol import Reply, SealedTask, Task, TaskKind, make_upload
from fedforest_secure.protocol.api import (
    JobStatus,
    JoinBody,
    JoinResponse,
    RoundInfo,
    SecAggStep,
)
from fedforest_secure.secure_sum import encode_contribution

from .data import load_site_table, schema_sha256
from .evaluation import LedgeredEvalWorker, SiteWorker, site_worker
from .log import SiteLog
from .secagg_session import SecAggSession, identity_key
from .state import ClientState
from .transport import ApiRejected, Transport

__all__ = ["ClientOptions", "ClientResult", "ProfileRefused", "RESTARTED_SECURE",
           "check_job_profile", "pinned_profile", "run_client"]


class ProfileRefused(FedForestError):
    """The job's privacy profile is not the one this site pinned: the client takes no part."""


#: What a client restarted in the middle of a secure round is told (its round keys were in the
#: memory of the process that died, so it cannot answer that round's steps).
RESTARTED_SECURE = ("a restarted site cannot rejoin an open secure round; the job goes on "
                    "without this site while enough sites remain")


_M = TypeVar("_M", bound=BaseModel)

#: Profile fields that are labels for humans, not privacy settings.
_PROFILE_LABELS = frozenset({"name", "description"})


def pinned_profile(name_or_path: str) -> dict[str, Any]:
    """The profile a site pins with ``--profile`` (shipped name or TOML path), as a dict."""
    return load_profile(name_or_path).to_dict()


def check_job_profile(pinned: dict[str, Any], job_profile: Any) -> None:
    """Refuse (:class:`ProfileRefused`) a job whose profile differs from the pinned one.

    Every privacy setting must be equal (secure aggregation, fixed point, threshold, sketch,
    abstention, H-splits, the whole ``dp`` section with its budget, ``min_clients``, ...); only
    the labels ``name`` and ``description`` may differ. A server cannot hand the site a weaker
    profile (``open``, ``secure_aggregation = false``, a larger or missing DP budget), nor a
    different one that it claims is equivalent.
    """
    want = pinned.get("name", "?")
    try:
        job = PrivacyProfile.from_dict(job_profile).to_dict()
    except FedForestError as exc:
        raise ProfileRefused(f"the job's privacy profile is not a valid profile ({exc}); this "
                             f"site pinned {want!r}: refusing to take part") from None
    diffs = sorted(k for k in set(pinned) | set(job)
                   if k not in _PROFILE_LABELS and pinned.get(k) != job.get(k))
    if diffs:
        shown = "; ".join(f"{k}: job {job.get(k)!r}, pinned {pinned.get(k)!r}" for k in diffs)
        raise ProfileRefused(
            f"the job's privacy profile {job.get('name', '?')!r} is not the profile this site "
            f"pinned ({want!r}): {shown}. Refusing to take part: this site did not join the job "
            "(it only asked what the job is)")


@dataclass
class ClientOptions:
    server: str
    token: str
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
class _Ctx:
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
    watch: _Watch

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
        ring = bool(self.config.profile.get("fixed_point",
                                            self.config.profile.get("secure_aggregation")))
        if ring:
            return np.asarray(encode_contribution(self.config, task, reply))
        return np.asarray(reply.summable, dtype=np.float64)

    def receipt(self, task: Task, body: bytes, seq: int | str, head: str,
                server_receipt: dict[str, Any] | None) -> None:
        if server_receipt is not None:
            self.state.add_receipt(server_receipt)
            self.result.receipts.append(server_receipt)
        try:
            rec = Receipt(job_id=self.job, round_id=task.round_id, client=self.name,
                          upload_digest=hashlib.sha256(body).hexdigest(),
                          chain_head_seen=str(head), seq_seen=int(seq))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"the server announced a malformed audit tip: {exc}") from exc
        write_receipt(self.state.root / "receipts", rec)


@dataclass
class _Watch:
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
        try:
            st = JobStatus.model_validate(tr.get_json(f"/v1/jobs/{self.job}"))
        except (ValidationError, FedForestError, ValueError):
            return  # the log is a courtesy: never fail training over it
        self.observe(st)

    def observe(self, st: JobStatus) -> None:
        invited = tuple(m.name for m in st.members if m.state == "invited")
        if st.status == "waiting" and invited and invited != self._waiting_for:
            self.log.info(f"job {self.job}: waiting for site{'s' if len(invited) > 1 else ''} "
                          f"{_names(invited)} to join")
        self._waiting_for = invited
        for m in st.members:
            if m.state == "dropped" and m.name not in self._dropped and m.index != self.me:
                self._dropped.add(m.name)
                at = f" at round {m.dropped_round}" if m.dropped_round is not None else ""
                self.log.warn(f"job {self.job}: site {m.name} was dropped{at}; the job "
                              f"continues with {st.active_clients} sites (at least "
                              f"{st.min_clients} needed)")


def _names(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def run_client(opts: ClientOptions, log: SiteLog | None = None) -> ClientResult:
    """Run one institution's side of a job until the job ends (or this client is dropped)."""
    # validated before anything is sent: the training table and/or the held-out rows (a
    # table that does not fit the schema: the server is told "table", nothing more)
    try:
        train = load_site_table(opts.data, opts.schema) if opts.data is not None else None
        held_out = load_site_table(opts.eval_data, opts.schema) if opts.eval_data is not None \
            else None
    except SchemaError:
        _decline_alone(opts, "table", log)
        raise
    if train is None and held_out is None:
        raise FedForestError("give the site's table (--data) or its held-out rows "
                             "(--eval-data)")
    _check_outputs(opts)
    pinned = pinned_profile(opts.profile) if opts.profile is not None else None
    if pinned is None or pinned.get("dp") is not None:
        # the DP machinery (diffprivlib, SciPy) takes seconds to import on a loaded machine:
        # loaded before joining, not inside the first round's deadline, unless this site
        # pinned a profile without DP
        import fedforest_secure.privacy.dp  # noqa: F401
    log = log or SiteLog()
    tr = Transport(opts.server, opts.token, opts.ca, opts.cert, opts.key,
                   retry_budget_s=opts.retry_budget_s, insecure_dev=opts.insecure_dev,
                   on_wait=log.info)
    state = ClientState(opts.state_dir)
    try:
        X, y = train if train is not None else (None, None)
        return _run(opts, tr, state, X, y, log, pinned, held_out)
    finally:
        tr.close()


def _run(opts: ClientOptions, tr: Transport, state: ClientState, X: np.ndarray | None,
         y: np.ndarray | None, log: SiteLog, pinned: dict[str, Any] | None = None,
         held_out: tuple[np.ndarray, np.ndarray] | None = None) -> ClientResult:
    job = opts.job
    identity = None
    # the job as the join would answer it, checked against this site's pins, schema and
    # table before joining: a site that refuses a job is never counted as having joined it
    try:
        offered = tr.get_json(f"/v1/jobs/{job}/offer")
    except ApiRejected as exc:
        if exc.code != "dropped":
            raise
        # a site dropped earlier (a missed deadline, a refusal) that comes back: what happened
        # and what it can still do, not an HTTP error
        return ClientResult(status="dropped", detail=_dropped_detail(job, exc.detail))
    info = _parse(JoinResponse, offered, "job offer")
    if pinned is not None:  # before anything else leaves the site
        with _declining(tr, job, "profile", log):
            check_job_profile(pinned, info.config.get("profile"))
    else:
        log.warn("no --profile pinned: this site accepts the privacy profile the server "
                 "states for the job")
    want = info.schema_sha256
    if want is not None and want != schema_sha256(opts.schema):
        _decline(tr, job, "schema", log)
        raise FedForestError("the local schema file differs from the job's schema; "
                             "get the federation's schema file")
    try:
        config = JobConfig.from_json(json.dumps(info.config))
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed job configuration in the join response: {exc}") from exc
    with _declining(tr, job, "job_config", log):
        _check_job(config, opts, log)
    k = info.client_index
    train = (X, y) if X is not None and y is not None else None
    worker = site_worker(config, k, train, held_out, state.root)
    if isinstance(worker, LedgeredEvalWorker):  # scored these rows with a model before
        with _declining(tr, job, "evaluated_before", log):
            worker.check()
    table = None if train is None else _table_digest(*train)
    _check_same_table(state, job, table)
    joined = _parse(JoinResponse,
                    tr.post_json(f"/v1/jobs/{job}/join", _join_body(state, job, opts)),
                    "join response")
    if (joined.config, joined.client_index, joined.schema_sha256) != (
            info.config, k, info.schema_sha256):
        raise ProtocolError("the join response differs from the job the server offered")
    if table is not None:
        write_atomic(state.root / f"table-{job}.sha256", table.encode())
    secure_hint = bool(config.profile.get("secure_aggregation"))
    if secure_hint:
        identity = identity_key(state, job)
    log.info(f"joined job {job} as client {k} of {config.n_clients} "
             f"({worker.n_rows} rows, profile {config.profile.get('name', '?')})")
    _replay(tr, job, worker)
    cpu0 = time.process_time()  # start-up (imports, table, join) done: training from here
    result = ClientResult(status="running")
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total} levels"), TimeElapsedColumn(),
                        console=log.console, disable=opts.quiet or log.plain)
    with progress:
        bar = progress.add_task(f"job {job}", total=config.max_depth + 1)
        ctx = _Ctx(opts, tr, state, config, job, k, info.client_name or f"client-{k}",
                   worker, result, progress, bar, log, _Watch(job, log, k))
        ctx.waiting()
        try:
            if secure_hint and identity is not None:
                _run_secure(ctx, identity)
            else:
                _run_open(ctx)
        except ApiRejected as exc:
            if exc.code != "dropped":
                raise
            # dropped while it ran (it stalled past a deadline): as for a site coming back
            result.status, result.detail = "dropped", _dropped_detail(job, exc.detail)
        progress.update(bar, completed=config.max_depth + 1)
    if result.status == "done":
        ctx.watch.poll(tr, force=True)  # a site dropped during the last level is named too
        resp = tr.request("GET", f"/v1/jobs/{job}/model")
        model = resp.content
        kind = "model" if config.evaluation is None else "evaluation"
        out = opts.model_out or (opts.state_dir / f"{job}.{kind}.json")
        write_atomic(out, model)
        result.model_path = out
        _model_receipt(ctx, model, resp.headers)
        log.info(f"job {job} done: {kind} saved to {out} "
                 f"(sha256 {hashlib.sha256(model).hexdigest()[:16]}...)")
    else:
        log.warn(f"job {job} ended: {result.status} {result.detail}")
    result.bytes_sent, result.bytes_received = tr.bytes_sent, tr.bytes_received
    stats = json.dumps({
        "job": job, "status": result.status, "rounds": result.rounds,
        "bytes_sent": result.bytes_sent, "bytes_received": result.bytes_received,
        "requests": tr.requests,
        "cpu_s": time.process_time(), "cpu_training_s": time.process_time() - cpu0})
    # the last job's, and each job's own (a site may run a training then an evaluation job)
    write_atomic(opts.state_dir / "stats.json", stats)
    write_atomic(opts.state_dir / f"stats-{job}.json", stats)
    return result


def _table_digest(X: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of the training rows as the worker reads them."""
    h = hashlib.sha256()
    for arr in (X, y):
        a = np.ascontiguousarray(arr)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.data.cast("B"))
    return h.hexdigest()


def _check_same_table(state: ClientState, job: str, table: str | None) -> None:
    """A site's rows cannot change within a job: a restarted client rebuilds its part of the
    job's earlier rounds from its table, so it must be the table it joined with."""
    path = state.root / f"table-{job}.sha256"
    if table is None or not path.exists():
        return
    if path.read_text().strip() != table:
        raise FedForestError(f"this site joined job {job} with another table (--data): a "
                             "site's rows cannot change within a job. Restart the client with "
                             "the table it joined with; a changed table takes part in a new "
                             "job")


def _check_outputs(opts: ClientOptions) -> None:
    """The model file and the state directory can be written: checked before joining, not
    when a job of hours ends."""
    try:
        opts.state_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=opts.state_dir, prefix=".fedforest-check-"):
            pass
    except OSError as exc:
        raise FedForestError(f"--state-dir {opts.state_dir}: {exc.strerror or exc}") from None
    out = opts.model_out
    if out is not None:
        if out.is_dir():
            raise FedForestError(f"--out {out} is a directory; name the model file")
        if not out.parent.is_dir():
            raise FedForestError(f"--out {out}: the directory {out.parent} does not exist")
        try:  # a read-only or foreign directory: found now, not after the training
            with tempfile.NamedTemporaryFile(dir=out.parent, prefix=".fedforest-check-"):
                pass
        except OSError as exc:
            raise FedForestError(f"--out {out}: cannot write in {out.parent}: "
                                 f"{exc.strerror or exc}") from None


def _parse(model: type[_M], obj: object, what: str) -> _M:
    """``obj`` (parsed JSON from the server) as ``model``; a :class:`ProtocolError` if it
    does not validate."""
    try:
        return model.model_validate(obj)
    except ValidationError:
        raise ProtocolError(f"malformed {what}") from None


def _check_job(config: JobConfig, opts: ClientOptions, log: SiteLog) -> None:
    """Refuse a job whose configuration disagrees with this site's own schema file (bounds
    included: they calibrate the DP noise) or with its pinned number of clients."""
    from fedforest_secure.privacy.pinning import check_job_config
    from fedforest_secure.schema import Schema

    check_job_config(config, schema=Schema.load(opts.schema), n_clients=opts.n_clients)
    if opts.n_clients is None and config.profile.get("secure_aggregation"):
        log.warn(f"no --clients pinned: this site takes the server's word that the job has "
                 f"{config.n_clients} clients")


def _decline(tr: Transport, job: str, reason: str, log: SiteLog) -> None:
    """Tell the server why this site will not join ``job`` (a code; the message stays in the
    site's log), so the operator sees it beside the member; best effort."""
    try:
        tr.post_json(f"/v1/jobs/{job}/decline", {"reason": reason})
        log.warn(f"job {job}: the server was told this site declines it ({reason}); it waits "
                 "for this site until it joins")
    except (FedForestError, OSError, ValueError) as exc:
        log.info(f"job {job}: the server was not told this site declines it: {exc}")


@contextlib.contextmanager
def _declining(tr: Transport, job: str, reason: str, log: SiteLog) -> Iterator[None]:
    """A check whose failure (a :class:`FedForestError`) this site declines the job for."""
    try:
        yield
    except FedForestError:
        _decline(tr, job, reason, log)
        raise


def _decline_alone(opts: ClientOptions, reason: str, log: SiteLog | None) -> None:
    """:func:`_decline` before the client's transport exists (its table failed to load)."""
    if not opts.job:
        return
    try:
        tr = Transport(opts.server, opts.token, opts.ca, opts.cert, opts.key,
                       retry_budget_s=min(opts.retry_budget_s, 10.0),
                       insecure_dev=opts.insecure_dev)
    except (FedForestError, OSError, ValueError):
        return
    try:
        _decline(tr, opts.job, reason, log or SiteLog())
    finally:
        tr.close()


def _dropped_detail(job: str, why: str) -> str:
    """What a site dropped from ``job`` is told: what happened and what it can still do."""
    return (f"this site was dropped from job {job} ({why}); the job went on without it. Once "
            f"the job is done, `fedforest model download --job {job}` fetches its model")


def _model_receipt(ctx: _Ctx, model: bytes, headers: Any) -> None:
    """Keep a receipt of the model and of the audit-chain head the server announced with it:
    it covers the job's last round and its model entry (``fedforest audit verify --receipts``).
    A server that keeps no audit log announces no entry (sequence 0): there is nothing for a
    receipt to cover, and the site is told so."""
    from fedforest_secure.audit import ModelReceipt, write_receipt

    if str(headers.get("X-FedForest-Audit-Seq", "0")) == "0":
        ctx.log.warn(f"job {ctx.job}: the server keeps no audit log: this site keeps no model "
                     "receipt, and nothing records which model the job gave")
        return
    try:
        rec = ModelReceipt(job_id=ctx.job, client=ctx.name,
                           model_digest=hashlib.sha256(model).hexdigest(),
                           chain_head_seen=str(headers.get("X-FedForest-Audit-Head", "")),
                           seq_seen=int(headers.get("X-FedForest-Audit-Seq", "0")))
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"the server announced a malformed audit tip with the model: "
                            f"{exc}") from exc
    write_receipt(ctx.state.root / "receipts", rec)


def _join_body(state: ClientState, job: str, opts: ClientOptions) -> dict[str, Any]:
    """Every client registers its Ed25519 identity key (used only by secure jobs); a client
    with a TLS certificate also certifies the key with it (see
    :mod:`fedforest_secure.secagg.directory`)."""
    from fedforest_secure.secagg.directory import certify_identity

    key = bytes(identity_key(state, job).verify_key)
    cert = None
    if opts.cert is not None and opts.key is not None:
        cert = certify_identity(job, key, opts.cert.read_bytes(),
                                opts.key.read_bytes()).to_json()
    return JoinBody(identity_key=key.hex(), identity_cert=cert).model_dump(exclude_none=True)


def _run_open(ctx: _Ctx) -> None:
    """Plain (or fixed-point) sums: one GET task / POST upload per round."""
    tr, job, result = ctx.tr, ctx.job, ctx.result
    while True:
        resp = tr.request("GET", f"/v1/jobs/{job}/task", params={"wait": LONG_POLL_S})
        status = resp.headers.get("X-FedForest-Status", "")
        if resp.status_code == 204:
            if status in ("done", "failed", "dropped"):
                detail = resp.headers.get("X-FedForest-Detail", "")
                result.status, result.detail = status, (
                    _dropped_detail(job, detail) if status == "dropped" else detail)
                return
            ctx.waiting()
            continue
        task = _check_task(resp.content, resp.headers, job)
        ctx.show(task)
        reply = ctx.worker.handle(task)
        body = make_upload(task, ctx.contribution(task, reply), reply.disclosed)
        receipt = _upload(tr, job, task, body)
        ctx.receipt(task, body, resp.headers.get("X-FedForest-Audit-Seq", "0"),
                    resp.headers.get("X-FedForest-Audit-Head", ""), receipt)
        result.rounds += 1


def _run_secure(ctx: _Ctx, identity: SigningKey) -> None:
    """Secure aggregation: follow GET /secagg (advert, shares, masked upload, unmask)."""
    tr, job = ctx.tr, ctx.job
    ca = ctx.opts.ca.read_bytes() if ctx.opts.ca is not None and ctx.opts.cert is not None \
        else None
    session = SecAggSession(ctx.config, tr, job, ctx.index, identity, ca_pem=ca)
    tr.step_wait = LONG_POLL_S  # every POST brings the next step back: no separate GET
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="shares") as sender:
            _secure_steps(ctx, session, sender)
    except KeyboardInterrupt:
        # stopped (Ctrl-C): the round keys die with this process, so the open round goes on
        # without this site; the server learns it now, not at the step's deadline
        r = session.open_round
        if r is not None and not session.refused(r):
            tr.retry_budget_s = min(tr.retry_budget_s, 5.0)
            _tell_stopped(ctx, session, r)
        raise


def _tell_stopped(ctx: _Ctx, session: SecAggSession, r: int) -> None:
    """Tell the server this site stopped: refuse round ``r`` or, where ``r`` closed meanwhile,
    the round open now (this site's keys for it rode on its answer to ``r``, so the server
    counts the site in and would wait for it until the step's deadline)."""
    for _ in range(2):
        try:
            session.refuse_round(r, "stopped")
            return
        except ApiRejected as exc:
            if exc.code != "round_closed":
                ctx.log.info(f"round {r}: the server was not told this site stopped: {exc}")
                return
            try:
                step = _parse(SecAggStep, ctx.tr.get_json(f"/v1/jobs/{ctx.job}/secagg"),
                              "secure-aggregation step")
            except (FedForestError, OSError) as err:
                ctx.log.info(f"round {r}: the server was not told this site stopped: {err}")
                return
            if step.round_id is None or step.round_id <= r:
                ctx.log.info(f"round {r}: the server was not told this site stopped: {exc}")
                return
            r = step.round_id
        except (FedForestError, OSError) as exc:
            ctx.log.info(f"round {r}: the server was not told this site stopped: {exc}")
            return


def _secure_steps(ctx: _Ctx, session: SecAggSession, sender: ThreadPoolExecutor) -> None:
    """The loop of :func:`_run_secure`; ``sender`` posts the share bundles."""
    tr, job, result = ctx.tr, ctx.job, ctx.result
    task: Task | None = None
    reply: Reply | None = None
    vector: np.ndarray | None = None
    while True:
        step = _parse(SecAggStep, tr.take_next_step() or tr.get_json(
            f"/v1/jobs/{job}/secagg", params={"wait": LONG_POLL_S}), "secure-aggregation step")
        status = step.status
        if status in ("done", "failed", "dropped"):
            result.status, result.detail = status, (
                _dropped_detail(job, str(step.detail)) if status == "dropped"
                else str(step.detail))
            return
        if status != "task":
            ctx.waiting()
            continue
        if step.round_id is None:
            raise ProtocolError("a secure-aggregation step without its round")
        r = session.open_round = step.round_id
        if session.client is None:
            session.connect(on_wait=ctx.waiting)
        if step.action != "advert" and not session.advertised(r):
            # this process never sent keys for round r: it is a restart of a client whose
            # round keys died with the old process. Refusing the round drops it now, rather
            # than at the step's deadline, which every other site would wait for
            ctx.log.warn(f"job {job}: {RESTARTED_SECURE}")
            try:
                session.refuse_round(r, "restarted")
            except ApiRejected as exc:  # the round closed, or the site was dropped, meanwhile
                ctx.log.info(f"round {r}: the server did not record the refusal: {exc}")
            result.status, result.detail = "dropped", RESTARTED_SECURE
            return
        if task is None or task.round_id != r:
            body = tr.request("GET", f"/v1/jobs/{job}/rounds/{r}/task").content
            digest = hashlib.sha256(body).digest()
            if digest.hex() != step.task_digest:
                raise ProtocolError(f"round {r}: the task does not match its announced digest")
            # hashed and packed once: the worker, the round setup check and the upload header
            # all ask for its digest
            task = SealedTask.from_wire(body, digest)
            if task.job_id != job or task.round_id != r:
                raise ProtocolError("the server sent a task of another job or round")
            reply = vector = None
        action = step.action
        message = str(step.message)
        ctx.show(task, f" · {action}")
        try:
            if action == "advert":
                session.advert(r)
            elif action == "share":
                # shares first, then the answer: the shares go out from a second thread while
                # this one computes; that POST waits for the round's share deliveries and
                # brings this client's back as its next step, so the masked upload follows
                # the answer without another request, while slower clients still compute
                posted = sender.submit(session.post_shares, r,
                                       session.share_bundle(task, message))
                try:
                    reply = ctx.worker.handle(task)
                    vector = ctx.contribution(task, reply)
                finally:
                    failed = posted.exception()
                if failed is not None:
                    raise failed
            elif action == "upload":
                if reply is None or vector is None:
                    reply = ctx.worker.handle(task)
                    vector = ctx.contribution(task, reply)
                header, masked = session.mask(task, message, vector)
                body = make_upload(task, masked, reply.disclosed, secagg=header)
                receipt = _upload(tr, job, task, body)
                ctx.receipt(task, body, step.audit_seq, step.audit_head, receipt)
                result.rounds += 1
            elif action == "sign":
                session.sign(task, message)
            elif action == "unmask":
                session.unmask(task, message)
        except (RefusedRequest, InvalidMessage) as exc:
            # a request a privacy rule refuses, or a peer's message (relayed by the server)
            # that does not authenticate: the round cannot go on with this site, and says why
            code = exc.code if isinstance(exc, RefusedRequest) else "invalid_message"
            ctx.log.warn(f"refused the server's request in round {r}: {exc}")
            if not session.refused(r):  # the site's own answer refused: the server learns it
                try:  # now, not at the step's deadline every other site would wait for
                    session.refuse_round(r, code)
                except ApiRejected as rej:  # the round closed, or the site was dropped
                    ctx.log.info(f"round {r}: the server did not record the refusal: {rej}")
            result.status, result.detail = "refused", f"round {r}: {exc}"
            return
        except ApiRejected as exc:
            if exc.code in ("wrong_phase", "round_closed"):
                continue  # the phase moved on (e.g. a deadline passed): ask again
            raise


def _check_task(body: bytes, headers: httpx.Headers, job: str) -> Task:
    digest = hashlib.sha256(body).digest()
    if headers.get("X-FedForest-Task-Digest") not in (None, digest.hex()):
        raise ProtocolError("task digest header does not match the task body")
    task = SealedTask.from_wire(body, digest)
    if task.job_id != job:
        raise ProtocolError("the server sent a task of another job")
    return task


def _replay(tr: Transport, job: str, worker: SiteWorker) -> None:
    """After a restart, rebuild the worker by answering the job's earlier SKETCH tasks again."""
    listed = tr.get_json(f"/v1/jobs/{job}/rounds")
    if not isinstance(listed, list):
        raise ProtocolError("malformed round list")
    for r in (_parse(RoundInfo, item, "round list") for item in listed):
        if r.status != "closed" or r.kind != TaskKind.SKETCH.value:
            continue
        body = tr.request("GET", f"/v1/jobs/{job}/rounds/{r.round_id}/task").content
        digest = hashlib.sha256(body).digest()
        if digest.hex() != r.task_digest:
            raise ProtocolError(f"round {r.round_id}: task does not match its digest")
        worker.handle(SealedTask.from_wire(body, digest))


def _upload(tr: Transport, job: str, task: Task, body: bytes) -> dict[str, Any] | None:
    try:
        receipt = dict(tr.request("POST", f"/v1/jobs/{job}/rounds/{task.round_id}/upload",
                                  content=body).json())
        receipt.pop("next", None)  # the next step (secure runs), not part of the receipt
        return receipt
    except ApiRejected as exc:
        if exc.code == "round_closed" and exc.body.get("counted"):
            return None  # a retry of an upload the server already counted
        raise
