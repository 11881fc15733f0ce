"""API tests (FastAPI TestClient): auth, 4xx on bad input, state unchanged after rejections."""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from db_outage import database_down
from ports import free_port
from sqlalchemy import func, inspect, select
from threaded_server import serving

from fedforest_cli.sim_processes import child_env, write_server_config
from fedforest_secure.config import JobConfig
from fedforest_secure.federation import client_seed
from fedforest_secure.pki import DevPKI, create_ca, issue_certificate, load_certificate
from fedforest_secure.protocol import Task, make_upload, pack
from fedforest_secure.worker import Worker
from server_app.app import create_app
from server_app.audit_hook import NullAudit
from server_app.auth import add_client
from server_app.db import ClientRow, Database, JobRow, MemberRow, RoundRow, UploadRow
from server_app.jobspec import load_job_spec
from server_app.logs import LOGGER
from server_app.runtime import ServerState
from server_app.serve import check_transport
from server_app.settings import ConfigError, ServerSettings, TLSSettings
from server_app.store import membership

with warnings.catch_warnings():
    # starlette warns that its TestClient will move from httpx to httpx2; narrow and local.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

K = 3


@pytest.fixture()
def env(tmp_path: Path, tiny_parts, job_dir, db_url: str) -> Iterator[dict]:
    parts, feat = tiny_parts
    job_toml = job_dir(tmp_path / "job", parts, feat, n_clients=K)
    db = Database(db_url)
    tokens = [add_client(db, f"client-{k}") for k in range(K)]
    outsider = add_client(db, "outsider")
    state = ServerState(db, NullAudit())
    state.create_job(load_job_spec(job_toml))
    app = create_app(db, state=state, tick_seconds=60)
    with TestClient(app) as http:
        yield {"http": http, "db": db, "tokens": tokens, "outsider": outsider, "parts": parts}
    db.dispose()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def join_all(env: dict) -> list[dict]:
    return [env["http"].post("/v1/jobs/job-a/join", headers=auth(t)).json()
            for t in env["tokens"]]


def get_task(env: dict, k: int) -> Task:
    r = env["http"].get("/v1/jobs/job-a/task", headers=auth(env["tokens"][k]))
    assert r.status_code == 200, r.text
    return Task.from_bytes(r.content)


def reply_body(env: dict, info: dict, k: int, task: Task) -> bytes:
    config = JobConfig.from_json(__import__("json").dumps(info["config"]))
    X, y = env["parts"][k]
    w = Worker(config, X, y, client_index=k, seed=client_seed(config, k))
    rep = w.handle(task)
    return make_upload(task, rep.summable, rep.disclosed)


def upload(env: dict, k: int, round_id: int, body: bytes, job: str = "job-a"):
    return env["http"].post(f"/v1/jobs/{job}/rounds/{round_id}/upload", content=body,
                            headers={**auth(env["tokens"][k]),
                                     "Content-Type": "application/octet-stream"})


def snapshot(db: Database) -> tuple:
    with db.session() as s:
        return (s.scalar(select(func.count()).select_from(UploadRow)),
                s.scalar(select(func.count()).select_from(RoundRow)),
                tuple(s.scalars(select(RoundRow.running_sum))))


def test_health_and_openapi(env: dict) -> None:
    http = env["http"]
    assert http.get("/health").json()["status"] == "ok"
    paths = http.get("/openapi.json").json()["paths"]
    assert "/v1/jobs/{job_id}/rounds/{round_id}/upload" in paths


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"},
                                     {"Authorization": "Bearer ffs_AAAAAAAAAAAAAAAA_" + "x" * 43},
                                     {"Authorization": "Basic abc"}])
def test_unauthenticated_is_401(env: dict, headers: dict) -> None:
    r = env["http"].post("/v1/jobs/job-a/join", headers=headers)
    assert r.status_code == 401
    assert r.json()["error"] == "unauthenticated"


def test_outsider_and_unknown_job_are_404(env: dict) -> None:
    http = env["http"]
    r = http.post("/v1/jobs/job-a/join", headers=auth(env["outsider"]))
    assert r.status_code == 404 and r.json()["error"] == "unknown_job"
    r = http.get("/v1/jobs/nope/task", headers=auth(env["tokens"][0]))
    assert r.status_code == 404
    r = http.get("/v1/jobs/bad%20id/task", headers=auth(env["tokens"][0]))
    assert r.status_code == 422


def test_job_waits_for_all_joins_then_serves_tasks(env: dict) -> None:
    http = env["http"]
    http.post("/v1/jobs/job-a/join", headers=auth(env["tokens"][0]))
    r = http.get("/v1/jobs/job-a/task", headers=auth(env["tokens"][0]))
    assert r.status_code == 204 and r.headers["X-FedForest-Status"] == "wait"
    join_all(env)
    task = get_task(env, 0)
    assert task.round_id >= 0 and task.job_id == "job-a"
    st = http.get("/v1/jobs/job-a", headers=auth(env["tokens"][1])).json()
    assert st["status"] == "running" and st["active_clients"] == K


