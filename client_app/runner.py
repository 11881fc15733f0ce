"""The client loop: check the site's table and the job, join, run the job's rounds, download the
model.

Only two kinds of things leave the site: the summable vector of each round (fixed-point encoded
by :func:`fedforest_secure.secure_sum.encode_contribution`, and masked under secure aggregation,
so the server can only learn the sum over clients) and the per-client items the job's privacy
profile discloses. The rounds themselves (tasks, uploads, the secure-aggregation steps, the
replay after a restart) are :mod:`client_app.loops`; what a run shares between its steps is
:mod:`client_app.context`.

Before every upload the client writes an audit :class:`~fedforest_secure.audit.SentReceipt`
(the task's and the upload's SHA-256 and the audit-chain tip the server announced with the task),
synced to disk before the request goes, and after the server's answer the upload's
:class:`~fedforest_secure.audit.Receipt`, to ``<state dir>/receipts/<client>.jsonl``;
``fedforest audit verify --receipts`` checks them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from fedforest_secure.audit import GENESIS, write_receipt
from fedforest_secure.config import MAX_BINS, MAX_ESTIMATORS, JobConfig
from fedforest_secure.errors import FedForestError, ProtocolError, RefusedRequest, SchemaError
from fedforest_secure.files import os_error_text, readable_by, write_atomic
from fedforest_secure.protocol.api import JoinResponse, SecAggStep
from fedforest_secure.startup import lasting_imports

from .context import (
    RESTARTED_SECURE,
    ClientOptions,
    ClientResult,
    RunContext,
    Watch,
    dropped_detail,
    ended,
    job_status_briefly,
    parse_as,
)
from .data import load_site_table, schema_sha256
from .declines import check_server_version, decline, decline_alone, declining
from .downloads import fetch_result
from .evaluation import LedgeredEvalWorker, site_worker
from .log import SiteLog
from .loops import replay, run_open, run_secure
from .pins import ProfileRefused, check_job_profile, job_profile_settings, pinned_profile
from .secagg_session import (
    check_federation_ca,
    check_own_certificate,
    identity_key,
    join_body,
    post_refusal,
    stored_identity,
)
from .state import ClientState, check_job_name, holding_output, make_state_dir
from .transport import ApiRejected, Transport

__all__ = ["ClientOptions", "ClientResult", "ProfileRefused", "RESTARTED_SECURE", "TableChanged",
           "check_job_profile", "job_profile_settings", "pinned_profile", "run_client"]


class TableChanged(FedForestError):
    """A site restarted on other rows than the ones it joined its job with."""


def run_client(opts: ClientOptions, log: SiteLog | None = None) -> ClientResult:
    """Run one institution's side of a job until the job ends (or this client is dropped)."""
    if opts.data is None and opts.eval_data is None:
        raise FedForestError("give the site's table (--data) or its held-out rows "
                             "(--eval-data)")
    check_job_name(opts.job)
    # a path that names no file (or one this process may not read) is a slip of this site's,
    # not a table that does not fit the job: said before anything is sent (the server would
    # be told "table")
    for option, path in (("--data", opts.data), ("--eval-data", opts.eval_data),
                         ("--schema", opts.schema)):
        if path is None:
            continue
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            raise FedForestError(f"{option} {path} {what}: nothing was sent to the server")
        try:  # a file this process may not read: the site's setup, not the table's content
            with path.open("rb"):
                pass
        except OSError as exc:
            raise FedForestError(f"{option} {path} cannot be read ({exc.strerror or exc}): "
                                 "nothing was sent to the server") from None
    # validated before anything is sent: the training table and/or the held-out rows (a
    # table that does not fit the schema: the server is told "table", nothing more)
    try:
        train = load_site_table(opts.data, opts.schema) if opts.data is not None else None
        held_out = load_site_table(opts.eval_data, opts.schema) if opts.eval_data is not None \
            else None
    except SchemaError:
        decline_alone(opts, "table", log)
        raise
    _check_outputs(opts)
    pinned = pinned_profile(opts.profile) if opts.profile is not None else None
    log = log or SiteLog()
    state = ClientState(opts.state_dir)
    with contextlib.ExitStack() as held:
        # one client per job in a state directory (clients of other jobs share it), and one
        # client per model file: checked before anything is sent, held until this one ends
        held.enter_context(state.locked(opts.job))
        if opts.model_out is not None:
            held.enter_context(holding_output(opts.model_out, opts.job))
        tr = Transport(opts.server, opts.token, opts.ca, opts.cert, opts.key,
                       retry_budget_s=opts.retry_budget_s, insecure_dev=opts.insecure_dev,
                       on_wait=log.info)
        _warn_readable_key(opts, log)
        try:
            X, y = train if train is not None else (None, None)
            return _run(opts, tr, state, X, y, log, pinned, held_out)
        except ApiRejected as exc:
            if exc.status != 401:
                raise
            raise FedForestError(
                f"{exc}: the server does not know this site's token (mistyped, or rotated or "
                "revoked by its operator, which takes effect within 30 s): ask the "
                "federation's coordinator for the site's current token and start the client "
                "again with it (--token or FEDFOREST_TOKEN); under a secure profile a site "
                "that stopped mid-job cannot rejoin that job") from None
        finally:
            tr.close()


