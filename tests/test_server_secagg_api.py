"""Secure aggregation through the REST API (TestClient, in-process clients, a manual clock)."""

from __future__ import annotations

import json
import logging
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from db_outage import database_down
from nacl.signing import SigningKey
from sqlalchemy.exc import OperationalError

from fedforest_secure.config import JobConfig
from fedforest_secure.federation import client_seed
from fedforest_secure.privacy import load_profile
from fedforest_secure.protocol import Task, make_upload
from fedforest_secure.secagg import (
    RoundSetup,
    SecAggClient,
    ShareDelivery,
    SurvivorSet,
    UnmaskRequest,
    parse,
)
from fedforest_secure.secagg._primitives import _shamir
from fedforest_secure.secure_sum import encode_contribution, make_codec, unmask_floor
from fedforest_secure.worker import Worker
from server_app.app import create_app
from server_app.audit_hook import AuditSink, NullAudit, open_audit
from server_app.auth import TokenCache, add_client
from server_app.db import Database, JobRow, RoundRow
from server_app.jobspec import load_job_spec
from server_app.logs import LOGGER
from server_app.runtime import ServerState

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

K = 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def env(tmp_path: Path, tiny_parts, job_dir, db_url: str) -> Iterator[dict]:
    yield from _env(tmp_path, tiny_parts, job_dir, db_url, "secure")


@pytest.fixture()
def env_plus(tmp_path: Path, tiny_parts, job_dir, db_url: str) -> Iterator[dict]:
    """A job whose profile (the sites' own) asks for the SecAgg+ graph of 2 neighbours."""
    plus = tmp_path / "secure-plus.toml"
    plus.write_text(load_profile("secure", name="secure-plus", neighbours=2).to_toml())
    yield from _env(tmp_path, tiny_parts, job_dir, db_url, str(plus))


@pytest.fixture()
def env_all(tmp_path: Path, tiny_parts, job_dir, db_url: str) -> Iterator[dict]:
    """A secure job whose min_clients is every site (above the threshold t = 3)."""
    yield from _env(tmp_path, tiny_parts, job_dir, db_url, "secure", min_clients=K)


@pytest.fixture()
def env_audited(tmp_path: Path, tiny_parts, job_dir, db_url: str) -> Iterator[dict]:
    """As ``env``, with an audit log (``env["audit"]``)."""
    yield from _env(tmp_path, tiny_parts, job_dir, db_url, "secure",
                    audit=open_audit(str(tmp_path / "audit.db")))


@pytest.fixture()
def env_all_audited(tmp_path: Path, tiny_parts, job_dir, db_url: str) -> Iterator[dict]:
    """As ``env_all``, with an audit log (``env["audit"]``)."""
    yield from _env(tmp_path, tiny_parts, job_dir, db_url, "secure", min_clients=K,
                    audit=open_audit(str(tmp_path / "audit.db")))


def _env(tmp_path: Path, tiny_parts, job_dir, db_url: str, profile: str,
         min_clients: int | None = None, audit: AuditSink | None = None,
         wall: Clock | None = None) -> Iterator[dict]:
    """``env["clock"]`` is the server's monotonic clock, and its wall clock too unless
    ``wall`` is given (``env["wall"]``)."""
    parts, feat = tiny_parts
    job_toml = job_dir(tmp_path / "job", parts, feat, n_clients=K, profile=profile,
                       deadline=30.0, min_clients=min_clients)
    db = Database(db_url)
    tokens = [add_client(db, f"client-{k}") for k in range(K)]
    clock = Clock()
    state = ServerState(db, audit or NullAudit(), clock=wall or clock, monotonic=clock)
    state.create_job(load_job_spec(job_toml))
    app = create_app(db, state=state, tick_seconds=3600)
    with TestClient(app) as http:
        env = {"http": http, "db": db, "tokens": tokens, "parts": parts, "clock": clock,
               "wall": wall or clock, "state": state, "audit": audit}
        yield env
    for other in env.get("extra_dbs", []):  # the engines of restart()'s servers
        other.dispose()
    db.dispose()


def h(env: dict, k: int) -> dict[str, str]:
    return {"Authorization": f"Bearer {env['tokens'][k]}"}


def join_all(env: dict) -> tuple[JobConfig, dict[int, SecAggClient]]:
    keys = {k: SigningKey.generate() for k in range(K)}
    for k in range(K):
        r = env["http"].post("/v1/jobs/job-a/join", headers=h(env, k),
                             json={"identity_key": bytes(keys[k].verify_key).hex()})
        assert r.status_code == 200, r.text
        info = r.json()
    config = JobConfig.from_json(json.dumps(info["config"]))
    d = env["http"].get("/v1/jobs/job-a/directory", headers=h(env, 0)).json()
    assert d["complete"]
    directory = {int(i): bytes.fromhex(v) for i, v in d["keys"].items()}
    return config, {k: SecAggClient(k, "job-a", keys[k], directory, n_clients=K,
                                    threshold=config.profile["threshold"],
                                    neighbours=config.profile.get("neighbours"),
                                    min_survivors=unmask_floor(config)) for k in range(K)}


def offer(env: dict, k: int) -> dict:
    return env["http"].get("/v1/jobs/job-a/secagg", headers=h(env, k)).json()


def post(env: dict, k: int, r: int, kind: str, body: str):
    return env["http"].post(f"/v1/jobs/job-a/rounds/{r}/secagg/{kind}", headers={
        **h(env, k), "Content-Type": "application/json"}, content=body.encode())


def first_round(env: dict, config: JobConfig) -> tuple[Task, dict[int, np.ndarray], dict]:
    o = offer(env, 0)
    assert o["status"] == "task" and o["action"] == "advert"
    r = o["round_id"]
    task = Task.from_bytes(env["http"].get(f"/v1/jobs/job-a/rounds/{r}/task",
                                           headers=h(env, 0)).content)
    vectors, replies = {}, {}
    for k in range(K):
        X, y = env["parts"][k]
        w = Worker(config, X, y, client_index=k, seed=client_seed(config, k))
        replies[k] = w.handle(task)
        vectors[k] = encode_contribution(config, task, replies[k])
    return task, vectors, replies


def run_until_upload(env: dict, sa: dict[int, SecAggClient], r: int) -> None:
    for k in range(K):
        assert post(env, k, r, "advert", sa[k].advertise(r).model_dump_json()).status_code == 200
    for k in range(K):
        o = offer(env, k)
        assert o["action"] == "share", o
        bundle = sa[k].share_keys(parse(RoundSetup, o["message"]))
        assert post(env, k, r, "shares", bundle.model_dump_json()).status_code == 200


def upload(env: dict, sa: dict, k: int, task: Task, vec: np.ndarray):
    o = offer(env, k)
    assert o["action"] == "upload", o
    header, masked = sa[k].mask(parse(ShareDelivery, o["message"]), vec)
    body = make_upload(task, masked, {}, secagg=header.model_dump_json())
    return env["http"].post(f"/v1/jobs/job-a/rounds/{task.round_id}/upload", content=body,
                            headers={**h(env, k), "Content-Type": "application/octet-stream"})


def sign(env: dict, sa: dict, k: int, r: int):
    o = offer(env, k)
    assert o["action"] == "sign", o
    signature = sa[k].sign_survivors(parse(SurvivorSet, o["message"]))
    return post(env, k, r, "signature", signature.model_dump_json())


def unmask(env: dict, sa: dict, k: int, r: int):
    o = offer(env, k)
    assert o["action"] == "unmask", o
    resp = sa[k].unmask(parse(UnmaskRequest, o["message"]), next_advert=sa[k].advertise(r + 1))
    return post(env, k, r, "unmask", resp.model_dump_json())


