"""A malicious client: out-of-range values, malformed masked uploads, uploads after being dropped,
and poisoning that the protocol cannot see (inside the masked sum).

Where the protocol can see a value it range-checks it: the client's codec refuses anything outside
the fixed-point range before encoding (``OverflowRisk``), and the server checks every upload's
type, length, round, task digest and sender. Inside the masked sum the server sees only uniform
ring elements, so an in-range but false contribution is accepted and shifts the aggregate: the
last test demonstrates that residual risk (threat_model.md says so).
"""

# ruff: noqa: F811  (the `env` fixture is imported from test_server_secagg_api and used as a parameter)
from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_fuzz_api import db_snapshot, secagg_snapshot
from test_server_secagg_api import (
    aggregate,
    env,  # noqa: F401 - the secure-job fixture (K=4, manual clock), reused
    first_round,
    h,
    join_all,
    offer,
    run_until_upload,
    sign,
    unmask,
)
from test_server_secagg_api import upload as secure_upload

from fedforest_secure.config import JobConfig
from fedforest_secure.errors import OverflowRisk
from fedforest_secure.federation import client_seed
from fedforest_secure.protocol import Reply, Task, make_upload, pack
from fedforest_secure.secagg import ShareDelivery, UnmaskResponse, parse
from fedforest_secure.secure_sum import encode_contribution, make_codec
from fedforest_secure.worker import Worker
from server_app.app import create_app
from server_app.audit_hook import NullAudit
from server_app.auth import add_client
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

K = 4
OCTET = {"Content-Type": "application/octet-stream"}


def state_of(env: dict[str, Any]) -> tuple[Any, ...]:
    return db_snapshot(env["db"]), secagg_snapshot(env["state"])


# -- range checks before encoding ------------------------------------------------------------
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan, 2.0**40, -(2.0**40)])
def test_out_of_range_contribution_is_refused_before_encoding(env: dict, bad: float) -> None:
    config, _ = join_all(env)
    task, vecs, replies = first_round(env, config)
    summable = replies[0].summable.copy()
    summable[1] = bad  # a count no site can have, or not a number at all
    evil = Reply(round_id=task.round_id, summable=summable, disclosed={})
    with pytest.raises(OverflowRisk, match=r"value\[1\]") as refused:
        encode_contribution(config, task, evil)
    assert "scale the data down" in str(refused.value)  # and says what to do
    # the honest encoding is unaffected, and its decode is exact for counts
    codec = make_codec(config, task)
    assert np.array_equal(codec.decode(vecs[0]), replies[0].summable)


# -- malformed masked uploads ----------------------------------------------------------------
def _masked(env: dict, sa: dict, k: int, task: Task, vec: np.ndarray) -> tuple[str, np.ndarray]:
    o = offer(env, k)
    assert o["action"] == "upload", o
    header, masked = sa[k].mask(parse(ShareDelivery, o["message"]), vec)
    return header.model_dump_json(), masked


def _post(env: dict, k: int, round_id: int, body: bytes, job: str = "job-a") -> Any:
    return env["http"].post(f"/v1/jobs/{job}/rounds/{round_id}/upload", content=body,
                            headers={**h(env, k), **OCTET})