def _warn_readable_key(opts: ClientOptions, log: SiteLog) -> None:
    """Warn when the site's TLS key (``--key``, else the key in ``--cert``) can be read by
    other users of the machine, or by its group: whoever reads it can act as this site."""
    if opts.cert is None:
        return
    option, key = ("--key", opts.key) if opts.key is not None else ("--cert", opts.cert)
    readers = readable_by(key)
    if readers is None:
        return
    who, mode = readers
    whom = "other users of this machine" if who == "others" else "its group"
    log.warn(f"{option} {key}: {whom} can read it (mode {mode:04o}), and whoever reads the key "
             f"can act as this site; make it readable by this site's user only: chmod 600 {key}")


def _import_dp_stack() -> None:
    """Import the DP machinery (diffprivlib, SciPy, scikit-learn) of a job whose profile has
    DP: it takes seconds on a loaded machine, so a site loads it once it read the job's
    profile in the offer and before it joins, not inside the first round's deadline; a job
    without DP never loads it. Its modules live as long as the process (the first import
    only: a process running several sites, or the tests, freezes its heap once)."""
    if "fedforest_secure.privacy.dp" not in sys.modules:
        with lasting_imports():
            import fedforest_secure.privacy.dp  # noqa: F401


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
        return ClientResult(status="dropped", detail=dropped_detail(job, exc.detail, tr))
    info = parse_as(JoinResponse, offered, "job offer")
    check_server_version(tr, job, info.server_version, log)
    if pinned is not None:  # before anything else leaves the site
        with declining(tr, job, "profile", log):
            check_job_profile(pinned, info.config.get("profile"))
    else:
        log.warn("no --profile pinned: this site accepts the privacy profile the server "
                 "states for the job")
        with declining(tr, job, "profile", log):  # a valid one only
            job_profile_settings(info.config.get("profile"))
    want = info.schema_sha256
    if want is not None and want != schema_sha256(opts.schema):
        decline(tr, job, "schema", log)
        raise FedForestError("the local schema file differs from the job's schema; "
                             "get the federation's schema file")
    try:
        config = JobConfig.from_json(json.dumps(info.config))
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed job configuration in the join response: {exc}") from exc
    # from here on the job's profile is read as the pin check read it: a setting the server
    # left out is PrivacyProfile's default for every reader, not a weaker one of its own
    config = dataclasses.replace(config, profile=job_profile_settings(config.profile))
    if config.profile.get("dp") is not None:
        _import_dp_stack()
    with declining(tr, job, "job_config", log):
        _check_job(config, opts, log)
    if opts.cert is not None and config.profile.get("secure_aggregation"):
        check_own_certificate(opts.cert, job)  # as every other site will check it
        if opts.ca is not None:  # the CA every identity of the job is checked against
            check_federation_ca(opts.ca, job)
    k = info.client_index
    train = (X, y) if X is not None and y is not None else None
    worker = site_worker(config, k, train, held_out, state.root, sent=info.config,
                         evaluate_again=opts.evaluate_again)
    if isinstance(worker, LedgeredEvalWorker):  # answered an evaluation on these rows before
        with declining(tr, job, "evaluated_before", log):
            worker.check()
    table = None if train is None else _table_digest(*train)
    secure = bool(config.profile.get("secure_aggregation"))
    site = info.client_name or f"client-{k}"
    try:
        _check_same_table(state, job, table, site)
    except TableChanged:
        if not secure:
            raise
        # a restarted site (this process holds its state directory) brought back with
        # another table: it could not answer the open round anyway (its round keys died with
        # the old process), so it leaves that round now rather than have the other sites wait
        # for its deadline
        told = _leave_open_round(tr, job, log)
        raise FedForestError(f"this site joined job {job} with another table (--data): a "
                             "site's rows cannot change within a job. Under a secure profile a "
                             "restarted site leaves the job's open round"
                             + (" (the server was told)" if told else "")
                             + " and the job goes on without it while enough sites remain"
                             ) from None
    try:
        joined = parse_as(JoinResponse,
                          tr.post_json(f"/v1/jobs/{job}/join",
                                       join_body(state, job, opts.cert, opts.key,
                                                 secure=secure)),
                          "join response")
    except ApiRejected as exc:
        if exc.code == "identity_mismatch":
            raise _identity_mismatch(state, job) from None
        if exc.code == "job_failed":  # before this site joined (e.g. cancelled): its reason
            return ClientResult(status="failed", detail=exc.detail)
        raise
    if (joined.config, joined.client_index, joined.schema_sha256) != (
            info.config, k, info.schema_sha256):
        raise ProtocolError("the join response differs from the job the server offered")
    if table is not None:
        write_atomic(state.root / f"table-{job}.sha256", f"{table}\n{site}\n".encode())
    if secure:
        identity = identity_key(state, job)
    log.info(f"joined job {job} as client {k} of {config.n_clients} "
             f"({worker.n_rows} rows, profile {config.profile.get('name', '?')})")
    # before this process: a restart, or an earlier job of that name
    uploaded = state.uploaded_in(job)
    # a restarted secure site that uploaded in the job answers none of its rounds again (the
    # secure loop refuses the first one it is asked about): nothing to rebuild, and the other
    # sites wait for its refusal
    if not (secure and uploaded):
        replay(tr, job, worker)
    cpu0 = time.process_time()  # start-up (imports, table, join) done: training from here
    requests0 = tr.requests
    result = ClientResult(status="running")
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total} levels"), TimeElapsedColumn(),
                        console=log.console, disable=opts.quiet or log.plain)
    with progress:
        bar = progress.add_task(f"job {job}", total=config.max_depth + 1)
        ctx = RunContext(opts, tr, state, config, job, k, info.client_name or f"client-{k}",
                         worker, result, progress, bar, log, Watch(job, log, k),
                         uploaded_before=uploaded)
        ctx.waiting()
        try:
            if secure and identity is not None:
                run_secure(ctx, identity)
            else:
                run_open(ctx)
        except ApiRejected as exc:
            if exc.code == "job_finished":
                # the job ended while this site was in a step (it failed: a round aborted):
                # said as the job's end, with its reason, not as an HTTP error
                result.status, result.detail = _job_end(tr, job, exc)
            elif exc.code == "dropped":
                # dropped while it ran (it stalled past a deadline): as for a site coming back
                result.status, result.detail = "dropped", dropped_detail(job, exc.detail, tr)
            else:
                raise
        progress.update(bar, completed=config.max_depth + 1)
    # training ends with the job: fetching and checking its model is not counted in it
    cpu_training, requests_training = time.process_time() - cpu0, tr.requests - requests0
    sent_training, received_training = tr.bytes_sent, tr.bytes_received
    if result.status == "done":
        ctx.watch.poll(tr, force=True)  # a site dropped during the last level is named too
        # as `fedforest model download` fetches it: the digest the job records, parsed
        got = fetch_result(tr, job)
        kind = "model" if config.evaluation is None else "evaluation"
        if got.kind != kind:
            other = "an evaluation result" if got.kind == "evaluation" else "a model"
            raise ProtocolError(f"the server's answer for job {job}'s {kind} is {other}; "
                                "not written")
        out = opts.model_out or (opts.state_dir / f"{job}.{kind}.json")
        write_atomic(out, got.body)
        result.model_path = out
        _model_receipt(ctx, got.body, got.headers)
        log.info(f"job {job} done: {kind} saved to {out} (sha256 {got.digest[:16]}...)")
    else:
        if result.status == "failed":
            _failed_receipt(ctx)
        log.warn(f"job {job} ended: {ended(result.status, result.detail)}")
    result.bytes_sent, result.bytes_received = tr.bytes_sent, tr.bytes_received
    stats = json.dumps({
        "job": job, "status": result.status, "rounds": result.rounds,
        "bytes_sent": result.bytes_sent, "bytes_received": result.bytes_received,
        "requests": tr.requests, "requests_training": requests_training,
        "bytes_sent_training": sent_training, "bytes_received_training": received_training,
        "cpu_s": time.process_time(), "cpu_training_s": cpu_training})
    save_stats(opts.state_dir, result, job, stats, log)
    return result


