"""A site that will not join a job says why, as a code (POST /v1/jobs/{job}/decline): its
table does not fit the schema, its schema file is another, the job's profile or configuration
is not the one it pinned. The operator sees it beside the member, instead of a job that waits
for it with no reason given, and so does that site; the other sites see only that it has not
joined. The site's join clears it."""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client_app import runner
from client_app.log import SiteLog
from client_app.runner import ClientOptions
from client_app.state import ClientState
from client_app.transport import ApiRejected
from fedforest_cli.server_cli import format_jobs
from fedforest_secure import __version__
from fedforest_secure.errors import FedForestError
from fedforest_secure.protocol.api import JobStatus
from server_app import _joins
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


def test_a_sites_declining_is_shown_to_the_operator_and_that_site_only_until_it_joins(
        server: dict) -> None:
    http, site, ops = server["http"], server["site"], server["ops"]
    http.post("/v1/jobs/job-a/join", headers=site[0])
    r = http.post("/v1/jobs/job-a/decline", json={"reason": "table"}, headers=site[2])
    assert r.status_code == 200, r.text
    assert _declined(http, site[2]) == {"client-0": None, "client-1": None, "client-2": "table"}
    # another site sees that client-2 has not joined, not why (its table: its own data)
    for other in (site[0], site[1]):
        assert _declined(http, other) == {"client-0": None, "client-1": None, "client-2": None}
        st = http.get("/v1/jobs/job-a", headers=other).json()
        assert [m["state"] for m in st["members"]] == ["active", "invited", "invited"]
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


class _SiteOverTestClient:
    """A site's transport over the test client: JSON in and out, a 4xx as ApiRejected."""

    def __init__(self, http: TestClient, headers: dict[str, str]) -> None:
        self.http, self.headers = http, headers
        self.sent: list[tuple[str, str]] = []

    def _json(self, r: Any) -> Any:
        if r.status_code >= 400:
            body = r.json()
            raise ApiRejected(r.status_code, body["error"], body["detail"], body)
        return r.json()

    def get_json(self, path: str, params: Any = None) -> Any:
        self.sent.append(("GET", path))
        return self._json(self.http.get(path, headers=self.headers))

    def post_json(self, path: str, body: Any = None) -> Any:
        self.sent.append(("POST", path))
        return self._json(self.http.post(path, json=body, headers=self.headers))


def _run_site(http: TestClient, headers: dict[str, str], tmp_path: Path, tiny_parts: Any
              ) -> _SiteOverTestClient:
    X, y = tiny_parts[0][0]
    tr = _SiteOverTestClient(http, headers)
    opts = ClientOptions(server="https://127.0.0.1:1", token="t", job="job-a",
                         data=tmp_path / "d.csv", schema=tmp_path / "s.toml", ca=None,
                         state_dir=tmp_path / "state", quiet=True)
    runner._run(opts, tr, ClientState(opts.state_dir), X, y,  # type: ignore[arg-type]
                SiteLog(stream=io.StringIO()))
    return tr


def test_the_offer_states_the_servers_version(server: dict) -> None:
    offer = server["http"].get("/v1/jobs/job-a/offer", headers=server["site"][0]).json()
    assert offer["server_version"] == __version__


def test_a_site_declines_a_job_whose_server_runs_another_version(
        server: dict, tmp_path: Path, tiny_parts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server says its version in the offer; a site of another version declines the job
    ("version") before it joins, and says which versions differ."""
    http, site = server["http"], server["site"]
    monkeypatch.setattr(_joins, "__version__", "0.0.1")
    with pytest.raises(FedForestError) as info:
        _run_site(http, site[0], tmp_path, tiny_parts)
    assert str(info.value) == (
        f"the server runs fedforest-secure '0.0.1' and this site {__version__!r}: this site "
        "did not join job job-a. Run one version on the server and every site (fedforest "
        "--version), upgraded together between jobs")
    assert _declined(http, site[0]) == {"client-0": "version", "client-1": None,
                                        "client-2": None}
    st = http.get("/v1/jobs/job-a", headers=site[1]).json()
    assert [m["state"] for m in st["members"]] == ["invited"] * 3
