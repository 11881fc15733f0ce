"""How a site's client ends a job over HTTPS (real uvicorn server and client processes), and what
the server and the other sites see of it. (A site that stalls past a round's deadline and comes
back is told it was dropped, exit code 3: test_integration_https.py, beside a killed site.)"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_integration_https import (
    Fed,
    freeze_mid_job,
    launch_client,
    launch_server,
    run_job,
    setup_fed,
    stop_all,
)

pytestmark = pytest.mark.integration


def test_a_server_without_an_audit_log_lets_its_sites_finish(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, audited=False)
    run_job(fed)
    logs = [(fed.root / f"client-{k}.log").read_text() for k in range(3)]
    assert all("keeps no audit log" in text for text in logs)
    assert (fed.root / "client-0.model.json").exists()
    assert not list((fed.root / "state" / "client-0" / "receipts").glob("*model*"))


def test_a_site_whose_table_does_not_fit_the_schema_declines_and_the_operator_sees_why(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """client-2's table has a value outside the schema's public bounds: the client stops
    before joining (exit code 2, row and column in its own log) and tells the server "table",
    which the job's status shows beside it; no value of the table reaches the server."""
    import time

    from server_app.db import Database, JobRow
    from server_app.status import job_status

    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3)
    csv = fed.sites[2].csv
    lines = csv.read_text().splitlines()
    cells = lines[1].split(",")
    cells[0] = "123456789"
    lines[1] = ",".join(cells)
    csv.write_text("\n".join(lines) + "\n")
    try:
        launch_server(fed)
        code = launch_client(fed, 2).wait(300)
    finally:
        stop_all(fed)
    log = (fed.root / "client-2.log").read_text()
    assert code == 2 and "outside the public bounds" in log, log
    db = Database(fed.db_url)
    with db.session() as sess:
        job = sess.get(JobRow, "job-a")
        assert job is not None
        st = job_status(sess, job, None, time.time())
    db.dispose()
    assert [m["declined"] for m in st["members"]] == [None, None, "table"]
    assert "123456789" not in (fed.root / "server.log").read_text()


def _break_receipts(fed: Fed, name: str) -> None:
    """Replace the site's receipts folder by a file: its next receipt cannot be written (as on
    a full or read-only disk)."""
    receipts = fed.root / "state" / name / "receipts"
    for _ in range(50):
        try:
            shutil.rmtree(receipts, ignore_errors=False)
            receipts.write_text("not a folder")
            return
        except OSError:  # the client was writing into it
            time.sleep(0.05)
    raise AssertionError(f"could not replace {receipts}")


def _run_stopping_one(fed: Fed, n: int, who: int,
                      stop: Callable[[list[subprocess.Popen[bytes]]], None]) -> list[int]:
    """Run the job with ``n`` sites, freeze site ``who`` once round 2 is open (the job cannot
    end without it: :func:`freeze_mid_job`), call ``stop(clients)`` while it is frozen (a
    signal sent then is delivered as it goes on), let it go on, and return every client's
    exit code."""
    try:
        launch_server(fed)
        clients = [launch_client(fed, k) for k in range(n)]
        freeze_mid_job(fed, clients[who], 2)
        try:
            stop(clients)
        finally:
            clients[who].send_signal(signal.SIGCONT)
        return [c.wait(200) for c in clients]
    finally:
        stop_all(fed)


@pytest.mark.parametrize(("stop", "exit_code", "said", "reason"), [
    ("SIGINT", 130, "interrupted", "refused: stopped"),
    ("SIGTERM", 143, "terminated", "refused: stopped"),
    ("SIGHUP", 129, "hung up", "refused: stopped"),  # the terminal it ran in closed
    ("receipt_error", 2, "receipts", "refused: failed"),
])
def test_a_secure_site_that_stops_mid_job_tells_the_server_and_the_others_do_not_wait(
        tmp_path: Path, tiny_parts, job_dir, stop: str, exit_code: int, said: str,
        reason: str) -> None:
    """A site's client stops mid-job: Ctrl-C (SIGINT), SIGTERM (how a service manager stops
    it), SIGHUP (its terminal closed), or an error it cannot go on after (its receipt cannot be
    written, as on a full disk). Its round keys die with the process, so it tells the server
    at once (a refusal, code "stopped", or "failed" after an error) and exits saying why (130
    "interrupted", 143 "terminated", 129 "hung up", or 2 with the error); the other sites go
    on without waiting out the round's deadline (here 300 s: the job would outlast the test's
    wait)."""
    from fedforest_secure.audit import AuditLog

    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=4, deadline=300.0,
                    min_clients=3, profile="secure")

    def stop_client_3(clients: list[subprocess.Popen[bytes]]) -> None:
        if stop == "receipt_error":
            # frozen while its receipts go (it writes none meanwhile): the job cannot end
            # before the receipt of its next answer, which it cannot write
            _break_receipts(fed, "client-3")
        else:
            clients[3].send_signal(getattr(signal, stop))

    *codes, stopped = _run_stopping_one(fed, 4, 3, stop_client_3)
    log3 = (fed.root / "client-3.log").read_text()
    assert stopped == exit_code and said in log3, log3
    assert codes == [0, 0, 0]
    with AuditLog(fed.audit_url, create=False) as log:
        drops = [e.payload for e in log.entries(job_id="job-a") if e.kind == "client_dropped"]
    assert [(d["client"], d["reason"]) for d in drops] == [("client-3", reason)]


