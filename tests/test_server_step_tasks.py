"""A step POST that asks ``?with_task=true`` is answered with the next step's JSON and, when
that step is a task of another round (the unmask response of round r brings round r + 1's
first step), the open round's task bytes after it; the header says where the JSON ends."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_server_secagg_api import K, _env, all_uploaded, h, offer, sign

from fedforest_secure.protocol import Task
from fedforest_secure.protocol.steps import STEP_JSON_BYTES, split_step
from fedforest_secure.secagg import SurvivorSet, UnmaskRequest, parse


@pytest.fixture()
def env(tmp_path: Path, tiny_parts, job_dir, db_url: str) -> Iterator[dict]:
    """A secure job of K = 4 sites (a manual clock)."""
    yield from _env(tmp_path, tiny_parts, job_dir, db_url, "secure")


def _unmask(env: dict, sa: dict, k: int, r: int, query: str):
    o = offer(env, k)
    assert o["action"] == "unmask", o
    resp = sa[k].unmask(parse(UnmaskRequest, o["message"]), next_advert=sa[k].advertise(r + 1))
    return env["http"].post(f"/v1/jobs/job-a/rounds/{r}/secagg/unmask{query}", headers={
        **h(env, k), "Content-Type": "application/json"}, content=resp.model_dump_json().encode())


def test_the_step_of_the_next_round_comes_with_its_task_after_the_json(env: dict) -> None:
    config, sa, task, _ = all_uploaded(env)
    r = task.round_id
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200
    for k in range(K - 1):
        assert _unmask(env, sa, k, r, "").status_code == 200
    # the last unmask closes the round: its answer's next step is round r + 1's shares
    last = _unmask(env, sa, K - 1, r, "?next_wait=5&with_task=true")
    assert last.status_code == 200
    text, body = split_step(last.content, last.headers.get(STEP_JSON_BYTES))
    step = json.loads(text)["next"]
    assert step["round_id"] == r + 1 and step["action"] == "share"
    assert body is not None and hashlib.sha256(body).hexdigest() == step["task_digest"]
    fetched = env["http"].get(f"/v1/jobs/job-a/rounds/{r + 1}/task", headers=h(env, 0))
    assert body == fetched.content
    assert Task.from_bytes(body).round_id == r + 1


def test_a_step_of_the_same_round_or_without_with_task_is_json_alone(env: dict) -> None:
    config, sa, task, _ = all_uploaded(env)
    r = task.round_id
    for k in range(K - 1):
        assert sign(env, sa, k, r).status_code == 200
    o = offer(env, K - 1)
    assert o["action"] == "sign", o
    signature = sa[K - 1].sign_survivors(parse(SurvivorSet, o["message"])).model_dump_json()
    # the last signature's next step is this round's unmask: no task comes with it
    resp = env["http"].post(f"/v1/jobs/job-a/rounds/{r}/secagg/signature?next_wait=5"
                            "&with_task=true", headers={**h(env, K - 1), "Content-Type":
                                                        "application/json"},
                            content=signature.encode())
    assert resp.status_code == 200 and STEP_JSON_BYTES not in resp.headers
    nxt = json.loads(resp.content)["next"]
    assert nxt["action"] == "unmask" and nxt["round_id"] == r
    for k in range(K - 1):  # the round stays open: each next step is this round's
        resp = _unmask(env, sa, k, r, "?with_task=true")
        assert STEP_JSON_BYTES not in resp.headers
        assert json.loads(resp.content)["accepted"] == "unmask"
    resp = _unmask(env, sa, K - 1, r, "?next_wait=5")  # closes it, not asking for the task
    assert STEP_JSON_BYTES not in resp.headers
    assert json.loads(resp.content)["next"]["round_id"] == r + 1
