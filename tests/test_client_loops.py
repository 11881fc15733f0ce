"""A site records each upload in its receipts before it sends it: a site stopped while the
upload's request waits for its answer (a secure upload's POST waits until every site has
uploaded) still holds a record of what it sent, which ``audit verify`` checks against the log.
An upload refused because the server counted another one of the site says what to check."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import numpy as np
import pytest
from rich.progress import Progress

from client_app import loops
from client_app.context import ClientOptions, ClientResult, RunContext, Watch
from client_app.log import SiteLog
from client_app.secagg_session import SecAggSession
from client_app.state import ClientState
from client_app.transport import Transport
from fedforest_secure.audit import Receipt, SentReceipt, read_receipts
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError, ProtocolError
from fedforest_secure.protocol import Block, Reply, StatKind, Task, TaskKind

JOB = "job-r"
HEAD = "ab" * 32


def _task_bytes() -> bytes:
    layout = (Block("totals", (2, 3), (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)),)
    return Task(job_id=JOB, round_id=0, kind=TaskKind.HISTOGRAM, level=0,
                params={"nodes": [0, 1]}, arrays={"thresholds": np.linspace(0, 1, 4)},
                layout=layout).to_bytes()


class _Ctx(RunContext):
    """A run context whose answer is a fixed vector (no table, no privacy profile to encode
    it with); the receipts are written by :class:`RunContext` itself."""

    def contribution(self, task: Task, reply: Reply) -> np.ndarray:
        return np.zeros(6, dtype=np.uint64)

    def show(self, task: Task, what: str = "") -> None:
        pass


class _Worker:
    def handle(self, task: Task) -> Reply:
        return Reply(round_id=task.round_id, summable=np.zeros(6))


class _Session:
    """A secure session whose round keys exist already (the advert went out)."""

    open_round: int | None = None
    client = object()

    def advertised(self, r: int) -> bool:
        return True

    def refused(self, r: int) -> bool:
        return False

    def mask(self, task: Task, message: str, vector: np.ndarray) -> tuple[str, np.ndarray]:
        return "{}", vector


def _context(tr: Transport, log: SiteLog, opts: ClientOptions, state: ClientState,
             result: ClientResult, progress: Progress) -> _Ctx:
    """Site ``alice``'s (index 0) run context of job ``JOB``, answering with :class:`_Worker`."""
    return _Ctx(opts=opts, tr=tr, state=state,
                config=cast(JobConfig, SimpleNamespace(profile={})), job=JOB, index=0,
                name="alice", worker=cast(Any, _Worker()), result=result, progress=progress,
                bar=progress.add_task("job"), log=log, watch=Watch(JOB, log, 0),
                uploaded_before=False)


def _records(receipts: Path) -> list[Any]:
    return [r for _, r in read_receipts(receipts)] if receipts.is_dir() else []