def test_the_offer_answers_what_the_join_does_without_joining(env: dict) -> None:
    """A site reads the job from the offer and checks it before it joins: asking changes no
    membership, so a site that then refuses is never counted as joined."""
    http = env["http"]
    offers = [http.get("/v1/jobs/job-a/offer", headers=auth(t)).json() for t in env["tokens"]]
    st = http.get("/v1/jobs/job-a", headers=auth(env["tokens"][0])).json()
    assert st["status"] == "waiting" and {m["state"] for m in st["members"]} == {"invited"}
    assert offers == join_all(env)
    r = http.get("/v1/jobs/job-a/offer", headers=auth(env["outsider"]))
    assert r.status_code == 404 and r.json()["error"] == "unknown_job"


def test_an_open_jobs_join_with_another_identity_key_than_the_sites_first_is_refused(
        env: dict) -> None:
    """Every client sends its identity key (kept in its state directory): under the open
    profile too the key a site first joined with is kept. Its client restarted on the same
    state directory joins the running job again; a second client of the site (another state
    directory: another key) is refused, and the job goes on with the site's first client."""
    http, tokens = env["http"], env["tokens"]
    keys = [{"identity_key": f"{k + 1:02x}" * 32} for k in range(K)]
    for k in range(K):
        assert http.post("/v1/jobs/job-a/join", headers=auth(tokens[k]),
                         json=keys[k]).status_code == 200
    assert http.post("/v1/jobs/job-a/join", headers=auth(tokens[0]),
                     json=keys[0]).status_code == 200  # a restart
    r = http.post("/v1/jobs/job-a/join", headers=auth(tokens[0]),
                  json={"identity_key": "ee" * 32})
    assert r.status_code == 409 and r.json() == {
        "error": "identity_mismatch",
        "detail": "this client joined with another identity key; it cannot change mid-job"}
    st = http.get("/v1/jobs/job-a", headers=auth(tokens[0])).json()
    assert st["status"] == "running" and st["active_clients"] == K
    with env["db"].session() as s:  # once the job is done, any client of the site joins it
        job = s.get(JobRow, "job-a")  # to download the model
        assert job is not None
        job.status = "done"
    assert http.post("/v1/jobs/job-a/join", headers=auth(tokens[0]),
                     json={"identity_key": "ee" * 32}).status_code == 200


def test_bad_uploads_rejected_and_change_nothing(env: dict) -> None:
    infos = join_all(env)
    task = get_task(env, 0)
    good = reply_body(env, infos[0], 0, task)
    before = snapshot(env["db"])
    cases = {
        "malformed": (b"garbage", 400),
        "truncated": (good[:-8], 400),
        "wrong_round_path": (good, 409),  # sent to round 5
        "wrong_layout": (make_upload(task, np.zeros(3), {}), 400),
        "nan": (make_upload(task, np.full(reply_body_len(good), np.nan), {}), 400),
        "wrong_header": (pack({"type": "upload", "job_id": "job-a", "round_id": task.round_id,
                               "task_digest": "00" * 32, "encoding": "float64"},
                              {"__summable__": np.zeros(reply_body_len(good))}), 409),
        # a valid vector with a disclosed item the task asks alone or not as it asks it
        "disclosure_missing": (make_upload(task, np.zeros(reply_body_len(good)), {}), 400),
        "disclosure_alone": (make_upload(task, np.zeros(reply_body_len(good)),
                                         {"sketch_points": np.zeros(4)}), 400),
    }
    for name, (body, status) in cases.items():
        rid = task.round_id + 5 if name == "wrong_round_path" else task.round_id
        if name == "wrong_round_path":
            body = good.replace(f'"round_id":{task.round_id}'.encode(),
                                f'"round_id":{rid}'.encode())
        r = upload(env, 0, rid, body)
        assert r.status_code == status, (name, r.text)
        assert set(r.json()) >= {"error", "detail"}
        assert snapshot(env["db"]) == before, name
    r = env["http"].post(f"/v1/jobs/job-a/rounds/{task.round_id}/upload", content=good,
                         headers={**auth(env["tokens"][0]), "Content-Type": "application/json"})
    assert r.status_code == 415
    r = upload(env, 0, task.round_id, good, job="other-job")  # not this site's job
    assert (r.status_code, r.json()["error"]) == (404, "unknown_job")
    assert snapshot(env["db"]) == before
    assert upload(env, 0, task.round_id, good).status_code == 200  # the site's own upload


def test_a_malformed_disclosure_is_refused_naming_the_item_and_the_honest_one_accepted(
        env: dict) -> None:
    """An upload whose disclosed quantile sketch lacks its counts is a 400
    ``malformed_upload`` naming the item; nothing is stored, so the site's honest upload is
    accepted (not a ``409 conflicting_upload``)."""
    infos = join_all(env)
    task = get_task(env, 0)
    assert "sketch_points" in task.disclose
    good = reply_body(env, infos[0], 0, task)
    before = snapshot(env["db"])
    bad = make_upload(task, np.zeros(reply_body_len(good)), {"sketch_points": np.zeros(4)})
    r = upload(env, 0, task.round_id, bad)
    assert r.status_code == 400
    assert r.json()["error"] == "malformed_upload"
    assert "missing ['sketch_counts']" in r.json()["detail"]
    assert "not stored" in r.json()["detail"]
    assert snapshot(env["db"]) == before
    r = upload(env, 0, task.round_id, good)
    assert r.status_code == 200 and r.json()["duplicate"] is False