def aggregate(env: dict, r: int) -> np.ndarray:
    with env["db"].session() as s:
        rr = s.get(RoundRow, ("job-a", r))
        assert rr is not None and rr.status == "closed"
        return np.frombuffer(rr.aggregate, dtype="<f8").copy()


def test_join_of_a_secure_job_needs_an_identity_key(env: dict) -> None:
    r = env["http"].post("/v1/jobs/job-a/join", headers=h(env, 0))
    assert r.status_code == 400 and r.json()["error"] == "identity_required"
    r = env["http"].post("/v1/jobs/job-a/join", headers=h(env, 0), json={"identity_key": "zz"})
    assert r.status_code == 400
    key = SigningKey.generate()
    body = {"identity_key": bytes(key.verify_key).hex()}
    assert env["http"].post("/v1/jobs/job-a/join", headers=h(env, 0), json=body).status_code \
        == 200
    other = {"identity_key": bytes(SigningKey.generate().verify_key).hex()}
    r = env["http"].post("/v1/jobs/job-a/join", headers=h(env, 0), json=other)
    assert r.status_code == 409 and r.json()["error"] == "identity_mismatch"



def test_a_join_with_another_sites_identity_key_is_refused(env: dict) -> None:
    """Two sites of a job with one identity key (a state directory copied from another site)
    would give a directory every site refuses: the second join is refused, naming why, and
    the site stays invited."""
    body = {"identity_key": bytes(SigningKey.generate().verify_key).hex()}
    assert env["http"].post("/v1/jobs/job-a/join", headers=h(env, 0), json=body).status_code \
        == 200
    r = env["http"].post("/v1/jobs/job-a/join", headers=h(env, 1), json=body)
    assert r.status_code == 409 and r.json()["error"] == "identity_taken"
    assert "another site of this job joined with this identity key" in r.json()["detail"]
    assert "delete identity-job-a.ed25519 and table-job-a.sha256 from this site's " \
           "--state-dir" in r.json()["detail"]
    own = {"identity_key": bytes(SigningKey.generate().verify_key).hex()}
    assert env["http"].post("/v1/jobs/job-a/join", headers=h(env, 1), json=own).status_code \
        == 200  # nothing of the refused join was kept


def test_a_site_restarted_with_new_keys_for_a_finished_job_is_told_it_is_done(
        env: dict) -> None:
    """A site whose state directory is gone (its identity key with it) starts its client
    again for a job that finished: it learns the job is done (and gets its model), rather
    than that its key "cannot change mid-job"."""
    from server_app.db import JobRow

    key = {"identity_key": bytes(SigningKey.generate().verify_key).hex()}
    assert env["http"].post("/v1/jobs/job-a/join", headers=h(env, 0), json=key).status_code \
        == 200
    with env["db"].session() as sess:
        job = sess.get(JobRow, "job-a")
        assert job is not None
        job.status, job.reason = "done", "training complete"
    fresh = {"identity_key": bytes(SigningKey.generate().verify_key).hex()}
    r = env["http"].post("/v1/jobs/job-a/join", headers=h(env, 0), json=fresh)
    assert r.status_code == 200, r.text
    assert env["http"].get("/v1/jobs/job-a/secagg", headers=h(env, 0)).json()["status"] \
        == "done"


def all_uploaded(env: dict) -> tuple[JobConfig, dict[int, SecAggClient], Task,
                                     dict[int, np.ndarray]]:
    """The first round up to its consistency step: every client uploaded."""
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    run_until_upload(env, sa, task.round_id)
    for k in range(K):
        assert upload(env, sa, k, task, vecs[k]).status_code == 200
    return config, sa, task, vecs


def test_a_full_secure_round_over_the_api_gives_the_plain_sum(env: dict) -> None:
    config, sa, task, vecs = all_uploaded(env)
    r = task.round_id
    for k in range(K):  # the consistency step: one request more per client
        assert sign(env, sa, k, r).status_code == 200
    for k in range(K):
        assert unmask(env, sa, k, r).status_code == 200
    want = make_codec(config, task).decode(sum(vecs.values(), np.zeros_like(vecs[0])))
    assert np.array_equal(aggregate(env, r), want)
    # steady state: the next round's adverts rode on the unmask responses
    o = offer(env, 0)
    assert o["round_id"] == r + 1 and o["action"] == "share"



def test_a_secure_round_whose_sum_no_honest_sites_can_make_fails_the_job_and_releases_nothing(
        env: dict) -> None:
    """A malicious site adds 2^63 to every word of its encoded upload before masking: the
    masks cancel and the unmasked sum is out of every honest range (counts at -9.2e18). The
    job fails at that round with the reason; no aggregate is stored, no next round issued."""
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    for k in range(K):
        vec = vecs[k] + np.uint64(2**63) if k == 1 else vecs[k]
        assert upload(env, sa, k, task, vec).status_code == 200
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200
    for k in range(K):
        assert unmask(env, sa, k, r).status_code == 200
    o = offer(env, 0)
    assert o["status"] == "failed", o
    assert o["detail"].startswith(f"round {r}: the aggregate lies outside what {K} sites' "
                                  "encodings can sum to (entry 0: value -9.22"), o
    assert "a site sent values outside the codec's range; training stopped and no aggregate " \
        "was released" in o["detail"], o
    with env["db"].session() as s:
        job = s.get(JobRow, "job-a")
        assert job is not None and job.status == "failed" and job.model_json is None
        rr = s.get(RoundRow, ("job-a", r))
        assert rr is not None and rr.aggregate is None and rr.status != "closed"
        assert s.get(RoundRow, ("job-a", r + 1)) is None  # no next round was issued

def test_a_secagg_plus_round_over_the_api_routes_shares_between_neighbours_only(
        env_plus: dict) -> None:
    env = env_plus
    config, sa = join_all(env)
    assert config.profile["neighbours"] == 2
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    for k in range(K):
        assert post(env, k, r, "advert", sa[k].advertise(r).model_dump_json()).status_code == 200
    for k in range(K):
        setup = parse(RoundSetup, offer(env, k)["message"])
        assert setup.neighbours == 2  # the graph of the job's profile, announced to everyone
        # each client gets the roster's ids and its own group's adverts (itself and 2 others)
        assert setup.roster == tuple(range(K)) and len(setup.adverts) == 3
        assert k in {a.client_id for a in setup.adverts}
        assert post(env, k, r, "shares", sa[k].share_keys(setup).model_dump_json()
                    ).status_code == 200
    for k in range(K):
        delivery = parse(ShareDelivery, offer(env, k)["message"])
        assert len(delivery.ciphertexts) == 2 and k not in delivery.ciphertexts
        assert upload(env, sa, k, task, vecs[k]).status_code == 200
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200
    for k in range(K):
        assert unmask(env, sa, k, r).status_code == 200
    want = make_codec(config, task).decode(sum(vecs.values(), np.zeros_like(vecs[0])))
    assert np.array_equal(aggregate(env, r), want)


def test_every_client_of_a_phase_gets_the_one_serialised_broadcast(env: dict) -> None:
    """The setup, survivor set and unmask request go to every client: the server makes their
    JSON once per round, not once per client (O(K) work for an O(K) message, not O(K^2))."""
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    for k in range(K):
        assert post(env, k, r, "advert", sa[k].advertise(r).model_dump_json()).status_code == 200
    sr = env["state"].runtimes.get("job-a").secure.current
    made = [sr.action_for(k)[1] for k in range(K)]
    assert made[0] is not None and all(m is made[0] for m in made)


