"""Fuzz the HTTP API from its own OpenAPI schema (schemathesis, in-process ASGI, valid tokens).

Two jobs share one server: ``job-o`` (open profile, round 1 collecting uploads) and ``job-s``
(secure profile, round 1 collecting key advertisements; the fuzzing client still owes its
advert). The fuzzer is client 0, a member of both, with a valid token. For every generated
request (schema-valid and schema-violating, on real and random job ids and rounds):

* the server never answers 5xx;
* a rejection is a 4xx whose body is JSON ``{"error": ..., "detail": ...}``;
* a rejection changes nothing: every database row and the in-memory secure-aggregation state
  (phase, who advertised / shared / uploaded / answered, riding adverts) are identical before
  and after.

The secure-aggregation POST routes read their JSON body by hand (so the generated schema does not
describe it); the schema given to schemathesis declares their pydantic message models, so the
fuzzer sends well-typed as well as broken key adverts, share bundles and unmask responses.
``/secagg/refuse`` is fuzzed by a separate test: a well-formed refusal is *accepted* and makes the
refusing client leave the job, which would end the others' coverage early.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey
from schemathesis import GenerationMode
from sqlalchemy import select

from fedforest_secure.secagg import (
    KeyAdvert,
    SecAggClient,
    ShareBundle,
    SurvivorSignature,
    UnmaskResponse,
)
from server_app.app import create_app
from server_app.audit_hook import NullAudit
from server_app.auth import add_client
from server_app.db import Base, Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

K = 3
EXAMPLES = 200
_BODY_MODELS = {"advert": KeyAdvert, "shares": ShareBundle, "signature": SurvivorSignature,
                "unmask": UnmaskResponse}


class _Recorder(NullAudit):
    """An audit sink that counts what was appended (a rejection must append nothing)."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, str]] = []

    def append(self, job_id: str, kind: str, payload: Any, arrays: Any = None) -> None:
        self.entries.append((job_id, kind))


def db_snapshot(db: Database) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, as plain tuples (column order), sorted."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with db.session() as sess:
        for table in Base.metadata.sorted_tables:
            rows = sess.execute(select(table)).all()
            out[table.name] = sorted((tuple(r) for r in rows), key=repr)
    return out


def secagg_snapshot(state: ServerState) -> dict[str, Any]:
    """The in-memory secure-aggregation state of every job (the database holds its messages;
    this is the live state machine rebuilt from them)."""
    out: dict[str, Any] = {}
    for job_id, rt in sorted(state.runtimes.loaded().items()):
        bridge = rt.secure
        if bridge is None:
            out[job_id] = (rt.task.round_id if rt.task is not None else None,)
            continue
        sr = bridge.current
        out[job_id] = (
            sorted(bridge.pending),
            None if sr is None else (sr.round_id, sr.phase, sorted(sr.dropped),
                                     sorted(sr.server.advertised), sorted(sr.server.shared),
                                     sorted(sr.server.uploaded), sorted(sr.server.answered),
                                     sorted(sr.server.next_adverts)))
    return out


def full_snapshot(env: dict[str, Any]) -> tuple[Any, ...]:
    return (db_snapshot(env["db"]), secagg_snapshot(env["state"]), len(env["audit"].entries))


@pytest.fixture()
def env(tmp_path: Path, tiny_parts, job_dir, db_url: str) -> Iterator[dict[str, Any]]:
    parts, feat = tiny_parts
    db = Database(db_url)
    tokens = [add_client(db, f"client-{k}") for k in range(K)]
    outsider = add_client(db, "outsider")
    audit = _Recorder()
    state = ServerState(db, audit, clock=lambda: 1000.0,  # a frozen clock: no deadline passes
                        monotonic=lambda: 1000.0)
    for job_id, profile in (("job-o", "open"), ("job-s", "secure")):
        toml = job_dir(tmp_path / job_id, parts, feat, n_clients=K, job_id=job_id,
                       profile=profile)
        state.create_job(load_job_spec(toml))
    app = create_app(db, state=state, tick_seconds=3600)
    with TestClient(app) as http:
        auth = [{"Authorization": f"Bearer {t}"} for t in tokens]
        for k in range(K):
            assert http.post("/v1/jobs/job-o/join", headers=auth[k]).status_code == 200
        keys = {k: SigningKey.generate() for k in range(K)}
        for k in range(K):
            r = http.post("/v1/jobs/job-s/join", headers=auth[k],
                          json={"identity_key": bytes(keys[k].verify_key).hex()})
            assert r.status_code == 200, r.text
        d = http.get("/v1/jobs/job-s/directory", headers=auth[0]).json()
        directory = {int(i): bytes.fromhex(v) for i, v in d["keys"].items()}
        sa = {k: SecAggClient(k, "job-s", keys[k], directory, n_clients=K, threshold=0.67)
              for k in range(K)}
        rounds = {j: http.get(f"/v1/jobs/{j}", headers=auth[0]).json()["round_id"]
                  for j in ("job-o", "job-s")}
        for k in (1, 2):  # the others advertised; client 0 (the fuzzer) still owes its advert
            r = http.post(f"/v1/jobs/job-s/rounds/{rounds['job-s']}/secagg/advert",
                          headers={**auth[k], "Content-Type": "application/json"},
                          content=sa[k].advertise(rounds["job-s"]).model_dump_json().encode())
            assert r.status_code == 200, r.text
        yield {"app": app, "http": http, "db": db, "state": state, "audit": audit,
               "token": tokens[0], "outsider": outsider, "rounds": rounds, "sa": sa}
    db.dispose()


