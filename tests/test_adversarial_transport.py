"""Network attacker and authentication: tokens, cross-job access, TLS and plain-HTTP refusal."""

from __future__ import annotations

import hmac
import socket
import threading
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nacl.signing import SigningKey
from test_fuzz_api import db_snapshot
from test_pki import _tls_server

import server_app.auth as auth_module
from client_app.transport import Transport, TransportFailed
from fedforest_secure.pki import DevPKI, init_dev_pki
from fedforest_secure.protocol import Task, make_upload
from fedforest_secure.secagg import SecAggClient
from server_app.app import create_app
from server_app.audit_hook import NullAudit
from server_app.auth import add_client, authenticate
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


# -- tokens ----------------------------------------------------------------------------------
class _Spy:
    """Stands in for the ``hmac`` module inside server_app.auth and records compare_digest."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, Any]] = []

    def compare_digest(self, a: Any, b: Any) -> bool:
        self.calls.append((a, b))
        return hmac.compare_digest(a, b)


def test_tokens_are_checked_with_compare_digest_on_every_path(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    db = Database(f"sqlite:///{tmp_path / 'auth.db'}")
    token = add_client(db, "site-a")
    spy = _Spy()
    monkeypatch.setattr(auth_module, "hmac", types.SimpleNamespace(
        compare_digest=spy.compare_digest))
    prefix, token_id, secret = token.split("_", 2)
    wrong_secret = f"{prefix}_{token_id}_{'A' * 43}"
    unknown_id = f"{prefix}_{'B' * 16}_{secret}"
    cases = {token: True, wrong_secret: False, unknown_id: False, "garbage": False, "": False}
    for candidate, ok in cases.items():
        before = len(spy.calls)
        row = authenticate(db, candidate)
        assert (row is not None) is ok, candidate
        assert len(spy.calls) == before + 1, f"no constant-time comparison for {candidate!r}"
        a, b = spy.calls[-1]
        # what is compared are two fixed-length digests, never the raw secret
        assert len(a) == len(b) == 64 and secret not in (a, b)
    # and through the HTTP layer
    app = create_app(db, state=ServerState(db, NullAudit()), tick_seconds=3600)
    with TestClient(app) as http:
        before = len(spy.calls)
        r = http.get("/v1/me", headers={"Authorization": f"Bearer {wrong_secret}"})
        assert r.status_code == 401 and len(spy.calls) == before + 1
        r = http.get("/v1/me", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and r.json()["name"] == "site-a"
        # the site's next requests are answered from the token cache: compared alike
        for candidate, status in ((token, 200), (wrong_secret, 401)):
            before = len(spy.calls)
            r = http.get("/v1/me", headers={"Authorization": f"Bearer {candidate}"})
            assert r.status_code == status
            assert len(spy.calls) > before, "a cached token was not compared in constant time"
    db.dispose()


# -- cross-job requests ----------------------------------------------------------------------
@pytest.fixture()
def two_jobs(tmp_path: Path, tiny_parts, job_dir) -> Iterator[dict[str, Any]]:
    """job-a (open) has clients 0-3; job-b (secure) has clients 0-2. Client 3 is job-a's only."""
    parts, feat = tiny_parts
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    tokens = [add_client(db, f"client-{k}") for k in range(4)]
    state = ServerState(db, NullAudit(), clock=lambda: 1000.0, monotonic=lambda: 1000.0)
    for job_id, n, profile in (("job-a", 4, "open"), ("job-b", 3, "secure")):
        state.create_job(load_job_spec(job_dir(tmp_path / job_id, parts, feat, n_clients=n,
                                               job_id=job_id, profile=profile)))
    app = create_app(db, state=state, tick_seconds=3600)
    with TestClient(app) as http:
        hdr = [{"Authorization": f"Bearer {t}"} for t in tokens]
        for k in range(4):
            assert http.post("/v1/jobs/job-a/join", headers=hdr[k]).status_code == 200
        for k in range(3):
            key = bytes(SigningKey.generate().verify_key).hex()
            assert http.post("/v1/jobs/job-b/join", headers=hdr[k],
                             json={"identity_key": key}).status_code == 200
        yield {"http": http, "db": db, "hdr": hdr}
    db.dispose()