def test_malformed_masked_uploads_are_rejected_and_change_nothing(env: dict) -> None:
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    header, masked = _masked(env, sa, 0, task, vecs[0])
    other_header = json.loads(header) | {"sender": 1}
    wrong_round = json.loads(header) | {"round_id": r + 1}
    good = make_upload(task, masked, {}, secagg=header)
    cases: dict[str, tuple[bytes, int]] = {
        "wrong_length": (make_upload(task, masked[:-1], {}, secagg=header), 400),
        "float_not_ring": (make_upload(task, masked.astype(np.float64), {}, secagg=header), 400),
        "truncated": (good[:-8], 400),
        "no_secagg_header": (make_upload(task, masked, {}), 400),
        "header_names_another_client": (
            make_upload(task, masked, {}, secagg=json.dumps(other_header)), 403),
        "header_for_another_round": (
            make_upload(task, masked, {}, secagg=json.dumps(wrong_round)), 409),
        "another_task": (pack({"type": "upload", "job_id": "job-a", "round_id": r,
                               "task_digest": "00" * 32, "encoding": "uint64",
                               "secagg": header}, {"__summable__": masked}), 409),
        "plaintext_riding_along": (
            make_upload(task, masked, {"node_stats": np.ones(3)}, secagg=header), 400),
    }
    before = state_of(env)
    for name, (body, status) in cases.items():
        resp = _post(env, 0, r, body)
        assert resp.status_code == status, (name, resp.text)
        assert {"error", "detail"} <= set(resp.json()), name
        assert state_of(env) == before, name
    # the same body sent to a round that was not issued, or to a job this site is not in:
    # refused before the body is read
    wrong_round = _post(env, 0, r + 1, good)
    assert (wrong_round.status_code, wrong_round.json()["error"]) == (409, "wrong_round")
    other_job = _post(env, 0, r, good, job="job-b")
    assert (other_job.status_code, other_job.json()["error"]) == (404, "unknown_job")
    assert state_of(env) == before
    # the genuine upload still goes through; its replay is the same receipt, a variant a 409
    first = _post(env, 0, r, good)
    assert first.status_code == 200 and not first.json()["duplicate"]
    after = state_of(env)
    again = _post(env, 0, r, good)
    assert again.status_code == 200 and again.json()["duplicate"]
    variant = make_upload(task, masked + np.uint64(1), {}, secagg=header)
    assert _post(env, 0, r, variant).json()["error"] in ("conflicting_upload", "protocol_error")
    assert state_of(env) == after


def test_a_dropped_client_cannot_upload_or_unmask_afterwards(env: dict) -> None:
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    late_header, late_masked = _masked(env, sa, 3, task, vecs[3])  # prepared, never sent in time
    for k in range(K - 1):
        assert secure_upload(env, sa, k, task, vecs[k]).status_code == 200
    env["clock"].now += 31
    env["state"].tick()  # client 3 misses the upload deadline: dropped, its masks recovered
    assert offer(env, 3)["status"] == "dropped"
    before = state_of(env)
    resp = _post(env, 3, r, make_upload(task, late_masked, {}, secagg=late_header))
    assert resp.status_code == 403 and resp.json()["error"] == "dropped"
    late_unmask = UnmaskResponse(job_id="job-a", round_id=r, sender=3, self_mask_shares={},
                                 key_shares={})
    resp = env["http"].post(f"/v1/jobs/job-a/rounds/{r}/secagg/unmask",
                            content=late_unmask.model_dump_json(),
                            headers={**h(env, 3), "Content-Type": "application/json"})
    assert resp.status_code == 403 and resp.json()["error"] == "dropped"
    resp = env["http"].post("/v1/jobs/job-a/join", headers=h(env, 3), json={
        "identity_key": bytes(sa[3].identity.verify_key).hex()})
    assert resp.status_code == 403 and resp.json()["error"] == "dropped"
    assert state_of(env) == before
    for k in range(K - 1):
        assert sign(env, sa, k, r).status_code == 200
    for k in range(K - 1):
        assert unmask(env, sa, k, r).status_code == 200
    want = make_codec(config, task).decode(sum((vecs[k] for k in range(K - 1)),
                                               np.zeros_like(vecs[0])))
    assert np.array_equal(aggregate(env, r), want)  # the late vector is in no sum