def fuzz_schema(app: Any) -> Any:
    """The app's OpenAPI document, plus the JSON bodies of the secure-aggregation routes."""
    spec = copy.deepcopy(app.openapi())
    comps = spec.setdefault("components", {}).setdefault("schemas", {})
    for kind, model in _BODY_MODELS.items():
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        comps.update(js.pop("$defs", {}))
        comps[model.__name__] = js
        op = spec["paths"][f"/v1/jobs/{{job_id}}/rounds/{{round_id}}/secagg/{kind}"]["post"]
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
    schema = schemathesis.openapi.from_dict(spec)
    schema.app = _without_lifespan(app)
    return schema


def _without_lifespan(app: Any) -> Any:
    """``app`` for the fuzzer's requests, without a lifespan of its own: the env's TestClient
    runs the app's (its deadline ticker); a second one, started by the fuzzer's calls, would be
    shut down only as the interpreter exits, logging into pytest's closed capture."""
    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    return wrapped


def _no_refuse(schema: Any) -> Any:
    return schema.exclude(path_regex=r"/secagg/refuse$")


def _strategy(env: dict[str, Any], schema: Any) -> st.SearchStrategy[Any]:
    """Schema-valid and schema-violating requests, on the real jobs and on random ids."""
    parts = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        parts.append(schema.as_strategy(mode))
        for job_id, rid in env["rounds"].items():
            parts.append(schema.as_strategy(mode, path_parameters={"job_id": job_id}))
            parts.append(schema.as_strategy(mode, path_parameters={"job_id": job_id,
                                                                   "round_id": rid}))
    return st.one_of(parts)


def check_call(env: dict[str, Any], case: Any, token: str) -> int:
    """Send one generated request; check the no-5xx / JSON-4xx / unchanged-state rules."""
    if isinstance(case.query, dict) and "wait" in case.query:
        case.query["wait"] = 0  # long polls would only make the run slower
    before = full_snapshot(env)
    resp = case.call(headers={"Authorization": f"Bearer {token}"})
    # a task is octet-stream: the body is shown, never decoded as UTF-8 (that may fail)
    body = resp.content[:300].decode("utf-8", "replace")
    where = f"{case.method} {case.formatted_path} -> {resp.status_code}: {body}"
    assert resp.status_code < 500, where
    if resp.status_code >= 400:
        ctype = (resp.headers.get("content-type") or [""])[0]
        assert ctype.startswith("application/json"), where
        body = resp.json()
        assert isinstance(body, dict) and isinstance(body.get("error"), str), where
        assert isinstance(body.get("detail"), str) and body["detail"], where
        assert full_snapshot(env) == before, f"a rejected request changed state: {where}"
    return int(resp.status_code)


_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                     suppress_health_check=list(HealthCheck))


def test_fuzzed_requests_never_5xx_and_rejections_change_nothing(env: dict[str, Any]) -> None:
    schema = _no_refuse(fuzz_schema(env["app"]))
    seen: set[int] = set()

    @_SETTINGS
    @given(case=_strategy(env, schema))
    def run(case: Any) -> None:
        seen.add(check_call(env, case, env["token"]))

    run()
    assert any(s >= 400 for s in seen)  # the fuzzer did reach the rejection paths
    # the jobs are where they were: job-s still waits for client 0's advert, job-o for uploads
    assert secagg_snapshot(env["state"])["job-s"][1][:2] == (env["rounds"]["job-s"], "advertise")
    o = env["http"].get("/v1/jobs/job-s/secagg", headers={
        "Authorization": f"Bearer {env['token']}"}).json()
    assert o["action"] == "advert"


def test_fuzzed_requests_with_an_outsider_token_are_refused(env: dict[str, Any]) -> None:
    """A valid token of a client that is in no job: every job route says 404, nothing moves."""
    schema = fuzz_schema(env["app"])
    before = full_snapshot(env)

    @settings(_SETTINGS, max_examples=EXAMPLES // 2)
    @given(case=_strategy(env, schema))
    def run(case: Any) -> None:
        status = check_call(env, case, env["outsider"])
        if "{job_id}" in case.path and status < 400:
            pytest.fail(f"outsider got {status} on {case.method} {case.formatted_path}")

    run()
    assert full_snapshot(env) == before


def test_fuzzed_refusals_never_5xx(env: dict[str, Any]) -> None:
    """``/secagg/refuse``: malformed bodies are 4xx and change nothing; accepted ones drop."""
    schema = fuzz_schema(env["app"]).include(path_regex=r"/secagg/refuse$")

    @settings(_SETTINGS, max_examples=EXAMPLES // 2)
    @given(case=_strategy(env, schema))
    def run(case: Any) -> None:
        check_call(env, case, env["token"])

    run()


def test_state_snapshot_detects_an_accepted_message(env: dict[str, Any]) -> None:
    """The comparison is not blind: an accepted advert moves the secure round on."""
    before = full_snapshot(env)
    r = env["rounds"]["job-s"]
    resp = env["http"].post(f"/v1/jobs/job-s/rounds/{r}/secagg/advert", headers={
        "Authorization": f"Bearer {env['token']}", "Content-Type": "application/json"},
        content=env["sa"][0].advertise(r).model_dump_json().encode())
    assert resp.status_code == 200, resp.text
    assert full_snapshot(env) != before
    assert secagg_snapshot(env["state"])["job-s"][1][1] == "share"
