"""The CPU one HTTPS request costs, server and client: the floor under every exchange of a job.

    python benchmarks/request_cost.py
    python benchmarks/request_cost.py --requests 500 --mb 3

Starts ``fedforest server`` (dev PKI, mutual TLS, SQLite) on 127.0.0.1 with one registered
site and sends it, with the site's own transport (:class:`client_app.transport.Transport`:
httpx, client certificate and token, kept-alive connection), ``--requests`` of each:

* ``GET /health``: no authentication, one database check;
* ``GET /v1/me``: the token and the certificate checked, no job state: what every request of
  a job pays before its own work.

Then the bytes a task or an upload carries: a bare Starlette app under uvicorn (no FastAPI, no
database) serving a ``--mb`` MB body, once over TLS (the dev server certificate) and once over
plain HTTP, fetched with httpx: the stack's cost per MB.

CPU is user + system seconds: the server process's from ``/proc/<pid>/stat`` (Linux), the
client's ``time.process_time()``; each divided by the requests sent. Wall time per request is
printed beside it. Loopback only.
"""

from __future__ import annotations

import argparse
import functools
import os
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from client_app.transport import Transport
from fedforest_cli.sim_processes import child_env, free_port, one_site_server, stop


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(pid: int, n: int, send: Callable[[], object]) -> tuple[float, float, float]:
    """``(wall ms, server CPU ms, client CPU ms)`` per request over ``n`` calls of ``send``."""
    send()  # the connection is open and warm
    s0, c0, t0 = _proc_cpu(pid), time.process_time(), time.perf_counter()
    for _ in range(n):
        send()
    wall = time.perf_counter() - t0
    return (1000 * wall / n, 1000 * (_proc_cpu(pid) - s0) / n,
            1000 * (time.process_time() - c0) / n)


def _serve_bytes(port: int, mb: float, certs: Path | None) -> None:
    """The bare app: ``GET /body`` answers ``mb`` MB (TLS with the dev server certificate
    when ``certs`` is given)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    body = os.urandom(int(mb * 1e6))

    async def get_body(_request: Request) -> Response:
        return Response(body, media_type="application/octet-stream")

    app = Starlette(routes=[Route("/body", get_body)])
    tls = {} if certs is None else {"ssl_certfile": str(certs / "server.pem"),
                                    "ssl_keyfile": str(certs / "server.key")}
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", **tls)  # type: ignore[arg-type]


def _bytes_rows(certs: Path, mb: float, n: int) -> list[tuple[str, float, float, float]]:
    rows = []
    for scheme in ("https", "http"):
        port = free_port()
        argv = [sys.executable, str(Path(__file__).resolve()), "--serve-bytes", str(port),
                "--mb", str(mb)] + (["--certs", str(certs)] if scheme == "https" else [])
        proc = subprocess.Popen(argv, env=child_env())
        verify: ssl.SSLContext | bool = ssl.create_default_context(
            cafile=str(certs / "ca.pem")) if scheme == "https" else False
        try:
            with httpx.Client(base_url=f"{scheme}://127.0.0.1:{port}", verify=verify) as http:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        http.get("/body")
                        break
                    except httpx.TransportError:
                        if time.monotonic() > deadline or proc.poll() is not None:
                            raise
                        time.sleep(0.1)
                wall, srv, cli = _measure(proc.pid, n, lambda: http.get("/body").content)
        finally:
            stop(proc)
        rows.append((f"GET {mb:g} MB, bare uvicorn + Starlette, {scheme}", wall, srv, cli))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300, help="requests of each kind")
    ap.add_argument("--mb", type=float, default=3.0, help="body size of the bytes rows, MB")
    ap.add_argument("--serve-bytes", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--certs", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve_bytes is not None:
        _serve_bytes(a.serve_bytes, a.mb, a.certs)
        return
    with tempfile.TemporaryDirectory(prefix="fedforest-request-cost-") as tmp:
        rows: list[tuple[str, float, float, float]] = []
        with one_site_server(Path(tmp)) as srv:
            certs = srv.certs
            tr = Transport(srv.url, srv.token, certs / "ca.pem", certs / "client-0.pem",
                           certs / "client-0.key", retry_budget_s=10.0)
            try:
                for path, what in (("/health", "no authentication"),
                                   ("/v1/me", "token and certificate checked")):
                    wall, srv_ms, cli = _measure(srv.proc.pid, a.requests,
                                                 functools.partial(tr.request, "GET", path))
                    rows.append((f"GET {path} ({what}), fedforest server", wall, srv_ms, cli))
            finally:
                tr.close()
        rows += _bytes_rows(certs, a.mb, max(a.requests // 10, 10))
    t = Table(title=f"CPU per HTTP request on 127.0.0.1 ({a.requests} requests of each kind; "
                    f"{max(a.requests // 10, 10)} of the {a.mb:g} MB bodies)")
    for col in ("request", "wall ms", "server CPU ms", "client CPU ms"):
        t.add_column(col, justify="left" if col == "request" else "right")
    for name, wall, server_ms, cli in rows:
        t.add_row(name, f"{wall:.2f}", f"{server_ms:.2f}", f"{cli:.2f}")
    Console().print(t)


if __name__ == "__main__":
    main()
