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
from client_app.transport import ApiRejected, ServerUnreachable, Transport, TransportFailed
from fedforest_secure.errors import ProtocolError, RefusedRequest


@dataclass
class _Session:
    open_now: int
    refusals: list[tuple[int, str]] = field(default_factory=list)

    def refuse_round(self, round_id: int, code: str) -> None:
        if round_id != self.open_now:
            raise ApiRejected(409, "round_closed", f"round {round_id} is not the open round", {})
        self.refusals.append((round_id, code))

    def last_refused(self) -> int | None:
        return max((r for r, _ in self.refusals), default=None)


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
    # a server this client gave up on may answer again: told, briefly
    (TransportFailed("the server did not answer for 300s"), [(2, "failed")]),
    # a defect of the client's own: the open round goes on without it at once
    (KeyError("nodes"), [(2, "failed")]),
    # the server dropped the site, the job ended, or the server refuses its token: nothing
    # to tell
    (ApiRejected(403, "dropped", "this client was dropped at round 2", {}), []),
    (ApiRejected(409, "job_finished", "the job is failed", {}), []),
    (ApiRejected(401, "unauthenticated", "unknown or revoked token", {}), []),
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
    seconds, not the wait of a long poll plus its margin and the five-minute retry budget."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", free_port()))
        srv.listen(8)
        tr = Transport(f"http://127.0.0.1:{srv.getsockname()[1]}", "t", None, insecure_dev=True)
        try:
            started = time.monotonic()
            with tr.brief(1.0), pytest.raises(TransportFailed, match=r"reached this client "
                                              r"within 1s \(no answer on the connection for 1s"):
                tr.request("GET", "/v1/me")
            took = time.monotonic() - started
            assert (tr.retry_budget_s, tr._timeout) == (300.0, None)  # restored
        finally:
            tr.close()
    # on a loaded machine: less than the 40 s an answer is otherwise waited for (the answer
    # margin)
    assert took < 30.0, took


def test_a_secure_site_stopping_on_a_defect_of_its_own_refuses_the_open_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception outside the errors the client expects (a defect: KeyError) ends the site's
    steps too: it refuses the open round on its way out, so the other sites do not wait for
    it until the step's deadline, and the error is raised as it was."""
    from types import SimpleNamespace

    session = _OpenSession(open_now=4)
    monkeypatch.setattr(loops, "SecAggSession", lambda *a, **k: session)

    def broken(*a: Any) -> None:
        raise KeyError("nodes")

    monkeypatch.setattr(loops, "secure_steps", broken)
    tr = _BriefTransport({})
    ctx = SimpleNamespace(tr=tr, job="job-a", log=_Log(), index=0, config=None,
                          opts=SimpleNamespace(ca=None, cert=None),
                          refusal_receipt=lambda *a: None)
    with pytest.raises(KeyError, match="nodes"):
        loops.run_secure(ctx, None)  # type: ignore[arg-type]
    assert session.refusals == [(4, "failed")]
    assert tr.briefs == 1


def test_the_status_poll_asks_briefly_and_never_fails_the_site() -> None:
    """The poll of the job's status (who joined, who was dropped) is a courtesy: a server that
    keeps failing it costs the site's loop seconds (a brief question), not the transport's
    retry budget, and no error."""
    from client_app.context import Watch

    asked: list[float] = []

    class Failing(Transport):
        def request(self, method: str, path: str, **_: Any) -> Any:
            asked.append(self.retry_budget_s)
            raise TransportFailed("the server kept failing (HTTP 503)")

    tr = Failing("http://127.0.0.1:9", "t", None, insecure_dev=True, retry_budget_s=600.0)
    try:
        Watch("job-a", _Log(), 0).poll(tr, force=True)  # type: ignore[arg-type]
    finally:
        tr.close()
    assert asked == [5.0]
    assert tr.retry_budget_s == 600.0  # restored


# ------------------------------------------------ what a site that left a secure job says last
@dataclass
class _StatusTransport(_BriefTransport):
    """Answers the job's status with ``status`` (None: the server does not answer it)."""

    status: dict[str, Any] | None = None

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        self.asked.append(path)
        if self.status is None:
            raise TransportFailed("the server did not answer for 5s")
        return self.status


