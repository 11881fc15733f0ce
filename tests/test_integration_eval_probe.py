"""A server probing where the sites' held-out rows lie through their decisions to take part in
an evaluation job, over HTTPS: a real server and three client processes on 127.0.0.1.

The server evaluates model A (a constant forest), then offers a probe job of model B, equal to
A except on a small box of x0 that holds one of site 0's held-out rows and none of the other
sites'. Every site decides from facts that do not depend on its rows, so the server sees the
same outcome from all three."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ports import free_port

from fedforest_cli.sim_data import SiteData, schema_dict, write_csv, write_schema
from fedforest_cli.sim_evaluation import (
    create_eval_job,
    run_eval_clients,
    wait_job,
    write_eval_job,
)
from fedforest_cli.sim_processes import start_client, start_server, stop_all, wait_healthy
from fedforest_cli.simulate import write_server_config
from fedforest_secure import FedForestClassifier
from fedforest_secure.pki import init_dev_pki
from server_app.admin import ServerAdmin
from server_app.auth import add_client
from server_app.db import Database
from server_app.settings import load_settings

pytestmark = pytest.mark.integration

SITES = 3
A, B = [0.9, 0.1], [0.2, 0.8]


def _leaf(value: list[float]) -> dict[str, Any]:
    return {"feature": -1, "gain": 0.0, "impurity": 0.0, "kind": 0, "left": -1,
            "missing_left": False, "n": 100.0, "right": -1, "threshold": 0.0, "value": value}


def _split(threshold: float, left: int, right: int) -> dict[str, Any]:
    return {**_leaf(A), "feature": 0, "kind": 1, "left": left, "right": right,
            "threshold": threshold}


def _model(template: str, nodes: list[dict[str, Any]], path: Path) -> Path:
    """``template``'s model file with one tree of ``nodes`` (the root first), at ``path``."""
    doc = json.loads(template)
    doc["trees"] = [{**{k: [n[k] for n in nodes] for k in _leaf(A)}, "sets": {}}]
    path.write_text(json.dumps(doc))
    return path


def _outcomes(db: Path, job: str, procs: list[Any], timeout: float = 240.0
              ) -> list[tuple[str, str | None]]:
    """(state, decline code) of each member as the server's operator sees them, once every
    site joined or declined (or the timeout passed); the clients are stopped then."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            with ServerAdmin(f"sqlite:///{db}") as admin:
                st = admin.status(job)
            assert st is not None
            seen = [(m.state, m.declined) for m in st.members]
            if all(state != "invited" or declined for state, declined in seen) \
                    or time.monotonic() > deadline:
                return seen
            time.sleep(0.5)
    finally:
        stop_all(procs)


def test_a_probe_job_sees_the_same_decision_from_a_site_with_a_row_in_its_box_and_without(
        tmp_path: Path, tiny_parts: Any) -> None:
    parts, feat = tiny_parts
    held = [(X[40:], y[40:]) for X, y in parts[:SITES]]
    x0 = [set(X[:, 0].tolist()) for X, _ in held]
    v = min(x0[0] - x0[1] - x0[2])
    lo, hi = v - 5e-4, v + 5e-4  # x0 in (lo, hi]: one of site 0's rows, none of the others'
    assert [int(np.sum((X[:, 0] > lo) & (X[:, 0] <= hi))) for X, _ in held][1:] == [0, 0]
    X_all = np.concatenate([X for X, _ in held])
    y_all = np.concatenate([y for _, y in held])
    write_schema(tmp_path / "schema.toml", schema_dict(X_all, y_all, "classification", feat))
    template = FedForestClassifier(n_estimators=1, max_depth=1, random_state=0).fit(
        X_all, y_all).model_.to_json()
    model_a = _model(template, [_leaf(A)], tmp_path / "A.json")
    model_b = _model(template, [_split(lo, 1, 2), _leaf(A), _split(hi, 3, 4), _leaf(B),
                                _leaf(A)], tmp_path / "B.json")
    names = [f"client-{k}" for k in range(SITES)]
    csvs = [tmp_path / f"{n}.test.csv" for n in names]
    for path, (X, y) in zip(csvs, held, strict=True):
        write_csv(path, X, y, feat, "classification")
    certs = tmp_path / "certs"
    init_dev_pki(certs, SITES, client_names=names)
    server_toml = write_server_config(tmp_path, free_port(), certs)
    settings = load_settings(server_toml)
    db = Database(settings.database)
    tokens = [add_client(db, n) for n in names]
    db.dispose()
    sites = [SiteData(n, csvs[k], tmp_path / "schema.toml", tokens[k], *held[k])
             for k, n in enumerate(names)]
    url = f"https://127.0.0.1:{settings.port}"
    for job, model in (("eval-a", model_a), ("probe-1", model_b), ("probe-2", model_b)):
        create_eval_job(server_toml, write_eval_job(tmp_path / f"{job}.toml", job, names,
                                                    "secure", [model], deadline=120.0))
    server = start_server(server_toml, tmp_path / "server.log")
    try:
        wait_healthy(url, certs / "ca.pem", server, timeout=240, cert=certs / "client-0.pem",
                     key=certs / "client-0.key")
        first = run_eval_clients(sites, csvs, url, "eval-a", certs, tmp_path,
                                 tmp_path / "server.db", profile="secure", timeout=300)
        assert first.exit_codes == [0] * SITES

        def clients(job: str, **again: bool) -> list[Any]:
            return [start_client(s, url, job, certs, tmp_path / "clients" / s.name,
                                 tmp_path / "logs" / f"{s.name}.{job}.log",
                                 tmp_path / "clients" / f"{s.name}.{job}.json",
                                 profile="secure", n_clients=SITES, eval_data=csvs[k], **again)
                    for k, s in enumerate(sites)]

        # by default a site answers one evaluation per held-out set: all three decline
        seen = _outcomes(tmp_path / "server.db", "probe-1", clients("probe-1"))
        assert seen == [("invited", "evaluated_before")] * SITES
        # sites that allow another evaluation on their rows all join, and answer it
        procs = clients("probe-2", evaluate_again=True)
        try:
            result = json.loads(wait_job(tmp_path / "server.db", "probe-2", procs, 300))
            assert [p.wait(30) for p in procs] == [0] * SITES
        finally:
            stop_all(procs)
        assert result["models"][0]["metrics"]["n"] == sum(len(y) for _, y in held)
    finally:
        stop_all([server])