# -- residual risk: in-range poisoning inside the masked sum ---------------------------------
def test_residual_in_range_poisoning_inside_the_masked_sum_shifts_the_aggregate(
        env: dict) -> None:
    """RESIDUAL (documented): the server cannot check a masked contribution. A client that
    reports 50x its counts (well inside the codec's range) is accepted, and the released sum
    moves by exactly the poison. Nothing in secure aggregation can detect this."""
    config, sa = join_all(env)
    task, vecs, replies = first_round(env, config)
    r = task.round_id
    poison = replies[0].summable * 49.0
    lying = Reply(round_id=r, summable=replies[0].summable + poison, disclosed={})
    bad_vec = encode_contribution(config, task, lying)  # passes the range check
    run_until_upload(env, sa, r)
    assert secure_upload(env, sa, 0, task, bad_vec).status_code == 200
    for k in range(1, K):
        assert secure_upload(env, sa, k, task, vecs[k]).status_code == 200
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200
    for k in range(K):
        assert unmask(env, sa, k, r).status_code == 200
    honest = sum((rep.summable for rep in replies.values()), np.zeros_like(poison))
    got = aggregate(env, r)
    assert not np.array_equal(got, honest)
    np.testing.assert_allclose(got - honest, poison, rtol=0, atol=1e-6)


# -- plaintext uploads (no masking) are range-checked against the codec's public bounds -------
def _plain_env(tmp_path: Path, parts: list, feat: list, job_dir: Any, profile: str = "open"
               ) -> Iterator[dict]:
    toml = job_dir(tmp_path / "job", parts, feat, n_clients=3, profile=profile)
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    tokens = [add_client(db, f"client-{k}") for k in range(3)]
    state = ServerState(db, NullAudit(), clock=lambda: 1000.0, monotonic=lambda: 1000.0)
    state.create_job(load_job_spec(toml))
    app = create_app(db, state=state, tick_seconds=3600)
    with TestClient(app, raise_server_exceptions=False) as http:
        yield {"http": http, "db": db, "tokens": tokens, "state": state, "parts": parts[:3]}
    db.dispose()


@pytest.fixture()
def open_env(tmp_path: Path, tiny_parts, job_dir) -> Iterator[dict]:
    parts, feat = tiny_parts
    yield from _plain_env(tmp_path, parts, feat, job_dir)


def _join_plain(env: dict) -> tuple[list[dict[str, str]], JobConfig, Task]:
    http = env["http"]
    auth = [{"Authorization": f"Bearer {t}"} for t in env["tokens"]]
    for a in auth:
        resp = http.post("/v1/jobs/job-a/join", headers=a)
        assert resp.status_code == 200
    config = JobConfig.from_json(json.dumps(resp.json()["config"]))
    resp = http.get("/v1/jobs/job-a/task", headers=auth[0])
    assert resp.status_code == 200
    return auth, config, Task.from_bytes(resp.content)


def _honest_bodies(env: dict, config: JobConfig, task: Task) -> list[bytes]:
    out = []
    for k, (X, y) in enumerate(env["parts"]):
        reply = Worker(config, X, y, client_index=k, seed=client_seed(config, k)).handle(task)
        vec = (encode_contribution(config, task, reply) if config.profile.get("fixed_point")
               else reply.summable.astype(np.float64))
        out.append(make_upload(task, vec, reply.disclosed))
    return out


def _post_plain(env: dict, auth: dict[str, str], task: Task, body: bytes) -> Any:
    return env["http"].post(f"/v1/jobs/job-a/rounds/{task.round_id}/upload", content=body,
                            headers={**auth, **OCTET})


def _honest_uploads_close_the_round(env: dict, auth: list[dict[str, str]], task: Task,
                                    honest: list[bytes]) -> None:
    """After a refused upload, the sites' honest uploads are accepted and close the round:
    the job is not wedged."""
    for a, body in zip(auth, honest, strict=True):
        assert _post_plain(env, a, task, body).status_code == 200
    status = env["http"].get("/v1/jobs/job-a", headers=auth[0]).json()
    assert status["status"] in ("running", "done") and status["round_id"] > task.round_id