def reply_body_len(body: bytes) -> int:
    from fedforest_secure.protocol import unpack

    return int(unpack(body)[1]["__summable__"].shape[0])


def test_duplicate_upload_is_idempotent_and_replay_rejected(env: dict) -> None:
    infos = join_all(env)
    task = get_task(env, 0)
    r0 = task.round_id
    bodies = [reply_body(env, infos[k], k, task) for k in range(K)]
    first = upload(env, 0, r0, bodies[0])
    assert first.status_code == 200 and not first.json()["duplicate"]
    again = upload(env, 0, r0, bodies[0])
    assert again.status_code == 200 and again.json()["duplicate"]
    assert again.json()["upload_sha256"] == hashlib.sha256(bodies[0]).hexdigest()
    # a different vector for the same round is a conflict, and counted nowhere
    other = bodies[1]
    r = upload(env, 0, r0, make_upload(task, np.zeros(reply_body_len(bodies[0])), {}))
    assert r.status_code == 409 and r.json()["error"] == "conflicting_upload"
    with env["db"].session() as s:
        assert s.scalar(select(func.count()).select_from(UploadRow)) == 1
    for k in (1, 2):
        assert upload(env, k, r0, bodies[k]).status_code == 200
    # round 0 is closed now: a replay is a 409 that says it was counted
    r = upload(env, 0, r0, bodies[0])
    assert r.status_code == 409 and r.json()["error"] == "round_closed"
    assert r.json()["counted"] is True
    r = upload(env, 1, r0, other[:-1] + b"\x01")
    assert r.status_code in (400, 409)
    nxt = get_task(env, 0)
    assert nxt.round_id > r0


def test_task_of_any_issued_round_and_unknown_round(env: dict) -> None:
    join_all(env)
    http = env["http"]
    r0 = get_task(env, 0).round_id
    r = http.get(f"/v1/jobs/job-a/rounds/{r0}/task", headers=auth(env["tokens"][2]))
    assert r.status_code == 200
    r = http.get("/v1/jobs/job-a/rounds/9/task", headers=auth(env["tokens"][2]))
    assert r.status_code == 404
    r = http.get("/v1/jobs/job-a/model", headers=auth(env["tokens"][2]))
    assert r.status_code == 409 and r.json()["error"] == "no_model"


def test_the_model_of_a_failed_job_is_said_to_be_none_not_pending(env: dict) -> None:
    join_all(env)
    with env["db"].session() as sess:
        job = sess.get(JobRow, "job-a")
        assert job is not None
        job.status, job.reason = "failed", "only 2 clients remain, fewer than the required 3"
    r = env["http"].get("/v1/jobs/job-a/model", headers=auth(env["tokens"][2]))
    assert r.status_code == 409 and r.json()["error"] == "no_model"
    assert r.json()["detail"] == ("the job failed (only 2 clients remain, fewer than the "
                                  "required 3): it has no model")


def test_plain_http_refused_off_loopback(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        check_transport(ServerSettings(host="0.0.0.0"), insecure_dev=True)
    with pytest.raises(ConfigError):
        check_transport(ServerSettings(host="127.0.0.1"), insecure_dev=False)
    check_transport(ServerSettings(host="127.0.0.1"), insecure_dev=True)


def test_tls_files_that_cannot_serve_are_refused_before_start(dev_pki: DevPKI,
                                                               tmp_path: Path) -> None:
    def settings(cert: Path, key: Path, client_ca: Path | None = None) -> ServerSettings:
        return ServerSettings(host="127.0.0.1", tls=TLSSettings(cert=cert, key=key,
                                                                client_ca=client_ca))

    check_transport(settings(dev_pki.server_cert, dev_pki.server_key, dev_pki.ca_cert),
                    insecure_dev=False)
    with pytest.raises(ConfigError, match="does not match"):
        check_transport(settings(dev_pki.server_cert, dev_pki.client_keys[0]),
                        insecure_dev=False)
    junk = tmp_path / "junk.pem"
    junk.write_text("not PEM")
    with pytest.raises(ConfigError, match="client_ca.*junk.pem"):
        check_transport(settings(dev_pki.server_cert, dev_pki.server_key, junk),
                        insecure_dev=False)


def _expired_server_pki(root: Path) -> Path:
    """``root/ca.pem``, and ``root/server.pem`` + ``server.key``: a server certificate for
    127.0.0.1 that expired five days ago."""
    ca = create_ca()
    ca.write(root / "ca.pem", root / "ca.key")
    start = _dt.datetime.now(_dt.UTC) - _dt.timedelta(days=15)
    issue_certificate(ca, "127.0.0.1", server=True, hosts=("127.0.0.1",), days=10,
                      now=start).write(root / "server.pem", root / "server.key")
    return root / "server.pem"


def test_an_expired_server_certificate_is_refused_before_start(tmp_path: Path) -> None:
    cert = _expired_server_pki(tmp_path)
    after = load_certificate(cert).not_valid_after_utc
    settings = ServerSettings(host="127.0.0.1", tls=TLSSettings(
        cert=cert, key=tmp_path / "server.key", client_ca=tmp_path / "ca.pem"))
    with pytest.raises(ConfigError) as err:
        check_transport(settings, insecure_dev=False)
    assert str(err.value).startswith(f"[tls] cert {cert}: the certificate expired on "
                                     f"{after:%Y-%m-%d %H:%M} UTC"), str(err.value)


def test_the_server_command_refuses_to_start_with_an_expired_certificate(
        tmp_path: Path) -> None:
    cert = _expired_server_pki(tmp_path)
    config = write_server_config(tmp_path, free_port(), tmp_path)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fedforest_cli", "server", "--config", str(config)],
            capture_output=True, text=True, timeout=60, env={**child_env(), "COLUMNS": "300"})
    except subprocess.TimeoutExpired:
        pytest.fail("the server started with an expired certificate")
    assert done.returncode == 2, done.stderr
    assert f"error: [tls] cert {cert.resolve()}: the certificate expired on" in done.stderr


