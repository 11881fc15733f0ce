"""Several jobs at once on one real uvicorn server (TLS, mTLS) on 127.0.0.1: five jobs of five
sites each (the same five site identities in every job, each job with its own tables), open and
secure profiles mixed. Each job's model equals the same job run in process, and a job whose
sites are all frozen (SIGSTOP, mid-job) does not hold up the others. The server's database and
audit log run on each backend (SQLite files, PostgreSQL).

The sites of one job run as threads of one client process (``run_client`` per site, each with
its own TLS identity, token, state directory and transport): five processes instead of 25."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_integration_https import (
    _job_status,
    provision,
    stop,
    trees,
)

from fedforest_cli.sim_processes import child_env
from fedforest_secure.federation import run_in_process
from fedforest_secure.model import ForestModel
from server_app.jobspec import build_config, load_job_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: the job whose client process is frozen mid-job, and each job's profile
SLOW = 4
PROFILES = ["open", "secure", "open", "secure", "open"]
N_SITES = 5


def _job_parts(parts: list, j: int) -> list:
    """Job ``j``'s tables: site k holds the tiny table ``(k + j) % 5`` (a different federation
    of the same sites for every job)."""
    return [parts[(k + j) % N_SITES] for k in range(N_SITES)]


def _start_job_clients(root: Path, url: str, job: str, tokens: list[str],
                       profile: str) -> subprocess.Popen[bytes]:
    jd = root / job
    spec = [{"server": url, "token": tokens[k], "job": job,
             "data": str(jd / "sites" / f"client-{k}.csv"), "schema": str(jd / "schema.toml"),
             "ca": str(root / "certs" / "ca.pem"),
             "cert": str(root / "certs" / f"client-{k}.pem"),
             "key": str(root / "certs" / f"client-{k}.key"),
             "state_dir": str(jd / "state" / f"client-{k}"),
             "model_out": str(jd / f"client-{k}.model.json"),
             "retry_budget_s": 300.0, "quiet": True, "profile": profile,
             "n_clients": N_SITES}
            for k in range(N_SITES)]
    path = jd / "clients.json"
    path.write_text(json.dumps(spec))
    with (jd / "clients.log").open("ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "fedforest_cli.client_group", str(path)],
                                stdout=fh, stderr=subprocess.STDOUT, env=child_env())


def _wait(db: str, job: str, until: Any, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = _job_status(db, job)
        if until(st):
            return st
        time.sleep(0.05)
    raise AssertionError(f"{job} never got there: {_job_status(db, job)}")


def test_five_concurrent_jobs_match_in_process_and_a_frozen_job_stalls_none(
        tmp_path: Path, tiny_parts, job_dir, make_db_url) -> None:
    parts, feat = tiny_parts
    jobs = [f"job-{j}" for j in range(N_SITES)]
    for j, job in enumerate(jobs):  # the frozen job is deeper: it is mid-job when frozen
        job_dir(tmp_path / job, _job_parts(parts, j), feat, n_clients=N_SITES, job_id=job,
                trees=2, depth=3 if j == SLOW else 2, profile=PROFILES[j], deadline=300.0)
    names = [f"client-{k}" for k in range(N_SITES)]
    server_db = make_db_url("server")
    fed = provision(tmp_path, names, [tmp_path / job / "job.toml" for job in jobs],
                    database=server_db, audit_database=make_db_url("audit"))
    tokens, url = fed.tokens, fed.url

    procs: list[subprocess.Popen[bytes]] = []
    try:
        fed.launch(tmp_path / "server.log", procs)
        clients = [_start_job_clients(tmp_path, url, job, tokens, PROFILES[j])
                   for j, job in enumerate(jobs)]
        procs += clients
        # freeze the slow job's client process (all its sites, their open connections
        # included) once its first round is under way
        _wait(server_db, jobs[SLOW],
              lambda st: st["round"] >= 1 or st["status"] in ("done", "failed"))
        clients[SLOW].send_signal(signal.SIGSTOP)
        frozen = _job_status(server_db, jobs[SLOW])
        assert frozen["status"] == "running", frozen
        codes = {j: clients[j].wait(300) for j in range(N_SITES) if j != SLOW}
        # every other job finished while the frozen one still waits on its round
        others = {j: _job_status(server_db, jobs[j]) for j in codes}
        still = _job_status(server_db, jobs[SLOW])
        clients[SLOW].send_signal(signal.SIGCONT)
        codes[SLOW] = clients[SLOW].wait(300)
        finished = _job_status(server_db, jobs[SLOW])
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
        for p in reversed(procs):
            stop(p)
    logs = {j: (tmp_path / jobs[j] / "clients.log").read_text() for j in range(N_SITES)}
    assert codes == dict.fromkeys(range(N_SITES), 0), logs
    assert all(st["status"] == "done" for st in others.values()), others
    assert still["status"] == "running", still
    assert finished["status"] == "done", finished
    for j, job in enumerate(jobs):  # each job's model: the same job alone, in process
        config = build_config(load_job_spec(tmp_path / job / "job.toml"))
        alone = run_in_process(config, [(X.astype(float), y) for X, y in _job_parts(parts, j)])
        for k in range(N_SITES):
            got = ForestModel.from_json((tmp_path / job / f"client-{k}.model.json").read_text())
            assert trees(got) == trees(alone), (job, k)