@pytest.mark.parametrize("value", [1e308, -1e308, 2.0**37, 1e20])
def test_open_profile_upload_of_huge_finite_values_is_a_4xx_not_a_wedged_job(
        open_env: dict, value: float) -> None:
    http = open_env["http"]
    auth, config, task = _join_plain(open_env)
    n = sum(b.size for b in task.layout)
    assert n > 0
    before = db_snapshot(open_env["db"])
    huge = make_upload(task, np.full(n, value), {})
    resps = [_post_plain(open_env, a, task, huge) for a in auth]
    assert [r.status_code for r in resps] == [400] * 3, [r.text for r in resps]
    for r in resps:
        body = r.json()
        assert body["error"] == "out_of_range"
        assert "summable[0]" in body["detail"] and "not stored" in body["detail"]
    assert db_snapshot(open_env["db"]) == before  # nothing stored
    status = http.get("/v1/jobs/job-a", headers=auth[0]).json()
    assert status["status"] == "running" and status["round_id"] == task.round_id
    # one entry out of range is enough to refuse the whole vector
    honest = _honest_bodies(open_env, config, task)
    from fedforest_secure.protocol import unpack

    _, arrays = unpack(honest[0])
    vec = arrays.pop("__summable__").copy()
    vec[-1] = value
    assert _post_plain(open_env, auth[0], task, make_upload(task, vec, arrays)).status_code == 400
    assert db_snapshot(open_env["db"]) == before
    _honest_uploads_close_the_round(open_env, auth, task, honest)