def test_open_and_closed_round_tasks_are_the_stored_bytes(env: dict) -> None:
    """The open round's task is served from memory (the same bytes to every client), a closed
    round's from the database: either way the exact bytes whose digest the round announced."""
    infos = join_all(env)
    http = env["http"]
    first = http.get("/v1/jobs/job-a/task", headers=auth(env["tokens"][0]))
    task = Task.from_bytes(first.content)
    digest = hashlib.sha256(first.content).hexdigest()
    assert first.headers["X-FedForest-Task-Digest"] == digest == task.digest().hex()
    for k in range(K):
        again = http.get(f"/v1/jobs/job-a/rounds/{task.round_id}/task",
                         headers=auth(env["tokens"][k]))
        assert again.content == first.content
    for k in range(K):  # close the round
        assert upload(env, k, task.round_id, reply_body(env, infos[k], k, task)
                      ).status_code == 200
    assert get_task(env, 0).round_id > task.round_id
    closed = http.get(f"/v1/jobs/job-a/rounds/{task.round_id}/task",
                      headers=auth(env["tokens"][1]))
    assert closed.content == first.content
    with env["db"].session() as s:
        assert s.get(RoundRow, ("job-a", task.round_id)).task_blob == first.content


def test_an_upload_in_many_chunks_with_a_content_length_is_read_whole(env: dict) -> None:
    """The body buffer grows as the chunks arrive (never sized from the Content-Length)."""
    infos = join_all(env)
    task = get_task(env, 0)
    body = reply_body(env, infos[0], 0, task)
    assert len(body) > 400  # grows several times

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 100):
            yield body[i:i + 100]

    r = env["http"].post(f"/v1/jobs/job-a/rounds/{task.round_id}/upload", content=chunks(),
                         headers={**auth(env["tokens"][0]),
                                  "Content-Type": "application/octet-stream",
                                  "Content-Length": str(len(body))})
    assert r.status_code == 200, r.text
    assert r.json()["upload_sha256"] == hashlib.sha256(body).hexdigest()


