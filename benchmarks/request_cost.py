"""The CPU one HTTPS request costs, server and client: the floor under every exchange of a job.

    python benchmarks/request_cost.py
    python benchmarks/request_cost.py --seconds 5 --mb 3

Starts ``fedforest server`` (dev PKI, mutual TLS, SQLite) on 127.0.0.1 with one registered
site and sends it, with the site's own transport (:class:`client_app.transport.Transport`:
httpx, client certificate and token, kept-alive connection), each kind for ``--seconds``:

* ``GET /health``: no authentication, one database check;
* ``GET /v1/me``: the token and the certificate checked, no job state: what every request of
  a job pays before its own work.

Then the bytes a task or an upload carries: a bare Starlette app under uvicorn (no FastAPI, no
database) serving a ``--mb`` MB body, once over TLS (the dev server certificate) and once over
plain HTTP, fetched with httpx: the stack's cost per MB.

CPU is user + system seconds: the server process's from ``/proc/<pid>/stat`` (Linux, in clock
ticks of 10 ms), the client's ``time.process_time()``; each divided by the requests sent. Wall
time per request is printed beside it, and the number of requests. Loopback only.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
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

#: a table row: what was sent, wall ms, server CPU ms and client CPU ms per request, requests
_Row = tuple[str, float, float, float, int]


def _proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(pid: int, seconds: float, send: Callable[[], object]
             ) -> tuple[float, float, float, int]:
    """``(wall ms, server CPU ms, client CPU ms, requests)`` per request, sending with ``send``
    for at least ``seconds`` and at least 10 requests (the server's CPU is counted in clock
    ticks of 10 ms: over a few seconds that is a fraction of a percent)."""
    send()  # the connection is open and warm
    s0, c0, t0 = _proc_cpu(pid), time.process_time(), time.perf_counter()
    n = 0
    while n < 10 or time.perf_counter() - t0 < seconds:
        send()
        n += 1
    wall = time.perf_counter() - t0
    return (1000 * wall / n, 1000 * (_proc_cpu(pid) - s0) / n,
            1000 * (time.process_time() - c0) / n, n)


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


def _bytes_rows(certs: Path, mb: float, seconds: float) -> list[_Row]:
    rows: list[_Row] = []
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
                wall, srv, cli, n = _measure(proc.pid, seconds,
                                             lambda: http.get("/body").content)
        finally:
            stop(proc)
        rows.append((f"GET {mb:g} MB, bare uvicorn + Starlette, {scheme}", wall, srv, cli, n))
    return rows


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value
    return parse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=_positive(float), default=3.0,
                    help="how long each kind of request is sent (at least 10 of each)")
    ap.add_argument("--mb", type=_positive(float), default=3.0,
                    help="body size of the bytes rows, MB")
    ap.add_argument("--serve-bytes", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--certs", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve_bytes is not None:
        _serve_bytes(a.serve_bytes, a.mb, a.certs)
        return
    # a terminated run (``timeout``, a cancelled job) stops its servers and removes its files
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="fedforest-request-cost-") as tmp:
        rows: list[_Row] = []
        with one_site_server(Path(tmp)) as srv:
            certs = srv.certs
            tr = Transport(srv.url, srv.token, certs / "ca.pem", certs / "client-0.pem",
                           certs / "client-0.key", retry_budget_s=10.0)
            try:
                for path, what in (("/health", "no authentication"),
                                   ("/v1/me", "token and certificate checked")):
                    wall, srv_ms, cli, n = _measure(srv.proc.pid, a.seconds,
                                                    functools.partial(tr.request, "GET", path))
                    rows.append((f"GET {path} ({what}), fedforest server", wall, srv_ms, cli, n))
            finally:
                tr.close()
        rows += _bytes_rows(certs, a.mb, a.seconds)
    t = Table(title=f"CPU per HTTP request on 127.0.0.1 (each kind sent for {a.seconds:g} s)")
    for col in ("request", "requests", "wall ms", "server CPU ms", "client CPU ms"):
        t.add_column(col, justify="left" if col == "request" else "right")
    for name, wall, server_ms, cli, n in rows:
        t.add_row(name, str(n), f"{wall:.2f}", f"{server_ms:.2f}", f"{cli:.2f}")
    Console().print(t)


if __name__ == "__main__":
    main()