def save_stats(state_dir: Path, result: ClientResult, job: str, stats: str,
               log: SiteLog) -> None:
    """Write the job's statistics: ``stats.json`` (the last job's) and ``stats-<job>.json``
    (a site may run a training then an evaluation job). The job ended all the same when they
    cannot be written (a full disk): a warning says so and names the file."""
    try:
        write_atomic(state_dir / "stats.json", stats)
        write_atomic(state_dir / f"stats-{job}.json", stats)
    except OSError as exc:
        log.warn(f"job {job} ended ({ended(result.status, result.detail)}); its statistics "
                 f"were not saved: {os_error_text(exc)}")


def _job_end(tr: Transport, job: str, exc: ApiRejected) -> tuple[str, str]:
    """``(status, detail)`` of a job that ended while this site was in a step: its status and
    reason as the server states them (asked briefly), else what the refusal said."""
    st = job_status_briefly(tr, job)
    if st is None:
        return "failed", exc.detail
    if st.status == "done":  # the model is there: fetched as at the end of any job
        return "done", ""
    return st.status, st.reason or exc.detail


def _identity_mismatch(state: ClientState, job: str) -> FedForestError:
    """The join's 409 ``identity_mismatch`` in words. Nothing is refused: the site's client
    that holds the key it joined with may be running (from another directory)."""
    return FedForestError(
        f"this site joined job {job} with another identity key than the one in --state-dir "
        f"{state.root} (identity-{job}.ed25519): is its client running from another "
        "directory (a relative --state-dir), or was that file lost? A site keeps its key for "
        "a whole job: run the client with the state directory it joined with")