def test_a_failed_jobs_log_cut_before_its_failure_does_not_verify_against_the_sites_receipts(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """A secure job of three sites that needs all three fails when client-2 stops mid-job. The
    two others are told the job failed and keep a receipt of it with the chain head the server
    announced: their receipts verify the log, and the same log cut before its failure entries
    (which would read as a job still running, "OK so far") does not."""
    import sqlite3

    from typer.testing import CliRunner

    from fedforest_cli.audit_cli import audit_app

    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, deadline=300.0,
                    min_clients=3, profile="secure")
    _run_stopping_one(fed, 3, 2, lambda clients: clients[2].send_signal(signal.SIGTERM))
    receipts = tmp_path / "receipts"
    receipts.mkdir()
    for k in (0, 1):
        log = (fed.root / f"client-{k}.log").read_text()
        assert "ended: failed" in log, log
        shutil.copy(fed.root / "state" / f"client-{k}" / "receipts" / f"client-{k}.jsonl",
                    receipts)
    kinds = [json.loads(line).get("kind") for k in (0, 1)
             for line in (receipts / f"client-{k}.jsonl").read_text().splitlines()]
    assert kinds.count("failed") == 2
    audit_db = tmp_path / "audit.db"

    def verify() -> tuple[int, str]:
        res = CliRunner().invoke(audit_app, ["verify", "--db", str(audit_db),
                                             "--receipts", str(receipts)])
        return res.exit_code, res.output

    code, out = verify()
    assert code == 0, out
    with sqlite3.connect(audit_db) as con:
        first = con.execute("SELECT min(seq) FROM audit_entries WHERE job_id = 'job-a' AND "
                            "kind IN ('round_aborted', 'job_failed')").fetchone()[0]
        con.execute("DELETE FROM audit_arrays WHERE job_id = 'job-a' AND seq >= ?", (first,))
        con.execute("DELETE FROM audit_entries WHERE job_id = 'job-a' AND seq >= ?", (first,))
    code, out = verify()
    assert code == 1, out
    assert f"the log has no entry seq {first}" in out or "no round_aborted or job_failed" in out


#: ``python -c`` body of a malicious site: ``fedforest client`` whose share bundles carry
#: correctly addressed ciphertexts that are all zeros (the server cannot tell them apart)
def _garbage_shares(peers: str) -> str:
    """A ``python -c`` client whose share ciphertexts to the peers for which ``peers`` (a
    Python expression in ``v``, the peer's index) holds are all zeros."""
    return f"""
from fedforest_secure.secagg import client as C
_share = C.SecAggClient._share_keys_from_parts
def _garbage(self, setup, randbelow):
    bundle = _share(self, setup, randbelow)
    return bundle.model_copy(update={{"ciphertexts": {{
        v: (bytes(len(ct)) if {peers} else ct) for v, ct in bundle.ciphertexts.items()}}}})
C.SecAggClient._share_keys_from_parts = _garbage
from fedforest_cli.cli import app
app(prog_name="fedforest")
"""


def _run_with_a_malicious_client_0(tmp_path: Path, tiny_parts, job_dir,
                                   monkeypatch: pytest.MonkeyPatch, script: str
                                   ) -> tuple[Fed, list[int], list[str]]:
    """A secure job of four sites whose client-0 runs ``script``: the fed, the four exit
    codes and the four client logs."""
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=4, deadline=300.0,
                    profile="secure")
    popen = subprocess.Popen

    def malicious(cmd: list[str], **kw: object) -> subprocess.Popen[bytes]:
        at = cmd.index("-m")
        return popen([*cmd[:at], "-c", script, *cmd[at + 2:]], **kw)  # type: ignore[call-overload]

    try:
        launch_server(fed)
        with monkeypatch.context() as m:
            m.setattr(subprocess, "Popen", malicious)
            clients = [launch_client(fed, 0)]
        clients += [launch_client(fed, k) for k in range(1, 4)]
        codes = [c.wait(300) for c in clients]
    finally:
        stop_all(fed)
    return fed, codes, [(fed.root / f"client-{k}.log").read_text() for k in range(4)]