@pytest.mark.parametrize("profile", ["secure", "open"])
def test_the_upload_is_recorded_in_the_receipts_before_its_request_is_sent(
        tmp_path: Path, profile: str) -> None:
    """When the upload's POST reaches the server, the site's receipts file already holds a
    sent record of it (the task's and the body's digests, the chain head given with the
    step); the server's answer adds the upload's receipt after it."""
    task = _task_bytes()
    task_digest = hashlib.sha256(task).hexdigest()
    receipts = tmp_path / "state" / "receipts"
    at_upload: list[Any] = []
    sent_body: list[bytes] = []
    asked_task = 0

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal asked_task
        path = request.url.path
        if path == f"/v1/jobs/{JOB}/secagg":
            return httpx.Response(200, json={
                "status": "task", "action": "upload", "round_id": 0, "message": "{}",
                "task_digest": task_digest, "audit_seq": 3, "audit_head": HEAD})
        if path == f"/v1/jobs/{JOB}/rounds/0/task":
            return httpx.Response(200, content=task)
        if path == f"/v1/jobs/{JOB}/task":  # the open profile's long poll
            asked_task += 1
            if asked_task > 1:
                return httpx.Response(204, headers={"X-FedForest-Status": "done"})
            return httpx.Response(200, content=task, headers={
                "X-FedForest-Task-Digest": task_digest, "X-FedForest-Audit-Seq": "3",
                "X-FedForest-Audit-Head": HEAD})
        if path == f"/v1/jobs/{JOB}/rounds/0/upload":
            at_upload.extend(_records(receipts))
            sent_body.append(request.content)
            return httpx.Response(200, json={"accepted": True, "round_id": 0,
                                             "next": {"status": "done", "detail": "ok"}})
        return httpx.Response(404, json={"error": "not_found", "detail": path})

    tr, log, opts = _mocked(answer, tmp_path)
    result = ClientResult(status="running")
    with Progress(disable=True) as progress:
        ctx = _context(tr, log, opts, ClientState(tmp_path / "state"), result, progress)
        if profile == "secure":
            tr.step_wait = 10.0  # the upload's answer brings the next step, as in run_secure
            with ThreadPoolExecutor(max_workers=1) as sender:
                loops.secure_steps(ctx, cast(SecAggSession, _Session()), sender)
        else:
            loops.run_open(ctx)
    assert result.status == "done" and result.rounds == 1
    digest = hashlib.sha256(sent_body[0]).hexdigest()
    sent = SentReceipt(JOB, 0, "alice", task_digest, digest, HEAD, 3)
    assert at_upload == [sent]
    assert _records(receipts) == [sent, Receipt(JOB, 0, "alice", digest, HEAD, 3)]
    assert json.loads((receipts / "alice.jsonl").read_text().splitlines()[0])["kind"] == "sent"


def test_an_upload_the_server_counted_another_of_says_another_client_of_the_site_may_have(
        tmp_path: Path) -> None:
    """A ``409 conflicting_upload``: the server counted another upload of this site for the
    round, which this client's retries and restarts never send (the same rows and state
    directory give the same bytes). The client stops saying what to check."""
    task = _task_bytes()

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == f"/v1/jobs/{JOB}/task":
            return httpx.Response(200, content=task, headers={
                "X-FedForest-Task-Digest": hashlib.sha256(task).hexdigest(),
                "X-FedForest-Audit-Seq": "3", "X-FedForest-Audit-Head": HEAD})
        assert request.url.path == f"/v1/jobs/{JOB}/rounds/0/upload"
        return httpx.Response(409, json={"error": "conflicting_upload", "detail": "a different "
                                         "upload for round 0 was already counted"})

    tr, log, opts = _mocked(answer, tmp_path)
    with Progress(disable=True) as progress:
        ctx = _Ctx(opts=opts, tr=tr, state=ClientState(tmp_path / "state"),
                   config=cast(JobConfig, SimpleNamespace(profile={})), job=JOB, index=0,
                   name="alice", worker=cast(Any, _Worker()),
                   result=ClientResult(status="running"), progress=progress,
                   bar=progress.add_task("job"), log=log, watch=Watch(JOB, log, 0),
                   uploaded_before=False)
        with pytest.raises(FedForestError) as err:
            loops.run_open(ctx)
    assert str(err.value) == (
        f"job {JOB}: the server has counted another upload of this site for round 0 (409 "
        "conflicting_upload): another client of this site may have uploaded for this round. "
        "Check that one client only runs for this site (on this machine and others), with the "
        "--state-dir and --data it joined with")


def _mocked(answer: Any, tmp_path: Path) -> tuple[Transport, SiteLog, ClientOptions]:
    """A site's transport whose requests ``answer`` handles, its log and its options."""
    tr = Transport("http://127.0.0.1:9", "token", None, insecure_dev=True)
    tr.close()
    tr._http = httpx.Client(base_url=tr.base_url, transport=httpx.MockTransport(answer))
    opts = ClientOptions(server="http://127.0.0.1:9", token="token", job=JOB, data=None,
                         schema=tmp_path / "schema.json", ca=None, state_dir=tmp_path / "state")
    return tr, SiteLog(plain=True), opts