def test_bad_secagg_messages_are_rejected_and_change_nothing(env: dict) -> None:
    config, sa = join_all(env)
    task, _, _ = first_round(env, config)
    r = task.round_id
    adv = sa[1].advertise(r).model_dump_json()
    assert post(env, 0, r, "advert", adv).status_code == 403  # names another client
    assert post(env, 0, r, "advert", "{not json").status_code == 400
    assert post(env, 0, r, "shares", "{}").status_code == 400
    forged = json.loads(sa[0].advertise(r).model_dump_json())
    forged["mask_key"] = forged["enc_key"]  # breaks the signature
    assert post(env, 0, r, "advert", json.dumps(forged)).json()["error"] == "invalid_message"
    assert offer(env, 0)["action"] == "advert"  # still owed: nothing was accepted


def all_but_last_uploaded(env: dict) -> tuple[JobConfig, dict[int, SecAggClient], Task,
                                              dict[int, np.ndarray]]:
    """The first round's upload phase: every client shared its keys, all but K - 1 uploaded."""
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    run_until_upload(env, sa, task.round_id)
    for k in range(K - 1):
        assert upload(env, sa, k, task, vecs[k]).status_code == 200
    return config, sa, task, vecs


def last_misses_the_upload(env: dict) -> tuple[JobConfig, dict[int, SecAggClient], Task,
                                               dict[int, np.ndarray]]:
    """The first round up to its upload deadline, passed: client K - 1 shared its keys but
    never uploaded."""
    config, sa, task, vecs = all_but_last_uploaded(env)
    env["clock"].now += 31
    env["state"].tick()
    return config, sa, task, vecs


def last_misses_the_signature(env: dict) -> tuple[JobConfig, dict[int, SecAggClient], Task,
                                                  dict[int, np.ndarray]]:
    """The first round up to its signature deadline, passed: every client uploaded, client
    K - 1 never signed."""
    config, sa, task, vecs = all_uploaded(env)
    for k in range(K - 1):
        assert sign(env, sa, k, task.round_id).status_code == 200
    env["clock"].now += 31
    env["state"].tick()
    return config, sa, task, vecs


def test_a_client_missing_the_upload_deadline_is_dropped_and_its_masks_recovered(
        env: dict) -> None:
    config, sa, task, vecs = last_misses_the_upload(env)
    r = task.round_id
    assert offer(env, 3)["status"] == "dropped"
    for k in range(K - 1):
        assert sign(env, sa, k, r).status_code == 200
    for k in range(K - 1):
        assert unmask(env, sa, k, r).status_code == 200
    want = make_codec(config, task).decode(
        sum((vecs[k] for k in range(K - 1)), np.zeros_like(vecs[0])))
    assert np.array_equal(aggregate(env, r), want)


def test_a_site_dropped_after_its_upload_is_in_the_sum_and_counted_dropped_in_the_round_line(
        env: dict, caplog: pytest.LogCaptureFixture) -> None:
    """The last client uploads, then misses the signature deadline: its upload is in the sum
    (it is in the survivor set), and the round's log line counts it among the clients and
    as dropped during the round."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    config, sa, task, vecs = last_misses_the_signature(env)
    r = task.round_id
    assert offer(env, K - 1)["status"] == "dropped"
    for k in range(K - 1):
        assert unmask(env, sa, k, r).status_code == 200
    want = make_codec(config, task).decode(sum(vecs.values(), np.zeros_like(vecs[0])))
    assert np.array_equal(aggregate(env, r), want)
    lines = [x.getMessage() for x in caplog.records if x.getMessage().startswith("event=round ")]
    assert len(lines) == 1 and f" clients={K} dropped=1 " in lines[0], lines


def test_a_job_left_with_too_few_sites_after_a_round_ends_its_audit_chain_with_the_failure(
        env_all_audited: dict) -> None:
    """min_clients is every site; the last one uploads, then misses the signature deadline:
    the round's sum is released, and the job fails before the next round. The audit chain
    ends with that failure and its reason (else it would end at the round, as a chain whose
    end was cut does)."""
    env = env_all_audited
    config, sa, task, vecs = last_misses_the_signature(env)
    r = task.round_id
    for k in range(K - 1):
        assert unmask(env, sa, k, r).status_code == 200
    status = env["http"].get("/v1/jobs/job-a", headers=h(env, 0)).json()
    assert status["status"] == "failed", status
    kinds = [json.loads(line)["kind"] for line in env["audit"].export("job-a").splitlines()]
    assert kinds[-3:] == ["client_dropped", "round", "job_failed"], kinds
    last = json.loads(env["audit"].export("job-a").splitlines()[-1])
    assert last["payload"]["reason"] == (f"only {K - 1} clients remain, fewer than the "
                                         f"required {K}; training stopped")
    ok, _, problems = env["audit"].verify_chain("job-a")
    assert ok, problems


def test_a_secure_job_cancelled_mid_round_fails_for_every_site_and_releases_no_sum(
        env_all_audited: dict) -> None:
    """The operator cancels a running secure job while its round waits for two masked
    uploads: the server fails it (``fedforest server cancel-job`` records the request, the
    next full tick applies it), every site's next poll reads the reason, a late upload is
    refused, no sum is released, the chain ends with the failure and verifies, and the job's
    rounds can be pruned."""
    from server_app.cancel import CANCELLED, request_cancel
    from server_app.retention import prune

    env = env_all_audited
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    body = upload_body(env, sa, 3, task, vecs[3])
    for k in range(2):
        assert upload(env, sa, k, task, vecs[k]).status_code == 200
    request_cancel(env["db"], "job-a", env["clock"]())
    env["state"].tick(full_every=1)
    for k in range(K):
        o = offer(env, k)
        assert (o["status"], o["detail"]) == ("failed", CANCELLED), o
    late = post_upload(env, 3, r, body)
    assert late.status_code == 409 and late.json()["error"] == "job_finished", late.text
    st = env["http"].get("/v1/jobs/job-a", headers=h(env, 2)).json()
    assert (st["status"], st["reason"], st["phase"]) == ("failed", CANCELLED, None)
    with env["db"].session() as s:
        rr = s.get(RoundRow, ("job-a", r))
        assert rr is not None and rr.aggregate is None and rr.status != "closed"
    entries = [json.loads(line) for line in env["audit"].export("job-a").splitlines()]
    assert [e["kind"] for e in entries][-2:] == ["round_aborted", "job_failed"]
    assert entries[-2]["payload"] == {"round_id": r, "reason": CANCELLED}
    assert entries[-1]["payload"] == {"reason": CANCELLED}
    assert "round" not in [e["kind"] for e in entries]
    ok, _, problems = env["audit"].verify_chain("job-a", began_audited=True)
    assert ok, problems
    assert prune(env["db"], env["state"].spool, job_ids=["job-a"]).jobs == ["job-a"]


def test_a_secure_round_with_fewer_uploads_than_min_clients_releases_no_sum(
        env_all: dict) -> None:
    """min_clients may lie above t: a round with fewer masked uploads than it fails before
    anyone is asked for unmasking shares (a sum over 3 of the job's 4 required sites was
    released)."""
    env = env_all
    task = last_misses_the_upload(env)[2]
    r = task.round_id
    o = offer(env, 0)
    assert o["status"] == "failed", o
    assert "only 3 masked uploads, fewer than the job's min_clients = 4" in o["detail"]
    assert "[client-3 missed the deadline]" in o["detail"]  # who was missing, by name
    assert "no partial sum was released" in o["detail"]
    with env["db"].session() as s:
        rr = s.get(RoundRow, ("job-a", r))
        assert rr is not None and rr.aggregate is None and rr.status != "closed"
    # the failed job's aborted round is shown in no phase (it said "upload", as if running)
    st = env["http"].get("/v1/jobs/job-a", headers=h(env, 0)).json()
    assert st["status"] == "failed" and st["phase"] is None


def test_too_few_clients_left_fails_the_job_with_a_clear_reason(env: dict) -> None:
    config, sa = join_all(env)
    task, _, _ = first_round(env, config)
    r = task.round_id
    for k in range(2):  # t = ceil(0.67 * 4) = 3: two adverts are not enough
        assert post(env, k, r, "advert", sa[k].advertise(r).model_dump_json()).status_code \
            == 200
    env["clock"].now += 31
    env["state"].tick()
    o = offer(env, 0)
    assert o["status"] == "failed" and "no partial sum was released" in o["detail"]
    assert "[client-2 and client-3 missed the deadline]" in o["detail"], o["detail"]
    with env["db"].session() as s:
        assert s.get(JobRow, "job-a").status == "failed"


def corrupt_unmask(env: dict, sa: dict, k: int, r: int, owners: tuple[int, ...]):
    """``unmask``, with client ``k``'s self-mask share of each of ``owners`` moved by ``k + 1``
    (errors that differ: equal ones at x = 1 and 2 would cancel in the first 3 shares)."""
    o = offer(env, k)
    assert o["action"] == "unmask", o
    resp = sa[k].unmask(parse(UnmaskRequest, o["message"]), next_advert=sa[k].advertise(r + 1))
    shares = dict(resp.self_mask_shares)
    for owner in owners:
        shares[owner] = _shamir.to_bytes((_shamir.from_bytes(shares[owner]) + k + 1)
                                         % _shamir.PRIME)
    return post(env, k, r, "unmask",
                resp.model_copy(update={"self_mask_shares": shares}).model_dump_json())


def test_a_corrupt_unmask_share_is_routed_around_and_its_site_named(
        env: dict, caplog: pytest.LogCaptureFixture) -> None:
    """K = 4, t = 3, every site unmasks: client-0's share of client-1's self-mask seed is
    corrupt. The round closes with the exact sum and the server log names client-0."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    config, sa, task, vecs = all_uploaded(env)
    r = task.round_id
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200
    assert corrupt_unmask(env, sa, 0, r, (1,)).status_code == 200
    for k in range(1, K):
        assert unmask(env, sa, k, r).status_code == 200
    want = make_codec(config, task).decode(sum(vecs.values(), np.zeros_like(vecs[0])))
    assert np.array_equal(aggregate(env, r), want)
    lines = [x.getMessage() for x in caplog.records
             if x.getMessage().startswith("event=corrupt_shares ")]
    assert len(lines) == 1, lines
    assert "client-0 sent a corrupt share of client-1's self-mask seed" in lines[0], lines


