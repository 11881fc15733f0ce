"""The client loop: join, replay after a restart, answer tasks, upload, download the model.

Only two kinds of things leave the site: the summable vector of each round (fixed-point encoded,
and masked under secure aggregation, so the server can only learn the sum over clients) and the
per-client items the job's privacy profile discloses.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError, ProtocolError
from fedforest_secure.protocol import Task, TaskKind
from server_app.uploads import make_upload

from .data import load_site_table, schema_sha256
from .state import ClientState
from .transport import ApiRejected, Transport

__all__ = ["ClientOptions", "ClientResult", "run_client"]


@dataclass
class ClientOptions:
    server: str
    token: str
    job: str
    data: Path
    schema: Path
    ca: Path | None
    cert: Path | None = None
    key: Path | None = None
    state_dir: Path = Path(".fedforest-client")
    model_out: Path | None = None
    poll_s: float = 0.2
    retry_budget_s: float = 300.0
    quiet: bool = False


@dataclass
class ClientResult:
    status: str  # "done" | "failed" | "dropped"
    detail: str = ""
    model_path: Path | None = None
    rounds: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    receipts: list[dict[str, Any]] = field(default_factory=list)


def _engine() -> tuple[Any, Any, Any]:
    from fedforest_secure.federation import client_seed
    from fedforest_secure.worker import Worker
    from server_app.engine import make_codec

    return Worker, client_seed, make_codec


def run_client(opts: ClientOptions) -> ClientResult:
    """Run one institution's side of a job until the job ends (or this client is dropped)."""
    X, y = load_site_table(opts.data, opts.schema)  # validated before anything is sent
    console = Console(stderr=True, quiet=opts.quiet)
    tr = Transport(opts.server, opts.token, opts.ca, opts.cert, opts.key,
                   retry_budget_s=opts.retry_budget_s)
    state = ClientState(opts.state_dir)
    try:
        return _run(opts, tr, state, X, y, console)
    finally:
        tr.close()


def _run(opts: ClientOptions, tr: Transport, state: ClientState, X: np.ndarray, y: np.ndarray,
         console: Console) -> ClientResult:
    job = opts.job
    info = tr.post_json(f"/v1/jobs/{job}/join")
    want = info.get("schema_sha256")
    if want is not None and want != schema_sha256(opts.schema):
        raise FedForestError("the local schema file differs from the job's schema; "
                             "get the federation's schema file")
    config = JobConfig.from_json(json.dumps(info["config"]))
    k = int(info["client_index"])
    Worker, client_seed, make_codec = _engine()
    worker = Worker(config, X, y, client_index=k, seed=client_seed(config, k))
    ring = bool(config.profile.get("fixed_point", config.profile.get("secure_aggregation")))
    secagg = _secagg_session(config, tr, state, job, k)
    console.log(f"joined job {job} as client {k} of {config.n_clients} "
                f"({len(y)} rows, profile {config.profile.get('name', '?')})")
    _replay(tr, job, worker)
    result = ClientResult(status="running")
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total} levels"), TimeElapsedColumn(),
                        console=console, disable=opts.quiet)
    with progress:
        bar = progress.add_task(f"job {job}", total=config.max_depth + 1)
        while True:
            resp = tr.request("GET", f"/v1/jobs/{job}/task")
            status = resp.headers.get("X-FedForest-Status", "")
            if resp.status_code == 204:
                if status in ("done", "failed", "dropped"):
                    result.status, result.detail = status, resp.headers.get(
                        "X-FedForest-Detail", "")
                    break
                time.sleep(opts.poll_s)
                continue
            task = _check_task(resp.content, resp.headers, job)
            progress.update(bar, completed=task.level,
                            description=f"job {job} · level {task.level} · round {task.round_id}"
                                        f" ({task.kind.value})")
            reply = worker.handle(task)
            vector = make_codec(config, task).encode(reply.summable) if ring else reply.summable
            if secagg is not None:
                vector = secagg.mask(task, vector)
            receipt = _upload(tr, job, task, vector, reply.disclosed)
            if receipt is not None:
                receipt["audit_head_at_task"] = resp.headers.get("X-FedForest-Audit-Head")
                state.add_receipt(receipt)
                result.receipts.append(receipt)
            result.rounds += 1
        progress.update(bar, completed=config.max_depth + 1)
    if result.status == "done":
        model = tr.request("GET", f"/v1/jobs/{job}/model").content
        out = opts.model_out or (opts.state_dir / f"{job}.model.json")
        out.write_bytes(model)
        result.model_path = out
        console.log(f"job {job} done: model saved to {out} "
                    f"(sha256 {hashlib.sha256(model).hexdigest()[:16]}…)")
    else:
        console.log(f"job {job} ended: {result.status} {result.detail}")
    result.bytes_sent, result.bytes_received = tr.bytes_sent, tr.bytes_received
    return result


def _check_task(body: bytes, headers: Any, job: str) -> Task:
    digest = hashlib.sha256(body).hexdigest()
    if headers.get("X-FedForest-Task-Digest") not in (None, digest):
        raise ProtocolError("task digest header does not match the task body")
    task = Task.from_bytes(body)
    if task.job_id != job:
        raise ProtocolError("the server sent a task of another job")
    return task


def _replay(tr: Transport, job: str, worker: Any) -> None:
    """After a restart, rebuild the worker by answering the job's earlier SKETCH tasks again."""
    rounds = tr.get_json(f"/v1/jobs/{job}/rounds")
    for r in rounds:
        if r["status"] != "closed" or r["kind"] != TaskKind.SKETCH.value:
            continue
        body = tr.request("GET", f"/v1/jobs/{job}/rounds/{r['round_id']}/task").content
        if hashlib.sha256(body).hexdigest() != r["task_digest"]:
            raise ProtocolError(f"round {r['round_id']}: task does not match its digest")
        worker.handle(Task.from_bytes(body))


def _upload(tr: Transport, job: str, task: Task, vector: np.ndarray,
            disclosed: dict[str, np.ndarray]) -> dict[str, Any] | None:
    body = make_upload(task, vector, disclosed)
    try:
        return dict(tr.request("POST", f"/v1/jobs/{job}/rounds/{task.round_id}/upload",
                               content=body).json())
    except ApiRejected as exc:
        if exc.code == "round_closed" and exc.body.get("counted"):
            return None  # a retry of an upload the server already counted
        raise


def _secagg_session(config: JobConfig, tr: Transport, state: ClientState, job: str,
                    k: int) -> Any:
    if not config.profile.get("secure_aggregation"):
        return None
    try:
        from .secagg_session import SecAggSession
    except ImportError:
        # Never fall back to unmasked uploads for a profile that promises masking.
        raise FedForestError("this build cannot yet run secure aggregation over HTTPS; "
                             "use a profile with secure_aggregation = false") from None
    return SecAggSession(config, tr, state, job, k)
