"""A secure site stopped with Ctrl-C tells the server at once, even when the round it was in
closed just before: it refuses the round open now, which already counts it in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from client_app import loops
from client_app.transport import ApiRejected


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
