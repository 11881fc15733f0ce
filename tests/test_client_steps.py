"""The client transport's secure-aggregation POSTs ask for the next step (``?next_wait=``) and
keep it for the client loop, so a step needs no separate ``GET /secagg``."""

from __future__ import annotations

import json

import httpx
import pytest

from client_app.transport import Transport

NEXT = {"status": "task", "action": "upload", "round_id": 3, "message": "{}"}


def _transport(seen: list[httpx.Request]) -> Transport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"accepted": True, "next": NEXT})

    tr = Transport("http://127.0.0.1:9", "token", None, insecure_dev=True)
    tr.close()
    tr._http = httpx.Client(base_url=tr.base_url, transport=httpx.MockTransport(answer))
    return tr


@pytest.mark.parametrize("path", ["secagg/advert", "secagg/shares", "secagg/signature",
                                  "secagg/unmask", "upload"])
def test_a_step_post_asks_for_the_next_step_and_keeps_it(path: str) -> None:
    seen: list[httpx.Request] = []
    tr = _transport(seen)
    tr.step_wait = 10.0
    tr.request("POST", f"/v1/jobs/j/rounds/3/{path}", content=b"{}")
    assert seen[0].url.params.get("next_wait") == "10.0"
    assert tr.take_next_step() == NEXT
    assert tr.take_next_step() is None  # handed over once


@pytest.mark.parametrize("path", ["/v1/jobs/j/rounds/3/secagg/refuse", "/v1/jobs/j/join"])
def test_other_posts_do_not_wait_for_a_step(path: str) -> None:
    seen: list[httpx.Request] = []
    tr = _transport(seen)
    tr.step_wait = 10.0
    tr.request("POST", path, content=json.dumps({"reason": "x"}).encode())
    assert "next_wait" not in seen[0].url.params
    assert tr.take_next_step() is None


def test_without_step_wait_no_post_waits() -> None:
    seen: list[httpx.Request] = []
    tr = _transport(seen)
    tr.request("POST", "/v1/jobs/j/rounds/3/secagg/shares", content=b"{}")
    assert "next_wait" not in seen[0].url.params
    assert tr.take_next_step() is None