def test_an_upload_without_content_length_is_read_whole(env: dict) -> None:
    """A chunked upload (no Content-Length) is read into a growing buffer: same receipt."""
    infos = join_all(env)
    task = get_task(env, 0)
    body = reply_body(env, infos[0], 0, task)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]

    r = env["http"].post(f"/v1/jobs/job-a/rounds/{task.round_id}/upload", content=chunks(),
                         headers={**auth(env["tokens"][0]),
                                  "Content-Type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    assert r.json()["upload_sha256"] == hashlib.sha256(body).hexdigest()


def test_a_failure_reason_with_a_newline_and_any_character_reaches_the_sites(env: dict) -> None:
    """The reason travels in the X-FedForest-Detail header, on uvicorn as the server runs: a
    newline becomes a space, and a character beyond latin-1 arrives as it is (every site's
    poll failed otherwise)."""
    import httpx
    import uvicorn

    reason = "round 3: the coordinator failed (KeyError: '体重')\nsee § 5b"
    with env["db"].session() as s:
        job = s.get(JobRow, "job-a")
        job.status, job.reason = "failed", reason
    port = free_port()
    with serving(uvicorn.Config(env["http"].app, host="127.0.0.1", port=port,
                                log_level="warning", lifespan="off")):
        r = httpx.get(f"http://127.0.0.1:{port}/v1/jobs/job-a/task",
                      headers=auth(env["tokens"][0]), timeout=10)
    assert (r.status_code, r.headers["X-FedForest-Status"]) == (204, "failed")
    assert r.headers["X-FedForest-Detail"] == reason.replace("\n", " ")


def test_a_cached_token_still_needs_its_secret(env: dict) -> None:
    http, token = env["http"], env["tokens"][0]
    assert http.get("/v1/me", headers=auth(token)).status_code == 200  # cached from here on
    wrong = token[:-1] + ("A" if token[-1] != "A" else "B")
    r = http.get("/v1/me", headers=auth(wrong))
    assert r.status_code == 401 and r.json()["error"] == "unauthenticated"
    assert http.get("/v1/me", headers=auth(token)).json()["name"] == "client-0"


@pytest.mark.parametrize("name", ["hospital-a\n", "hospital a", "-a", "a" * 65])
def test_a_site_or_operator_name_with_a_trailing_newline_is_refused_as_any_bad_name(
        tmp_path: Path, name: str) -> None:
    from server_app.auth import TokenError, add_operator

    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    with pytest.raises(TokenError) as client:
        add_client(db, name)
    with pytest.raises(TokenError) as operator:
        add_operator(db, name)
    assert str(client.value) == ("client names are 1-64 characters: letters, digits, '_', "
                                 "'.', '-'")
    assert str(operator.value) == ("operator names are 1-64 characters: letters, digits, "
                                   "'_', '.', '-'")
    with db.session() as sess:
        assert sess.scalars(select(ClientRow)).all() == []
    db.dispose()


def test_a_token_with_a_trailing_newline_authenticates_no_one(env: dict) -> None:
    from server_app.auth import TokenCache, authenticate

    token = env["tokens"][0]
    cache = TokenCache(env["db"])
    assert cache(token) is not None  # cached from here on
    assert authenticate(env["db"], token + "\n") is None
    assert cache(token + "\n") is None


def test_token_cache_forgets_a_revoked_token_after_its_ttl(env: dict) -> None:
    from server_app.auth import TokenCache, hash_secret
    from server_app.db import ClientRow

    now = [0.0]
    cache = TokenCache(env["db"], ttl=10.0, clock=lambda: now[0])
    token = env["tokens"][1]
    assert cache(token).name == "client-1"
    with env["db"].session() as s:  # an operator revokes the token in the database
        s.scalar(select(ClientRow).where(ClientRow.name == "client-1")).token_hash = \
            hash_secret("a new secret")
    assert cache(token).name == "client-1"  # within the TTL: the row is not read again
    now[0] = 10.0
    assert cache(token) is None
    assert cache.lookup("not a token") == (False, None)


@pytest.mark.parametrize("change", ["revoke", "rotate"])
def test_a_token_revoked_while_the_cache_holds_it_joins_no_job(env: dict,
                                                              change: str) -> None:
    """client-0's token is in the token cache (it just read the job) when it is revoked (or
    replaced): its other requests still pass for up to the cache's 30 s, but its join is
    refused at once (the join checks the token in the database)."""
    from server_app.auth import revoke_client, rotate_token

    http, token = env["http"], env["tokens"][0]
    assert http.get("/v1/jobs/job-a", headers=auth(token)).status_code == 200
    (revoke_client if change == "revoke" else rotate_token)(env["db"], "client-0")
    assert http.get("/v1/jobs/job-a", headers=auth(token)).status_code == 200  # cached
    refused = http.post("/v1/jobs/job-a/join", headers=auth(token))
    assert refused.status_code == 401, refused.text
    assert refused.json()["detail"] == "unknown or revoked token"
    assert http.post("/v1/jobs/job-a/join",
                     headers=auth(env["tokens"][1])).status_code == 200


@pytest.mark.parametrize("change", ["revoke", "rotate"])
def test_a_long_poll_answered_after_its_token_was_revoked_is_refused(env: dict,
                                                                     change: str) -> None:
    """A site's long poll waits for the job to start; its token is revoked (or replaced)
    while it waits, the cache still holding it: the task the poll would get is refused (401)
    at once, not handed out for up to the cache's 30 s more. A site whose token holds gets
    its task through the same wait."""
    from concurrent.futures import ThreadPoolExecutor

    from server_app.auth import revoke_client, rotate_token

    http, tokens = env["http"], env["tokens"]
    for t in tokens[:2]:
        assert http.post("/v1/jobs/job-a/join", headers=auth(t)).status_code == 200
    with ThreadPoolExecutor(2) as pool:
        polls = [pool.submit(http.get, "/v1/jobs/job-a/task?wait=20", headers=auth(t))
                 for t in tokens[:2]]
        time.sleep(1.0)  # both polls wait: the job waits for its third site
        assert not any(p.done() for p in polls)
        (revoke_client if change == "revoke" else rotate_token)(env["db"], "client-0")
        assert http.post("/v1/jobs/job-a/join", headers=auth(tokens[2])).status_code == 200
        refused, answered = (p.result(timeout=30) for p in polls)
    assert refused.status_code == 401, refused.text
    assert refused.json()["detail"] == "unknown or revoked token"
    assert answered.status_code == 200 and answered.headers["X-FedForest-Status"] == "task"


def test_round_blobs_are_stored_after_the_small_columns() -> None:
    """SQLite reaches a column stored after a blob by walking the blob's overflow pages: the
    round's status and phase (read by every request) must come before its vectors."""
    names = [c.name for c in RoundRow.__table__.columns]
    blobs = ["task_blob", "running_sum", "aggregate", "disclosed_blob"]
    assert names[-len(blobs):] == blobs


def test_a_request_to_a_finished_job_does_not_load_its_model(tmp_path: Path) -> None:
    """membership() runs on every client request; the job's model is read only by /model."""
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    model = '{"trees": "' + "x" * 1_000_000 + '"}'
    with db.session() as sess:
        client = ClientRow(name="site-0", token_id="t" * 32, token_hash="h" * 64)
        sess.add(client)
        sess.add(JobRow(id="job-a", spec_json="{}", config_json="{}", status="done", reason="",
                        min_clients=1, round_deadline_s=1.0, current_round=3,
                        model_json=model, model_digest="d" * 64))
        sess.flush()
        sess.add(MemberRow(job_id="job-a", client_id=client.id, client_index=0, state="active"))
    with db.session() as sess:
        client = sess.scalars(select(ClientRow)).one()
        job, member = membership(sess, client, "job-a")
        assert (job.status, member.client_index) == ("done", 0)
        assert "model_json" in inspect(job).unloaded
        assert job.model_json == model  # loaded where it is read
    assert [c.name for c in JobRow.__table__.columns][-1] == "model_json"


def _one_job(tmp_path: Path, parts: Any, feat: list[str], job_dir: Any
             ) -> tuple[Database, list[str], ServerState]:
    """A SQLite server database with K clients and job-a (open) created for them."""
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    tokens = [add_client(db, f"client-{k}") for k in range(K)]
    state = ServerState(db, NullAudit())
    state.create_job(load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=K)))
    return db, tokens, state


