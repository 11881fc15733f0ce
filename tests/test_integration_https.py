"""Real uvicorn server (TLS, mTLS) and real client processes on 127.0.0.1, with the server's
database and the audit log on each backend (SQLite files, PostgreSQL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ports import free_port

from fedforest_cli.sim_data import SiteData
from fedforest_cli.sim_processes import stop
from fedforest_cli.simulate import (
    _job_status,
    collect_receipts,
    db_url,
    start_client,
    start_server,
    wait_healthy,
    write_server_config,
)
from fedforest_secure.audit import AuditLog, contains_per_client_plaintext, verify_log
from fedforest_secure.federation import run_in_process
from fedforest_secure.model import ForestModel
from fedforest_secure.pki import init_dev_pki
from server_app.admin import ServerAdmin
from server_app.db import Database
from server_app.jobspec import build_config, load_job_spec
from server_app.settings import load_settings

pytestmark = pytest.mark.integration


@dataclass
class Fed:
    root: Path
    server: Provisioned
    sites: list[SiteData]
    job_toml: Path
    parts: list
    db_url: str
    audit_url: str
    profile: str = "open"  # the job's profile, which every client pins with --profile
    #: every process launched for this federation (stopped by :func:`stop_all`)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def certs(self) -> Path:
        return self.server.certs

    @property
    def server_toml(self) -> Path:
        return self.server.toml


@dataclass
class Provisioned:
    """A server's configuration on 127.0.0.1 with its clients registered and jobs created."""

    certs: Path
    port: int
    toml: Path
    #: the clients' bearer tokens, in the order of their names
    tokens: list[str]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def launch(self, log: Path, procs: list[subprocess.Popen[bytes]]
               ) -> subprocess.Popen[bytes]:
        """Start the server (appended to ``procs`` at once, so the caller stops it whatever
        happens next) and wait until it answers over mTLS."""
        proc = start_server(self.toml, log)
        procs.append(proc)
        # generous: a server's imports take long on a loaded machine
        wait_healthy(self.url, self.certs / "ca.pem", proc, timeout=180,
                     cert=self.certs / "client-0.pem", key=self.certs / "client-0.key")
        return proc


def provision(root: Path, names: list[str], job_tomls: list[Path], *,
              database: str | None = None, audit_database: str | None = None,
              audited: bool = True) -> Provisioned:
    """Development certificates for ``names`` in ``root/certs``, ``root/server.toml`` on a free
    port (SQLite files in root unless database URLs are given; no audit log unless
    ``audited``), the clients registered and the jobs created, as an operator does before
    starting the server."""
    certs = root / "certs"
    init_dev_pki(certs, len(names), client_names=names)
    port = free_port()
    server_toml = write_server_config(root, port, certs, database=database,
                                      audit_database=audit_database)
    if not audited:
        server_toml.write_text("".join(
            line for line in server_toml.read_text().splitlines(keepends=True)
            if not line.startswith("audit_database")))
    with ServerAdmin.from_settings(load_settings(server_toml)) as admin:
        tokens = [admin.add_client(n) for n in names]
        for job_toml in job_tomls:
            admin.create_job(load_job_spec(job_toml))
    return Provisioned(certs, port, server_toml, tokens)


def setup_fed(root: Path, parts, feat, job_dir, *, n_clients: int, deadline: float = 60.0,
              min_clients: int | None = None, profile: str = "open",
              make_db_url=None, audited: bool = True) -> Fed:
    """A job with its sites, certificates and server configuration; the databases are
    ``make_db_url("server")`` and ``make_db_url("audit")`` (default: SQLite files in root)."""
    job_toml = job_dir(root, parts, feat, n_clients=n_clients, deadline=deadline,
                       min_clients=min_clients, profile=profile)
    names = [f"client-{k}" for k in range(n_clients)]
    urls = ((make_db_url("server"), make_db_url("audit")) if make_db_url is not None
            else (db_url(root / "server.db"), db_url(root / "audit.db")))
    server = provision(root, names, [job_toml], database=urls[0], audit_database=urls[1],
                       audited=audited)
    sites = [SiteData(n, root / "sites" / f"{n}.csv", root / "schema.toml", t, *parts[k])
             for k, (n, t) in enumerate(zip(names, server.tokens, strict=True))]
    return Fed(root, server, sites, job_toml, parts[:n_clients], urls[0], urls[1], profile)


