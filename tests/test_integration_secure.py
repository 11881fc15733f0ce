"""Secure aggregation over HTTPS: real uvicorn server (TLS, mTLS) and real client processes,
with the server's database and the audit log on each backend (SQLite files, PostgreSQL)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError, ProgrammingError
from test_integration_https import (
    Fed,
    _job_status,
    freeze_mid_job,
    launch_client,
    launch_server,
    reference,
    run_job,
    setup_fed,
    stop_all,
    trees,
)
from two_tier_pki import write_two_tier_pki

from client_app.context import RESTARTED_SECURE, uploaded_before_detail
from fedforest_cli.simulate import collect_receipts
from fedforest_secure.audit import AuditLog, contains_per_client_plaintext, verify_log
from fedforest_secure.model import ForestModel
from server_app.db import Database, MemberRow

pytestmark = pytest.mark.integration


def _round_entries(db: str) -> list:
    with AuditLog(db, create=False) as log:
        return [e for e in log.entries(job_id="job-a") if e.kind == "round"]


def test_secure_job_matches_in_process_and_its_log_has_no_plaintext(
        tmp_path: Path, tiny_parts, job_dir, make_db_url) -> None:
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, profile="secure",
                    make_db_url=make_db_url)
    try:
        launch_server(fed)
        clients = [launch_client(fed, k) for k in range(3)]
        codes = [c.wait(600) for c in clients]
    finally:
        stop_all(fed)
    assert codes == [0, 0, 0], [(fed.root / f"client-{k}.log").read_text() for k in range(3)]
    got = ForestModel.from_json((fed.root / "client-2.model.json").read_text())
    assert trees(got) == trees(reference(fed))  # the in-process run also masks (same profile)
    receipts = collect_receipts(fed.root, fed.root / "state")
    report = verify_log(fed.audit_url, receipts_dir=receipts, replay=True)
    assert report.ok, report.problems
    rounds = _round_entries(fed.audit_url)
    assert rounds and report.receipts_checked == 3 * len(rounds) + 3  # and 3 model receipts
    assert all(e.payload["masked"] is True for e in rounds)
    assert all(e.payload["secagg"]["recovered"] == [] for e in rounds)
    # each round: the aggregate in full, the task by its digest and the shape of its arrays
    # (none in the first level's totals round)
    assert all(set(e.arrays) == {"aggregate"} and isinstance(e.payload["task_arrays"], dict)
               for e in rounds)
    assert all(e.payload["task_arrays"] for e in rounds[1:])
    with AuditLog(fed.audit_url, create=False) as log:
        assert contains_per_client_plaintext(log, "job-a") == []
        joined = [e for e in log.entries(job_id="job-a") if e.kind == "client_joined"]
        splits = [s for e in log.entries(job_id="job-a") if e.kind == "split"
                  for s in e.payload["splits"]]
        models = [e for e in log.entries(job_id="job-a") if e.kind == "model"]
    assert len(joined) == 3 and all(len(e.payload["identity_key"]) == 64 for e in joined)
    # every split decision of the forest is in the log, and the final model's digest
    assert len(splits) == sum(int((t.kind != 0).sum()) for t in got.trees)
    assert len(models) == 1
    # each round's log line says how long each phase stayed open and the server's close took
    closed = [x for x in (fed.root / "server.log").read_text().splitlines()
              if "event=round " in x]
    assert len(closed) == len(rounds)
    # (after the first round the keys came with the unmask answers: the advert phase is short)
    timed = re.compile(r" phase_s=advertise:[0-9.]+,share:[0-9.]+,upload:[0-9.]+,"
                       r"sign:[0-9.]+,unmask:[0-9.]+ close_s=[0-9.]+$")
    assert all(timed.search(x) for x in closed), closed


def test_a_secure_job_on_a_two_tier_pki_trains_with_the_chain_as_every_sites_ca(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """An institution's PKI (root CA -> issuing CA -> the server and the sites): every site's
    --ca and the server's client_ca hold the issuing CA then the root. TLS reaches the root,
    the identities are checked against the issuing CA, and the job trains."""
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, profile="secure")
    write_two_tier_pki(fed.certs, [s.name for s in fed.sites])
    assert trees(run_job(fed)) == trees(reference(fed))  # every site exited 0
    assert _job_status(fed.db_url, "job-a")["status"] == "done"


def test_secure_client_sigkilled_mid_level_is_dropped_and_training_completes(
        tmp_path: Path, tiny_parts, job_dir, make_db_url) -> None:
    parts, feat = tiny_parts
    # deadline: each step's; generous for a loaded CI box
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=5, deadline=15.0, min_clients=4,
                    profile="secure", make_db_url=make_db_url)
    try:
        launch_server(fed)
        clients = [launch_client(fed, k) for k in range(5)]
        freeze_mid_job(fed, clients[4], 2)
        os.kill(clients[4].pid, signal.SIGKILL)
        clients[4].wait(5)
        # the site restarts its client: it cannot answer the open round without the keys
        # that died with the old process, tells the server so (a refusal, code "restarted"),
        # and the server drops it at once instead of at the step's deadline (if the deadline
        # has passed before the restarted client asks, it is told it was dropped)
        restarted = launch_client(fed, 4)
        codes = [c.wait(600) for c in clients[:4]]
        restarted_code = restarted.wait(300)
    finally:
        stop_all(fed)
    assert codes == [0, 0, 0, 0], [(fed.root / f"client-{k}.log").read_text()
                                   for k in range(4)]
    for k in range(4):  # every other site is told, once, that client-4 was dropped
        told = (fed.root / f"client-{k}.log").read_text()
        assert told.count("site client-4 was dropped at round") == 1, told
    log4 = (fed.root / "client-4.log").read_text()
    assert restarted_code != 0
    # it uploaded in the job's earlier rounds: its receipts say so (a refusal at the first
    # step); stopped before its first upload, it lacks the open round's keys
    said = [RESTARTED_SECURE, uploaded_before_detail(
        "job-a", fed.root / "state" / "client-4" / "receipts")]
    refused = any(why in log4 for why in said)
    assert refused or "was dropped at round" in log4, log4
    assert "arrived in stage" not in log4
    with AuditLog(fed.audit_url, create=False) as log:
        drops = [e.payload for e in log.entries(job_id="job-a") if e.kind == "client_dropped"]
    assert [d["client"] for d in drops] == ["client-4"], drops
    reason = "refused: restarted" if refused else "missed the round deadline"
    assert drops[0]["reason"].startswith(reason), (drops, log4)
    st = _job_status(fed.db_url, "job-a")
    assert st["status"] == "done", st["reason"]
    db = Database(fed.db_url)
    with db.session() as s:
        states = {m.client_index: m.state for m in s.query(MemberRow)}
    db.dispose()
    assert states[4] == "dropped" and all(states[k] == "active" for k in range(4))
    rounds = _round_entries(fed.audit_url)
    assert "client-4" not in rounds[-1].payload["clients"]
    assert all(e.payload["masked"] is True for e in rounds)
    # the server's round lines count the drop once, in the round it happened in (also when
    # client-4's upload of that round was in, and counted)
    lines = [x for x in (fed.root / "server.log").read_text().splitlines()
             if "event=round " in x and "job=job-a " in x]
    counted = [int(m.group(1)) for x in lines for m in [re.search(r" dropped=(\d+) ", x)] if m]
    assert len(counted) == len(lines) and sum(counted) == 1, lines
    report = verify_log(fed.audit_url,
                        receipts_dir=collect_receipts(fed.root, fed.root / "state"),
                        replay=True)
    assert report.ok, report.problems


def test_a_secure_job_cancelled_by_the_operator_stops_every_site_with_the_reason(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """`fedforest server cancel-job` while a secure job runs (one site frozen mid-job): the
    running server fails it, every site stops with the reason, and the log verifies against
    every site's receipts."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app as cli_app
    from server_app.cancel import CANCELLED

    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, profile="secure")
    try:
        launch_server(fed)
        clients = [launch_client(fed, k) for k in range(3)]
        freeze_mid_job(fed, clients[2], 2)
        time.sleep(0.5)  # the other two sites answer what they can of the open round
        res = CliRunner().invoke(cli_app, ["server", "cancel-job", "--config",
                                           str(fed.server_toml), "--job", "job-a"])
        clients[2].send_signal(signal.SIGCONT)
        codes = [c.wait(120) for c in clients]
    finally:
        stop_all(fed)
    assert res.exit_code == 0, res.output
    assert _job_status(fed.db_url, "job-a")["reason"] == CANCELLED
    logs = [(fed.root / f"client-{k}.log").read_text() for k in range(3)]
    assert all(code != 0 for code in codes), (codes, logs)
    assert all(CANCELLED in log for log in logs), logs
    with AuditLog(fed.audit_url, create=False) as log:
        last = log.entries(job_id="job-a")[-1]
    assert (last.kind, last.payload) == ("job_failed", {"reason": CANCELLED})
    report = verify_log(fed.audit_url,
                        receipts_dir=collect_receipts(fed.root, fed.root / "state"))
    assert report.ok, report.problems