def test_corrupt_unmask_shares_beyond_repair_fail_the_job_naming_the_sites(env: dict) -> None:
    """client-0 and client-1 both corrupt their shares of client-2's seed: no 3 of the 4 fit,
    so the job fails, no sum is released, and the status names the sites that sent them."""
    config, sa, task, _ = all_uploaded(env)
    r = task.round_id
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200
    for k in range(K):
        answer = corrupt_unmask(env, sa, k, r, (2,) if k < 2 else ())
        assert answer.status_code == 200
    o = offer(env, 0)
    assert o["status"] == "failed" and "no partial sum was released" in o["detail"]
    assert "self-mask seed of client 2 does not match its advertisement" in o["detail"]
    assert ("sites whose shares may be corrupt: client-0, client-1, client-2, client-3"
            in o["detail"]), o["detail"]


def test_an_aborted_round_names_the_sites_that_refused_and_those_that_missed_the_deadline(
        env: dict[str, Any]) -> None:
    """client-1 refuses the round (it stopped), client-3 never answers: with two adverts of
    the t = 3 needed the round aborts at the deadline, and its reason names both, each with
    what it did."""
    config, sa = join_all(env)
    task, _, _ = first_round(env, config)
    r = task.round_id
    assert env["http"].post(f"/v1/jobs/job-a/rounds/{r}/secagg/refuse", headers=h(env, 1),
                            json={"reason": "stopped"}).status_code == 200
    for k in (0, 2):
        assert post(env, k, r, "advert", sa[k].advertise(r).model_dump_json()).status_code \
            == 200
    env["clock"].now += 31
    env["state"].tick()
    o = offer(env, 0)
    assert o["status"] == "failed", o
    assert (f"round {r}: secure aggregation aborted in phase advertise: only 2 clients "
            "advertised keys" in o["detail"]), o["detail"]
    assert "[client-1 refused (stopped); client-3 missed the deadline]" in o["detail"], o


def test_a_refusal_is_recorded_and_surfaces_in_the_job_status(env: dict) -> None:
    config, sa = join_all(env)
    task, _, _ = first_round(env, config)
    r = task.round_id
    free = env["http"].post(f"/v1/jobs/job-a/rounds/{r}/secagg/refuse", headers=h(env, 1),
                            json={"reason": "refusing both shares of client 0"})
    assert free.status_code == 422  # a refusal is a code from the fixed list, not free text
    other = env["http"].post(f"/v1/jobs/job-a/rounds/{r + 1}/secagg/refuse", headers=h(env, 1),
                             json={"reason": "both_shares"})
    assert other.status_code == 409  # only for the open round
    for k in (1, 2):
        r2 = env["http"].post(f"/v1/jobs/job-a/rounds/{r}/secagg/refuse", headers=h(env, k),
                              json={"reason": "both_shares"})
        assert r2.status_code == 200
    o = offer(env, 1)
    assert o["status"] == "dropped"
    for k in (0, 3):
        post(env, k, r, "advert", sa[k].advertise(r).model_dump_json())
    o = offer(env, 0)
    assert o["status"] == "failed" and "refused" in o["detail"], o
    assert "both_shares" in o["detail"]


def refuse(env: dict, k: int, r: int, body: dict[str, Any]):
    return env["http"].post(f"/v1/jobs/job-a/rounds/{r}/secagg/refuse", headers=h(env, k),
                            json=body)


def test_a_well_formed_refusal_in_an_open_job_is_refused(tmp_path: Path, tiny_parts, job_dir,
                                                        db_url: str) -> None:
    """A refusal with a valid reason code in an open job (no secure aggregation) is a 409
    ``not_secure``: nothing to refuse there."""
    for env in _env(tmp_path, tiny_parts, job_dir, db_url, "open"):
        for k in range(K):
            assert env["http"].post("/v1/jobs/job-a/join", headers=h(env, k)).status_code == 200
        res = refuse(env, 1, 0, {"reason": "both_shares"})
        assert res.status_code == 409 and res.json()["error"] == "not_secure", res.text


def test_a_site_outside_the_round_can_neither_refuse_nor_accuse(env: dict) -> None:
    """A site that left the round (its own refusal) is no member of it: a second refusal,
    accusing a peer, is a 403 ``not_participant`` and names nobody."""
    config, sa = join_all(env)
    task, _, _ = first_round(env, config)
    r = task.round_id
    assert refuse(env, 3, r, {"reason": "stopped"}).status_code == 200
    res = refuse(env, 3, r, {"reason": "invalid_message", "accused": 0})
    assert res.status_code == 403 and res.json()["error"] == "not_participant", res.text
    st = env["http"].get("/v1/jobs/job-a", headers=h(env, 0)).json()
    assert "accus" not in str(st.get("reason")), st


