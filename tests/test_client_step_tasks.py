"""A step that brings its round's task after its JSON (``?with_task=true``): the client answers
from those bytes without asking for the task, after the same checks as a fetched task's (its
digest against the step's); bytes that do not match, or a body the header does not split, are
refused; a step that brings no task has its task fetched."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from rich.progress import Progress
from test_client_loops import _context, _mocked, _Session

from client_app import loops, transport
from client_app.answers import JSON_MAX, AnswerTooLarge
from client_app.context import ClientResult
from client_app.secagg_session import SecAggSession
from client_app.state import ClientState
from client_app.transport import Transport
from fedforest_secure.errors import ProtocolError
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind
from fedforest_secure.protocol.steps import STEP_JSON_BYTES, join_step

JOB = "job-r"
HEAD = "ab" * 32


def _task(r: int, job: str = JOB) -> bytes:
    layout = (Block("totals", (2, 3), (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)),)
    return Task(job_id=job, round_id=r, kind=TaskKind.HISTOGRAM, level=r,
                params={"nodes": [0, 1]}, layout=layout).to_bytes()


def _step(r: int, digest: str) -> dict[str, Any]:
    return {"status": "task", "action": "upload", "round_id": r, "message": "{}",
            "task_digest": digest, "audit_seq": 3, "audit_head": HEAD}


def _run(tmp_path: Path, attach: str) -> tuple[ClientResult, list[str], list[str]]:
    """Round 0 from ``GET /secagg``; its upload's answer brings round 1's step with, by
    ``attach``: its task (``"task"``), other bytes (``"altered"``), a header that does not
    split the body (``"bad_header"``), nothing (``"none"``), or, with their own digest in
    the step, round 0's task (``"other_round"``) or another job's round 1 task
    (``"other_job"``). Returns the result, the paths asked and the query of the upload
    POSTs; a second upload of a round is refused (409), so a client that answers a task of
    another round again ends at once."""
    tasks = {r: _task(r) for r in (0, 1)}
    digests = {r: hashlib.sha256(b).hexdigest() for r, b in tasks.items()}
    if attach == "other_round":
        tasks[1], digests[1] = tasks[0], digests[0]
    elif attach == "other_job":
        tasks[1] = _task(1, "job-other")
        digests[1] = hashlib.sha256(tasks[1]).hexdigest()
    asked: list[str] = []
    queries: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        asked.append(path)
        if path == f"/v1/jobs/{JOB}/secagg":
            return httpx.Response(200, json=_step(0, digests[0]))
        for r in (0, 1):
            if path == f"/v1/jobs/{JOB}/rounds/{r}/task":
                return httpx.Response(200, content=tasks[r])
        if path.endswith("/upload"):
            if path in asked[:-1]:
                return httpx.Response(409, json={"error": "conflict", "detail": "uploaded"})
            queries.append(request.url.query.decode())
            r = int(path.split("/")[-2])
            if r == 1:
                return httpx.Response(200, json={"accepted": True, "round_id": 1,
                                                 "next": {"status": "done", "detail": "ok"}})
            text = json.dumps({"accepted": True, "round_id": 0,
                               "next": _step(1, digests[1])}).encode()
            if attach == "none":
                return httpx.Response(200, content=text)
            sent = tasks[1] if attach != "altered" else tasks[1][:-1] + b"\x01"
            body, headers = join_step(text, sent)
            if attach == "bad_header":
                headers = {STEP_JSON_BYTES: str(len(body))}
            return httpx.Response(200, content=body, headers=headers)
        return httpx.Response(404, json={"error": "not_found", "detail": path})

    tr, log, opts = _mocked(answer, tmp_path)
    tr.step_wait = 10.0
    result = ClientResult(status="running")
    with Progress(disable=True) as progress:
        ctx = _context(tr, log, opts, ClientState(tmp_path / "state"), result, progress)
        with ThreadPoolExecutor(max_workers=1) as sender:
            loops.secure_steps(ctx, cast(SecAggSession, _Session()), sender)
    return result, asked, queries


def test_the_task_that_came_with_the_step_is_answered_without_fetching_it(
        tmp_path: Path) -> None:
    result, asked, queries = _run(tmp_path, "task")
    assert result.status == "done" and result.rounds == 2
    assert f"/v1/jobs/{JOB}/rounds/1/task" not in asked
    assert f"/v1/jobs/{JOB}/rounds/0/task" in asked  # the first step came by GET, alone
    assert all("with_task=true" in q for q in queries)


def test_a_step_without_its_task_has_it_fetched(tmp_path: Path) -> None:
    result, asked, _ = _run(tmp_path, "none")
    assert result.status == "done" and result.rounds == 2
    assert f"/v1/jobs/{JOB}/rounds/1/task" in asked


def test_task_bytes_that_do_not_match_the_steps_digest_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ProtocolError, match="does not match its announced digest"):
        _run(tmp_path, "altered")


@pytest.mark.parametrize("attach", ["other_round", "other_job"])
def test_a_task_of_another_round_or_job_that_came_with_a_step_is_refused(
        tmp_path: Path, attach: str) -> None:
    with pytest.raises(ProtocolError, match="a task of another job or round"):
        _run(tmp_path, attach)


def test_a_step_answer_whose_header_does_not_split_it_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProtocolError, match="does not leave a task"):
        _run(tmp_path, "bad_header")


def _step_answer(body: bytes, headers: dict[str, str]) -> Transport:
    """A site's transport (``step_wait`` on) whose step POSTs are answered ``body``."""
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers=headers)
    tr = _mocked(answer, Path("."))[0]
    tr.step_wait = 10.0
    return tr


def _post_step(tr: Transport) -> httpx.Response:
    return tr.request("POST", f"/v1/jobs/{JOB}/rounds/0/secagg/signature", content=b"{}",
                      content_type="application/json")


def _padded(n: int) -> bytes:
    """A step answer's JSON of ``n`` bytes."""
    head = b'{"accepted":"signature","pad":"'
    return head + b"x" * (n - len(head) - 2) + b'"}'


def test_a_step_answer_without_the_header_is_json_of_at_most_the_json_limit() -> None:
    text = _padded(JSON_MAX + 1)
    with pytest.raises(AnswerTooLarge, match="announces"):  # refused unread
        _post_step(_step_answer(text, {}))


def test_the_json_of_a_split_step_answer_is_at_most_the_json_limit() -> None:
    body, headers = join_step(_padded(JSON_MAX + 1), b"t")
    with pytest.raises(AnswerTooLarge, match="the JSON of the server's step answer"):
        _post_step(_step_answer(body, headers))


def test_the_task_of_a_split_step_answer_is_at_most_a_tasks_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "TASK_MAX", 1000)
    text = json.dumps({"accepted": "unmask", "next": _step(1, "00" * 32)}).encode()
    body, headers = join_step(text, b"t" * 1001)
    with pytest.raises(AnswerTooLarge, match="the task of the server's step answer"):
        _post_step(_step_answer(body, headers))
    body, headers = join_step(text, b"t" * 1000)  # at the limit: taken
    tr = _step_answer(body, headers)
    _post_step(tr)
    assert tr.take_next_step() is not None and tr.take_step_task() == b"t" * 1000


def test_a_split_step_answer_is_handed_on_as_its_json_alone() -> None:
    text = json.dumps({"accepted": "unmask", "next": _step(1, "00" * 32)}).encode()
    resp = _post_step(_step_answer(*join_step(text, b"task bytes")))
    assert resp.content == text
    assert resp.headers["content-length"] == str(len(text))
    assert resp.headers["content-type"] == "application/json"
    assert STEP_JSON_BYTES not in resp.headers