def test_a_non_finite_aggregate_fails_the_job_once_with_a_reason_never_a_5xx(
        open_env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth: were a non-finite sum to get past the upload checks, closing the round
    fails the job with a clear reason (HTTP 200 for the upload), and later requests and
    deadline ticks see a failed job instead of repeating the error."""
    monkeypatch.setattr(ServerState, "_bounds", lambda self, rt: None)  # no range check
    http, state = open_env["http"], open_env["state"]
    auth, config, task = _join_plain(open_env)
    n = sum(b.size for b in task.layout)
    from fedforest_secure.protocol import unpack

    disclosed = unpack(_honest_bodies(open_env, config, task)[0])[1]
    del disclosed["__summable__"]
    huge = make_upload(task, np.full(n, 1e308), disclosed)
    statuses = [_post_plain(open_env, a, task, huge).status_code for a in auth]
    assert statuses == [200, 200, 200]
    status = http.get("/v1/jobs/job-a", headers=auth[0]).json()
    assert status["status"] == "failed"
    assert f"round {task.round_id}" in status["reason"] and "non-finite" in status["reason"]
    state.tick()  # no exception, nothing changes
    resp = http.get("/v1/jobs/job-a/task", headers=auth[1])
    assert resp.status_code == 204 and resp.headers["X-FedForest-Status"] == "failed"
    assert _post_plain(open_env, auth[0], task, huge).status_code < 500


def test_a_fixed_point_upload_in_the_clear_is_range_checked_in_ring_units(
        tmp_path: Path, tiny_parts: Any, job_dir: Any) -> None:
    """``secure_aggregation = false`` with ``fixed_point``: the ring encodings are summed in the
    clear, so each one is checked against ``round(max_abs * 2^frac_bits)`` (no wrapped sum)."""
    from fedforest_secure import load_profile

    prof = tmp_path / "fixed-clear.toml"
    prof.write_text(load_profile("secure", secure_aggregation=False, name="fixed-clear")
                    .to_toml())
    parts, feat = tiny_parts
    gen = _plain_env(tmp_path, parts, feat, job_dir, profile=str(prof))
    env = next(gen)
    try:
        auth, config, task = _join_plain(env)
        n = sum(b.size for b in task.layout)
        before = db_snapshot(env["db"])
        for bad in (np.uint64(2**63), np.uint64(2**62), np.uint64(2**64 - 2**62)):
            resp = _post_plain(env, auth[0], task, make_upload(task, np.full(n, bad), {}))
            assert resp.status_code == 400 and resp.json()["error"] == "out_of_range"
            assert "ring units" in resp.json()["detail"]
        assert db_snapshot(env["db"]) == before
        for a, body in zip(auth, _honest_bodies(env, config, task), strict=True):
            assert _post_plain(env, a, task, body).status_code == 200
        status = env["http"].get("/v1/jobs/job-a", headers=auth[0]).json()
        assert status["status"] in ("running", "done") and status["round_id"] > task.round_id
    finally:
        gen.close()


_BAD_SKETCHES: dict[str, dict[str, np.ndarray]] = {
    "points_without_counts": {"sketch_points": np.zeros(4)},
    "counts_without_points": {"sketch_counts": np.zeros(4)},
    "mismatched_shapes": {"sketch_points": np.zeros((2, 2, 2)), "sketch_counts": np.zeros(3)},
    "integer_dtype": {"sketch_points": np.zeros((1,), dtype=np.int32),
                      "sketch_counts": np.zeros(1, dtype=np.int32)},
}


@pytest.mark.parametrize("variant", sorted(_BAD_SKETCHES))
def test_a_malformed_disclosed_sketch_is_a_4xx_and_the_sites_honest_upload_is_then_accepted(
        open_env: dict, variant: str) -> None:
    """The attack: under ``open`` one site uploads a valid summable vector with a malformed
    quantile sketch (one of its two arrays alone, shapes that do not match the task, an integer
    dtype). It was stored, and closing the round then raised on every retry and tick (a
    KeyError) or failed the job naming no site; now it is refused at receipt, nothing is
    stored, and the site's honest upload is accepted and closes the round."""
    auth, config, task = _join_plain(open_env)
    assert "sketch_points" in task.disclose
    before = db_snapshot(open_env["db"])
    honest = _honest_bodies(open_env, config, task)
    from fedforest_secure.protocol import unpack

    vec = unpack(honest[0])[1]["__summable__"]
    resp = _post_plain(open_env, auth[0], task, make_upload(task, vec, _BAD_SKETCHES[variant]))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == "malformed_upload"
    assert "sketch_" in resp.json()["detail"] and "not stored" in resp.json()["detail"]
    assert db_snapshot(open_env["db"]) == before  # nothing stored
    _honest_uploads_close_the_round(open_env, auth, task, honest)


def test_any_exception_from_the_coordinator_fails_the_job_once_with_a_reason_never_a_5xx(
        open_env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth: were an item to get past the upload checks and make the coordinator
    raise something other than a protocol error (here an injected KeyError, as a disclosed
    sketch without its counts once did), closing the round fails the job once with a reason
    naming the error; the closing upload gets its 200, and later requests, ticks and retries
    see a failed job instead of a 500 each time."""
    from fedforest_secure.coordinator import Coordinator

    def broken(self: Coordinator, *args: Any, **kwargs: Any) -> None:
        raise KeyError("sketch_counts")

    monkeypatch.setattr(Coordinator, "submit", broken)
    http, state = open_env["http"], open_env["state"]
    auth, config, task = _join_plain(open_env)
    honest = _honest_bodies(open_env, config, task)
    statuses = [_post_plain(open_env, a, task, b).status_code
                for a, b in zip(auth, honest, strict=True)]
    assert statuses == [200, 200, 200]
    resp = http.get("/v1/jobs/job-a", headers=auth[0])
    assert resp.status_code == 200
    status = resp.json()
    assert status["status"] == "failed"
    assert f"round {task.round_id}" in status["reason"]
    assert "KeyError: 'sketch_counts'" in status["reason"]
    state.tick()  # no exception: the job is no longer running
    state.tick(full_every=1)
    resp = http.get("/v1/jobs/job-a/task", headers=auth[1])
    assert resp.status_code == 204 and resp.headers["X-FedForest-Status"] == "failed"
    assert _post_plain(open_env, auth[0], task, honest[0]).status_code < 500