def _open_phase(engine: Engine) -> tuple[int, str, str]:
    """(current round, its phase, job status), read straight from the server's database."""
    try:
        with engine.connect() as con:
            row = con.execute(text(
                "SELECT j.current_round, r.phase, j.status FROM jobs j LEFT JOIN rounds r ON "
                "r.job_id = j.id AND r.round_id = j.current_round WHERE j.id = 'job-a'")).first()
    except (OperationalError, ProgrammingError):  # the server has not created its tables yet
        row = None
    return (-1, "", "") if row is None else (int(row[0]), str(row[1] or ""), str(row[2]))


def _kill_and_restart(fed: Fed, phase: str) -> tuple[int, str, str]:
    """Run the job of three sites; SIGKILL the server once a secure round from round 3 on is
    in its ``phase`` step, restart it, and wait for every site to finish (each must exit 0).
    Returns the open round, phase and job status the killed server left in its database."""
    watch = create_engine(fed.db_url)
    try:
        server = launch_server(fed)
        clients = [launch_client(fed, k) for k in range(3)]
        deadline = time.monotonic() + 600
        seen = (-1, "", "")
        while time.monotonic() < deadline:
            seen = _open_phase(watch)
            if seen[2] != "running" and seen[0] > 0 or seen[0] >= 3 and seen[1] == phase:
                break
            time.sleep(0.002)
        assert seen[2] == "running" and seen[1] == phase, f"never caught phase {phase}: {seen}"
        server.send_signal(signal.SIGKILL)
        server.wait()
        killed_at = _open_phase(watch)
        time.sleep(1.0)  # the clients' requests fail meanwhile; they back off and retry
        launch_server(fed)
        codes = [c.wait(600) for c in clients]
    finally:
        watch.dispose()
        stop_all(fed)
    assert codes == [0, 0, 0], [(fed.root / f"client-{k}.log").read_text() for k in range(3)]
    return killed_at