@dataclass
class _UnreachableSession(_OpenSession):
    """A session whose server does not answer its refusal."""

    def refuse_round(self, round_id: int, code: str) -> None:
        raise TransportFailed("the server did not answer for 5s")


def _run_secure_failing(monkeypatch: pytest.MonkeyPatch, session: _Session,
                        tr: _Transport, error: BaseException) -> Any:
    """``run_secure`` whose steps raise ``error`` in round ``session.open_now``."""
    from types import SimpleNamespace

    monkeypatch.setattr(loops, "SecAggSession", lambda *a, **k: session)

    def failing(*a: Any) -> None:
        raise error

    monkeypatch.setattr(loops, "secure_steps", failing)
    ctx = SimpleNamespace(tr=tr, job="job-a", log=_Log(), index=0, config=None,
                          opts=SimpleNamespace(ca=None, cert=None, retry_budget_s=60.0),
                          refusal_receipt=lambda *a: None)
    return ctx


UNREACHABLE = ServerUnreachable(
    "POST /v1/jobs/job-a/rounds/4/secagg/unmask: the server at https://h:8443 did not answer "
    "for 60s (connection refused); is it running, and are the address and port right?",
    failure="POST /v1/jobs/job-a/rounds/4/secagg/unmask: the server at https://h:8443 did not "
            "answer for 60s (connection refused)")