def test_a_member_of_one_job_gets_404_on_every_route_of_another(two_jobs: dict) -> None:
    http, hdr, db = two_jobs["http"], two_jobs["hdr"], two_jobs["db"]
    rb = http.get("/v1/jobs/job-b", headers=hdr[0]).json()["round_id"]
    task_b = Task.from_bytes(http.get(f"/v1/jobs/job-b/rounds/{rb}/task", headers=hdr[0]).content)
    body_b = make_upload(task_b, np.zeros(sum(b.size for b in task_b.layout), dtype=np.uint64),
                         {})
    key = SigningKey.generate()
    others = {u: bytes(SigningKey.generate().verify_key) for u in (1, 2)}
    intruder = SecAggClient(0, "job-b", key, {0: bytes(key.verify_key), **others}, n_clients=3,
                            threshold=0.67)
    advert = intruder.advertise(rb).model_dump_json().encode()
    json_hdr = {**hdr[3], "Content-Type": "application/json"}
    requests = [
        ("GET", "/v1/jobs/job-b", {}), ("GET", "/v1/jobs/job-b/task", {}),
        ("GET", "/v1/jobs/job-b/secagg", {}), ("GET", "/v1/jobs/job-b/rounds", {}),
        ("GET", f"/v1/jobs/job-b/rounds/{rb}/task", {}), ("GET", "/v1/jobs/job-b/model", {}),
        ("GET", "/v1/jobs/job-b/directory", {}), ("POST", "/v1/jobs/job-b/join", {}),
        ("POST", f"/v1/jobs/job-b/rounds/{rb}/upload",
         {"content": body_b, "headers": {**hdr[3], "Content-Type": "application/octet-stream"}}),
        ("POST", f"/v1/jobs/job-b/rounds/{rb}/secagg/advert",
         {"content": advert, "headers": json_hdr}),
        ("POST", f"/v1/jobs/job-b/rounds/{rb}/secagg/refuse",
         {"json": {"reason": "roster"}, "headers": hdr[3]}),
    ]
    before = db_snapshot(db)
    for method, path, kw in requests:
        kw = {"headers": hdr[3], **kw}
        r = http.request(method, path, **kw)
        assert r.status_code == 404 and r.json()["error"] == "unknown_job", (method, path, r.text)
        if path.endswith("/upload"):
            continue  # the body's own header names job-b, so job-zz is a header mismatch
        # the answer for "not your job" is the same as for "no such job": no probing
        r2 = http.request(method, path.replace("job-b", "job-zz"), **kw)
        assert (r2.status_code, r2.json()["error"]) == (404, "unknown_job"), path
    assert db_snapshot(db) == before
    # job-b's own members still see it
    assert http.get("/v1/jobs/job-b", headers=hdr[1]).status_code == 200


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer "},
                                     {"Authorization": "bearer ffs_x"},
                                     {"Authorization": "Token abc"}])
def test_every_job_route_needs_a_token(two_jobs: dict, headers: dict) -> None:
    http, db = two_jobs["http"], two_jobs["db"]
    before = db_snapshot(db)
    paths = [r.path for r in http.app.routes if getattr(r, "path", "").startswith("/v1/")]
    assert len(paths) >= 15
    for route in http.app.routes:
        path = getattr(route, "path", "")
        if not path.startswith("/v1/"):
            continue
        url = path.replace("{job_id}", "job-a").replace("{round_id}", "1")
        for method in sorted(route.methods - {"HEAD"}):  # type: ignore[attr-defined]
            r = http.request(method, url, headers=headers)
            assert r.status_code in (401, 403), (method, url, r.status_code)
            assert r.json()["error"] in ("unauthenticated", "http_error"), r.text
    assert db_snapshot(db) == before


# -- TLS and plain HTTP ------------------------------------------------------------------------
def test_transport_refuses_a_server_certificate_from_another_ca(dev_pki: DevPKI,
                                                               tmp_path: Path) -> None:
    rogue = init_dev_pki(tmp_path / "rogue", 0)
    port, th = _tls_server(rogue.server_cert, rogue.server_key)
    tr = Transport(f"https://127.0.0.1:{port}", "tok", dev_pki.ca_cert, retry_budget_s=0.0)
    try:
        with pytest.raises(TransportFailed, match="TLS verification"):
            tr.request("GET", "/health")
    finally:
        tr.close()
        th.join(5)


@pytest.mark.parametrize("url", ["http://fedforest.example.org:8443", "http://10.0.0.1",
                                 "http://localhost.example.org", "ftp://127.0.0.1",
                                 "fedforest.example.org"])
def test_transport_refuses_plain_http_off_loopback(url: str) -> None:
    with pytest.raises(ValueError):
        Transport(url, "tok", None)


def test_transport_needs_the_federation_ca_for_https() -> None:
    with pytest.raises(ValueError, match="--ca"):
        Transport("https://fedforest.example.org", "tok", None)


@pytest.mark.parametrize("insecure_dev", [False, True])
@pytest.mark.parametrize("url", ["http://127.0.0.1.evil.example:8080",
                                 "http://127.0.0.1@evil.example",
                                 "http://127.0.0.1:80@evil.example",
                                 "http://user:pw@127.0.0.1:8080",
                                 "http://localhost.evil.example",
                                 "http://127.0.0.1\\@evil.example",
                                 "http://0x7f.0.0.1", "http://2130706433",
                                 "http://[::ffff:7f00:1]", "http://10.0.0.1",
                                 "https://127.0.0.1@evil.example"])
