"""A secure site stopped with Ctrl-C tells the server at once, even when the round it was in
closed just before: it refuses the round open now, which already counts it in. One that stops
on an error refuses too, unless the server knows already; either gives up within seconds."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from ports import free_port

from client_app import loops
from client_app.transport import ApiRejected, Transport, TransportFailed
from fedforest_secure.errors import ProtocolError, RefusedRequest


@dataclass
class _Session:
    open_now: int
    refusals: list[tuple[int, str]] = field(default_factory=list)

    def refuse_round(self, round_id: int, code: str) -> None:
        if round_id != self.open_now:
            raise ApiRejected(409, "round_closed", f"round {round_id} is not the open round", {})
        self.refusals.append((round_id, code))


@dataclass
class _Transport:
    step: dict[str, Any]
    asked: list[str] = field(default_factory=list)

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        self.asked.append(path)
        return self.step


@dataclass
class _Log:
    lines: list[str] = field(default_factory=list)

    def info(self, msg: str) -> None:
        self.lines.append(msg)


@dataclass
class _Ctx:
    tr: _Transport
    job: str = "job-a"
    log: _Log = field(default_factory=_Log)


def test_a_site_stopped_as_its_round_closes_refuses_the_round_open_now() -> None:
    session = _Session(open_now=3)
    ctx = _Ctx(_Transport({"status": "task", "action": "share", "round_id": 3}))
    loops.tell_stopped(ctx, session, 2)  # type: ignore[arg-type]
    assert session.refusals == [(3, "stopped")]
    assert ctx.tr.asked == ["/v1/jobs/job-a/secagg"]
    assert ctx.log.lines == []


def test_a_site_stopped_in_its_open_round_refuses_that_round() -> None:
    session = _Session(open_now=2)
    ctx = _Ctx(_Transport({}))
    loops.tell_stopped(ctx, session, 2)  # type: ignore[arg-type]
    assert session.refusals == [(2, "stopped")]
    assert ctx.tr.asked == []


def test_with_no_later_round_open_the_site_says_the_server_was_not_told() -> None:
    session = _Session(open_now=99)
    ctx = _Ctx(_Transport({"status": "wait", "detail": "no open round"}))
    loops.tell_stopped(ctx, session, 2)  # type: ignore[arg-type]
    assert session.refusals == []
    assert ctx.log.lines and "was not told this site stopped" in ctx.log.lines[0]


@dataclass
class _OpenSession(_Session):
    """A session in round ``open_now``, which it has not refused."""

    @property
    def open_round(self) -> int:
        return self.open_now

    def refused(self, round_id: int) -> bool:
        return False


@dataclass
class _BriefTransport(_Transport):
    briefs: int = 0

    @contextlib.contextmanager
    def brief(self, seconds: float = 5.0) -> Iterator[None]:
        self.briefs += 1
        yield


@pytest.mark.parametrize(("error", "refusal"), [
    (OSError(28, "No space left on device"), [(2, "failed")]),
    (ProtocolError("the task does not match its announced digest"), [(2, "failed")]),
    (RefusedRequest("a roster that is not the job's", code="roster"), [(2, "roster")]),
    # the server dropped the site, refuses its token, or cannot be reached: nothing to tell
    (ApiRejected(403, "dropped", "this client was dropped at round 2", {}), []),
    (ApiRejected(401, "unauthenticated", "unknown or revoked token", {}), []),
    (TransportFailed("the server did not answer for 300s"), []),
])
def test_a_secure_site_stopping_on_an_error_tells_the_server_only_what_it_does_not_know(
        error: Exception, refusal: list[tuple[int, str]]) -> None:
    session = _OpenSession(open_now=2)
    ctx = _Ctx(_BriefTransport({}))
    loops.leave_after_error(ctx, session, error)  # type: ignore[arg-type]
    assert session.refusals == refusal
    assert ctx.tr.briefs == len(refusal)  # the refusal gives up within seconds
    assert ctx.log.lines == []


def test_a_brief_request_to_a_server_that_never_answers_gives_up_within_seconds() -> None:
    """A stopping client (SIGTERM under a service manager's grace period) or a courtesy
    question asks briefly: a server that accepts the connection and never answers costs it
    seconds, not the transport's two-minute timeout and five-minute retry budget."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", free_port()))
        srv.listen(8)
        tr = Transport(f"http://127.0.0.1:{srv.getsockname()[1]}", "t", None, insecure_dev=True)
        try:
            started = time.monotonic()
            with tr.brief(1.0), pytest.raises(TransportFailed, match="did not answer for 1s"):
                tr.request("GET", "/v1/me")
            took = time.monotonic() - started
            assert (tr.retry_budget_s, tr._timeout) == (300.0, None)  # restored
        finally:
            tr.close()
    assert took < 10.0
