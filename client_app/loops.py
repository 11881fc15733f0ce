"""The round loops of a client that joined a job: open jobs (GET the task, POST the upload)
and secure aggregation (the server's steps: shares, masked upload, survivor-set signature,
unmask), and the replay of a job's earlier sketch rounds after a restart."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

import httpx
import numpy as np
from nacl.signing import SigningKey

from fedforest_secure.errors import FedForestError, InvalidMessage, ProtocolError, RefusedRequest
from fedforest_secure.protocol import Reply, SealedTask, Task, TaskKind, make_upload
from fedforest_secure.protocol.api import RoundInfo, SecAggStep

from .answers import TASK_MAX, answer_json
from .context import (
    LONG_POLL_S,
    RESTARTED_SECURE,
    RunContext,
    dropped_detail,
    job_status_briefly,
    left_detail,
    parse_as,
    uploaded_before_detail,
)
from .evaluation import SiteWorker
from .secagg_session import SecAggSession
from .stop import raise_if_asked
from .transport import ApiRejected, ServerUnreachable, Transport

__all__ = ["LeftSecureJob", "ShareSender", "leave_after_error", "replay", "run_open",
           "run_secure", "secure_steps", "tell_stopped"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class LeftSecureJob(FedForestError):
    """This client gave up on its server in the middle of a secure round: the site has left
    the job (its round keys die with the process), which running the client again cannot
    rejoin."""


class ShareSender(Executor):
    """Runs each call in a daemon thread of its own: the share bundle's POST, which waits for
    the round's share deliveries while the main thread computes. A client that stops (Ctrl-C,
    SIGTERM: the signal interrupts the main thread only) waits for none of them, neither on
    its way out nor when the process exits; such a request sends no retry once the stop is
    recorded (:mod:`client_app.stop`)."""

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
               ) -> Future[_T]:
        done: Future[_T] = Future()

        def run() -> None:
            if not done.set_running_or_notify_cancel():
                return
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # the caller's to look at
                done.set_exception(exc)

        threading.Thread(target=run, name="shares", daemon=True).start()
        return done


def run_open(ctx: RunContext) -> None:
    """Plain (or fixed-point) sums: one GET task / POST upload per round."""
    tr, job, result = ctx.tr, ctx.job, ctx.result
    while True:
        resp = tr.request("GET", f"/v1/jobs/{job}/task", params={"wait": LONG_POLL_S},
                          limit=TASK_MAX)
        status = resp.headers.get("X-FedForest-Status", "")
        if resp.status_code == 204:
            if status in ("done", "failed", "dropped"):
                detail = resp.headers.get("X-FedForest-Detail", "")
                result.status, result.detail = status, (
                    dropped_detail(job, detail, tr) if status == "dropped" else detail)
                return
            ctx.waiting()
            continue
        task = _check_task(resp.content, resp.headers, job)
        ctx.show(task)
        reply = ctx.worker.handle(task)
        body = make_upload(task, ctx.contribution(task, reply), reply.disclosed)
        seq = resp.headers.get("X-FedForest-Audit-Seq", "0")
        head = resp.headers.get("X-FedForest-Audit-Head", "")
        ctx.receipt_sent(task, body, seq, head)  # on disk before the upload goes
        receipt = _upload(tr, job, task, body)
        ctx.receipt(task, body, seq, head, receipt)
        result.rounds += 1


def run_secure(ctx: RunContext, identity: SigningKey) -> None:
    """Secure aggregation: follow GET /secagg (advert, shares, masked upload, unmask)."""
    tr, job = ctx.tr, ctx.job
    ca = ctx.opts.ca.read_bytes() if ctx.opts.ca is not None and ctx.opts.cert is not None \
        else None
    session = SecAggSession(ctx.config, tr, job, ctx.index, identity, ca_pem=ca,
                            on_refused=ctx.refusal_receipt)
    tr.step_wait = LONG_POLL_S  # every POST brings the next step back: no separate GET
    try:
        try:
            secure_steps(ctx, session, ShareSender())
        except Exception as exc:  # a stop wrapped in another error is the stop
            raise_if_asked(exc)
            raise
    except KeyboardInterrupt as exc:
        # stopped (Ctrl-C, SIGTERM): the round keys die with this process, so the open round
        # goes on without this site; the server learns it now, not at the step's deadline
        r = session.open_round
        if r is None:  # before its first round: the same command resumes it
            raise
        try:
            told = _leave_round(ctx, session, "stopped")
            if told:  # the round the server recorded: the next one, if r closed meanwhile
                r = session.last_refused() or r
            st = job_status_briefly(tr, job)
        except KeyboardInterrupt:  # a second Ctrl-C cuts the leaving short
            told, st = session.refused(r), None
        # what the command prints last: the site left the job, which a rerun cannot rejoin
        exc.add_note(left_detail(job, f"it stopped in the middle of secure round {r}",
                                 told=told, st=st))
        raise
    except Exception as exc:
        # an error this process stops on (a full disk, a server that misbehaves, a defect of
        # this program): the same (the command prints the error)
        told = leave_after_error(ctx, session, exc)
        r = session.open_round
        if isinstance(exc, ServerUnreachable) and r is not None:
            # "is it running?" would send the site's operator to rerun the client once the
            # server is back: that cannot rejoin the job
            st = job_status_briefly(tr, job) if told else None
            raise LeftSecureJob(
                f"{exc.failure}; "
                + left_detail(job, f"it gave up on the server in the middle of secure round "
                                   f"{r}", told=told, st=st)
                + f". --retry-budget sets how long a client waits for its server "
                  f"({ctx.opts.retry_budget_s:.0f}s here, 300s by default)") from exc
        raise


def leave_after_error(ctx: RunContext, session: SecAggSession, exc: Exception) -> bool:
    """This process stops on ``exc`` in a secure job: refuse the open round (code ``failed``,
    or the refusal's own code), unless the server cannot be told or knows already. Whether
    the server took the refusal (now or before)."""
    if _server_knows(exc):
        return False
    return _leave_round(ctx, session, exc.code if isinstance(exc, RefusedRequest) else "failed")


def _server_knows(exc: Exception) -> bool:
    """Whether a refusal would tell the server nothing: it dropped the site, the job ended, or
    it refuses the site's credentials. A server this client gave up on
    (:class:`TransportFailed`) is still told, briefly: it may answer again, and it would
    otherwise wait for this site until the step's deadline."""
    return isinstance(exc, ApiRejected) and (exc.code in ("dropped", "job_finished")
                                             or exc.status in (401, 403))


def _leave_round(ctx: RunContext, session: SecAggSession, code: str) -> bool:
    """This process stops in the middle of a secure round: refuse it with ``code`` (unless it
    did already), within a few seconds. Whether the server has this site's refusal."""
    r = session.open_round
    if r is None:
        return False
    if session.refused(r):
        return True
    with ctx.tr.brief():
        return tell_stopped(ctx, session, r, code)


def tell_stopped(ctx: RunContext, session: SecAggSession, r: int, code: str = "stopped"
                 ) -> bool:
    """Tell the server this site stopped (a refusal with ``code``): refuse round ``r`` or,
    where ``r`` closed meanwhile, the round open now (this site's keys for it rode on its
    answer to ``r``, so the server counts the site in and would wait for it until the step's
    deadline). Whether the server took the refusal."""
    for _ in range(2):
        try:
            session.refuse_round(r, code)
            return True
        except ApiRejected as exc:
            if exc.code != "round_closed":
                ctx.log.info(f"round {r}: the server was not told this site stopped: {exc}")
                return False
            try:
                step = parse_as(SecAggStep, ctx.tr.get_json(f"/v1/jobs/{ctx.job}/secagg"),
                                "secure-aggregation step")
            except (FedForestError, OSError) as err:
                ctx.log.info(f"round {r}: the server was not told this site stopped: {err}")
                return False
            if step.round_id is None or step.round_id <= r:
                ctx.log.info(f"round {r}: the server was not told this site stopped: {exc}")
                return False
            r = step.round_id
        except (FedForestError, OSError) as exc:
            ctx.log.info(f"round {r}: the server was not told this site stopped: {exc}")
            return False
    return False


def secure_steps(ctx: RunContext, session: SecAggSession, sender: Executor) -> None:
    """The loop of :func:`run_secure`; ``sender`` posts the share bundles (in another
    thread)."""
    tr, job, result = ctx.tr, ctx.job, ctx.result
    task: Task | None = None
    reply: Reply | None = None
    vector: np.ndarray | None = None
    while True:
        brought = tr.take_next_step()
        # the task of a step of the next round may come with it, checked below as a fetched one
        attached = tr.take_step_task()
        step = parse_as(SecAggStep, brought or tr.get_json(
            f"/v1/jobs/{job}/secagg", params={"wait": LONG_POLL_S}), "secure-aggregation step")
        status = step.status
        if status in ("done", "failed", "dropped"):
            result.status, result.detail = status, (
                dropped_detail(job, str(step.detail), tr) if status == "dropped"
                else str(step.detail))
            return
        if status != "task":
            ctx.waiting()
            continue
        if step.round_id is None:
            raise ProtocolError("a secure-aggregation step without its round")
        r = session.open_round = step.round_id
        if session.client is None:
            try:
                session.connect(on_wait=ctx.waiting)
            except (RefusedRequest, InvalidMessage) as exc:  # a peer's identity: accused
                # (RefusedRequest: a certificate not valid yet on this clock, accusing nobody)
                _refuse_step(ctx, session, r, exc)
                return
        if not session.advertised(r) and (step.action != "advert" or ctx.uploaded_before):
            # this process never sent keys for round r: it is a restart. Asked a step past the
            # advert, its round keys died with the old process; having uploaded in the job
            # before (its receipts say so), its record of the questions it answered and of
            # the DP releases it made died too, so it answers no question of the job again,
            # whatever the step (an honest server never asks it for keys: they rode on its
            # last unmask; one that does could ask it again what it answered over fewer
            # sites). Refusing the round drops it now, rather than at the step's deadline,
            # which every other site would wait for. The receipts know a job by its name: an
            # upload they record may be an earlier job's of that name, and the site says so
            why = (uploaded_before_detail(job, ctx.state.root / "receipts")
                   if ctx.uploaded_before else RESTARTED_SECURE)
            ctx.log.warn(f"job {job}: {why}")
            try:
                session.refuse_round(r, "restarted")
            except ApiRejected as exc:  # the round closed, or the site was dropped, meanwhile
                ctx.log.info(f"round {r}: the server did not record the refusal: {exc}")
            # whether the job went on without this site or failed for want of it
            result.status, result.detail = "dropped", dropped_detail(job, why, tr)
            return
        if task is None or task.round_id != r:
            body = attached if attached is not None else tr.request(
                "GET", f"/v1/jobs/{job}/rounds/{r}/task", limit=TASK_MAX).content
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
                except KeyboardInterrupt:
                    raise  # stopped: the POST is not waited for
                except BaseException:
                    posted.exception()  # the shares' POST ends before the error goes on
                    raise
                failed = posted.exception()
                if failed is not None:
                    raise failed
            elif action == "upload":
                if reply is None or vector is None:
                    reply = ctx.worker.handle(task)
                    vector = ctx.contribution(task, reply)
                header, masked = session.mask(task, message, vector)
                body = make_upload(task, masked, reply.disclosed, secagg=header)
                # recorded on disk before it goes: the POST waits until every site has
                # uploaded, and a site stopped meanwhile keeps a record of what it sent
                ctx.receipt_sent(task, body, step.audit_seq, step.audit_head)
                receipt = _upload(tr, job, task, body)
                ctx.receipt(task, body, step.audit_seq, step.audit_head, receipt)
                result.rounds += 1
            elif action == "sign":
                session.sign(task, message)
            elif action == "unmask":
                session.unmask(task, message)
        except (RefusedRequest, InvalidMessage) as exc:
            _refuse_step(ctx, session, r, exc)
            return
        except ApiRejected as exc:
            if exc.code in ("wrong_phase", "round_closed"):
                continue  # the phase moved on (e.g. a deadline passed): ask again
            raise


def _refuse_step(ctx: RunContext, session: SecAggSession, r: int,
                 exc: RefusedRequest | InvalidMessage) -> None:
    """A request a privacy rule refuses, or a peer's message or identity (relayed by the
    server) that does not authenticate: the round cannot go on with this site, which says
    why, and ends ``refused``."""
    code = exc.code if isinstance(exc, RefusedRequest) else "invalid_message"
    # a peer's message that does not authenticate: the refusal accuses that peer, so the
    # server's log and the job status name it, not only this site as refusing
    accused = exc.peer if isinstance(exc, InvalidMessage) else None
    ctx.log.warn(f"refused the server's request in round {r}: {exc}")
    if not session.refused(r):  # the site's own answer refused: the server learns it now,
        try:  # not at the step's deadline every other site would wait for
            try:
                session.refuse_round(r, code, accused=accused)
            except ApiRejected as rej:
                if rej.code != "invalid_accusation" or accused is None:
                    raise
                # the peer is not in the round (e.g. dropped before it): the refusal still
                # goes in, accusing nobody
                session.refuse_round(r, code)
        except ApiRejected as rej:  # the round closed, or the site was dropped
            ctx.log.info(f"round {r}: the server did not record the refusal: {rej}")
    ctx.result.status, ctx.result.detail = "refused", f"round {r}: {exc}"


def _check_task(body: bytes, headers: httpx.Headers, job: str) -> Task:
    digest = hashlib.sha256(body).digest()
    if headers.get("X-FedForest-Task-Digest") not in (None, digest.hex()):
        raise ProtocolError("task digest header does not match the task body")
    task = SealedTask.from_wire(body, digest)
    if task.job_id != job:
        raise ProtocolError("the server sent a task of another job")
    return task


def replay(tr: Transport, job: str, worker: SiteWorker) -> None:
    """After a restart, rebuild the worker by answering the job's SKETCH tasks again: the
    closed ones and the open one, which this site may have uploaded before it stopped (the
    server then only waits for the others, and its next round is that level's histogram);
    none once the job is finished and its rounds were pruned. A worker answers a round twice
    with one reply, so the open round's upload, if still due, is the same. (A secure site
    that uploaded in the job before is not rebuilt: it answers none of the job's rounds
    again, see :func:`secure_steps`.)"""
    listed = tr.get_json(f"/v1/jobs/{job}/rounds")
    if not isinstance(listed, list):
        raise ProtocolError("malformed round list")
    for r in (parse_as(RoundInfo, item, "round list") for item in listed):
        if r.status not in ("closed", "open") or r.kind != TaskKind.SKETCH.value:
            continue
        try:
            body = tr.request("GET", f"/v1/jobs/{job}/rounds/{r.round_id}/task",
                              limit=TASK_MAX).content
        except ApiRejected as exc:
            if exc.code == "pruned":  # a finished job: nothing to answer, its model to fetch
                return
            raise
        digest = hashlib.sha256(body).digest()
        if digest.hex() != r.task_digest:
            raise ProtocolError(f"round {r.round_id}: task does not match its digest")
        try:
            worker.handle(SealedTask.from_wire(body, digest))
        except RefusedRequest:
            if r.status == "closed":
                raise
            # the open round's task: the job's loop meets it again and refuses it there,
            # telling the server (a secure round's refusal drops this site at once)


def _upload(tr: Transport, job: str, task: Task, body: bytes) -> dict[str, Any] | None:
    try:
        path = f"/v1/jobs/{job}/rounds/{task.round_id}/upload"
        receipt = answer_json(tr.request("POST", path, content=body), f"POST {path}")
        if not isinstance(receipt, dict):
            raise ProtocolError(f"malformed answer to POST {path}: not a receipt")
        return receipt
    except ApiRejected as exc:
        if exc.code == "round_closed" and exc.body.get("counted"):
            return None  # a retry of an upload the server already counted
        if exc.code == "conflicting_upload":
            # this client's retries and restarts send the same bytes for a round (the same
            # rows, the same state directory): a different one is likely another client's
            raise FedForestError(
                f"job {job}: the server has counted another upload of this site for round "
                f"{task.round_id} ({exc.status} {exc.code}): another client of this site may "
                "have uploaded for this round. Check that one client only runs for this site "
                "(on this machine and others), with the --state-dir and --data it joined "
                "with") from None
        raise