def test_refusals_accusing_a_peer_are_audited_and_the_abort_names_the_accused(
        env_all_audited: dict) -> None:
    """A malicious client-0 sent share ciphertexts that do not authenticate: the three honest
    sites refuse the round naming it (code invalid_message, ``accused`` its index). Their
    ``client_dropped`` entries and the round's abort reason name client-0 and how many sites
    accused it, so the operator sees whom to exclude; before, the log named only the honest
    sites, as the ones that refused. An accusation of a site outside the round is a 400."""
    env = env_all_audited
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    assert upload(env, sa, 0, task, vecs[0]).status_code == 200  # the attacker uploads
    for bad in (7, 1):  # no such participant; the refusing site itself
        res = refuse(env, 1, r, {"reason": "invalid_message", "accused": bad})
        assert res.status_code == 400 and res.json()["error"] == "invalid_accusation", res.text
    for bad_body in ({"reason": "stopped", "accused": 0},  # an accusation needs its code
                     {"reason": "invalid_message", "accused": -1},
                     {"reason": "invalid_message", "accused": "client-0"}):
        assert refuse(env, 1, r, bad_body).status_code == 422, bad_body
    assert offer(env, 1)["action"] == "upload"  # the rejected refusals changed nothing
    for k in (1, 2, 3):
        res = refuse(env, k, r, {"reason": "invalid_message", "accused": 0})
        assert res.status_code == 200, res.text
    st = env["http"].get("/v1/jobs/job-a", headers=h(env, 0)).json()
    assert st["status"] == "failed", st
    assert "[client-1 refused (invalid_message, accusing client-0); client-2 refused " \
        "(invalid_message, accusing client-0); client-3 refused (invalid_message, accusing " \
        "client-0)]; accused by the sites that refused: client-0 (3 sites)" in st["reason"], st
    entries = [json.loads(line) for line in env["audit"].export("job-a").splitlines()]
    drops = [e["payload"] for e in entries if e["kind"] == "client_dropped"]
    assert drops == [{"client": f"client-{k}", "round_id": r, "accused": "client-0",
                      "reason": "refused: invalid_message (client-0's message did not "
                                "authenticate)"} for k in (1, 2, 3)]
    aborted = [e["payload"] for e in entries if e["kind"] == "round_aborted"]
    assert aborted == [{"round_id": r, "reason": st["reason"]}]
    ok, _, problems = env["audit"].verify_chain("job-a")
    assert ok, problems


def test_accusations_survive_a_server_restart_into_the_abort_reason(env_all: dict) -> None:
    env = env_all
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    assert upload(env, sa, 2, task, vecs[2]).status_code == 200
    for k in (0, 1):
        assert refuse(env, k, r, {"reason": "invalid_message", "accused": 2}).status_code == 200
    restart(env)
    assert refuse(env, 3, r, {"reason": "invalid_message", "accused": 0}).status_code == 200
    o = offer(env, 2)
    assert o["status"] == "failed", o
    assert "accused by the sites that refused: client-2 (2 sites), client-0 (1 site)" \
        in o["detail"], o["detail"]


def test_an_accusation_stops_the_round_the_other_sites_would_finish(env: dict) -> None:
    """client-1 refuses accusing client-0 and the three others upload (three is the job's t):
    the round aborts once its upload phase closes, also across a server restart between the
    accusation and the uploads, so a site spoiling the shares of one chosen peer cannot have
    the job go on without it."""
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    assert refuse(env, 1, r, {"reason": "invalid_message", "accused": 0}).status_code == 200
    restart(env)
    for k in (0, 2, 3):
        res = upload(env, sa, k, task, vecs[k])
        assert res.status_code in (200, 409), res.text
    o = offer(env, 2)
    assert o["status"] == "failed", o
    assert "accused by the sites that refused: client-0 (1 site)" in o["detail"], o["detail"]


def test_an_accusation_at_unmask_stops_the_round_before_its_sum(env: dict) -> None:
    """An accusation in the unmask phase, after the three others revealed their shares, stops
    the round before its sum."""
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    for k in range(K):
        assert upload(env, sa, k, task, vecs[k]).status_code == 200
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200
    for k in (0, 2, 3):
        assert unmask(env, sa, k, r).status_code == 200
    assert refuse(env, 1, r, {"reason": "invalid_message", "accused": 0}).status_code == 200
    o = offer(env, 0)
    assert o["status"] == "failed", o
    assert "accused by the sites that refused: client-0 (1 site)" in o["detail"], o["detail"]
    with env["db"].session() as sess:  # no sum of the round was stored
        rr = sess.get(RoundRow, ("job-a", r))
        assert rr is not None and rr.status != "closed" and rr.aggregate is None


def test_a_refusal_that_accuses_nobody_drops_only_the_refuser(env: dict) -> None:
    """A site that refuses without accusing a peer leaves; the round goes on with the three
    others (the job's t) and its sum comes out."""
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    assert refuse(env, 1, r, {"reason": "invalid_message"}).status_code == 200
    for step in (upload, sign, unmask):
        for k in (0, 2, 3):
            args = (task, vecs[k]) if step is upload else (r,)
            assert step(env, sa, k, *args).status_code == 200  # type: ignore[operator]
    total = aggregate(env, r)
    assert total.size > 0
    assert offer(env, 0)["status"] != "failed"


def test_a_refusal_sent_again_is_answered_as_recorded_while_its_round_is_open_and_closed(
        env_audited: dict) -> None:
    """client-1's refusal is recorded but its answer is lost on the way, and the client sends
    it again: while the round is open, and after the round closed without it, the server
    answers it as it did the first time (``duplicate`` true, with the chain's tip, past the
    site's drop), and the audit log holds the one drop. Another refusal of the round by the
    site it dropped is still a 403."""
    env = env_audited
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    first = refuse(env, 1, r, {"reason": "stopped"})
    assert first.status_code == 200 and first.json()["recorded"] is True, first.text
    again = refuse(env, 1, r, {"reason": "stopped"})
    assert again.status_code == 200, again.text
    assert again.json() == {**first.json(), "duplicate": True}
    assert first.json()["duplicate"] is False
    other = refuse(env, 1, r, {"reason": "failed"})
    assert other.status_code == 403 and other.json()["error"] == "not_participant", other.text
    for step in (upload, sign, unmask):
        for k in (0, 2, 3):
            args = (task, vecs[k]) if step is upload else (r,)
            assert step(env, sa, k, *args).status_code == 200  # type: ignore[operator]
    assert aggregate(env, r).size > 0  # the round closed without client-1
    late = refuse(env, 1, r, {"reason": "stopped"})
    assert late.status_code == 200, late.text
    assert late.json()["recorded"] is True and late.json()["duplicate"] is True
    assert late.json()["audit_seq"] > first.json()["audit_seq"]  # the round's entries since
    entries = [json.loads(line) for line in env["audit"].export("job-a").splitlines()]
    assert [e["payload"] for e in entries if e["kind"] == "client_dropped"] == [
        {"client": "client-1", "round_id": r, "reason": "refused: stopped"}]
    ok, _, problems = env["audit"].verify_chain("job-a")
    assert ok, problems


def restart(env: dict) -> None:
    """What a killed and restarted server process has: a new engine, state and app over the
    same database file, and nothing of the old process's memory."""
    db = Database(env["db"].url)
    env.setdefault("extra_dbs", []).append(db)
    env["state"] = ServerState(db, NullAudit(), clock=env["wall"], monotonic=env["clock"],
                               spool=env["state"].spool)
    env["http"] = TestClient(create_app(db, state=env["state"], tick_seconds=3600))


def upload_body(env: dict, sa: dict, k: int, task: Task, vec: np.ndarray) -> bytes:
    o = offer(env, k)
    assert o["action"] == "upload", o
    header, masked = sa[k].mask(parse(ShareDelivery, o["message"]), vec.copy())
    return make_upload(task, masked, {}, secagg=header.model_dump_json())


def post_upload(env: dict, k: int, r: int, body: bytes):
    return env["http"].post(f"/v1/jobs/job-a/rounds/{r}/upload", content=body, headers={
        **h(env, k), "Content-Type": "application/octet-stream"})


@pytest.mark.parametrize(("phase", "spool"), [("share", False), ("upload", False),
                                              ("sign", False), ("unmask", False),
                                              ("unmask", True)])