def launch_server(fed: Fed) -> subprocess.Popen[bytes]:
    return fed.server.launch(fed.root / "server.log", fed.procs)


def launch_client(fed: Fed, k: int, job: str = "job-a") -> subprocess.Popen[bytes]:
    s = fed.sites[k]
    proc = start_client(s, fed.url, job, fed.certs, fed.root / "state" / s.name,
                        fed.root / f"{s.name}.log", fed.root / f"{s.name}.model.json",
                        profile=fed.profile)
    fed.procs.append(proc)
    return proc


def run_job(fed: Fed, *, timeout: float = 600) -> ForestModel:
    """Start the server and every site's client, wait for the job to end, stop them all, and
    return the model client-0 saved (every client must have exited 0: their logs otherwise)."""
    try:
        launch_server(fed)
        clients = [launch_client(fed, k) for k in range(len(fed.sites))]
        codes = [c.wait(timeout) for c in clients]
    finally:
        stop_all(fed)
    assert codes == [0] * len(clients), [(fed.root / f"client-{k}.log").read_text()
                                         for k in range(len(clients))]
    return ForestModel.from_json((fed.root / "client-0.model.json").read_text())


def stop_all(fed: Fed) -> None:
    """Stop every process launched for ``fed`` that still runs (clients first)."""
    for proc in reversed(fed.procs):
        stop(proc)


def trees(model: ForestModel) -> dict:
    """The forest itself: what an in-process run must reproduce (the job's model also carries
    its schema and site names; run meta differs)."""
    d = model.to_dict()
    return {k: d[k] for k in ("task", "n_features", "n_classes", "n_clients", "trees")}


def reference(fed: Fed) -> ForestModel:
    config = build_config(load_job_spec(fed.job_toml))
    return run_in_process(config, [(X.astype(float), y) for X, y in fed.parts])


def wait_round(fed: Fed, at_least: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = _job_status(fed.db_url, "job-a")
        if st["round"] >= at_least or st["status"] in ("done", "failed"):
            return
        time.sleep(0.05)
    raise AssertionError("the job did not reach the round in time")


def freeze_mid_job(fed: Fed, client: subprocess.Popen[bytes], at_least: int,
                   timeout: float = 300) -> None:
    """Leave ``client`` frozen (SIGSTOP) once the job reaches round ``at_least``: the job
    cannot finish without its answers, so a kill or a restart that follows happens mid-job.
    The client runs in steps of 10 ms between frozen status checks, so a tiny job cannot run
    to its end between a check and the freeze; a job that ended anyway would make the test
    vacuous, so it fails here instead."""
    deadline = time.monotonic() + timeout
    client.send_signal(signal.SIGSTOP)
    while True:
        st = _job_status(fed.db_url, "job-a")
        if st["round"] >= at_least or st["status"] in ("done", "failed"):
            break
        assert time.monotonic() < deadline, "the job did not reach the round in time"
        client.send_signal(signal.SIGCONT)
        time.sleep(0.01)
        client.send_signal(signal.SIGSTOP)
    assert st["status"] == "running", f"the job was {st['status']} before the freeze"


def test_full_job_matches_in_process(tmp_path: Path, tiny_parts, job_dir, make_db_url) -> None:
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, make_db_url=make_db_url)
    try:
        launch_server(fed)
        clients = [launch_client(fed, k) for k in range(3)]
        codes = [c.wait(600) for c in clients]
    finally:
        stop_all(fed)
    assert codes == [0, 0, 0], [(fed.root / f"client-{k}.log").read_text() for k in range(3)]
    got = ForestModel.from_json((fed.root / "client-1.model.json").read_text())
    assert trees(got) == trees(reference(fed))
    receipts = (fed.root / "state" / "client-0" / "receipts.jsonl").read_text().splitlines()
    assert len(receipts) >= 2 and "upload_sha256" in json.loads(receipts[0])
    # the audit log verifies against every client's receipts, replays (tasks and model follow
    # from the logged aggregates and disclosures), and shows the open profile's per-client
    # plaintext: unmasked rounds and the disclosed quantile sketches
    report = verify_log(fed.audit_url, receipts_dir=collect_receipts(
        fed.root, fed.root / "state"), replay=True)
    assert report.ok, report.problems
    assert report.receipts_checked == 3 * len(receipts) + 3  # one model receipt per client
    with AuditLog(fed.audit_url, create=False) as log:
        plain = contains_per_client_plaintext(log, "job-a")
    assert {e.kind for e in plain} == {"round", "disclosure"}


