"""A secure site that cannot authenticate a peer's message relayed by the server (a share
ciphertext sent for another round, a forged signature) refuses the round at once, saying why
(code `invalid_message`), so the job stops for the reason it stops, not at the deadline with
the honest sites recorded as having missed it."""

from __future__ import annotations

import hashlib
import io
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from client_app import loops
from client_app.log import SiteLog
from client_app.runner import ClientResult
from client_app.transport import ApiRejected
from fedforest_secure.errors import InvalidMessage
from fedforest_secure.protocol import Task, TaskKind


def _run_upload_step(error: Exception) -> tuple[list[tuple[int, str, int | None]],
                                                 ClientResult, str]:
    """One upload step whose masking raises ``error``: what the session told the server
    (round, code, accused peer), the result, and the site's log."""
    task = Task(job_id="j", round_id=2, kind=TaskKind.SKETCH, level=0)
    body = task.to_bytes()
    step = {"status": "task", "action": "upload", "round_id": 2, "message": "{}",
            "task_digest": hashlib.sha256(body).hexdigest()}
    refused: list[tuple[int, str, int | None]] = []

    class Session:
        client = object()
        open_round: int | None = None

        def advertised(self, r: int) -> bool:
            return True

        def mask(self, *args: Any) -> Any:
            raise error

        def refused(self, r: int) -> bool:
            return False

        def refuse_round(self, r: int, code: str, accused: int | None = None) -> None:
            refused.append((r, code, accused))

    tr = SimpleNamespace(take_next_step=lambda: step, take_step_task=lambda: None,
                         get_json=None, request=lambda *a, **k: SimpleNamespace(content=body))
    result = ClientResult(status="running")
    stream = io.StringIO()
    ctx = SimpleNamespace(tr=tr, job="j", result=result, log=SiteLog(stream=stream),
                          worker=SimpleNamespace(handle=lambda t: SimpleNamespace(disclosed={})),
                          contribution=lambda t, r: [0.0], show=lambda *a: None,
                          waiting=lambda: None)
    with ThreadPoolExecutor(max_workers=1) as sender:
        loops.secure_steps(ctx, Session(), sender)  # type: ignore[arg-type]
    return refused, result, stream.getvalue()


def test_a_share_that_does_not_authenticate_is_refused_at_once_with_its_code() -> None:
    refused, result, _ = _run_upload_step(
        InvalidMessage("share delivery addressed to another client"))
    assert refused == [(2, "invalid_message", None)]  # the server's message: no peer accused
    assert result.status == "refused" and "addressed to another client" in result.detail


def test_a_peers_share_that_does_not_authenticate_is_refused_naming_that_peer() -> None:
    """A malicious site's garbage share ciphertext: the refusal accuses it (its index, checked
    by the server against the round's participants), and the site's log line names it."""
    refused, result, log = _run_upload_step(InvalidMessage(
        "the share ciphertext of client 3 does not authenticate; client 3 is site-d", peer=3))
    assert refused == [(2, "invalid_message", 3)]
    assert result.status == "refused" and "client 3 is site-d" in result.detail
    assert "refused the server's request in round 2: the share ciphertext of client 3 does " \
        "not authenticate; client 3 is site-d" in log


@pytest.mark.parametrize("in_round", [True, False])
def test_a_peer_whose_certified_identity_does_not_check_is_refused_naming_that_peer(
        in_round: bool) -> None:
    """The identity directory, checked when the site's first round comes: a peer's
    certificate that is no longer valid (it expired after that site joined) is that peer's to
    answer for. The refusal accuses it, so the job's reason names it, not every honest site as
    having failed. A peer that is not in the round (dropped before it) cannot be accused
    there (400 invalid_accusation): the refusal still goes in, accusing nobody."""
    task = Task(job_id="j", round_id=1, kind=TaskKind.SKETCH, level=0)
    step = {"status": "task", "action": "advert", "round_id": 1, "message": "{}",
            "task_digest": hashlib.sha256(task.to_bytes()).hexdigest()}
    refused: list[tuple[int, str, int | None]] = []

    class Session:
        client = None
        open_round: int | None = None

        def connect(self, **_: Any) -> None:
            raise InvalidMessage("directory entry 2 ('client-2'): the certificate is not valid "
                                 "now", peer=2)

        def refused(self, r: int) -> bool:
            return False

        def refuse_round(self, r: int, code: str, accused: int | None = None) -> None:
            if accused is not None and not in_round:
                raise ApiRejected(400, "invalid_accusation", "client 2 is not another "
                                  "participant of round 1", {})
            refused.append((r, code, accused))

    result = ClientResult(status="running")
    stream = io.StringIO()
    tr = SimpleNamespace(take_next_step=lambda: step, take_step_task=lambda: None)
    ctx = SimpleNamespace(tr=tr, job="j", result=result, log=SiteLog(stream=stream),
                          show=lambda *a: None, waiting=lambda: None)
    with ThreadPoolExecutor(max_workers=1) as sender:
        loops.secure_steps(ctx, Session(), sender)  # type: ignore[arg-type]
    assert refused == [(1, "invalid_message", 2 if in_round else None)]
    assert result.status == "refused" and "'client-2'" in result.detail
