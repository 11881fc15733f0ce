"""What a server checks before it serves: every unfinished job's audit chain is in the audit
log it is configured with (a restart on another audit database split the chain silently)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from test_integration_https import setup_fed

from fedforest_cli.sim_processes import start_server

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("form", ["url", "path"])
def test_a_server_refuses_to_serve_a_job_whose_audit_chain_is_in_another_log(
        tmp_path: Path, tiny_parts, job_dir, form: str) -> None:
    """The audit database given as a URL or as a file path: the refusal names the job and
    the log, and the server's lease is given back (the next server starts at once)."""
    from sqlalchemy import func, select

    from server_app.db import Database, LeaseRow

    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3)  # job-a created, audited
    toml = fed.server_toml
    other = tmp_path / "other-audit.db"
    toml.write_text(re.sub(r'(?m)^audit_database = ".*"$',
                           f'audit_database = "{"sqlite:///" if form == "url" else ""}{other}"',
                           toml.read_text()))
    proc = start_server(toml, tmp_path / "server.log")
    try:
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "server.log").read_text()
    assert code != 0, log
    assert "job 'job-a'" in log and "other-audit.db" in log and "audit_database" in log, log
    assert "Traceback" not in log
    db = Database(fed.db_url)
    with db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(LeaseRow)).scalar() == 0
    db.dispose()


def test_a_refused_client_certificate_is_in_the_server_log(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """A site connects with a certificate the federation's CA did not sign (a TLS handshake
    the server refuses): the operator reads in the server log that a certificate was refused,
    and OpenSSL's reason, not only the site its TLS error."""
    import socket
    import ssl

    from test_integration_https import launch_server, stop_all

    from fedforest_secure.pki import init_dev_pki

    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3)
    other = init_dev_pki(tmp_path / "other-ca", 1, client_names=["client-0"])
    try:
        launch_server(fed)
        ctx = ssl.create_default_context(cafile=str(fed.certs / "ca.pem"))
        ctx.load_cert_chain(str(other.client_certs[0]), str(other.client_keys[0]))
        port = int(fed.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            try:
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    tls.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    tls.recv(100)  # TLS 1.3: the refusal arrives after the handshake
            except (ssl.SSLError, ConnectionError):
                pass
        deadline = time.monotonic() + 10
        log = ""
        while time.monotonic() < deadline and "tls_refused" not in log:
            time.sleep(0.2)
            log = (tmp_path / "server.log").read_text()
    finally:
        stop_all(fed)
    line = next((x for x in log.splitlines() if "event=tls_refused" in x), None)
    assert line is not None, log[-2000:]
    assert "certificate" in line.lower(), line


def test_a_tls_warning_is_in_the_server_log_at_start_up(
        tmp_path: Path, tiny_parts, job_dir) -> None:
    """A server key its group can read: the server starts, and says so in its log."""
    from test_integration_https import launch_server, stop_all

    parts, feat = tiny_parts
    fed = setup_fed(tmp_path, parts, feat, job_dir, n_clients=3)
    (fed.certs / "server.key").chmod(0o640)
    try:
        launch_server(fed)
    finally:
        stop_all(fed)
    log = (tmp_path / "server.log").read_text()
    line = next((x for x in log.splitlines() if "event=tls_warning" in x), None)
    assert line is not None and " WARNING " in line, log[-2000:]
    assert "its group can read it (mode 0640)" in line and "chmod 600" in line, line
