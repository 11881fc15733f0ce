"""Secure aggregation over HTTPS: real uvicorn server (TLS, mTLS) and real client processes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from test_integration_https import (
    _job_status,
    launch_client,
    launch_server,
    reference,
    setup_fed,
    stop,
    trees,
    wait_round,
)

from client_app.simulate import collect_receipts
from fedforest_secure.audit import AuditLog, contains_per_client_plaintext, verify_log
from fedforest_secure.model import ForestModel
from server_app.db import Database, MemberRow

pytestmark = pytest.mark.integration


def _round_entries(db: Path) -> list:
    with AuditLog(db, create=False) as log:
        return [e for e in log.entries(job_id="job-a") if e.kind == "round"]


def test_secure_job_matches_in_process_and_its_log_has_no_plaintext(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, profile="secure")
    server = launch_server(fed)
    try:
        clients = [launch_client(fed, k) for k in range(3)]
        codes = [c.wait(180) for c in clients]
    finally:
        stop(server)
    assert codes == [0, 0, 0], [(fed.root / f"client-{k}.log").read_text() for k in range(3)]
    got = ForestModel.from_json((fed.root / "client-2.model.json").read_text())
    assert trees(got) == trees(reference(fed))  # the in-process run also masks (same profile)
    receipts = collect_receipts(fed.root, fed.root / "state")
    report = verify_log(fed.root / "audit.db", receipts_dir=receipts)
    assert report.ok, report.problems
    rounds = _round_entries(fed.root / "audit.db")
    assert rounds and report.receipts_checked == 3 * len(rounds)
    assert all(e.payload["masked"] is True for e in rounds)
    assert all(e.payload["secagg"]["recovered"] == [] for e in rounds)
    with AuditLog(fed.root / "audit.db", create=False) as log:
        assert contains_per_client_plaintext(log, "job-a") == []
        joined = [e for e in log.entries(job_id="job-a") if e.kind == "client_joined"]
        splits = [s for e in log.entries(job_id="job-a") if e.kind == "split"
                  for s in e.payload["splits"]]
        models = [e for e in log.entries(job_id="job-a") if e.kind == "model"]
    assert len(joined) == 3 and all(len(e.payload["identity_key"]) == 64 for e in joined)
    # every split decision of the forest is in the log, and the final model's digest
    assert len(splits) == sum(int((t.kind != 0).sum()) for t in got.trees)
    assert len(models) == 1


def test_secure_client_sigkilled_mid_level_is_dropped_and_training_completes(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=5, deadline=5.0, min_clients=3,
                    profile="secure")  # each step's deadline; generous for a loaded CI box
    server = launch_server(fed)
    try:
        clients = [launch_client(fed, k) for k in range(5)]
        wait_round(fed, 3)
        os.kill(clients[4].pid, signal.SIGKILL)
        codes = [c.wait(180) for c in clients[:4]]
        clients[4].wait(5)
    finally:
        stop(server)
    assert codes == [0, 0, 0, 0], [(fed.root / f"client-{k}.log").read_text()
                                   for k in range(4)]
    st = _job_status(fed.root / "server.db", "job-a")
    assert st["status"] == "done", st["reason"]
    db = Database(f"sqlite:///{fed.root / 'server.db'}")
    with db.session() as s:
        states = {m.client_index: m.state for m in s.query(MemberRow)}
    db.dispose()
    assert states[4] == "dropped" and all(states[k] == "active" for k in range(4))
    rounds = _round_entries(fed.root / "audit.db")
    assert "client-4" not in rounds[-1].payload["clients"]
    assert all(e.payload["masked"] is True for e in rounds)
    report = verify_log(fed.root / "audit.db",
                        receipts_dir=collect_receipts(fed.root, fed.root / "state"))
    assert report.ok, report.problems
