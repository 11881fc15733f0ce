"""A revoked site in a job: `server create-job` refuses it (the job would wait for it forever),
and a site revoked while a job waits for it is marked revoked where the operator reads the job
(`server status`, the /ui job list), not where the other sites do."""

from __future__ import annotations

import warnings
from pathlib import Path

from typer.testing import CliRunner

from fedforest_cli.cli import app
from server_app.app import create_app
from server_app.audit_hook import open_audit
from server_app.auth import add_client, add_operator, revoke_client
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


def _server_toml(root: Path) -> Path:
    toml = root / "server.toml"
    toml.write_text(f'database = "sqlite:///{root / "server.db"}"\n'
                    f'audit_database = "sqlite:///{root / "audit.db"}"\n')
    return toml


def test_create_job_refuses_a_revoked_site_saying_what_to_do(tmp_path: Path, tiny_parts,
                                                             job_dir) -> None:
    parts, feat = tiny_parts
    job = job_dir(tmp_path / "job", parts, feat, n_clients=3)
    cfg = ["--config", str(_server_toml(tmp_path))]
    run = CliRunner().invoke
    for k in range(3):
        assert run(app, ["server", "add-client", f"client-{k}", *cfg]).exit_code == 0
    assert run(app, ["server", "revoke-client", "client-2", *cfg]).exit_code == 0
    refused = run(app, ["server", "create-job", *cfg, "--job", str(job)])
    assert refused.exit_code == 2
    assert " ".join(refused.output.split()) == (
        "error: revoked clients ['client-2']: their tokens no longer authenticate, so the job "
        "would wait for them forever; give each a new token (`fedforest server rotate-token "
        "NAME`, and a new certificate if its old one leaked) or leave it out of the job's "
        "clients")
    assert "no jobs yet" in run(app, ["server", "status", *cfg]).output
    # given a new token, the site is a member like the others
    assert run(app, ["server", "rotate-token", "client-2", *cfg]).exit_code == 0
    created = run(app, ["server", "create-job", *cfg, "--job", str(job)])
    assert created.exit_code == 0, created.output


def test_a_site_revoked_while_a_job_waits_is_marked_revoked_to_the_operator_only(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    parts, feat = tiny_parts
    job = job_dir(tmp_path / "job", parts, feat, n_clients=3)
    toml = _server_toml(tmp_path)
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    tokens = [add_client(db, f"client-{k}") for k in range(3)]
    operator = add_operator(db, "ops")
    audit = open_audit(f"sqlite:///{tmp_path / 'audit.db'}")
    state = ServerState(db, audit)
    state.create_job(load_job_spec(job))
    revoke_client(db, "client-2")
    status = CliRunner().invoke(app, ["server", "status", "--config", str(toml)])
    assert status.exit_code == 0, status.output
    line = status.output.splitlines()[1]
    assert line.endswith("waiting for client-0, client-1, client-2 (client-2 is revoked: it "
                         "cannot join until `fedforest server rotate-token client-2`)"), line
    revoke_client(db, "client-1")
    line = CliRunner().invoke(app, ["server", "status", "--config", str(toml)]
                              ).output.splitlines()[1]
    assert line.endswith("waiting for client-0, client-1, client-2 (client-1, client-2 are "
                         "revoked: they cannot join until `fedforest server rotate-token "
                         "NAME`)"), line
    with TestClient(create_app(db, audit, state=state, tick_seconds=60)) as http:
        page = http.get("/ui/api/jobs", headers={"Authorization": f"Bearer {operator}"})
        assert [(m["name"], m["revoked"]) for m in page.json()["jobs"][0]["members"]] == [
            ("client-0", False), ("client-1", True), ("client-2", True)]
        # a site reads its job's members, not which of the others the operator revoked
        site = http.get("/v1/jobs/job-a", headers={"Authorization": f"Bearer {tokens[0]}"})
        assert site.status_code == 200, site.text
        assert all("revoked" not in m for m in site.json()["members"])
    db.dispose()