def test_transport_plain_http_only_to_a_loopback_host(url: str, insecure_dev: bool) -> None:
    """The URL is parsed, never prefix-matched: a host that merely starts like a loopback
    address, user-info hiding the real host, or a non-loopback host is refused, with or without
    ``--insecure-dev``."""
    with pytest.raises(ValueError):
        tr = Transport(url, "tok", None, insecure_dev=insecure_dev)
        tr.close()


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://127.8.9.10",
                                 "http://localhost:8080", "http://[::1]:8080",
                                 "http://LOCALHOST:1/prefix"])
def test_plain_http_to_loopback_needs_the_explicit_insecure_dev_flag(url: str) -> None:
    with pytest.raises(ValueError, match="--insecure-dev"):
        Transport(url, "tok", None)
    tr = Transport(url, "tok", None, insecure_dev=True)
    tr.close()


def test_the_client_command_refuses_plain_http_without_insecure_dev(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fedforest_cli.cli import app

    (tmp_path / "data.csv").write_text("x0,y\n1.0,0\n")
    (tmp_path / "schema.toml").write_text("")
    args = ["client", "--server", "http://127.0.0.1@evil.example", "--token", "t", "--job",
            "j", "--data", str(tmp_path / "data.csv"), "--schema", str(tmp_path / "schema.toml"),
            "--state-dir", str(tmp_path / "state")]
    help_text = CliRunner().invoke(app, ["client", "--help"], env={"COLUMNS": "200"}).output
    assert "--insecure-dev" in help_text and "--profile" in help_text
    from client_app import runner

    seen: list[str] = []

    def fake_table(data: Path, schema: Path) -> tuple[np.ndarray, np.ndarray]:
        seen.append("loaded")
        return np.zeros((1, 1)), np.zeros(1)

    import unittest.mock as mock

    with mock.patch.object(runner, "load_site_table", fake_table):
        for extra, match in (([], "user-info"), (["--insecure-dev"], "user-info")):
            res = CliRunner().invoke(app, args + extra)
            assert res.exit_code == 2 and match in res.output, res.output
        args[2] = "http://127.0.0.1:9"
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and "--insecure-dev" in res.output, res.output
    assert seen == ["loaded"] * 3


def test_a_token_with_a_trailing_newline_is_the_token_and_inner_whitespace_is_refused() -> None:
    """A token read from a file ends in a newline: it is stripped (the header was refused and
    retried until the budget ran out, blamed on the server). Whitespace or control characters
    inside are refused at once, without printing the token."""
    tr = Transport("http://127.0.0.1:9", "ffs_abc\n", None, insecure_dev=True)
    try:
        assert tr.token == "ffs_abc"
    finally:
        tr.close()
    for bad in ("ffs_a bc", "ffs_a\x00bc", "  "):
        with pytest.raises(ValueError, match="token .* is empty or holds spaces") as info:
            Transport("http://127.0.0.1:9", bad, None, insecure_dev=True)
        assert "ffs_a" not in str(info.value)


def _listener() -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    sock.settimeout(3.0)
    return sock, sock.getsockname()[1]


def _first_request(sock: socket.socket, seen: list[bytes]) -> None:
    """Accept one connection, keep its request head, answer 200 with a small JSON body."""
    try:
        conn, _ = sock.accept()
    except OSError:
        return
    with conn:
        conn.settimeout(3.0)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        seen.append(data)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")


def test_a_plain_http_client_ignores_the_proxy_of_its_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under --insecure-dev the bearer token travels in clear: it goes to the loopback server
    named, never to a proxy named in ``http_proxy``/``ALL_PROXY`` (which may be another
    machine)."""
    proxy, proxy_port = _listener()
    server, server_port = _listener()
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, f"http://127.0.0.1:{proxy_port}")
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    at_proxy: list[bytes] = []
    at_server: list[bytes] = []
    threads = [threading.Thread(target=_first_request, args=(proxy, at_proxy)),
               threading.Thread(target=_first_request, args=(server, at_server))]
    for t in threads:
        t.start()
    tr = Transport(f"http://127.0.0.1:{server_port}", "ffs_secret", None, insecure_dev=True,
                   retry_budget_s=2.0)
    try:
        tr.get_json("/v1/me")
    finally:
        tr.close()
        for sock in (proxy, server):
            sock.close()
        for t in threads:
            t.join(5)
    assert not any(b"ffs_secret" in r for r in at_proxy), at_proxy
    assert at_server and b"Bearer ffs_secret" in at_server[0]
