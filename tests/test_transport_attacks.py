"""Attacks 5-8 on the real server: a uvicorn process on 127.0.0.1 with TLS and mTLS."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from ports import free_port

from fedforest_cli.simulate import start_server, wait_healthy, write_server_config
from fedforest_secure.audit import AuditLog
from fedforest_secure.pki import init_dev_pki
from fedforest_secure.protocol import Task, make_upload
from server_app.audit_hook import open_audit
from server_app.auth import add_client
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

pytestmark = pytest.mark.integration

K = 3


@dataclass
class Live:
    root: Path
    port: int
    certs: Path
    tokens: list[str]
    proc: object

    def ctx(self, k: int = 0) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca.pem"))
        ctx.load_cert_chain(str(self.certs / f"client-{k}.pem"),
                            str(self.certs / f"client-{k}.key"))
        return ctx

    def http(self, k: int = 0, token: int | None = None) -> httpx.Client:
        headers = {} if token is None else {"Authorization": f"Bearer {self.tokens[token]}"}
        return httpx.Client(base_url=f"https://127.0.0.1:{self.port}", verify=self.ctx(k),
                            headers=headers, timeout=10)

    def raw(self, k: int = 0) -> ssl.SSLSocket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        return self.ctx(k).wrap_socket(sock, server_hostname="127.0.0.1")


def _start(root: Path, parts, feat, job_dir, profile: str = "open") -> Live:
    job_toml = job_dir(root / "job", parts, feat, n_clients=K, profile=profile)
    certs = root / "certs"
    init_dev_pki(certs, K, client_names=[f"client-{k}" for k in range(K)])
    port = free_port()
    server_toml = write_server_config(root, port, certs)
    server_toml.write_text(server_toml.read_text().replace(
        "[tls]", "body_timeout_s = 2.0\n\n[tls]"))
    from server_app.settings import load_settings
    settings = load_settings(server_toml)
    db = Database(settings.database)
    tokens = [add_client(db, f"client-{k}") for k in range(K)]
    audit = open_audit(settings.audit_database)
    ServerState(db, audit).create_job(load_job_spec(job_toml))
    audit.close()  # type: ignore[attr-defined]
    db.dispose()
    proc = start_server(server_toml, root / "server.log")
    try:  # a loaded machine can take a while to import and start the server
        wait_healthy(f"https://127.0.0.1:{port}", certs / "ca.pem", proc, timeout=120.0,
                     cert=certs / "client-0.pem", key=certs / "client-0.key")
    except BaseException:
        proc.terminate()
        proc.wait(10)
        raise
    return Live(root, port, certs, tokens, proc)


def _serving(root: Path, tiny_parts, job_dir) -> Iterator[Live]:
    parts, feat = tiny_parts
    lv = _start(root, parts, feat, job_dir)
    try:
        yield lv
    finally:
        lv.proc.terminate()  # type: ignore[attr-defined]
        lv.proc.wait(10)  # type: ignore[attr-defined]


@pytest.fixture()
def live(tmp_path: Path, tiny_parts, job_dir) -> Iterator[Live]:
    """A server of its own, for a test whose sites join the job (and so change it)."""
    yield from _serving(tmp_path, tiny_parts, job_dir)


@pytest.fixture(scope="module")
def unjoined(tmp_path_factory: pytest.TempPathFactory, tiny_parts, job_dir) -> Iterator[Live]:
    """One server for the tests that change nothing on it: no site is a member of its job
    (each of their requests is refused, or only asks who its sender is). Its log holds the
    lines of each of those tests, in turn."""
    yield from _serving(tmp_path_factory.mktemp("unjoined"), tiny_parts, job_dir)


def _response_head(sock: ssl.SSLSocket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    try:
        return sock.recv(4096)
    except TimeoutError:
        return b""


def test_attack5_an_unauthenticated_huge_join_body_is_refused_before_it_is_read(
        unjoined: Live) -> None:
    sock = unjoined.raw()
    claimed = 300 << 20
    sock.sendall(b"POST /v1/jobs/job-a/join HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(claimed).encode() + b"\r\n\r\n")
    sock.sendall(b"{" + b" " * (1 << 20))
    head = _response_head(sock, 5.0)
    sock.close()
    assert head.startswith(b"HTTP/1.1 4"), "the server keeps reading an unauthenticated body"


def test_attack5_a_stalled_upload_is_dropped(unjoined: Live) -> None:
    sock = unjoined.raw()
    sock.sendall(b"POST /v1/jobs/job-a/rounds/0/upload HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Authorization: Bearer " + unjoined.tokens[0].encode() + b"\r\n"
                 b"Content-Type: application/octet-stream\r\nContent-Length: 16777216\r\n\r\n")
    head = _response_head(sock, 8.0)
    sock.close()
    assert head.startswith(b"HTTP/1.1 408") or head.startswith(b"HTTP/1.1 4"), \
        "a stalled upload is held open with no body timeout"


def test_attack5_a_chunked_body_past_the_limit_is_cut_off_while_it_streams(
        unjoined: Live) -> None:
    sock = unjoined.raw()
    sock.sendall(b"POST /v1/jobs/job-a/join HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Authorization: Bearer " + unjoined.tokens[0].encode() + b"\r\n"
                 b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b" " * 32768
    sent = 0
    head = b""
    sock.settimeout(0.2)
    for _ in range(64):  # up to 2 MiB; the limit of a JSON route is 64 KiB
        try:
            sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sent += len(chunk)
        except OSError:
            break
        try:
            head = sock.recv(4096)
        except TimeoutError:
            continue
        if head:
            break
    if not head:
        head = _response_head(sock, 5.0)
    sock.close()
    assert head.startswith(b"HTTP/1.1 413"), head[:100]
    assert sent < 32 * len(chunk), "the server read the whole body before refusing it"


def test_attack6_a_token_is_bound_to_the_name_in_the_client_certificate(
        unjoined: Live) -> None:
    before = (unjoined.root / "server.log").stat().st_size  # the lines of the tests before
    with unjoined.http(k=2, token=0) as http:  # client-2's certificate, client-0's token
        r = http.get("/v1/me")
    assert r.status_code in (401, 403), f"client-2's certificate acts as {r.json()}"
    assert r.json()["error"] == "certificate_mismatch"
    with unjoined.http(k=2, token=2) as http:  # its own token over its own certificate
        assert http.get("/v1/me").json() == {"name": "client-2"}
    # the operator reads whose token came over whose certificate (a leaked token?); and an
    # unknown token is logged too, never the token itself
    with unjoined.http(k=1) as http:
        assert http.get("/v1/me", headers={"Authorization": "Bearer nope"}).status_code == 401
    with (unjoined.root / "server.log").open("rb") as fh:
        fh.seek(before)
        log = fh.read().decode()
    assert "event=auth_refused" in log and "reason=certificate_mismatch token_of=client-0 " \
        "certificate_of=client-2" in log, log[-2000:]
    assert 'reason="unknown or revoked token" peer=client-1' in log, log[-2000:]
    whole = (unjoined.root / "server.log").read_text()  # every test's lines: no token in any
    assert not any(token in whole for token in unjoined.tokens) and "nope" not in whole


@pytest.mark.parametrize("header", ["X-Forwarded-For", "Forwarded"])
def test_attack6_a_forwarded_header_does_not_lend_another_connections_certificate(
        unjoined: Live, header: str) -> None:
    """client-0 holds client-2's token: over its own certificate, it names a live connection
    of client-2's (its address and port) in a proxy header. The server binds the token to
    the certificate of the connection the request came on, whatever the headers say."""
    other = unjoined.raw(k=2)  # client-2's connection, kept open
    try:
        other.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert other.recv(4096).startswith(b"HTTP/1.1 200")
        host, port = other.getsockname()[:2]
        value = f"{host}:{port}" if header == "X-Forwarded-For" else f'for="{host}:{port}"'
        with unjoined.http(k=0, token=2) as http:
            r = http.get("/v1/me", headers={header: value})
    finally:
        other.close()
    assert r.status_code == 403, f"client-0 acts as {r.text}"
    assert r.json()["error"] == "certificate_mismatch"


def test_attack7_refuse_is_not_accepted_in_an_open_job(live: Live) -> None:
    with live.http(k=1, token=1) as http:
        assert http.post("/v1/jobs/job-a/join").status_code == 200
        r = http.post("/v1/jobs/job-a/rounds/0/secagg/refuse",
                      json={"reason": "<script>x</script> the coordinator is lying " * 5})
    assert r.status_code >= 400, "an open job accepted a refusal with free text"
    with AuditLog(live.root / "audit.db", create=False) as log:
        text = json.dumps([e.payload for e in log.entries(job_id="job-a")])
    assert "<script>" not in text


def test_attack8_negative_counts_are_rejected_in_open_rounds(live: Live, tiny_parts) -> None:
    """A site's honest upload (with every disclosure its task asks) whose counts are made
    negative: the range check refuses it, nothing else in the upload being wrong."""
    from fedforest_secure.config import JobConfig
    from fedforest_secure.federation import client_seed
    from fedforest_secure.protocol import StatKind, kind_code, kinds_vector
    from fedforest_secure.worker import Worker

    for k in (1, 2):
        with live.http(k=k, token=k) as other:
            assert other.post("/v1/jobs/job-a/join").status_code == 200
    with live.http(k=0, token=0) as http:
        info = http.post("/v1/jobs/job-a/join").json()
        r = http.get("/v1/jobs/job-a/task")
        assert r.status_code == 200
        task = Task.from_bytes(r.content)
        config = JobConfig.from_json(json.dumps(info["config"]))
        X, y = tiny_parts[0][0]
        reply = Worker(config, X, y, client_index=0, seed=client_seed(config, 0)).handle(task)
        vec = reply.summable.astype(np.float64)
        counts = kinds_vector(task.layout) == kind_code(StatKind.COUNT)
        assert counts.any()
        vec[counts] = -5.0
        body = make_upload(task, vec, reply.disclosed)
        r = http.post(f"/v1/jobs/job-a/rounds/{task.round_id}/upload", content=body,
                      headers={"Content-Type": "application/octet-stream"})
    assert info["config"]["profile"]["name"] == "open"
    assert r.status_code == 400, f"a negative count was accepted: {r.status_code} {r.text}"
    assert r.json()["error"] == "out_of_range", r.text


def test_a_client_that_disconnects_mid_upload_is_no_server_error(live: Live) -> None:
    """A site whose connection drops while it uploads (a network cut, a killed process) is a
    client's failure: the server logs it as such, without a traceback or an HTTP 500."""
    for k in (0, 1, 2):  # the job runs: its first round is open for uploads
        with live.http(k=k, token=k) as other:
            assert other.post("/v1/jobs/job-a/join").status_code == 200
    with live.http(0, token=0) as http:
        round_id = Task.from_bytes(http.get("/v1/jobs/job-a/task").content).round_id
    sock = live.raw()
    sock.sendall(f"POST /v1/jobs/job-a/rounds/{round_id}/upload HTTP/1.1\r\n".encode()
                 + b"Host: 127.0.0.1\r\n"
                 b"Authorization: Bearer " + live.tokens[0].encode() + b"\r\n"
                 b"Content-Type: application/octet-stream\r\nContent-Length: 1048576\r\n\r\n")
    sock.sendall(b"\0" * (1 << 19))  # half of a length the round's upload may have
    sock.close()
    time.sleep(1.0)
    with live.http(0, token=0) as http:  # the server answers on; the log has had its line
        assert http.get("/v1/me").status_code == 200
    log = (live.root / "server.log").read_text()
    assert "ClientDisconnect" not in log and "Traceback" not in log, log[-2000:]


