"""One site's requests in progress at once are capped (server_app/limits.py): beyond the cap
its next request is answered 429 at once, so one site's long polls cannot hold the server's
connections for the others; every other site is served as before."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from server_app.auth import TokenCache, add_client
from server_app.db import Database
from server_app.limits import BodyLimits, TransportLimits

CAP = 3


def _scope(token: str) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "https", "path": "/v1/jobs/j/secagg", "raw_path": b"/v1/jobs/j/secagg",
            "query_string": b"wait=30", "root_path": "", "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 443),
            "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {token}".encode())]}


def test_a_site_past_its_requests_in_progress_is_answered_429_and_others_are_served(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A site with CAP requests in progress (long polls) is answered 429 at once for the
    next, and logged once a minute for it, not once a request; another site is served."""
    from server_app.logs import LOGGER

    caplog.set_level(logging.INFO, logger=LOGGER)
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    greedy, other = add_client(db, "greedy"), add_client(db, "other")
    release = asyncio.Event()
    served: list[str] = []

    async def long_poll(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await release.wait()  # a long poll: answered when something happens
        served.append(scope["headers"][1][1].decode())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    layer = TransportLimits(long_poll, TokenCache(db), limits=BodyLimits(), max_in_flight=CAP)

    async def call(token: str) -> int:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await layer(_scope(token), receive, send)
        return int(sent[0]["status"])

    async def in_flight(count: int) -> None:
        """Until the layer counts ``count`` requests of the site in progress (5 s at most)."""
        for _ in range(500):
            if sum(layer._in_flight.values()) == count:  # noqa: SLF001
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{count} requests never were in progress")

    async def scenario() -> tuple[list[int], int, list[int], int]:
        try:
            polls = [asyncio.create_task(call(greedy)) for _ in range(CAP)]
            await in_flight(CAP)  # the site's CAP long polls are in progress
            # one more: answered at once, not held (a held one would time out here)
            refused = await asyncio.wait_for(call(greedy), 5)
            assert [await asyncio.wait_for(call(greedy), 5) for _ in range(3)] == [429] * 3
            others = asyncio.create_task(call(other))  # another site is not counted with it
            await in_flight(CAP + 1)
        finally:
            release.set()
        done = list(await asyncio.wait_for(asyncio.gather(*polls), 5))
        return done, refused, [await others], await asyncio.wait_for(call(greedy), 5)

    done, refused, others, again = asyncio.run(scenario())
    db.dispose()
    assert done == [200] * CAP and others == [200] and again == 200
    assert refused == 429
    assert len(served) == CAP + 2
    said = [r.getMessage() for r in caplog.records if "event=too_many_requests" in r.getMessage()]
    assert len(said) == 1 and "client=greedy" in said[0], said


def test_refused_tokens_are_logged_once_a_minute_with_the_count_left_out(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone may send requests with a made-up token: the server logs the first, then at most
    one line a minute for the same refusal, saying how many it left out."""
    import server_app.limits as limits
    from server_app.logs import LOGGER

    db = Database(f"sqlite:///{tmp_path / 's.db'}")

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise AssertionError("a refused request reached the app")

    layer = TransportLimits(app, TokenCache(db), limits=BodyLimits())

    async def call() -> int:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await layer(_scope("made-up"), receive, send)
        return int(sent[0]["status"])

    caplog.set_level(logging.INFO, logger=LOGGER)
    assert [asyncio.run(call()) for _ in range(5)] == [401] * 5
    lines = [r.getMessage() for r in caplog.records if "event=auth_refused" in r.getMessage()]
    assert len(lines) == 1 and "repeated" not in lines[0] and "made-up" not in lines[0]
    monkeypatch.setattr(limits, "LOG_EVERY_S", 0.0)  # a minute later
    assert asyncio.run(call()) == 401
    lines = [r.getMessage() for r in caplog.records if "event=auth_refused" in r.getMessage()]
    assert len(lines) == 2 and "repeated=4" in lines[1]
    db.dispose()