def test_a_restarted_server_resumes_the_open_secure_round(env: dict, phase: str, spool: bool,
                                                          tmp_path: Path) -> None:
    if spool:  # masked uploads wait in files beside the database instead of in a table
        env["state"].spool = tmp_path / "server.db.spool"
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    half = K // 2
    for k in range(K):
        assert post(env, k, r, "advert", sa[k].advertise(r).model_dump_json()).status_code == 200
    setups = {k: offer(env, k)["message"] for k in range(K)}
    bundles = {}
    for k in range(K):
        if phase == "share" and k == half:
            restart(env)
            assert {k2: offer(env, k2)["message"] for k2 in range(half, K)} == \
                {k2: setups[k2] for k2 in range(half, K)}  # the same roster, signed adverts
        if phase == "share" and k >= half:
            assert offer(env, 0)["action"] == "wait"  # its bundle survived the restart
        bundles[k] = sa[k].share_keys(parse(RoundSetup, setups[k])).model_dump_json()
        assert post(env, k, r, "shares", bundles[k]).status_code == 200
    bodies = {}
    for k in range(K):
        if phase == "upload" and k == half:
            restart(env)
        bodies[k] = upload_body(env, sa, k, task, vecs[k])
        assert post_upload(env, k, r, bodies[k]).status_code == 200
    survivor_set = offer(env, K - 1)["message"]
    for k in range(K):
        if phase == "sign" and k == half:
            restart(env)
            assert offer(env, K - 1)["message"] == survivor_set  # the same survivors to sign
        assert sign(env, sa, k, r).status_code == 200
    request = offer(env, K - 1)["message"]
    for k in range(K):
        if phase == "unmask" and k == half:
            restart(env)
            assert offer(env, K - 1)["message"] == request  # the same survivors and dropped
        assert unmask(env, sa, k, r).status_code == 200
    want = make_codec(config, task).decode(sum(vecs.values(), np.zeros_like(vecs[0])))
    assert np.array_equal(aggregate(env, r), want)
    o = offer(env, 0)  # the adverts that rode on the unmask responses survived too
    assert o["round_id"] == r + 1 and o["action"] == "share", o
    if spool:
        assert sorted(p.name for p in (tmp_path / "server.db.spool" / "job-a" / str(r)).iterdir()
                      ) == [f"{k}.u64" for k in range(K)]
        env["state"].tick()  # the closed round's masked vectors are removed
        assert not (tmp_path / "server.db.spool" / "job-a" / str(r)).exists()


def test_a_retry_after_a_restart_is_idempotent_and_a_changed_message_conflicts(
        env: dict) -> None:
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    adverts = {k: sa[k].advertise(r).model_dump_json() for k in range(K)}
    for k in range(K):
        assert post(env, k, r, "advert", adverts[k]).status_code == 200
    bundle0 = sa[0].share_keys(parse(RoundSetup, offer(env, 0)["message"])).model_dump_json()
    assert post(env, 0, r, "shares", bundle0).json()["duplicate"] is False
    restart(env)  # as if the server died before its answer reached client 0, which retries
    assert post(env, 0, r, "shares", bundle0).json() == {
        "job_id": "job-a", "round_id": r, "accepted": "shares", "duplicate": True}
    assert post(env, 0, r, "advert", adverts[0]).json()["duplicate"] is True
    changed = post(env, 0, r, "shares", bundle0.replace(",", ", ", 1))
    assert changed.status_code == 409 and changed.json()["error"] == "conflicting_message"
    for k in range(1, K):
        bundle = sa[k].share_keys(parse(RoundSetup, offer(env, k)["message"]))
        assert post(env, k, r, "shares", bundle.model_dump_json()).status_code == 200
    body = upload_body(env, sa, 0, task, vecs[0])
    assert post_upload(env, 0, r, body).json()["duplicate"] is False
    restart(env)
    assert post_upload(env, 0, r, body).json()["duplicate"] is True
    assert offer(env, 0)["action"] == "wait"  # counted once: nothing more is owed


def test_a_passed_deadline_is_applied_by_the_next_request_without_a_tick(env: dict) -> None:
    """Requests skip the deadline query while no deadline can have passed (a cached lower
    bound); once the clock passes it, the next request applies it (the ticker is idle here)."""
    all_but_last_uploaded(env)
    env["clock"].now += 29  # not yet: nothing happens, and no client is dropped
    assert offer(env, 3)["action"] == "upload"
    env["clock"].now += 2
    assert offer(env, 0)["action"] == "sign"  # the deadline moved the round on...
    assert offer(env, 3)["status"] == "dropped"  # ...and dropped the late client


def outage_during_the_upload(env: dict) -> tuple[dict[int, SecAggClient], Task, bytes]:
    """The first round's upload phase: every client but K - 1 uploaded; then the server's
    database is down for 40 s (the round deadline is 30 s) while client K - 1 tries to upload
    (a 503) and the tick fails; returns client K - 1's upload."""
    _config, sa, task, vecs = all_but_last_uploaded(env)
    r = task.round_id
    body = upload_body(env, sa, K - 1, task, vecs[K - 1])
    failing = TestClient(env["http"].app, raise_server_exceptions=False)
    with database_down(env["db"]):
        env["clock"].now += 5
        res = failing.post(f"/v1/jobs/job-a/rounds/{r}/upload", content=body,
                           headers={**h(env, K - 1), "Content-Type": "application/octet-stream"})
        assert res.status_code == 503 and res.json()["error"] == "database_unavailable"
        with pytest.raises(OperationalError):
            env["state"].tick()
        env["clock"].now += 35  # the round's deadline passed during the outage
    return sa, task, body


def test_a_database_outage_longer_than_the_deadline_drops_no_client(
        env: dict, caplog: pytest.LogCaptureFixture) -> None:
    """The server's database is down for longer than the round deadline while a client tries
    to upload: as after a restart, the open phase's deadline runs again from when the database
    answered, so the client that retried is not dropped and the round goes on with all."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    sa, task, body = outage_during_the_upload(env)
    r = task.round_id
    assert offer(env, 0)["action"] == "wait"  # the first request after the outage drops no one
    assert "event=database_available unreachable_s=35 " in caplog.text
    env["state"].tick()  # nor the first tick
    env["clock"].now += 29
    env["state"].tick()
    assert offer(env, K - 1)["action"] == "upload"  # still owed, not dropped
    res = post_upload(env, K - 1, r, body)
    assert res.status_code == 200, res.text
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200


def test_a_full_round_deadline_after_a_database_outage_a_silent_client_is_dropped(
        env: dict) -> None:
    """The deadline a database outage re-arms still applies: a client that does not upload
    within a full round deadline after the database answered again is dropped."""
    _sa, _task, _body = outage_during_the_upload(env)
    env["state"].tick()  # the database answers: the deadline runs again from now
    env["clock"].now += 31
    env["state"].tick()
    assert offer(env, K - 1)["status"] == "dropped"
    assert offer(env, 0)["action"] == "sign"


def test_a_server_stalled_longer_than_the_deadline_drops_no_client(
        env: dict, caplog: pytest.LogCaptureFixture) -> None:
    """The server process stalls (paused, a suspended VM) for 40 s of the upload phase (the
    round deadline is 30 s) while client K - 1's upload waits in its socket queue: its
    heartbeat is 40 s late, so the open phase's deadline runs again from when it runs again,
    and the upload that waited is taken."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    _config, sa, task, vecs = all_but_last_uploaded(env)
    r = task.round_id
    body = upload_body(env, sa, K - 1, task, vecs[K - 1])
    deadlines = env["state"].core.deadlines
    deadlines.beat(0.5)  # the serving process beats every tick...
    env["clock"].now += 5  # (a gap of 5 s is no stall)
    deadlines.beat(0.5)
    env["clock"].now += 40  # ...and then did not run for 40 s
    res = post_upload(env, K - 1, r, body)  # the first request after the stall
    assert res.status_code == 200, res.text
    assert [m for m in caplog.messages if "server_stalled" in m] == [
        "event=server_stalled stalled_s=40 deadlines=\"the open rounds' deadlines run again "
        "from now\""]
    assert "event=drop" not in caplog.text
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200


