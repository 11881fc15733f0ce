"""A site that will not join a job says why, as a code (POST /v1/jobs/{job}/decline): its
table does not fit the schema, its schema file is another, the job's profile or configuration
is not the one it pinned. The operator and the other sites see it beside the member, instead
of a job that waits for it with no reason given; the site's join clears it."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedforest_cli.server_cli import format_jobs
from fedforest_secure.protocol.api import JobStatus
from server_app.app import create_app
from server_app.audit_hook import open_audit
from server_app.auth import add_client, add_operator
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


@pytest.fixture()
def server(tmp_path: Path, tiny_parts, job_dir) -> Iterator[dict]:
    parts, feat = tiny_parts
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    tokens = [add_client(db, f"client-{k}") for k in range(3)]
    operator = add_operator(db, "ops")
    audit = open_audit(f"sqlite:///{tmp_path / 'audit.db'}")
    state = ServerState(db, audit)
    state.create_job(load_job_spec(job_dir(tmp_path / "job", parts, feat, n_clients=3)))
    with TestClient(create_app(db, audit, state=state, tick_seconds=60)) as http:
        yield {"http": http, "site": [{"Authorization": f"Bearer {t}"} for t in tokens],
               "ops": {"Authorization": f"Bearer {operator}"}}
    db.dispose()


def _declined(http: TestClient, headers: dict) -> dict[str, str | None]:
    st = JobStatus.model_validate(http.get("/v1/jobs/job-a", headers=headers).json())
    return {m.name: m.declined for m in st.members}


def test_a_sites_declining_is_shown_to_the_operator_and_the_sites_until_it_joins(
        server: dict) -> None:
    http, site, ops = server["http"], server["site"], server["ops"]
    http.post("/v1/jobs/job-a/join", headers=site[0])
    r = http.post("/v1/jobs/job-a/decline", json={"reason": "table"}, headers=site[2])
    assert r.status_code == 200, r.text
    assert _declined(http, site[0]) == {"client-0": None, "client-1": None, "client-2": "table"}
    page = http.get("/ui/api/jobs", headers=ops).json()["jobs"][0]
    assert [m.get("declined") for m in page["members"]] == [None, None, "table"]
    line = format_jobs([JobStatus.model_validate(page)]).splitlines()[1]
    assert "client-2 declined (table)" in line and "waiting for client-1" in line
    # the site fixed its table and joins: nothing is declined any more
    assert http.post("/v1/jobs/job-a/join", headers=site[2]).status_code == 200
    assert _declined(http, site[0])["client-2"] is None


def test_a_decline_carries_a_known_code_only_and_comes_from_a_site_not_joined(
        server: dict) -> None:
    http, site = server["http"], server["site"]
    bad = http.post("/v1/jobs/job-a/decline", json={"reason": "age 150 at line 9"},
                    headers=site[1])
    assert bad.status_code == 422  # a code from the fixed list: no data leaves the site
    http.post("/v1/jobs/job-a/join", headers=site[0])
    joined = http.post("/v1/jobs/job-a/decline", json={"reason": "table"}, headers=site[0])
    assert joined.status_code == 409 and joined.json()["error"] == "not_invited"