def test_secure_server_sigkilled_mid_round_resumes_and_gives_the_same_model(
        tmp_path: Path, tiny_parts, job_dir, make_db_url) -> None:
    """SIGKILL the server while a secure round collects unmask shares (the other steps are
    covered in-process by tests/test_server_secagg_api.py), restart it, and finish."""
    phase = "unmask"
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, profile="secure",
                    make_db_url=make_db_url)
    killed_at = _kill_and_restart(fed, phase)
    st = _job_status(fed.db_url, "job-a")
    assert st["status"] == "done", st["reason"]
    got = ForestModel.from_json((fed.root / "client-0.model.json").read_text())
    assert trees(got) == trees(reference(fed))  # equal to the uninterrupted in-process run
    log = (fed.root / "server.log").read_text()
    assert (f"event=resume job=job-a round={killed_at[0]} phase={killed_at[1]}" in log), \
        log[-2000:]
    db = Database(fed.db_url)
    with db.session() as s:
        assert all(m.state == "active" for m in s.query(MemberRow))  # nobody was dropped
    db.dispose()
    rounds = _round_entries(fed.audit_url)
    assert [e.payload["round_id"] for e in rounds] == sorted({e.payload["round_id"]
                                                             for e in rounds})
    assert all(e.payload["secagg"]["recovered"] == [] for e in rounds)
    report = verify_log(fed.audit_url,
                        receipts_dir=collect_receipts(fed.root, fed.root / "state"),
                        replay=True)
    assert report.ok, report.problems


def test_secure_regression_job_packs_its_grids_resumes_after_a_server_kill_and_matches(
        tmp_path: Path, job_dir) -> None:
    """A regression job under `secure` uploads its grids packed (a cell's count and sum in one
    word). SIGKILL the server while a round collects those masked uploads, restart it: the
    round resumes from the stored uploads and the model is the in-process run's."""
    import numpy as np

    from fedforest_secure.protocol import Task

    rng = np.random.default_rng(11)
    parts = []
    for k in range(3):
        X = rng.normal(loc=0.2 * k, size=(60, 4)).round(3)
        parts.append((X, (2 * X[:, 0] - X[:, 1] + rng.normal(scale=0.3, size=60)).round(3)))
    fed = setup_fed(tmp_path, parts, [f"x{j}" for j in range(4)], job_dir, n_clients=3,
                    profile="secure")
    killed_at = _kill_and_restart(fed, "upload")  # a packed grid round's uploads
    watch = create_engine(fed.db_url)
    try:
        with watch.connect() as con:
            blobs = [b for (b,) in con.execute(text(
                "SELECT task_blob FROM rounds WHERE job_id = 'job-a'"))]
    finally:
        watch.dispose()
    assert any("pack" in Task.from_bytes(b).params for b in blobs)
    log = (fed.root / "server.log").read_text()
    assert f"event=resume job=job-a round={killed_at[0]} phase=upload" in log, log[-2000:]
    got = ForestModel.from_json((fed.root / "client-0.model.json").read_text())
    assert got.task == "regression"
    assert trees(got) == trees(reference(fed))
    report = verify_log(fed.audit_url,
                        receipts_dir=collect_receipts(fed.root, fed.root / "state"),
                        replay=True)
    assert report.ok, report.problems