def test_a_full_round_deadline_after_a_stall_a_silent_client_is_dropped(env: dict) -> None:
    """The deadline a stall re-arms still applies: a client that does not upload within a
    full round deadline after the server ran again is dropped."""
    all_but_last_uploaded(env)
    deadlines = env["state"].core.deadlines
    deadlines.beat(0.5)
    env["clock"].now += 40
    env["state"].tick()  # the first tick after the stall drops no one...
    assert offer(env, K - 1)["action"] == "upload"
    for _ in range(31):  # ...but a full deadline after it, the server running (beating)
        env["clock"].now += 1
        deadlines.beat(0.5)
    env["state"].tick()
    assert offer(env, K - 1)["status"] == "dropped"
    assert offer(env, 0)["action"] == "sign"


def test_the_first_tick_of_a_server_whose_lease_was_taken_changes_nothing(
        env: dict, db_url: str) -> None:
    """A server paused past its lease and past the round deadline, whose database another
    server took over: its first act when it runs again may be its deadline tick, with the
    deadline it knew passed. The tick's step is rolled back (LeaseLost): no site is dropped,
    and the round stays open for the server that took over."""
    import time

    from server_app.db import MemberRow
    from server_app.lease import LEASE_S, LeaseLost, ServerLease

    lease = ServerLease(env["db"], 1)
    lease.acquire()
    lease.keep(lambda err: None)
    _config, _sa, task, _vecs = all_but_last_uploaded(env)
    env["clock"].now += 31  # the upload phase's deadline passed
    other = ServerLease(Database(db_url), 9, clock=lambda: time.time() + LEASE_S + 1)
    other.acquire()
    with pytest.raises(LeaseLost, match="^another server .* took this database over"):
        env["state"].tick()
    with env["db"].session() as sess:
        assert {m.state for m in sess.query(MemberRow)} == {"active"}
        rr = sess.get(RoundRow, ("job-a", task.round_id))
        assert rr is not None and (rr.status, rr.phase) == ("open", "upload")
    lease.release()
    other.db.dispose()


def test_a_refusal_reason_with_a_nul_character_is_refused_and_changes_nothing(
        env: dict) -> None:
    """PostgreSQL text cannot hold NUL: a reason carrying one is refused at the boundary (a
    reason is one of the refusal codes) before anything is stored, on every backend."""
    config, _sa = join_all(env)
    task, _, _ = first_round(env, config)
    for reason in ("bad\u0000reason\u0007", "\u0000" * 5, "other\u0000"):
        r = env["http"].post(f"/v1/jobs/job-a/rounds/{task.round_id}/secagg/refuse",
                             headers=h(env, 1), json={"reason": reason})
        assert r.status_code == 422, r.text
    assert offer(env, 1)["status"] == "task"  # still a member, nothing recorded


def test_a_client_that_answered_the_open_phase_waits_from_memory_until_it_closes(
        env: dict) -> None:
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    cache = TokenCache(env["db"])
    rows = {k: cache(env["tokens"][k]) for k in range(K)}
    answered = env["state"].secagg_answered
    assert not answered(rows[0], "job-a")  # no offer seen yet: asks the database
    for k in range(K):
        assert post(env, k, r, "advert", sa[k].advertise(r).model_dump_json()).status_code == 200
    for k in range(K - 1):
        o = offer(env, k)
        assert o["action"] == "share"
        bundle = sa[k].share_keys(parse(RoundSetup, o["message"]))
        assert post(env, k, r, "shares", bundle.model_dump_json()).status_code == 200
    assert all(answered(rows[k], "job-a") for k in range(K - 1))
    assert not answered(rows[K - 1], "job-a")  # it owes its shares
    # a step holding the server's lock may be moving the round on: no answer from memory then
    holder_in, release = threading.Event(), threading.Event()

    def hold() -> None:
        with env["state"].core.lock:
            holder_in.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    holder_in.wait(10)
    try:
        assert not answered(rows[0], "job-a")
    finally:
        release.set()
        holder.join()
    assert answered(rows[0], "job-a")
    # a long poll of a client that answered waits, then says so (one full offer at the end)
    o = env["http"].get("/v1/jobs/job-a/secagg", params={"wait": 0.3}, headers=h(env, 0))
    assert o.json()["status"] == "wait"
    last = offer(env, K - 1)
    bundle = sa[K - 1].share_keys(parse(RoundSetup, last["message"]))
    assert post(env, K - 1, r, "shares", bundle.model_dump_json()).status_code == 200
    # the share phase closed: everyone owes its upload
    assert not any(answered(rows[k], "job-a") for k in range(K))
    assert offer(env, 0)["action"] == "upload"
    for k in range(K - 1):  # the last client never uploads and is dropped at the deadline
        assert upload(env, sa, k, task, vecs[k]).status_code == 200
    assert answered(rows[0], "job-a")
    env["clock"].now += 31
    env["state"].tick()
    assert not answered(rows[K - 1], "job-a")
    assert offer(env, K - 1)["status"] == "dropped"
    assert not answered(rows[0], "job-a")  # the survivor set is out: it owes a signature