def test_a_killed_site_and_a_stalled_one_are_dropped_the_job_ends_and_the_stalled_one_is_told(
        tmp_path: Path, tiny_parts, job_dir, make_db_url) -> None:
    """Mid-job, client-4 is killed (SIGKILL) and client-3 stalls (SIGSTOP): the round's
    deadline drops both, the other three train to the end, and client-3, woken once the job is
    done, is told it was dropped (exit code 3, no traceback)."""
    parts, feat = tiny_parts
    # the round deadline drops the killed and the stalled client and must never drop a healthy
    # one: this job's rounds take up to 4.6 s each on an overloaded 2-core machine (3.4 s,
    # 2.7 s for the next ones); 15 s, as in the secure test, leaves a margin of three
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=5, deadline=15.0, min_clients=3,
                    make_db_url=make_db_url)
    try:
        launch_server(fed)
        clients = [launch_client(fed, k) for k in range(5)]
        freeze_mid_job(fed, clients[4], 2)
        freeze_mid_job(fed, clients[3], 2)  # the job is at round 2 already: frozen at once
        os.kill(clients[4].pid, signal.SIGKILL)
        codes = [c.wait(600) for c in clients[:3]]
        clients[4].wait(5)
        clients[3].send_signal(signal.SIGCONT)  # the job is done; the stalled site wakes up
        late = clients[3].wait(120)
    finally:
        stop_all(fed)
    assert codes == [0, 0, 0]
    st = _job_status(fed.db_url, "job-a")
    assert st["status"] == "done"
    db = Database(fed.db_url)
    from server_app.db import MemberRow

    with db.session() as s:
        states = {m.client_index: m.state for m in s.query(MemberRow)}
    db.dispose()
    assert states == {0: "active", 1: "active", 2: "active", 3: "dropped", 4: "dropped"}
    log = (fed.root / "client-3.log").read_text()
    assert late == 3, log
    assert "this site was dropped from job job-a" in log and "model download" in log
    assert "Traceback" not in log


def test_server_restart_mid_job_gives_the_same_model(tmp_path: Path, tiny_parts,
                                                     job_dir, make_db_url) -> None:
    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3, make_db_url=make_db_url)
    try:
        server = launch_server(fed)
        clients = [launch_client(fed, k) for k in range(3)]
        freeze_mid_job(fed, clients[2], 3)
        server.send_signal(signal.SIGKILL)
        server.wait()
        time.sleep(0.5)
        server = launch_server(fed)
        clients[2].send_signal(signal.SIGCONT)
        codes = [c.wait(600) for c in clients]
    finally:
        stop_all(fed)
    assert codes == [0, 0, 0]
    got = ForestModel.from_json((fed.root / "client-0.model.json").read_text())
    assert trees(got) == trees(reference(fed))
    # the open profile's job resumed in the round it was in, and the log says so
    assert "event=resume job=job-a round=" in (fed.root / "server.log").read_text()