def test_a_finished_job_keeps_no_coordinator_in_memory(tmp_path: Path, tiny_parts,
                                                       job_dir) -> None:
    """A server runs for weeks: once a job is done its coordinator (the forest being grown,
    every level's statistics) is let go; a later request about the job needs none."""
    import json

    parts, feat = tiny_parts
    db, tokens, state = _one_job(tmp_path, parts, feat, job_dir)
    with TestClient(create_app(db, state=state, tick_seconds=60)) as http:
        infos = [http.post("/v1/jobs/job-a/join", headers=auth(t)).json() for t in tokens]
        config = JobConfig.from_json(json.dumps(infos[0]["config"]))
        workers = [Worker(config, *parts[k], client_index=k, seed=client_seed(config, k))
                   for k in range(K)]
        for _ in range(100):
            r = http.get("/v1/jobs/job-a/task", headers=auth(tokens[0]))
            if r.status_code == 204:
                break
            task = Task.from_bytes(r.content)
            for k in range(K):
                rep = workers[k].handle(task)
                up = http.post(f"/v1/jobs/job-a/rounds/{task.round_id}/upload",
                               content=make_upload(task, rep.summable, rep.disclosed),
                               headers={**auth(tokens[k]),
                                        "Content-Type": "application/octet-stream"})
                assert up.status_code == 200, up.text
        assert r.headers.get("X-FedForest-Status") == "done"
        rt = state.core.runtimes.peek("job-a")
        assert rt is None or rt.coord is None
        assert http.get("/v1/jobs/job-a/model", headers=auth(tokens[1])).status_code == 200
    db.dispose()


def test_a_restarted_server_logs_the_resume_of_an_open_job_with_its_round_and_phase(
        tmp_path: Path, tiny_parts, job_dir, caplog: pytest.LogCaptureFixture) -> None:
    """The open profile resumes after a restart as the secure ones do, and says so: one
    ``event=resume`` line with the open round and its phase when the job is rebuilt."""
    db, tokens, state = _one_job(tmp_path, *tiny_parts, job_dir)
    with TestClient(create_app(db, state=state, tick_seconds=60)) as http:
        for t in tokens:
            assert http.post("/v1/jobs/job-a/join", headers=auth(t)).status_code == 200
    with db.session() as s:
        round_id = s.get(JobRow, "job-a").current_round
    assert round_id >= 0
    caplog.set_level(logging.INFO, logger=LOGGER)
    restarted = ServerState(db, NullAudit())  # a new process: nothing loaded
    restarted.tick()  # the deadline tick rebuilds the running job
    restarted.tick()
    lines = [r.getMessage() for r in caplog.records if "event=resume" in r.getMessage()]
    assert lines == [f"event=resume job=job-a round={round_id} phase=upload"], lines
    db.dispose()