@pytest.fixture()
def env_narrow(tmp_path: Path, job_dir, db_url: str,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """A secure regression job whose coordinator names a 2-bit count lane for its grids: too
    narrow for their pooled counts."""
    from fedforest_secure import coordinator

    rng = np.random.default_rng(5)
    parts = []
    for _ in range(K):
        X = rng.normal(size=(40, 4)).round(3)
        parts.append((X, (X[:, 0] + rng.normal(scale=0.2, size=40)).round(3)))
    monkeypatch.setattr(coordinator, "root_lane_bits", lambda *args: 2)
    yield from _env(tmp_path, (parts, [f"x{j}" for j in range(4)]), job_dir, db_url, "secure")


def test_a_packed_sum_whose_count_lane_wrapped_fails_the_job_and_releases_nothing(
        env_narrow: dict) -> None:
    env = env_narrow
    config, sa = join_all(env)
    workers = [Worker(config, *env["parts"][k], client_index=k, seed=client_seed(config, k))
               for k in range(K)]
    for step in range(2):  # the roots' totals, then their first grid (packed)
        o = offer(env, 0)
        r = o["round_id"]
        task = Task.from_bytes(env["http"].get(f"/v1/jobs/job-a/rounds/{r}/task",
                                               headers=h(env, 0)).content)
        vecs = {k: encode_contribution(config, task, workers[k].handle(task)) for k in range(K)}
        if step == 0:
            run_until_upload(env, sa, r)
        else:
            assert task.params["pack"] == 2 and make_codec(config, task).packing is not None
            for k in range(K):
                o = offer(env, k)
                assert o["action"] == "share", o
                bundle = sa[k].share_keys(parse(RoundSetup, o["message"]))
                assert post(env, k, r, "shares", bundle.model_dump_json()).status_code == 200
        for k in range(K):
            assert upload(env, sa, k, task, vecs[k]).status_code == 200
        for k in range(K):
            assert sign(env, sa, k, r).status_code == 200
        for k in range(K):
            assert unmask(env, sa, k, r).status_code == 200
    o = offer(env, 0)
    assert o["status"] == "failed", o
    assert "could not be decoded" in o["detail"] and "lane wrapped" in o["detail"], o
    with env["db"].session() as s:
        rr = s.get(RoundRow, ("job-a", r))
        assert rr is not None and rr.aggregate is None  # no aggregate was released


def test_an_error_of_a_database_that_answers_is_no_outage(env: dict) -> None:
    """A statement that fails on a database that answers (SQLite's missing table here; a lock,
    a full disk alike) moves no deadline and is not logged as an outage: the database answers
    a fresh connection's probe."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError, OperationalError

    db, deadlines = env["db"], env["state"].core.deadlines
    with pytest.raises(DBAPIError), db.session() as sess:  # SQLite: OperationalError
        sess.execute(text("SELECT * FROM no_such_table"))
    assert deadlines.unreachable_since is None
    with database_down(db):
        with pytest.raises(OperationalError), db.session() as sess:
            sess.execute(text("SELECT 1"))
        assert deadlines.unreachable_since is not None


@pytest.mark.parametrize("rides_on", ["upload", "unmask"])
def test_a_next_rounds_low_order_advert_riding_on_a_message_is_refused(
        env: dict, rides_on: str) -> None:
    """A site attaches, to its masked upload or its unmask response, a signed advert for the
    next round whose masking key is a low-order point (every peer's key agreement with it
    fails). The message is a 400 naming the key, as the same advert sent on its own is, and
    never a 5xx: the advert is not kept for the next round, whose opening would fail on it."""
    from fedforest_secure.secagg._rounds import advert_payload

    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r, k = task.round_id, K - 1
    run_until_upload(env, sa, r)
    nxt = sa[k].advertise(r + 1).model_copy(update={"mask_key": bytes(32)})
    payload = advert_payload("job-a", r + 1, k, nxt.enc_key, nxt.mask_key, nxt.self_mask_commit)
    nxt = nxt.model_copy(update={"signature": sa[k].identity.sign(payload).signature})
    refused = "client 3 advertised a masking key no key agreement accepts"
    for j in range(K - 1):
        assert upload(env, sa, j, task, vecs[j]).status_code == 200
    if rides_on == "upload":
        o = offer(env, k)
        header, masked = sa[k].mask(parse(ShareDelivery, o["message"]), vecs[k],
                                    next_advert=nxt)
        body = make_upload(task, masked, {}, secagg=header.model_dump_json())
        res = env["http"].post(f"/v1/jobs/job-a/rounds/{r}/upload", content=body,
                               headers={**h(env, k), "Content-Type": "application/octet-stream"})
        assert res.status_code == 400 and refused in res.json()["detail"], res.text
        return
    assert upload(env, sa, k, task, vecs[k]).status_code == 200
    for j in range(K):
        assert sign(env, sa, j, r).status_code == 200
    o = offer(env, k)
    resp = sa[k].unmask(parse(UnmaskRequest, o["message"]), next_advert=nxt)
    res = post(env, k, r, "unmask", resp.model_dump_json())
    assert res.status_code == 400 and refused in res.json()["detail"], res.text
    for j in range(K - 1):
        assert unmask(env, sa, j, r).status_code == 200
    env["clock"].now += 1000  # the step's deadline passes without client 3's answer
    assert env["http"].get("/v1/jobs/job-a", headers=h(env, 0)).status_code == 200
    assert aggregate(env, r).size > 0  # the round closed over the honest answers
    assert offer(env, 0)["round_id"] == r + 1  # and the next one opened


@pytest.mark.parametrize("path", ["/v1/jobs/job-a/rounds/1/secagg/signature",
                                  "/v1/jobs/job-a/rounds/1/secagg/shares",
                                  "/v1/jobs/job-a/rounds/1/secagg/refuse",
                                  "/v1/jobs/job-a/decline", "/v1/jobs/job-a/join"])
def test_a_site_whose_connection_closes_mid_message_is_a_warning_not_a_server_error(
        env: dict, caplog: pytest.LogCaptureFixture, path: str) -> None:
    """A site's network that drops during a POST (half a JSON body, then the connection
    gone): the server answers 400 and logs no ERROR, no traceback, but the site's failure (a
    warning naming it), whoever reads the body: the route as it arrives (a secure-aggregation
    message, as an upload), or the framework (join, decline, refuse: its 400, unparsed)."""
    import asyncio

    if not path.endswith("join"):
        join_all(env)
    caplog.set_level(logging.INFO, logger=LOGGER)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "https", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
             "server": ("127.0.0.1", 443),
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                         (b"content-length", b"400"),
                         (b"authorization", f"Bearer {env['tokens'][0]}".encode())]}
    arriving = iter([{"type": "http.request", "body": b'{"sender": 0, "sig', "more_body": True}])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(arriving, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(env["http"].app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 400
    if "/secagg/" in path and not path.endswith("refuse"):
        assert json.loads(sent[1]["body"])["error"] == "client_disconnected"
    said = [r.getMessage() for r in caplog.records if r.name.startswith(LOGGER)]
    assert any(m.startswith(f"event=client_gone path={path} client=client-0 ") for m in said), \
        said
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], \
        [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("path", ["/v1/jobs/job-a/rounds/1/secagg/shares",
                                  "/v1/jobs/job-a/rounds/1/upload"])
def test_a_body_that_stalls_is_logged_as_stalled_not_as_a_closed_connection(
        env: dict, caplog: pytest.LogCaptureFixture, path: str) -> None:
    """A site that sends part of a body and then nothing: after the body timeout it gets its
    408, and the server's log says the body stalled (the connection did not close)."""
    import asyncio

    config, sa = join_all(env)
    if path.endswith("upload"):  # the round takes uploads: its body is read
        run_until_upload(env, sa, first_round(env, config)[0].round_id)
    caplog.set_level(logging.INFO, logger=LOGGER)
    app = create_app(env["db"], state=env["state"], tick_seconds=3600, body_timeout_s=0.2)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "https", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50001),
             "server": ("127.0.0.1", 443),
             "headers": [(b"host", b"testserver"), (b"content-length", b"400"),
                         (b"content-type", b"application/octet-stream" if path.endswith(
                             "upload") else b"application/json"),
                         (b"authorization", f"Bearer {env['tokens'][0]}".encode())]}
    arriving = iter([{"type": "http.request", "body": b'{"sender": 0', "more_body": True}])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        message = next(arriving, None)
        if message is None:
            await asyncio.sleep(30)  # the rest never comes
            return {"type": "http.disconnect"}
        return message

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 408
    said = [r.getMessage() for r in caplog.records if r.name.startswith(LOGGER)]
    assert any("event=body_refused" in m and "body_timeout" in m and path in m
               for m in said), said
    assert not any("event=client_gone" in m for m in said), said
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_secagg_long_poll_answered_after_its_token_was_revoked_is_refused(env: dict) -> None:
    """Site 0 has posted its advert and waits for the next step; its token is revoked while
    it waits (the cache still holding it): when the others' adverts complete the phase, its
    poll gets 401, not the shares message."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from server_app.auth import revoke_client

    config, sa = join_all(env)
    task, _, _ = first_round(env, config)
    r = task.round_id
    assert post(env, 0, r, "advert", sa[0].advertise(r).model_dump_json()).status_code == 200
    with ThreadPoolExecutor(1) as pool:
        poll = pool.submit(env["http"].get, "/v1/jobs/job-a/secagg?wait=20", headers=h(env, 0))
        time.sleep(1.0)
        assert not poll.done()
        revoke_client(env["db"], "client-0")
        for k in range(1, K):
            assert post(env, k, r, "advert", sa[k].advertise(r).model_dump_json()
                        ).status_code == 200
        resp = poll.result(timeout=30)
    assert resp.status_code == 401, resp.text[:300]
    assert resp.json()["detail"] == "unknown or revoked token"
