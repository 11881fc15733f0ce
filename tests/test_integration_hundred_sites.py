"""A secure job of a hundred sites on the SecAgg+ graph, over HTTPS, end to end.

One real uvicorn server (TLS with client certificates, SQLite) on 127.0.0.1 and the hundred
sites as threads of four client processes (``python -m fedforest_cli.client_group``, 25 sites
each, every site with its own TLS identity, token, state directory and transport; a process per
site does not fit this 2-core machine). Every site pins the secure profile with 14 neighbours
(``2 ceil(log2 100)``) and the job's 100 clients. Every site ends ``done`` with the same model,
and that model equals the job run in process.

Marked ``hundred_sites`` (and ``slow``): deselected by default (pyproject's ``addopts``) so that
``make test`` stays within its budget; ``.ci/run`` runs it in its own step,
``pytest -m hundred_sites``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_integration_https import provision, stop, trees

from fedforest_cli.sim_processes import child_env
from fedforest_cli.simulate import (
    _job_status,
)
from fedforest_secure import load_profile
from fedforest_secure.federation import run_in_process
from fedforest_secure.model import ForestModel
from server_app.jobspec import build_config, load_job_spec
from server_app.settings import load_settings

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.hundred_sites]

K = 100
NEIGHBOURS = 14  # 2 ceil(log2 K)
PER_PROCESS = 25
JOB = "job-100"


def _parts() -> tuple[list[tuple[np.ndarray, np.ndarray]], list[str]]:
    """A hundred small tables of one two-class problem (16 rows and 3 features each; the sites
    differ in their feature means)."""
    rng = np.random.default_rng(100)
    parts = []
    for k in range(K):
        X = rng.normal(loc=0.02 * (k % 10), size=(16, 3)).round(3)
        y = ((X[:, 0] - 0.5 * X[:, 1] + rng.normal(scale=0.4, size=16)) > 0).astype(int)
        parts.append((X, y))
    return parts, [f"x{j}" for j in range(3)]


def _start_group(root: Path, url: str, tokens: list[str], profile: Path,
                 sites: range) -> subprocess.Popen[bytes]:
    spec = [{"server": url, "token": tokens[k], "job": JOB,
             "data": str(root / "job" / "sites" / f"client-{k}.csv"),
             "schema": str(root / "job" / "schema.toml"),
             "ca": str(root / "certs" / "ca.pem"),
             "cert": str(root / "certs" / f"client-{k}.pem"),
             "key": str(root / "certs" / f"client-{k}.key"),
             "state_dir": str(root / "state" / f"client-{k}"),
             "model_out": str(root / "models" / f"client-{k}.model.json"),
             "retry_budget_s": 600.0, "quiet": True, "profile": str(profile), "n_clients": K}
            for k in sites]
    path = root / f"group-{sites.start}.json"
    path.write_text(json.dumps(spec))
    with (root / f"group-{sites.start}.log").open("ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "fedforest_cli.client_group", str(path)],
                                stdout=fh, stderr=subprocess.STDOUT, env=child_env())


#: a site's routine progress lines (left out of a failure's report)
_ROUTINE = re.compile(r"joined job|: level \d+ of|waiting for sites|done: model saved|^\['done'")

#: the server's routine lines (left out of a failure's report): all but drops, refusals, errors
_ROUTINE_SERVER = re.compile(r"event=(join|job_started|job_done|startup|shutdown) |"
                             r"event=round .*dropped=0 ")


def _failures(root: Path, codes: list[int]) -> str:
    """What a failed run's logs tell: each failed group's lines other than routine progress,
    and the server's warnings, errors and drops (the whole logs run to hundreds of lines)."""
    out = [f"exit codes {codes}"]
    for g, code in zip(range(0, K, PER_PROCESS), codes, strict=True):
        if code != 0:
            lines = (root / f"group-{g}.log").read_text().splitlines()
            out += [f"-- group {g}:"] + [ln for ln in lines if not _ROUTINE.search(ln)][-40:]
    server = (root / "server.log").read_text().splitlines()
    out += ["-- server:"] + [ln for ln in server if not _ROUTINE_SERVER.search(ln)][-40:]
    return "\n".join(out)


def test_a_hundred_site_secagg_plus_job_gives_every_site_the_in_process_model(
        tmp_path: Path, job_dir) -> None:
    parts, feat = _parts()
    profile = tmp_path / "secure-plus.toml"
    profile.write_text(load_profile("secure", name="secure-plus",
                                    neighbours=NEIGHBOURS).to_toml())
    job_toml = job_dir(tmp_path / "job", parts, feat, n_clients=K, job_id=JOB, trees=2,
                       depth=3, profile=str(profile), deadline=600.0)
    (tmp_path / "models").mkdir()
    names = [f"client-{k}" for k in range(K)]
    fed = provision(tmp_path, names, [job_toml])
    tokens, url = fed.tokens, fed.url

    procs: list[subprocess.Popen[bytes]] = []
    try:
        fed.launch(tmp_path / "server.log", procs)
        groups = [_start_group(tmp_path, url, tokens, profile, range(s, s + PER_PROCESS))
                  for s in range(0, K, PER_PROCESS)]
        procs += groups
        codes = [g.wait(900) for g in groups]
        status = _job_status(load_settings(fed.toml).database, JOB)
    finally:
        for p in reversed(procs):
            stop(p)
    if codes != [0] * len(groups):  # pytest.fail: the report is not cut as an assert's is
        pytest.fail(_failures(tmp_path, codes), pytrace=False)
    assert status["status"] == "done", status
    config = build_config(load_job_spec(job_toml))
    assert config.profile["neighbours"] == NEIGHBOURS
    alone = trees(run_in_process(config, [(X.astype(float), y) for X, y in parts]))
    models = [ForestModel.from_json((tmp_path / "models" / f"client-{k}.model.json").read_text())
              for k in range(K)]
    assert all(trees(m) == alone for m in models)
