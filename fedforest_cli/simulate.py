"""``fedforest simulate``: a real server and K real client processes over HTTPS on 127.0.0.1.

Everything a real deployment does happens here, on one machine: dev certificates, a server
process (uvicorn, TLS, mutual TLS), one token per client, a job, K client processes that each
read only their own CSV, and at the end a comparison with centralized and local learning.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fedforest_secure.errors import FedForestError

from .sim_data import SimData, SiteData, prepare_sites
from .sim_eval import evaluate
from .sim_evaluation import EvalRun

__all__ = ["SimulateOptions", "run_simulation", "start_server", "start_client", "free_port"]

console = Console()


@dataclass
class SimulateOptions:
    dataset: str = "breast_cancer"
    clients: int = 4
    alpha: float = 0.5
    profile: str = "secure"
    out: Path = Path("fedforest-run")
    trees: int = 20
    depth: int = 6
    bins: int = 16
    seed: int = 0
    max_rows: int | None = None
    round_deadline: float = 60.0
    extra_forest: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_server_config(out: Path, port: int, certs: Path, *, mtls: bool = True,
                        database: str | None = None, audit_database: str | None = None
                        ) -> Path:
    """``out/server.toml`` for a server on 127.0.0.1:``port``; the databases default to the
    SQLite files ``out/server.db`` and ``out/audit.db`` (any SQLAlchemy URL otherwise)."""
    path = out / "server.toml"
    database = database or db_url(out / "server.db")
    audit_database = audit_database or db_url(out / "audit.db")
    lines = [
        'host = "127.0.0.1"', f"port = {port}",
        f'database = "{database}"',
        f'audit_database = "{audit_database}"',
        "tick_seconds = 0.2", "", "[tls]",
        f'cert = "{(certs / "server.pem").resolve()}"',
        f'key = "{(certs / "server.key").resolve()}"',
    ]
    if mtls:
        lines.append(f'client_ca = "{(certs / "ca.pem").resolve()}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def db_url(db: Path | str) -> str:
    """A SQLAlchemy URL: URLs pass through, a path is a SQLite file."""
    text = str(db)
    return text if "://" in text else f"sqlite:///{Path(text).resolve()}"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def start_server(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "fedforest_cli", "server", "--config",
                                 str(config)], stdout=fh, stderr=subprocess.STDOUT,
                                env=_child_env())


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
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    raise FedForestError(f"the server did not answer {url}/health within {timeout:.0f} s")


def start_client(site: SiteData, url: str, job: str, certs: Path, state: Path, log: Path,
                 model_out: Path, *, profile: str | None = None, n_clients: int | None = None,
                 insecure_dev: bool = False, eval_data: Path | None = None
                 ) -> subprocess.Popen[bytes]:
    """One client process. ``profile`` pins the privacy profile the site accepts (the job's
    own) and ``n_clients`` the number of clients it knows the job has; ``insecure_dev`` only
    when the server itself runs with ``--insecure-dev``; ``eval_data``: the site's held-out
    rows, for an evaluation job (instead of its table)."""
    env = _child_env()
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
    with log.open("ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)


def run_simulation(opts: SimulateOptions) -> dict[str, Any]:
    """Run the whole simulation; returns the scores and paths (also printed as a table)."""
    from fedforest_secure.model import ForestModel
    from fedforest_secure.pki import init_dev_pki

    out = opts.out.resolve()
    if out.exists() and any(out.iterdir()):
        import shutil

        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    t0 = time.monotonic()
    console.rule(f"FedForest simulation: {opts.dataset}, {opts.clients} institutions, "
                 f"profile {opts.profile}")
    console.print(f"forest: T={opts.trees} trees, maximum depth M={opts.depth}, sketch size "
                  f"B={opts.bins} (change with --trees/--depth/--bins)")
    names = [f"client-{k}" for k in range(opts.clients)]
    certs = out / "certs"
    init_dev_pki(certs, opts.clients, client_names=names)
    console.print(f"1. certificates: a federation CA, a server certificate for 127.0.0.1 and "
                  f"{opts.clients} client certificates in {certs}")
    port = free_port()
    server_toml = write_server_config(out, port, certs)
    sim = prepare_sites(opts, out, names, server_toml)
    console.print(f"2. data: {opts.dataset} split over {opts.clients} sites (Dirichlet "
                  f"alpha={opts.alpha}); each site's rows are in its own CSV; "
                  f"{len(sim.y_test)} rows held out for testing")
    url = f"https://127.0.0.1:{port}"
    server = start_server(server_toml, out / "logs" / "server.log")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        wait_healthy(url, certs / "ca.pem", server, cert=certs / f"{names[0]}.pem",
                     key=certs / f"{names[0]}.key")
        console.print(f"3. server listening on {url} (TLS with client certificates)")
        for site in sim.sites:
            procs.append(start_client(site, url, sim.job_id, certs, out / "clients" / site.name,
                                      out / "logs" / f"{site.name}.log",
                                      out / "clients" / f"{site.name}.model.json",
                                      profile=opts.profile,  # TLS: no http
                                      n_clients=len(sim.sites)))
        console.print(f"4. {len(procs)} client processes started; training...")
        _watch(out / "server.db", sim.job_id, opts.depth, procs)
        codes = [p.wait() for p in procs]
        status = _job_status(out / "server.db", sim.job_id)
        if status["status"] != "done":
            raise FedForestError(f"the job ended {status['status']}: {status['reason']} "
                                 f"(logs in {out / 'logs'})")
        model_text = status["model_json"]
        (out / "model.json").write_text(model_text)
        train_wall = time.monotonic() - t0
        console.print(f"5. model trained; every site scores it on its own held-out rows "
                      f"({', '.join(str(len(y)) for _, y in sim.held_out)} rows), "
                      "only the sums leave the sites")
        evaluation = _federated_evaluation(sim, opts, out, server_toml, url, certs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    model = ForestModel.from_json(model_text)
    wall = time.monotonic() - t0
    receipts = collect_receipts(out)
    audit = _audit_summary(out / "audit.db", receipts, sim.job_id)
    scores = evaluate(model, sim, opts, evaluation.result)
    _print_table(scores, sim, opts, wall, status["round"])
    _print_where(out, audit)
    return {"scores": scores, "wall_s": wall, "train_wall_s": train_wall,
            "eval_wall_s": evaluation.wall_s, "client_exit_codes": codes, "out": out,
            "model_digest": status["model_digest"], "receipts": receipts, "audit": audit,
            "rounds": status["round"], "evaluation": evaluation.result}


def _federated_evaluation(sim: SimData, opts: SimulateOptions, out: Path, server_toml: Path,
                          url: str, certs: Path) -> EvalRun:
    """An evaluation job of the trained model (same sites and profile): each site scores it on
    its own held-out rows, the server gets the sums."""
    from .sim_evaluation import create_eval_job, run_eval_clients, write_eval_job

    job_toml = write_eval_job(out / "eval.toml", f"{sim.job_id}-eval",
                              [s.name for s in sim.sites], opts.profile, [out / "model.json"],
                              names=["fedforest"], deadline=opts.round_deadline)
    job_id = create_eval_job(server_toml, job_toml)
    return run_eval_clients(sim.sites, sim.held_out_csvs, url, job_id, certs, out,
                            out / "server.db", profile=opts.profile)


def collect_receipts(out: Path, states: Path | None = None) -> Path:
    """Copy every client's audit receipts (``<states>/*/receipts/*.jsonl``, by default
    ``out/clients``) to ``out/receipts``."""
    import shutil

    dest = out / "receipts"
    dest.mkdir(exist_ok=True)
    for path in sorted((states or out / "clients").glob("*/receipts/*.jsonl")):
        shutil.copyfile(path, dest / path.name)
    return dest


def _audit_summary(db: Path, receipts: Path, job_id: str) -> dict[str, Any]:
    from fedforest_secure.audit import AuditLog, contains_per_client_plaintext, verify_log

    report = verify_log(db, receipts_dir=receipts)
    with AuditLog(db, create=False) as log:
        plain = contains_per_client_plaintext(log, job_id)
        n = len(log.entries(job_id=job_id))
    return {"ok": report.ok, "problems": list(report.problems), "entries": n,
            "receipts_checked": report.receipts_checked, "plaintext_entries": len(plain)}


def _job_status(db: Path | str, job_id: str) -> dict[str, Any]:
    """The job's status, read from the server's database (a SQLite path or any URL)."""
    from server_app.admin import ServerAdmin

    with ServerAdmin(db_url(db)) as admin:
        job = admin.job(job_id)
    if job is None:
        raise FedForestError(f"job {job_id} not found")
    return {"status": job.status, "reason": job.reason, "model_json": job.model_json,
            "model_digest": job.model_digest, "round": job.round_id}


def wait_for_job(db: Path | str, job_id: str, timeout: float) -> None:
    """Wait until the job exists in the server's database (created by another process, e.g.
    ``fedforest evaluate``); TimeoutError after ``timeout`` seconds."""
    from server_app.admin import ServerAdmin

    deadline = time.monotonic() + timeout
    with ServerAdmin(db_url(db)) as admin:
        while admin.job(job_id) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} was not created within {timeout:.0f} s")
            time.sleep(0.2)


def _watch(db_path: Path, job_id: str, depth: int, procs: list[subprocess.Popen[bytes]]
           ) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from server_app.admin import ServerAdmin

    with ServerAdmin(f"sqlite:///{db_path}") as admin, \
            Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                     TextColumn("level {task.completed}/{task.total}"), TimeElapsedColumn(),
                     console=console) as prog:
        bar = prog.add_task("waiting for clients", total=depth + 1)
        while any(p.poll() is None for p in procs):
            job = admin.job(job_id)
            rr = admin.latest_round(job_id)
            if job is not None and job.status in ("done", "failed"):
                prog.update(bar, completed=depth + 1, description=job.status)
            elif rr is not None:
                prog.update(bar, completed=rr.level,
                            description=f"round {rr.round_id} ({rr.kind})")
            time.sleep(0.3)


def _print_table(scores: dict[str, Any], sim: Any, opts: SimulateOptions, wall: float,
                 rounds: int) -> None:
    metric = scores["metric"]
    secure = opts.profile.startswith("secure")
    table = Table(title=f"{opts.dataset}: test {metric} on {len(sim.y_test)} held-out rows "
                        f"at {opts.clients} sites (higher is better)")
    table.add_column("method")
    table.add_column(metric, justify="right")
    table.add_column("who sees what")
    sees = (f"the server sees only masked vectors and their sum over the {opts.clients} sites"
            if secure else f"the server sees each site's statistics (profile {opts.profile})")
    noise = scores.get("fedforest_noise")
    value = f"{scores['fedforest']:.4f}" + (f" ± {noise:.4f}" if noise else "")
    how = ("; scored by federated evaluation: each site on its own held-out rows, the server "
           "sums" + (" (noisy: ± is the evaluation's DP noise)" if noise else "")
           if scores.get("federated") else "")
    table.add_row(f"FedForest over HTTPS (profile {opts.profile})", value, sees + how)
    table.add_row("centralized random forest", f"{scores['centralized']:.4f}",
                  "all rows pooled in one place (what federation avoids), scored on the "
                  "pooled held-out rows")
    table.add_row("local learning (mean over sites)", f"{scores['local']:.4f}",
                  "each site alone, on its own rows")
    console.print(table)
    console.print(f"T={opts.trees} trees, maximum depth {opts.depth}, B={opts.bins} bins, "
                  f"{opts.clients} sites, {rounds} aggregation rounds; wall time {wall:.1f}s. "
                  "FedForest should be close to the centralized forest and better than local "
                  "learning when the sites are heterogeneous.")


def _print_where(out: Path, audit: dict[str, Any]) -> None:
    db = out / "audit.db"
    status = "[green]OK[/green]" if audit["ok"] else "[red]PROBLEMS[/red]"
    console.print(f"audit log: {audit['entries']} entries, {audit['receipts_checked']} client "
                  f"receipts cross-checked: {status}; entries with per-client plaintext: "
                  f"{audit['plaintext_entries']}")
    for problem in audit["problems"][:5]:
        console.print(f"  [red]problem:[/red] {problem}")
    console.print(f"model:     {out / 'model.json'}\n"
                  f"audit log: {db}\n"
                  f"receipts:  {out / 'receipts'} (one file per site)\n"
                  f"logs:      {out / 'logs'}")
    console.print("next, try:\n"
                  f"  fedforest audit show --db {db}\n"
                  f"  fedforest audit verify --db {db} --receipts {out / 'receipts'}",
                  highlight=False, soft_wrap=True)
