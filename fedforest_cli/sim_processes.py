"""The processes of ``fedforest simulate`` and of the integration tests: a server on
127.0.0.1 (its TOML, its process, its health), one client process per site, and how each
client process ended."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedforest_secure.errors import FedForestError
from fedforest_secure.protocol.api import JobStatus

from .sim_data import SiteData

__all__ = ["ClientEnd", "OneSiteServer", "child_env", "client_ends", "db_url", "free_port",
           "one_site_server", "signals_held", "start_client", "start_server", "stop", "stop_all",
           "trained_over", "wait_healthy", "write_server_config"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_server_config(out: Path, port: int, certs: Path, *, mtls: bool = True,
                        database: str | None = None, audit_database: str | None = None
                        ) -> Path:
    """``out/server.toml`` for a server on 127.0.0.1:``port``; the databases default to the
    SQLite files ``out/server.db`` and ``out/audit.db`` (any SQLAlchemy URL otherwise)."""
    import tomli_w

    path = out / "server.toml"
    tls = {"cert": str((certs / "server.pem").resolve()),
           "key": str((certs / "server.key").resolve())}
    if mtls:
        tls["client_ca"] = str((certs / "ca.pem").resolve())
    # written by tomli_w: a " or \\ of a path is escaped
    path.write_text(tomli_w.dumps({
        "host": "127.0.0.1", "port": port, "database": database or db_url(out / "server.db"),
        "audit_database": audit_database or db_url(out / "audit.db"), "tick_seconds": 0.2,
        "tls": tls}), encoding="utf-8")
    return path


def db_url(db: Path | str) -> str:
    """A SQLAlchemy URL: URLs pass through, a path is a SQLite file (its URL percent-encodes
    what a URL would read otherwise: a ``?``, a ``%``)."""
    from fedforest_secure.dburl import sqlite_url

    text = str(db)
    return text if "://" in text else sqlite_url(Path(text).resolve())


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP that arrive inside the block reach their handlers at its
    end: a process started and recorded inside it (``procs.append(start_client(...))``) is,
    when the handler raises, either not started or recorded, so the code that stops the
    recorded processes stops it. (Blocking the signals with ``pthread_sigmask`` instead would
    leave them blocked in the child: exec keeps a signal mask.) In the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        held.append(signum)

    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for s, handler in kept.items():
        if callable(handler):  # an ignored signal stays ignored, a default one kills
            signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in kept.items():
            if callable(handler):
                signal.signal(s, handler)
        for held_signal in dict.fromkeys(held):
            signal.raise_signal(held_signal)


def start_server(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "fedforest_cli", "server", "--config",
                                 str(config)], stdout=fh, stderr=subprocess.STDOUT,
                                env=child_env())


def wait_healthy(url: str, ca: Path, proc: subprocess.Popen[bytes], timeout: float = 90.0,
                 cert: Path | None = None, key: Path | None = None) -> None:
    """Wait until the server answers ``/health``; a server that does not within ``timeout``
    seconds (its start-up imports take seconds on a loaded machine) is stopped."""
    import httpx

    from client_app.transport import tls_context

    deadline = time.monotonic() + timeout
    ctx = tls_context(ca, cert, key)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FedForestError(f"the server exited with code {proc.returncode}")
        try:
            if httpx.get(url + "/health", verify=ctx, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop(proc)
    raise FedForestError(f"the server did not answer {url}/health within {timeout:.0f} s")


def stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Terminate ``proc`` if it still runs; kill it after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_all(procs: Sequence[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """Terminate every process of ``procs`` that still runs, then wait for them all; kill
    those still running ``grace`` seconds later."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_client(site: SiteData, url: str, job: str, certs: Path, state: Path, log: Path,
                 model_out: Path, *, profile: str | None = None, n_clients: int | None = None,
                 insecure_dev: bool = False, eval_data: Path | None = None,
                 evaluate_again: bool = False) -> subprocess.Popen[bytes]:
    """One client process. ``profile`` pins the privacy profile the site accepts (the job's
    own) and ``n_clients`` the number of clients it knows the job has; ``insecure_dev`` only
    when the server itself runs with ``--insecure-dev``; ``eval_data``: the site's held-out
    rows, for an evaluation job (instead of its table); ``evaluate_again``: the site takes
    part in another evaluation of held-out rows it answered one on (``--evaluate-again``)."""
    env = child_env()
    env["FEDFOREST_TOKEN"] = site.token
    table = ["--eval-data", str(eval_data)] if eval_data is not None else ["--data",
                                                                         str(site.csv)]
    cmd = [sys.executable, "-m", "fedforest_cli", "client", "--server", url, "--job", job,
           *table, "--schema", str(site.schema), "--ca",
           str(certs / "ca.pem"), "--cert", str(certs / f"{site.name}.pem"), "--key",
           str(certs / f"{site.name}.key"), "--state-dir", str(state), "--out",
           str(model_out), "--quiet", "--retry-budget", "120"]
    if profile is not None:
        cmd += ["--profile", str(Path(profile).resolve()) if Path(profile).is_file()
                else profile]
    if n_clients is not None:
        cmd += ["--clients", str(n_clients)]
    if insecure_dev:
        cmd.append("--insecure-dev")
    if evaluate_again:
        cmd.append("--evaluate-again")
    with log.open("ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)


@dataclass(frozen=True)
class OneSiteServer:
    """A running ``fedforest server`` of :func:`one_site_server`."""

    proc: subprocess.Popen[bytes]
    url: str
    #: the dev PKI: ``ca.pem``, ``server.pem``/``.key``, ``client-0.pem``/``.key``
    certs: Path
    #: client-0's token
    token: str


@contextlib.contextmanager
def one_site_server(root: Path, port: int | None = None, timeout: float = 120.0
                    ) -> Iterator[OneSiteServer]:
    """``fedforest server`` on 127.0.0.1:``port`` (a free one by default) with mutual TLS (a
    dev PKI in ``root/certs``), SQLite in ``root`` and one registered site, ``client-0``, no
    jobs; stopped on exit."""
    from fedforest_secure.pki import init_dev_pki
    from server_app.auth import add_client
    from server_app.db import Database
    from server_app.settings import load_settings

    certs = root / "certs"
    init_dev_pki(certs, 1)
    config = write_server_config(root, port or free_port(), certs)
    settings = load_settings(config)
    db = Database(settings.database)
    token = add_client(db, "client-0")
    db.dispose()
    url = f"https://127.0.0.1:{settings.port}"
    log = root / "server.log"
    proc = start_server(config, log)
    try:
        try:
            wait_healthy(url, certs / "ca.pem", proc, timeout=timeout,
                         cert=certs / "client-0.pem", key=certs / "client-0.key")
        except FedForestError as exc:  # its log says why, and ``root`` may be a temporary dir
            tail = log.read_text(errors="replace").strip().splitlines()[-20:]
            raise FedForestError(f"{exc}; the end of its log:\n" + "\n".join(tail)) from None
        yield OneSiteServer(proc, url, certs, token)
    finally:
        stop(proc)


#: What a client's exit code says (``fedforest client``: 2 an error, 3 the job ended without
#: this site's model, 128 + n a signal it stopped on).
_EXITS = {2: "stopped on an error", 3: "ended without taking part to the end",
          129: "hung up", 130: "interrupted", 143: "terminated"}


@dataclass(frozen=True)
class ClientEnd:
    """How one client process ended: its exit code (negative: killed by that signal) and, if
    the server dropped it, the round."""

    name: str
    code: int
    dropped_round: int | None = None
    dropped: bool = False

    @property
    def ok(self) -> bool:
        """Whether the client ended done (it has the job's model)."""
        return self.code == 0

    def describe(self) -> str:
        """``client-2: killed by SIGKILL (exit code -9); dropped from the job at round 4``."""
        if self.code < 0:
            try:
                how = f"killed by {signal.Signals(-self.code).name}"
            except ValueError:
                how = f"killed by signal {-self.code}"
        else:
            how = _EXITS.get(self.code, "failed") if self.code else "done"
        at = f" at round {self.dropped_round}" if self.dropped_round is not None else ""
        return f"{self.name}: {how} (exit code {self.code})" + (
            f"; dropped from the job{at}" if self.dropped else "")


def client_ends(names: Sequence[str], codes: Sequence[int], status: JobStatus | None
                ) -> list[ClientEnd]:
    """How each client process (``names[k]`` exited with ``codes[k]``) ended, with whether the
    job's ``status`` (None: not known) lists it as dropped."""
    members = {m.name: m for m in status.members} if status is not None else {}
    out = []
    for name, code in zip(names, codes, strict=True):
        m = members.get(name)
        if m is not None and m.state == "dropped":
            out.append(ClientEnd(name, code, m.dropped_round, dropped=True))
        else:
            out.append(ClientEnd(name, code))
    return out


def trained_over(status: JobStatus | None, n: int) -> str:
    """The sites a job's model was trained over: ``5 sites``, or with sites dropped on the
    way, ``5 sites, 4 of them to the end (client-2 dropped at round 4)``."""
    gone = sorted((m for m in status.members if m.state == "dropped"),
                  key=lambda m: m.name) if status is not None else []
    if not gone:
        return f"{n} sites"
    said = ", ".join(f"{m.name}{' dropped' if i == 0 else ''}"
                     + (f" at round {m.dropped_round}" if m.dropped_round is not None else "")
                     for i, m in enumerate(gone))
    return f"{n} sites, {n - len(gone)} of them to the end ({said})"