def _post_head(live: Live, path: str, *, length: int | None, total: int) -> tuple[bytes, int]:
    """client-0 POSTs ``total`` bytes of zeros to ``path`` (with ``Content-Length: length``,
    or chunked), reading for an answer between chunks: ``(the answer's first bytes, bytes
    sent before it came)``."""
    sock = live.raw()
    framing = (f"Content-Length: {length}" if length is not None
               else "Transfer-Encoding: chunked").encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
                 + b"Authorization: Bearer " + live.tokens[0].encode() + b"\r\n"
                 b"Content-Type: application/octet-stream\r\n" + framing + b"\r\n\r\n")
    chunk = b"\0" * (1 << 16)
    sent, head = 0, b""
    sock.settimeout(0.2)
    while sent < total and not head:
        try:
            head = sock.recv(4096)  # an answer already (or the connection closed: b"")
            break
        except TimeoutError:
            pass
        try:
            sock.sendall(chunk if length is not None
                         else b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        except OSError:  # the server answered and closed: read its answer
            break
        sent += len(chunk)
    if not head:
        head = _response_head(sock, 5.0)
    sock.settimeout(5.0)
    while head and not _complete(head):  # the rest of the answer
        try:
            more = sock.recv(4096)
        except (TimeoutError, OSError):
            break
        if not more:
            break
        head += more
    sock.close()
    return head, sent


def _complete(answer: bytes) -> bool:
    """Whether ``answer`` holds a whole response (its head and Content-Length bytes)."""
    top, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in top.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return True


def _json_of(head: bytes) -> dict[str, object]:
    return dict(json.loads(head.split(b"\r\n\r\n", 1)[1]))


def test_an_upload_before_the_job_starts_is_refused_before_its_body_is_read(
        live: Live) -> None:
    """One member, the job not started (no round issued): a 128 MiB upload is answered
    at once, before its body is read, so no member makes the server hold such bodies
    (each up to ``max_upload_bytes``) before any check."""
    with live.http(k=0, token=0) as http:
        assert http.post("/v1/jobs/job-a/join").status_code == 200
    head, sent = _post_head(live, "/v1/jobs/job-a/rounds/1/upload", length=128 << 20,
                            total=128 << 20)
    assert head.startswith(b"HTTP/1.1 409"), head[:200]
    assert _json_of(head)["error"] == "wrong_round"
    assert sent < 8 << 20, f"the server read {sent} bytes before refusing"


def test_an_upload_larger_than_its_round_can_take_is_refused_before_its_body_is_read(
        live: Live, tiny_parts) -> None:
    """A member of the open round states 64 MiB, or sends a chunked body: refused with a
    413 naming the round's limit (its task's vector and disclosures plus the largest
    header), at once or as the body passes that limit; the site's honest upload is then
    accepted."""
    from fedforest_secure.config import JobConfig
    from fedforest_secure.federation import client_seed
    from fedforest_secure.worker import Worker

    for k in (1, 2):
        with live.http(k=k, token=k) as other:
            assert other.post("/v1/jobs/job-a/join").status_code == 200
    with live.http(k=0, token=0) as http:
        info = http.post("/v1/jobs/job-a/join").json()
        task = Task.from_bytes(http.get("/v1/jobs/job-a/task").content)
    path = f"/v1/jobs/job-a/rounds/{task.round_id}/upload"
    head, sent = _post_head(live, path, length=64 << 20, total=64 << 20)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    said = _json_of(head)
    assert said["error"] == "too_large", said
    limit = int(str(said["detail"]).split(" at most ")[1].split()[0])
    assert limit < 2 << 20, said  # the vector of a few KB and 1 MiB of header
    assert sent < 8 << 20, f"the server read {sent} bytes before refusing"
    head, sent = _post_head(live, path, length=None, total=64 << 20)
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    assert sent < limit + (8 << 20), f"the server read {sent} bytes of a chunked body"
    config = JobConfig.from_json(json.dumps(info["config"]))
    X, y = tiny_parts[0][0]
    reply = Worker(config, X, y, client_index=0, seed=client_seed(config, 0)).handle(task)
    body = make_upload(task, reply.summable.astype(np.float64), reply.disclosed)
    with live.http(k=0, token=0) as http:
        r = http.post(path, content=body, headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 200 and r.json()["duplicate"] is False, r.text