def _leave_open_round(tr: Transport, job: str, log: SiteLog) -> bool:
    """Refuse the job's open secure round (code ``restarted``) if this site takes part in
    it, whether it is asked for something now or waits for the others; whether the server
    was told."""
    try:
        with tr.brief():
            step = parse_as(SecAggStep, tr.get_json(f"/v1/jobs/{job}/secagg"),
                            "secure-aggregation step")
            if step.status not in ("task", "wait") or step.round_id is None:
                return False
            post_refusal(tr, job, step.round_id, "restarted")
        return True
    except (FedForestError, OSError, ValueError) as exc:
        log.info(f"job {job}: the server was not told this site left the open round: {exc}")
        return False


def _table_digest(X: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of the training rows as the worker reads them."""
    h = hashlib.sha256()
    for arr in (X, y):
        a = np.ascontiguousarray(arr)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.data.cast("B"))
    return h.hexdigest()


def _check_same_table(state: ClientState, job: str, table: str | None, site: str) -> None:
    """A site's rows cannot change within a job: a restarted client rebuilds its part of the
    job's earlier rounds from its table, so it must be the table it joined with. The file
    names the site that wrote it: another site's (a state directory copied from it) is
    refused with what to do, not taken for this site's table."""
    path = state.root / f"table-{job}.sha256"
    if table is None or not path.exists():
        return
    lines = path.read_text().split("\n")
    owner = lines[1].strip() if len(lines) > 1 else ""
    if owner and owner != site:
        raise FedForestError(
            f"the state directory {state.root} holds the files of site {owner!r} for job "
            f"{job}, not of this site ({site!r}): it was copied from that site's. Give each "
            f"site a state directory of its own (--state-dir), or delete table-{job}.sha256 "
            f"and identity-{job}.ed25519 from this one and start the client again")
    if lines[0].strip() != table:
        raise TableChanged(f"this site joined job {job} with another table (--data): a "
                             "site's rows cannot change within a job. Restart the client with "
                             "the table it joined with; a changed table takes part in a new "
                             "job")


def _check_outputs(opts: ClientOptions) -> None:
    """The model file and the state directory can be written: checked before joining, not
    when a job of hours ends; and the site's identity key for the job, if it has one, is
    its own (checked before anything is sent)."""
    try:
        make_state_dir(opts.state_dir)
        with tempfile.NamedTemporaryFile(dir=opts.state_dir, prefix=".fedforest-check-"):
            pass
        stored_identity(ClientState(opts.state_dir), opts.job)
    except OSError as exc:
        raise FedForestError(f"--state-dir {opts.state_dir}: {exc.strerror or exc}") from None
    out = opts.model_out
    if out is not None:
        if out.is_dir():
            raise FedForestError(f"--out {out} is a directory; name the model file")
        for option, path in (("--data", opts.data), ("--eval-data", opts.eval_data),
                             ("--schema", opts.schema)):
            if path is not None and path.exists() and out.exists() and out.samefile(path):
                raise FedForestError(f"--out {out} is the {option} file: the model would "
                                     "replace it; name another file")
        if not out.parent.is_dir():
            raise FedForestError(f"--out {out}: the directory {out.parent} does not exist")
        try:  # a read-only or foreign directory: found now, not after the training
            with tempfile.NamedTemporaryFile(dir=out.parent, prefix=".fedforest-check-"):
                pass
        except OSError as exc:
            raise FedForestError(f"--out {out}: cannot write in {out.parent}: "
                                 f"{exc.strerror or exc}") from None


def _check_job(config: JobConfig, opts: ClientOptions, log: SiteLog) -> None:
    """Refuse a job whose configuration disagrees with this site's own schema file (bounds
    included: they calibrate the DP noise; an evaluation's models trained on a schema that
    encodes rows otherwise) or with its pinned number of clients, or has more trees or sketch
    bins than a job may have."""
    from fedforest_secure.evaluation import EvalSpec
    from fedforest_secure.evaluation.trained_schema import check_model_schemas
    from fedforest_secure.privacy.pinning import check_job_config
    from fedforest_secure.schema import Schema

    # what no job the server creates exceeds (its job files' limits): a site sizes its
    # bootstrap (a pair per tree and row) and its sketches by them
    for name, most in (("n_estimators", MAX_ESTIMATORS), ("n_bins", MAX_BINS)):
        if getattr(config, name) > most:
            raise RefusedRequest(f"the job's {name} is {getattr(config, name)}, more than a job "
                                 f"may have ({most}): refusing to take part", code="job_config")
    schema = Schema.load(opts.schema)
    check_job_config(config, schema=schema, n_clients=opts.n_clients)
    if config.evaluation is not None:
        check_model_schemas(EvalSpec.of(config), schema, site=True)
    if opts.n_clients is None and config.profile.get("secure_aggregation"):
        log.warn(f"no --clients pinned: this site takes the server's word that the job has "
                 f"{config.n_clients} clients")


def _model_receipt(ctx: RunContext, model: bytes, headers: Any) -> None:
    """Keep a receipt of the model and of the audit-chain head the server announced with it:
    it covers the job's last round and its model entry (``fedforest audit verify --receipts``).
    A server that keeps no audit log announces no entry (sequence 0): there is nothing for a
    receipt to cover, and the site is told so."""
    from fedforest_secure.audit import ModelReceipt

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


def _failed_receipt(ctx: RunContext) -> None:
    """Keep a receipt of the job's failure and of the audit-chain head the server announces
    with it: it covers the entry of the failure (``fedforest audit verify --receipts``), so a
    log cut before it does not pass for a job still running."""
    from fedforest_secure.audit import FailedReceipt

    st = job_status_briefly(ctx.tr, ctx.job)
    if st is None or st.status != "failed":
        ctx.log.warn(f"job {ctx.job}: the server did not confirm the job's failure: this site "
                     "keeps no receipt of it")
        return
    if st.audit_seq == 0:
        why = ("the server keeps no audit log" if st.audit_head in ("", GENESIS) else
               "the server does not announce its audit chain's tip with the job's status (a "
               "server older than this client)")
        ctx.log.warn(f"job {ctx.job}: {why}: this site keeps no receipt of the job's failure")
        return
    try:
        rec = FailedReceipt(job_id=ctx.job, client=ctx.name, chain_head_seen=st.audit_head,
                            seq_seen=st.audit_seq)
    except (TypeError, ValueError) as exc:  # the job's failure is still what the site says
        ctx.log.warn(f"job {ctx.job}: the server announced a malformed audit tip with the "
                     f"job's failure ({exc}): this site keeps no receipt of it")
        return
    write_receipt(ctx.state.root / "receipts", rec)