def _open_round(tmp_path: Path, upload_answer: Any) -> tuple[ClientState, ClientResult, bytes]:
    """An open round whose upload the server answers with the JSON ``upload_answer(body)``;
    the site's state, its result and the upload's body."""
    task = _task_bytes()
    asked = 0
    sent: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal asked
        if request.url.path == f"/v1/jobs/{JOB}/task":
            asked += 1
            if asked > 1:
                return httpx.Response(204, headers={"X-FedForest-Status": "done"})
            return httpx.Response(200, content=task, headers={
                "X-FedForest-Task-Digest": hashlib.sha256(task).hexdigest(),
                "X-FedForest-Audit-Seq": "3", "X-FedForest-Audit-Head": HEAD})
        assert request.url.path == f"/v1/jobs/{JOB}/rounds/0/upload"
        sent.append(request.content)
        return httpx.Response(200, json=upload_answer(request.content))

    tr, log, opts = _mocked(answer, tmp_path)
    state = ClientState(tmp_path / "state")
    result = ClientResult(status="running")
    with Progress(disable=True) as progress:
        ctx = _context(tr, log, opts, state, result, progress)
        try:
            loops.run_open(ctx)
        finally:
            tr.close()
    return state, result, sent[0] if sent else b""


def test_of_the_servers_answer_to_an_upload_the_site_keeps_what_it_knows_and_checks(
        tmp_path: Path) -> None:
    """The server's answer adds a field of a MiB (and a malformed chain head): the site's
    ``receipts.jsonl`` keeps the job, round, index and upload digest it knows, and the task
    digest and duplicate flag the server states, a few hundred bytes."""
    task_digest = hashlib.sha256(_task_bytes()).hexdigest()

    def upload_answer(body: bytes) -> dict[str, Any]:
        return {"job_id": JOB, "round_id": 0, "client_index": 0,
                "upload_sha256": hashlib.sha256(body).hexdigest(), "task_sha256": task_digest,
                "duplicate": False, "audit_head": "<" * 64, "pad": "n" * (1 << 20)}

    state, result, body = _open_round(tmp_path, upload_answer)
    kept = {"job_id": JOB, "round_id": 0, "client_index": 0,
            "upload_sha256": hashlib.sha256(body).hexdigest(), "task_sha256": task_digest,
            "duplicate": False}
    assert result.status == "done"
    assert state.receipts() == [kept] and result.receipts == [kept]
    assert (state.root / "receipts.jsonl").stat().st_size < 400


def test_a_receipt_of_the_server_naming_another_upload_is_refused_after_the_sites_own(
        tmp_path: Path) -> None:
    """The site's own receipt of the upload (the digest it sent, the chain tip it was told)
    is on disk before the server's answer is refused: the evidence against that server."""
    with pytest.raises(ProtocolError) as err:
        _open_round(tmp_path, lambda body: {"upload_sha256": "0" * 64})
    sent = str(err.value).rsplit("SHA-256 ", 1)[1][:64]
    assert str(err.value).startswith(
        "round 0: the server's receipt of this site's upload names another upload ("
        f"{'0' * 64}); the upload this site sent has SHA-256 {sent}")
    assert not (tmp_path / "state" / "receipts.jsonl").exists()
    recs = [r for _, r in read_receipts(tmp_path / "state" / "receipts")]
    assert [type(r).__name__ for r in recs] == ["SentReceipt", "Receipt"]
    assert isinstance(recs[1], Receipt)
    assert (recs[1].round_id, recs[1].upload_digest, recs[1].chain_head_seen,
            recs[1].seq_seen) == (0, sent, HEAD, 3)