def _status(fed: Fed) -> dict[str, Any]:
    from server_app.db import Database, JobRow
    from server_app.status import job_status

    db = Database(fed.db_url)
    with db.session() as sess:
        job = sess.get(JobRow, "job-a")
        assert job is not None
        st: dict[str, Any] = job_status(sess, job, None, time.time())
    db.dispose()
    return st


def test_a_site_sending_garbage_shares_is_named_by_the_sites_that_refuse_the_round(
        tmp_path: Path, tiny_parts, job_dir,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """client-0 is malicious: its share ciphertexts are all zeros. Every honest site refuses
    the round naming it (threat_model.md §2.4): the round aborts, and the audit log and the
    job's status name client-0 as accused by the three others, not the honest sites alone as
    the ones that refused."""
    from fedforest_secure.audit import AuditLog, verify_log

    fed, codes, logs = _run_with_a_malicious_client_0(tmp_path, tiny_parts, job_dir,
                                                      monkeypatch, _garbage_shares("True"))
    assert codes == [3, 3, 3, 3], logs
    for log in logs[1:]:
        assert "the share ciphertext of client 0 does not authenticate" in log, log
    with AuditLog(fed.audit_url, create=False) as log:
        entries = log.entries(job_id="job-a")
    drops = sorted((e.payload["client"], e.payload.get("accused"), e.payload["reason"])
                   for e in entries if e.kind == "client_dropped")
    assert drops == [(f"client-{k}", "client-0", "refused: invalid_message (client-0's "
                      "message did not authenticate)") for k in (1, 2, 3)]
    aborted = [e.payload["reason"] for e in entries if e.kind == "round_aborted"]
    assert len(aborted) == 1
    # each refusing site keeps a receipt of the chain head the server answered its refusal
    # with: the log's account of who accused whom is checked against them
    receipts = tmp_path / "receipts"
    receipts.mkdir()
    for k in (1, 2, 3):
        kept = fed.root / "state" / f"client-{k}" / "receipts" / f"client-{k}.jsonl"
        assert '"kind": "refused"' in kept.read_text()
        shutil.copy(kept, receipts)
    with AuditLog(fed.audit_url, create=False) as log:
        assert verify_log(log, receipts_dir=receipts).ok
    assert "accused by the sites that refused: client-0 (3 sites)" in aborted[0], aborted
    st = _status(fed)
    assert st["status"] == "failed" and st["reason"] == aborted[0]


def test_a_site_sending_garbage_shares_to_one_peer_fails_the_job_instead_of_removing_it(
        tmp_path: Path, tiny_parts, job_dir,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """client-0 sends client-1 alone share ciphertexts that do not authenticate, and its
    other peers good ones: client-1 refuses the round accusing client-0, the others upload.
    The round aborts once its phase closes, so the accused site cannot choose which honest
    sites leave a job that goes on with it (it gets no model), and every site is told who
    accused whom."""
    from fedforest_secure.audit import AuditLog

    fed, codes, logs = _run_with_a_malicious_client_0(tmp_path, tiny_parts, job_dir,
                                                      monkeypatch, _garbage_shares("v == 1"))
    assert "the share ciphertext of client 0 does not authenticate" in logs[1], logs[1]
    assert codes[1] == 3, logs[1]
    st = _status(fed)
    assert st["status"] == "failed", (st["status"], st["reason"])
    assert "accused by the sites that refused: client-0 (1 site)" in st["reason"], st["reason"]
    with AuditLog(fed.audit_url, create=False) as log:
        entries = log.entries(job_id="job-a")
    assert not [e for e in entries if e.kind == "model"]
    assert [e.payload["reason"] for e in entries if e.kind == "round_aborted"] == [st["reason"]]
    for k in (0, 2, 3):  # the sites that stayed end with the job's failure, naming the accused
        assert codes[k] != 0, logs[k]
        assert not (fed.root / f"client-{k}.model.json").exists()
    for said in logs[2:]:
        assert "accused by the sites that refused: client-0 (1 site)" in said, said
