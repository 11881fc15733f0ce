"""Attack 3 over HTTPS: a real uvicorn server on 127.0.0.1 that lies about the job's DP setup.

The server is the real app behind one extra layer that rewrites the job configuration in the
join response, as a malicious coordinator would: a job "of 1000 clients" (each client's noise
share shrinks with K_min), a target bound of 0.03 on data bounded by 3 (one record would move
a sum by 100x the sensitivity the noise is calibrated for), or a budget of 17.4 instead of 1.
A real client, pinned to its profile, its number of clients and its own schema file, must
refuse right after the join response, naming what differs, and send nothing else.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvicorn
from ports import free_port

from client_app.runner import ClientOptions, ProfileRefused, run_client
from fedforest_cli.sim_data import schema_dict, write_job_toml, write_site_files
from fedforest_secure.errors import RefusedRequest
from fedforest_secure.pki import init_dev_pki
from server_app.app import create_app
from server_app.audit_hook import NullAudit
from server_app.auth import add_client
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

pytestmark = pytest.mark.integration

K = 3
JOB = "job-dp"


class LyingJoin:
    """ASGI layer: rewrites ``config`` in every job offer and join response with ``tamper``
    (and records the requests each client sends after it was told the job)."""

    def __init__(self, app: Any, tamper: dict[str, Any]) -> None:
        self.app, self.tamper = app, tamper
        self.after_told: list[str] = []
        self.told = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if self.told and path.startswith("/v1/"):
            self.after_told.append(path)
        if not path.endswith(("/join", "/offer")):
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def capture(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            else:
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    body = json.loads(b"".join(chunks))
                    cfg = body["config"]
                    for key, value in self.tamper.items():
                        if key == "epsilon":
                            cfg["profile"]["dp"]["epsilon"] = value
                        else:
                            cfg[key] = value
                    raw = json.dumps(body).encode()
                    headers = [(k, v) for k, v in start["headers"] if k != b"content-length"]
                    await send({**start, "headers": [*headers, (b"content-length",
                                                               str(len(raw)).encode())]})
                    await send({"type": "http.response.body", "body": raw})
                    self.told = True

        await self.app(scope, receive, capture)


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    rng = np.random.default_rng(5)
    parts = []
    for _ in range(K):
        X = rng.uniform(-1, 1, size=(40, 2)).round(3)
        y = np.clip(X[:, 0] * 2 + rng.normal(scale=0.5, size=40), -3, 3).round(3)
        parts.append((X, y))
    X = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    names = [f"client-{k}" for k in range(K)]
    schema = schema_dict(X, y, "regression", ["a", "b"])
    schema["target"]["bounds"] = [-3.0, 3.0]
    write_site_files(tmp_path, names, parts, ["a", "b"], "regression", schema)
    write_job_toml(tmp_path / "job.toml", JOB, names, "secure-dp", 30.0,
                   {"n_estimators": 2, "max_depth": 3, "n_bins": 8, "random_state": 1})
    return tmp_path


def _serve(root: Path, tamper: dict[str, Any]) -> Iterator[tuple[str, LyingJoin, list[str]]]:
    certs = root / "certs"
    init_dev_pki(certs, K, client_names=[f"client-{k}" for k in range(K)])
    db = Database(f"sqlite:///{root / 'server.db'}")
    tokens = [add_client(db, f"client-{k}") for k in range(K)]
    state = ServerState(db, NullAudit())
    state.create_job(load_job_spec(root / "job.toml"))
    liar = LyingJoin(create_app(db, state=state, tick_seconds=60), tamper)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(liar, host="127.0.0.1", port=port, log_level="error",
                                           ssl_certfile=str(certs / "server.pem"),
                                           ssl_keyfile=str(certs / "server.key")))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"https://127.0.0.1:{port}", liar, tokens
    finally:
        server.should_exit = True
        thread.join(10)
        db.dispose()


@pytest.mark.parametrize(("tamper", "named"), [
    ({"n_clients": 1000}, "n_clients: job 1000, this site 3"),
    ({"target_bound": 0.03}, "target_bound: job 0.03, this site's schema 3.0"),
    ({"epsilon": 17.4}, "epsilon"),
])
def test_attack3_a_client_refuses_a_server_that_lies_about_the_dp_setup(
        site: Path, tamper: dict[str, Any], named: str) -> None:
    gen = _serve(site, tamper)
    url, liar, tokens = next(gen)
    try:
        opts = ClientOptions(server=url, token=tokens[0], job=JOB,
                             data=site / "sites" / "client-0.csv", schema=site / "schema.toml",
                             ca=site / "certs" / "ca.pem", state_dir=site / "state",
                             quiet=True, retry_budget_s=2.0, profile="secure-dp", n_clients=K)
        with pytest.raises((RefusedRequest, ProfileRefused), match=named):
            run_client(opts)
        # the lie is in the offer: the site never joins; after the offer it sends only the
        # code of its refusal
        assert liar.told and liar.after_told == [f"/v1/jobs/{JOB}/decline"]
    finally:
        gen.close()