def test_a_secure_site_that_gives_up_on_its_server_mid_round_says_it_left_the_job(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server stayed away longer than the retry budget in the middle of a secure round:
    the site's round keys die with the process, so rerunning the client (what "is it
    running?" invites) cannot rejoin the job. The error says so, and names --retry-budget."""
    session = _UnreachableSession(open_now=4)
    tr = _StatusTransport({})
    ctx = _run_secure_failing(monkeypatch, session, tr, UNREACHABLE)
    with pytest.raises(loops.LeftSecureJob) as err:
        loops.run_secure(ctx, None)  # type: ignore[arg-type]
    text = str(err.value)
    assert text.startswith("POST /v1/jobs/job-a/rounds/4/secagg/unmask: the server at "
                           "https://h:8443 did not answer for 60s (connection refused); this "
                           "site has left job job-a (it gave up on the server in the middle of "
                           "secure round 4; the server could not be told"), text
    assert "running the client again cannot rejoin the job" in text
    assert "is it running" not in text
    assert text.endswith("--retry-budget sets how long a client waits for its server (60s "
                         "here, 300s by default)"), text
    assert err.value.__cause__ is UNREACHABLE
    assert tr.asked == []  # a server that did not answer the refusal is not asked more


def test_a_site_that_gave_up_on_its_server_but_told_it_says_what_became_of_the_job(
        monkeypatch: pytest.MonkeyPatch) -> None:
    session = _OpenSession(open_now=4)
    tr = _StatusTransport({}, status={"job_id": "job-a", "status": "running",
                                      "active_clients": 4, "min_clients": 3})
    ctx = _run_secure_failing(monkeypatch, session, tr, UNREACHABLE)
    with pytest.raises(loops.LeftSecureJob) as err:
        loops.run_secure(ctx, None)  # type: ignore[arg-type]
    assert session.refusals == [(4, "failed")]
    assert "(it gave up on the server in the middle of secure round 4; the server was told)" \
        in str(err.value)
    assert "the job goes on without it with 4 sites (at least 3 needed)" in str(err.value)


def test_a_server_error_outside_a_secure_round_is_raised_as_it_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before its first secure round a site holds no round keys: a rerun resumes it, and the
    error stays the transport's own."""
    session = _OpenSession(open_now=4)
    monkeypatch.setattr(_OpenSession, "open_round", property(lambda self: None))
    ctx = _run_secure_failing(monkeypatch, session, _StatusTransport({}), UNREACHABLE)
    with pytest.raises(ServerUnreachable):
        loops.run_secure(ctx, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("status", "says"), [
    ({"job_id": "job-a", "status": "running", "active_clients": 4, "min_clients": 3},
     "this site has left job job-a (it stopped in the middle of secure round 4; the server was "
     "told): its round keys die with this process, so running the client again cannot rejoin "
     "the job; the job goes on without it with 4 sites (at least 3 needed)"),
    ({"job_id": "job-a", "status": "running", "active_clients": 2, "min_clients": 3},
     "; the job cannot go on: 2 sites remain, fewer than the 3 it needs, so it stops without "
     "a model"),
    ({"job_id": "job-a", "status": "failed", "reason": "round 4: too few", "active_clients": 2,
      "min_clients": 3}, "; the job has failed (round 4: too few): there is no model"),
    (None, "; the job goes on without it while enough sites remain (`fedforest status --job "
           "job-a` says how it goes)"),
])
def test_a_secure_site_stopped_mid_round_says_it_left_and_what_became_of_the_job(
        monkeypatch: pytest.MonkeyPatch, status: dict[str, Any] | None, says: str) -> None:
    """Ctrl-C or SIGTERM in a secure round: the site refuses the round ("stopped"), asks the
    job's status briefly, and its interrupt carries what the command prints last."""
    session = _OpenSession(open_now=4)
    tr = _StatusTransport({}, status=status)
    ctx = _run_secure_failing(monkeypatch, session, tr, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt) as err:
        loops.run_secure(ctx, None)  # type: ignore[arg-type]
    assert session.refusals == [(4, "stopped")]
    assert tr.asked == ["/v1/jobs/job-a"]
    notes = getattr(err.value, "__notes__", [])
    assert len(notes) == 1 and says in notes[0], notes


def test_a_secure_site_stopped_after_its_job_failed_says_the_job_had_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The job failed before the stop reached the site: the server refuses its refusal
    (job_finished); it says the job had ended, not that it left a job that goes on."""

    @dataclass
    class Finished(_OpenSession):
        def refuse_round(self, round_id: int, code: str) -> None:
            raise ApiRejected(409, "job_finished", "the job is failed", {})

    tr = _StatusTransport({}, status={"job_id": "job-a", "status": "failed",
                                      "reason": "round 4: aborted", "active_clients": 2,
                                      "min_clients": 3})
    ctx = _run_secure_failing(monkeypatch, Finished(open_now=4), tr, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt) as err:
        loops.run_secure(ctx, None)  # type: ignore[arg-type]
    assert getattr(err.value, "__notes__", []) == [
        "job job-a had ended before this site stopped: the job has failed (round 4: aborted): "
        "there is no model"]


def test_a_site_stopped_outside_a_secure_round_adds_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    session = _OpenSession(open_now=4)
    monkeypatch.setattr(_OpenSession, "open_round", property(lambda self: None))
    tr = _StatusTransport({})
    ctx = _run_secure_failing(monkeypatch, session, tr, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt) as err:
        loops.run_secure(ctx, None)  # type: ignore[arg-type]
    assert getattr(err.value, "__notes__", []) == [] and tr.asked == []


def test_a_stopped_site_names_the_round_the_server_recorded_its_stop_in(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped just as round 3 closed: its refusal went to round 4, which counted it in, and
    the last words name round 4, where the server's log and the audit log record the stop."""
    from types import SimpleNamespace

    from client_app.secagg_session import SecAggSession

    class Session:
        open_round = 3
        _refused = {3, 4}  # round 3's refusal met its close; round 4's was taken

        def __init__(self, *_: Any, **__: Any) -> None:
            pass

        def refused(self, round_id: int) -> bool:
            return round_id in self._refused

        last_refused = SecAggSession.last_refused  # the session's own

    def stopped(*_: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(loops, "SecAggSession", Session)
    monkeypatch.setattr(loops, "secure_steps", stopped)
    monkeypatch.setattr(loops, "_leave_round", lambda *_: True)
    monkeypatch.setattr(loops, "job_status_briefly", lambda *_: None)
    ctx = SimpleNamespace(tr=SimpleNamespace(step_wait=0.0), job="job-a", config=None,
                          index=0, opts=SimpleNamespace(ca=None, cert=None),
                          refusal_receipt=None)
    with pytest.raises(KeyboardInterrupt) as exc:
        loops.run_secure(ctx, None)  # type: ignore[arg-type]
    said = " ".join(exc.value.__notes__)
    assert "it stopped in the middle of secure round 4; the server was told" in said, said