def test_a_job_whose_stored_rounds_no_longer_replay_fails_once_with_the_reason(
        tmp_path: Path, tiny_parts, job_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restarted server rebuilds a running job from its stored rounds; a stored round the
    coordinator refuses now (an upload stored under laxer checks) stops the job with "cannot
    resume" and the reason, once, rather than an error on every tick and request."""
    from fedforest_secure.errors import InvalidMessage
    from server_app.replay import Runtimes

    db, tokens, state = _one_job(tmp_path, *tiny_parts, job_dir)
    with TestClient(create_app(db, state=state, tick_seconds=60)) as http:
        for t in tokens:
            assert http.post("/v1/jobs/job-a/join", headers=auth(t)).status_code == 200

    def refused(self: Runtimes, rt: object, sess: object) -> None:
        raise InvalidMessage("client 1: sketch_counts missing beside sketch_points")

    monkeypatch.setattr(Runtimes, "_replay", refused)
    restarted = ServerState(db, NullAudit())  # a new process: nothing loaded
    restarted.tick()  # the deadline tick rebuilds the job (it raised, every tick)
    restarted.tick()
    with TestClient(create_app(db, state=restarted, tick_seconds=60)) as http:
        r = http.get("/v1/jobs/job-a", headers=auth(tokens[0]))
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "failed"
        assert r.json()["reason"] == ("cannot resume: client 1: sketch_counts missing beside "
                                      "sketch_points")
    db.dispose()


def test_a_stop_while_the_database_is_down_logs_the_shutdown_without_a_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The lifespan's shutdown counts the running jobs for its log line; with the database
    unreachable it logs the shutdown without the count, and the stop is clean (no "Application
    shutdown failed", exit 1)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    http = TestClient(create_app(db, tick_seconds=3600)).__enter__()
    with database_down(db):
        http.__exit__(None, None, None)  # the server stops while its database is down
    db.dispose()
    shutdown = [r.getMessage() for r in caplog.records if "event=shutdown" in r.getMessage()]
    assert shutdown == ["event=shutdown database=unreachable"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_the_tick_logs_an_outage_of_the_database_once_in_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The deadline tick meets an unreachable database on every full tick: an outage, not a
    bug, so one warning line when it begins, not a traceback every few seconds."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    app = create_app(db, tick_seconds=0.01)
    with TestClient(app), database_down(db):
        state: ServerState = app.state.server
        until = time.monotonic() + 10
        while state._ticks < 30 and time.monotonic() < until:  # several full ticks
            time.sleep(0.02)
    db.dispose()
    assert state._ticks >= 30
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == ['event=database_unavailable error="OperationalError: connection refused '
                     '(the test stopped the database)" deadlines="the open rounds\' deadlines '
                     'run again once it answers"']
    assert not [r for r in caplog.records if r.exc_info]


def test_requests_during_an_outage_of_the_database_get_503_and_log_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A request whose query meets an unreachable database is refused with 503 (the client
    retries) and logs no error or traceback: the outage is the one database_unavailable
    line. Both where a query meets it: the route's (a token the server knows from an
    earlier request) and the token's look-up before any route."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    known, new = add_client(db, "client-0"), add_client(db, "client-1")
    with TestClient(create_app(db, tick_seconds=3600)) as http:
        assert http.get("/v1/jobs/job-a", headers=auth(known)).status_code == 404
        with database_down(db):
            for token in (known, new, known, new):
                r = http.get("/v1/jobs/job-a", headers=auth(token))
                assert r.status_code == 503
                assert r.json() == {"error": "database_unavailable", "detail": "the server's "
                                    "database cannot be reached; retry later"}
    db.dispose()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == ['event=database_unavailable error="OperationalError: connection refused '
                     '(the test stopped the database)" deadlines="the open rounds\' deadlines '
                     'run again once it answers"']
    assert not [r for r in caplog.records if r.exc_info]


def test_an_open_site_restarted_after_its_upload_of_a_sketch_round_answers_the_next_round(
        env: dict) -> None:
    """Open profile: a site stopped after it uploaded a sketch round that is still open (the
    others have not) and started again replays the job's sketch rounds, the open one
    included, so its worker is at that level when the level's histogram round comes: the
    same answer as the process that never stopped."""
    from types import SimpleNamespace

    from client_app.loops import replay
    from fedforest_secure.protocol import TaskKind

    http, tokens = env["http"], env["tokens"]
    infos = join_all(env)
    config = JobConfig.from_json(__import__("json").dumps(infos[0]["config"]))
    workers = [Worker(config, *env["parts"][k], client_index=k, seed=client_seed(config, k))
               for k in range(K)]

    def answer_round(sites: range) -> Task:
        task = get_task(env, sites[0])
        for k in sites:
            rep = workers[k].handle(task)
            assert upload(env, k, task.round_id, make_upload(
                task, rep.summable, rep.disclosed)).status_code == 200
        return task

    task = answer_round(range(K))  # level 0's sketch
    while (task := get_task(env, 0)).kind != TaskKind.SKETCH or task.level < 1:
        answer_round(range(K))
    answer_round(range(1))  # site 0 uploads level 1's sketch; the round stays open
    restarted = Worker(config, *env["parts"][0], client_index=0,
                       seed=client_seed(config, 0))
    tr = SimpleNamespace(
        get_json=lambda path: http.get(path, headers=auth(tokens[0])).json(),
        request=lambda method, path, **_: http.request(method, path, headers=auth(tokens[0])))
    replay(tr, "job-a", restarted)  # type: ignore[arg-type]
    answer_round(range(1, K))  # the others: the sketch round closes
    histogram = get_task(env, 0)
    assert histogram.kind == TaskKind.HISTOGRAM and histogram.level == 1
    again = restarted.handle(histogram)
    assert np.array_equal(again.summable, workers[0].handle(histogram).summable)


@pytest.mark.parametrize("fixed_point", [False, True])
def test_more_distinct_values_than_the_sites_rows_at_a_node_are_refused_naming_the_block(
        tmp_path: Path, tiny_parts, job_dir, db_url: str, fixed_point: bool) -> None:
    """Open profile, method="exact": a site lists the distinct values of each (node, slot),
    and each becomes a candidate every site's next histogram carries. An upload listing more
    values at a node than the rows the same upload counts there (its node totals, decoded
    when fixed-point) is a 400 naming the block; nothing is stored, and the site's honest
    upload is then accepted."""
    from fedforest_secure.privacy import load_profile
    from fedforest_secure.secure_sum import encode_contribution

    parts, feat = tiny_parts
    profile = tmp_path / "open-fixed.toml"
    profile.write_text(load_profile("open", name="open-fixed", fixed_point=True).to_toml())
    job_toml = job_dir(tmp_path / "job", parts, feat, n_clients=K,
                       profile=str(profile) if fixed_point else "open")
    job_toml.write_text(job_toml.read_text().replace("[forest]\n", '[forest]\nmethod = "exact"\n'))
    db = Database(db_url)
    tokens = [add_client(db, f"client-{k}") for k in range(K)]
    state = ServerState(db, NullAudit())
    state.create_job(load_job_spec(job_toml))
    with TestClient(create_app(db, state=state, tick_seconds=60)) as http:
        env = {"http": http, "db": db, "tokens": tokens}
        infos = join_all(env)
        config = JobConfig.from_json(__import__("json").dumps(infos[0]["config"]))
        task = get_task(env, 0)
        assert config.method == "exact" and "unique" in task.disclose
        X, y = parts[0]
        rep = Worker(config, X, y, client_index=0, seed=client_seed(config, 0)).handle(task)
        summable = encode_contribution(config, task, rep) if fixed_point else rep.summable
        assert summable.dtype == (np.uint64 if fixed_point else np.float64)
        ptr, vals = rep.disclosed["unique_ptr"].copy(), rep.disclosed["unique_vals"]
        first = int(ptr[1])
        ptr[1:] += 61 - first  # 61 made-up values for the root's first slot; the site has 60
        forged = {**rep.disclosed, "unique_ptr": ptr,
                  "unique_vals": np.concatenate([np.arange(61.0), vals[first:]])}
        before = snapshot(db)
        r = upload(env, 0, task.round_id, make_upload(task, summable, forged))
        assert r.status_code == 400 and r.json()["error"] == "malformed_upload"
        assert r.json()["detail"] == (
            "disclosed item 'unique_vals' lists 61 distinct values at the node of the task's "
            "features row 0 (slot 0), more than its 60 rows there: a site has no more distinct "
            "values at a node than rows; the upload was not stored (disclose what the task "
            "asks, as it asks)")
        assert snapshot(db) == before
        r = upload(env, 0, task.round_id, make_upload(task, summable, dict(rep.disclosed)))
        assert r.status_code == 200 and r.json()["duplicate"] is False
    db.dispose()


@pytest.mark.parametrize("change", ["rotate", "revoke"])
def test_token_cache_keeps_no_entry_of_a_rotated_or_revoked_token(env: dict,
                                                                  change: str) -> None:
    """A site whose token is rotated again and again: the cache holds one entry for it, its
    newest token's; a token revoked or rotated away loses its entry when it is refused, and
    entries past their TTL go when the database is asked about another token."""
    from server_app.auth import TokenCache, revoke_client, rotate_token

    now = [0.0]
    cache = TokenCache(env["db"], ttl=10.0, clock=lambda: now[0])
    assert cache(env["tokens"][0]).name == "client-0"
    token = env["tokens"][1]
    for _ in range(20):
        assert cache(token).name == "client-1"
        token = rotate_token(env["db"], "client-1")
    assert cache(token).name == "client-1"
    assert sorted(row.name for row, _ in cache._rows.values()) == ["client-0", "client-1"]
    now[0] = 10.0  # past the TTL: the old token is refused, and its entry goes
    if change == "revoke":
        revoke_client(env["db"], "client-1")
    else:
        rotate_token(env["db"], "client-1")
    assert cache(token) is None
    assert cache._rows == {}  # client-0's entry is past its TTL too
    assert cache(env["tokens"][2]).name == "client-2"
    assert [row.name for row, _ in cache._rows.values()] == ["client-2"]
