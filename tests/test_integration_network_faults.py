"""A secure site whose network loses answers (real uvicorn server and client processes; one
site's client talks to the server through :class:`fault_proxy.FaultProxy`): stopped while its
share bundle's answer never comes, it stops within seconds and tells the server; stopped
while the answer to its refusal is lost, it sends the refusal again, which the server answers
as recorded, and the site says the server was told and keeps its receipt."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable

import pytest
from fault_proxy import Fault, FaultProxy
from test_integration_https import (
    Fed,
    launch_client,
    launch_server,
    setup_fed,
    stop_all,
    wait_round,
)

from fedforest_cli.sim_processes import start_client

pytestmark = pytest.mark.integration

#: seconds within which a client stopped with SIGTERM exits (under a second on a quiet machine):
#: short of the 10 s a container runtime gives it before it kills it (docs/deployment.md)
STOPS_WITHIN = 9.0
REFUSAL = r"^POST /v1/jobs/job-a/rounds/\d+/secagg/refuse "


def _run_through(fed: Fed, proxy: FaultProxy,
                 stop: Callable[[subprocess.Popen[bytes]], None]) -> tuple[int | None, float]:
    """The job with client-0 behind ``proxy``: ``stop(client-0)`` once the job is under way,
    then client-0's exit code (None if it still ran STOPS_WITHIN s after) and how long it took
    to exit."""
    try:
        launch_server(fed)
        proxy.start()
        s = fed.sites[0]
        first = start_client(s, proxy.url, "job-a", fed.certs, fed.root / "state" / s.name,
                             fed.root / f"{s.name}.log", fed.root / f"{s.name}.model.json",
                             profile=fed.profile)
        fed.procs.append(first)
        for k in range(1, len(fed.sites)):
            launch_client(fed, k)
        stop(first)
        stopped = time.monotonic()
        try:
            code: int | None = first.wait(STOPS_WITHIN)
        except subprocess.TimeoutExpired:
            code = None
        return code, time.monotonic() - stopped
    finally:
        stop_all(fed)
        proxy.close()


def _drops(fed: Fed) -> list[tuple[str, str]]:
    from fedforest_secure.audit import AuditLog

    with AuditLog(fed.audit_url, create=False) as log:
        return [(e.payload["client"], e.payload["reason"])
                for e in log.entries(job_id="job-a") if e.kind == "client_dropped"]


def test_a_site_stopped_while_its_shares_answer_never_comes_stops_within_seconds(
        tmp_path, tiny_parts, job_dir) -> None:
    """The answer to client-0's share bundle never comes (its connection goes silent): the
    client computes its answer and waits for that POST in a second thread. SIGTERM (what a
    service manager sends, killing it 10-90 s later) ends it within seconds, not after the
    POST's timeout and retries, and the server is told first (client-0 refused the round)."""
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, deadline=300.0,
                    profile="secure")
    shares = Fault(r"^POST /v1/jobs/job-a/rounds/\d+/secagg/shares", "blackhole")

    def stop(client: subprocess.Popen[bytes]) -> None:
        end = time.monotonic() + 120
        while not shares.hits:
            assert time.monotonic() < end, "client-0 never posted its shares"
            time.sleep(0.05)
        time.sleep(1.0)  # its answer computed, it waits for the POST
        client.send_signal(signal.SIGTERM)

    code, took = _run_through(fed, FaultProxy(fed.server.port, fed.certs, "client-0", [shares]),
                              stop)
    log = (fed.root / "client-0.log").read_text()
    assert code == 143, (code, log)
    assert took < STOPS_WITHIN, took
    assert "terminated: this site has left job job-a (it stopped in the middle of secure " \
           "round" in log and "; the server was told)" in log, log
    assert _drops(fed) == [("client-0", "refused: stopped")]


def test_a_stopped_sites_refusal_whose_answer_is_lost_is_sent_again_and_answered_recorded(
        tmp_path, tiny_parts, job_dir) -> None:
    """client-0 stops mid-round; the server records its refusal (and drops it) but the answer
    is lost (connection reset). The client sends the refusal again: the server answers it as
    recorded, so the client says the server was told and keeps its receipt of the refusal,
    and the audit log has the one drop."""
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, deadline=300.0,
                    profile="secure")
    # the refusal the server records (a refusal of a round that closed just before, which the
    # client may send first, is a 409 and goes through)
    refusal = Fault(REFUSAL, "reset", status=200)

    def stop(client: subprocess.Popen[bytes]) -> None:
        wait_round(fed, 2)
        client.send_signal(signal.SIGTERM)

    proxy = FaultProxy(fed.server.port, fed.certs, "client-0", [refusal])
    code, _ = _run_through(fed, proxy, stop)
    log = (fed.root / "client-0.log").read_text() + "\n".join(proxy.log)
    assert code == 143, (code, log)
    assert len(refusal.hits) == 1  # the recorded refusal's answer was lost
    assert "was not told" not in log and "; the server was told)" in log, log
    receipts = (fed.root / "state" / "client-0" / "receipts" / "client-0.jsonl").read_text()
    refused = [r for r in map(json.loads, receipts.splitlines()) if r.get("kind") == "refused"]
    assert [(r["job_id"], r["client"]) for r in refused] == [("job-a", "client-0")], receipts
    assert _drops(fed) == [("client-0", "refused: stopped")]
