"""``fedforest simulate``: a real server and K real client processes over HTTPS on 127.0.0.1.

Everything a real deployment does happens here, on one machine: dev certificates, a server
process (uvicorn, TLS, mutual TLS), one token per client, a job, K client processes that each
read only their own CSV, and at the end a comparison with centralized and local learning.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fedforest_secure.errors import FedForestError
from fedforest_secure.files import write_atomic
from fedforest_secure.protocol.api import JobStatus

from ._common import own_command
from .sim_data import (
    SimData,
    SimulateOptions,
    check_job_before_writing,
    load_table,
    prepare_sites,
)
from .sim_eval import evaluate
from .sim_evaluation import EvalRun
from .sim_processes import (
    ClientEnd,
    client_ends,
    db_url,
    free_port,
    signals_held,
    start_client,
    start_server,
    stop,
    stop_all,
    trained_over,
    wait_healthy,
    write_server_config,
)

__all__ = ["SimulateOptions", "collect_receipts", "db_url", "free_port", "run_simulation",
           "start_client", "start_server", "wait_for_job", "wait_healthy", "write_server_config"]

console = Console(emoji=False)

#: the file that marks a directory as a simulation's output (``--out``), which the next run
#: may replace
RUN_MARKER = ".fedforest-simulate"


@contextmanager
def uninterrupted() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP are ignored while the simulation's processes are stopped: a
    second Ctrl-C, or the SIGTERM a CI job sends after its SIGINT, would cut the stopping short
    and leave the server running. In the main thread only (where Python handles signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for s in kept:
        signal.signal(s, signal.SIG_IGN)
    try:
        yield
    finally:
        for s, handler in kept.items():
            signal.signal(s, handler)


def run_simulation(opts: SimulateOptions) -> dict[str, Any]:
    """Run the whole simulation; returns the scores and paths (also printed as a table)."""
    from fedforest_secure.model import ForestModel
    from fedforest_secure.pki import init_dev_pki
    from fedforest_secure.privacy import available_profiles

    opts.check()
    table = load_table(opts.dataset)  # read before anything is written: a missing file stops here
    opts.check_rows(len(table[1]))
    names = [f"client-{k}" for k in range(opts.clients)]
    check_job_before_writing(opts, names, table)
    # a profile file is named by its absolute path: job.toml and eval.toml lie in --out
    opts = replace(opts, profile=opts.profile_ref())
    out = opts.out.resolve()
    _clear_earlier_run(out, inputs=[] if opts.profile in available_profiles() else
                       [("--profile", Path(opts.profile))])
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_MARKER).write_text("written by fedforest simulate; the next run replaces this "
                                  "directory\n")
    (out / "logs").mkdir(exist_ok=True)
    t0 = time.monotonic()
    console.rule(f"FedForest simulation: {escape(opts.dataset)}, {opts.clients} institutions, "
                 f"profile {escape(opts.profile)}")
    console.print(f"forest: T={opts.trees} trees, maximum depth M={opts.depth}, sketch size "
                  f"B={opts.bins} (change with --trees/--depth/--bins)")
    certs = out / "certs"
    init_dev_pki(certs, opts.clients, client_names=names)
    console.print(f"1. certificates: a federation CA, a server certificate for 127.0.0.1 and "
                  f"{opts.clients} client certificates in {certs}", markup=False,
                  soft_wrap=True)
    port = free_port()
    server_toml = write_server_config(out, port, certs)
    sim = prepare_sites(opts, out, names, server_toml, table)
    console.print(f"2. data: {opts.dataset} split over {opts.clients} sites (Dirichlet "
                  f"alpha={opts.alpha}); each site's rows are in its own CSV; "
                  f"{len(sim.y_test)} rows held out for testing")
    url = f"https://127.0.0.1:{port}"
    # every process started is stopped however this ends: an error, Ctrl-C, or SIGTERM (which
    # the command turns into KeyboardInterrupt)
    server: subprocess.Popen[bytes] | None = None
    clients: list[subprocess.Popen[bytes]] = []
    try:
        with signals_held():  # a signal here finds the server recorded, or not started
            server = start_server(server_toml, out / "logs" / "server.log")
        wait_healthy(url, certs / "ca.pem", server, cert=certs / f"{names[0]}.pem",
                     key=certs / f"{names[0]}.key")
        console.print(f"3. server listening on {url} (TLS with client certificates)")
        for site in sim.sites:
            with signals_held():
                clients.append(start_client(site, url, sim.job_id, certs,
                                            out / "clients" / site.name,
                                            out / "logs" / f"{site.name}.log",
                                            out / "clients" / f"{site.name}.model.json",
                                            profile=opts.profile,  # TLS: no http
                                            n_clients=len(sim.sites)))
        console.print(f"4. {len(clients)} client processes started; training...")
        _watch(out / "server.db", sim.job_id, opts.depth, clients, server)
        codes = [p.wait() for p in clients]
        status = _job_status(out / "server.db", sim.job_id)
        members = _members(out / "server.db", sim.job_id)
        ends = client_ends([s.name for s in sim.sites], codes, members)
        failed = [e for e in ends if not e.ok]
        if status["status"] != "done":
            raise FedForestError(not_done(status, failed, out / "logs"))
        model_text = status["model_json"]
        write_atomic(out / "model.json", model_text)
        train_wall = time.monotonic() - t0
        console.print(f"5. model trained; every site scores it on its own held-out rows "
                      f"({', '.join(str(len(y)) for _, y in sim.held_out)} rows), "
                      "only the sums leave the sites")
        evaluation = _federated_evaluation(sim, opts, out, server_toml, url, certs)
    finally:  # the clients first: a client that leaves the job tells the server
        with uninterrupted():
            stop_all(clients)
            if server is not None:
                stop(server)
    model = ForestModel.from_json(model_text)
    wall = time.monotonic() - t0
    receipts = collect_receipts(out)
    audit = _audit_summary(out / "audit.db", receipts, sim.job_id)
    scores = evaluate(model, sim, opts, evaluation.result)
    over = trained_over(members, opts.clients)
    _print_table(scores, sim, opts, wall, status["round"], over)
    _print_where(out, audit)
    for end in failed:  # the model came without them: said last, with where to look
        console.print(f"[yellow]warning:[/yellow] {escape(end.describe())}; its log: "
                      f"{escape(str(out / 'logs' / (end.name + '.log')))}", soft_wrap=True)
    return {"scores": scores, "wall_s": wall, "train_wall_s": train_wall,
            "eval_wall_s": evaluation.wall_s, "client_exit_codes": codes, "out": out,
            "model_digest": status["model_digest"], "receipts": receipts, "audit": audit,
            "rounds": status["round"], "evaluation": evaluation.result,
            "failed_clients": failed, "trained_over": over}


def _clear_earlier_run(out: Path, inputs: Sequence[tuple[str, Path]] = ()) -> None:
    """Remove ``out`` if an earlier simulation wrote it; refuse any other non-empty directory
    (or a file) there, so a mistyped ``--out`` never deletes a user's files, and an earlier
    run's directory that holds one of the run's ``inputs`` (``(option, absolute path)``
    pairs: a ``--profile`` file), which the run reads after this."""
    if not out.exists():
        return
    if not out.is_dir():
        raise FedForestError(f"--out {out} is a file, not a directory")
    if not any(out.iterdir()):
        return
    # only the marker counts: a real deployment's directory holds a server.toml, a job.toml
    # and a CA as well
    if not (out / RUN_MARKER).is_file():
        raise FedForestError(f"--out {out} is a directory that holds files and is not the "
                             "output of an earlier `fedforest simulate` (the next run would "
                             "replace it): choose another --out, or empty it yourself")
    for option, path in inputs:
        if path.is_relative_to(out):
            raise FedForestError(f"{option} {path} lies in --out {out}, the directory of an "
                                 "earlier `fedforest simulate` that this run replaces (with "
                                 f"the file): move the file out of it, or choose another --out")
    import shutil

    shutil.rmtree(out)


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


def not_done(status: dict[str, Any], failed: list[ClientEnd], logs: Path) -> str:
    """Why a simulation has no model, once every client process has exited: the job's end
    (its status and reason), or, for a job still waiting or running, that every site's
    client stopped before it ended; then how each client that did not finish ended."""
    gone = "".join(f"; {e.describe()}" for e in failed)
    if status["status"] in ("done", "failed"):
        return f"the job ended {status['status']}: {status['reason']}{gone} (logs in {logs})"
    at = (f" at round {status['round']}"
          if status.get("round") is not None and status["round"] >= 0 else "")
    return (f"every site's client stopped before the job ended (it is still "
            f"{status['status']}{at}){gone}; see their logs in {logs}")


def _job_status(db: Path | str, job_id: str) -> dict[str, Any]:
    """The job's status, read from the server's database (a SQLite path or any URL)."""
    from server_app.admin import ServerAdmin

    with ServerAdmin(db_url(db)) as admin:
        job = admin.job(job_id)
    if job is None:
        raise FedForestError(f"job {job_id} not found")
    return {"status": job.status, "reason": job.reason, "model_json": job.model_json,
            "model_digest": job.model_digest, "round": job.round_id}


def _members(db: Path | str, job_id: str) -> JobStatus | None:
    """The job as ``fedforest status`` shows it: its members, who was dropped and when."""
    from server_app.admin import ServerAdmin

    with ServerAdmin(db_url(db)) as admin:
        return admin.status(job_id)


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


def _watch(db_path: Path, job_id: str, depth: int, procs: list[subprocess.Popen[bytes]],
           server: subprocess.Popen[bytes] | None = None) -> None:
    """Show the job's level until every client has exited; a server that exits meanwhile
    ends the simulation at once (its clients would only wait out their retry budget)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from server_app.admin import ServerAdmin

    with ServerAdmin(db_url(db_path)) as admin, \
            Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                     TextColumn("level {task.completed}/{task.total}"), TimeElapsedColumn(),
                     console=console) as prog:
        bar = prog.add_task("waiting for clients", total=depth + 1)
        while any(p.poll() is None for p in procs):
            if server is not None and server.poll() is not None:
                log = db_path.parent / "logs" / "server.log"
                raise FedForestError(f"the server exited with code {server.returncode} during "
                                     f"training (its log: {log})")
            job = admin.job(job_id)
            rr = admin.latest_round(job_id)
            if job is not None and job.status in ("done", "failed"):
                prog.update(bar, completed=depth + 1, description=job.status)
            elif rr is not None:
                prog.update(bar, completed=rr.level,
                            description=f"round {rr.round_id} ({rr.kind})")
            time.sleep(0.3)


def _print_table(scores: dict[str, Any], sim: Any, opts: SimulateOptions, wall: float,
                 rounds: int, over: str | None = None) -> None:
    """The comparison table; ``over``: the sites the model was trained over
    (:func:`~fedforest_cli.sim_processes.trained_over`; all of them by default)."""
    over = over or f"{opts.clients} sites"
    metric = scores["metric"]
    secure = opts.privacy_profile().secure_aggregation  # a file's name says nothing
    table = Table(title=f"{escape(opts.dataset)}: test {metric} on {len(sim.y_test)} held-out rows "
                        f"at {opts.clients} sites (higher is better)")
    table.add_column("method")
    table.add_column(metric, justify="right")
    table.add_column("who sees what")
    sees = (f"the server sees only masked vectors and their sum over the {over}"
            if secure else f"the server sees each site's statistics (profile "
                           f"{escape(opts.profile)})")
    noise = scores.get("fedforest_noise")
    value = f"{scores['fedforest']:.4f}" + (f" ± {noise:.4f}" if noise else "")
    how = ("; scored by federated evaluation: each site on its own held-out rows, the server "
           "sums" + (" (noisy: ± is the evaluation's DP noise)" if noise else "")
           if scores.get("federated") else "")
    table.add_row(f"FedForest over HTTPS (profile {escape(opts.profile)})", value, sees + how)
    table.add_row("centralized random forest", f"{scores['centralized']:.4f}",
                  "all rows pooled in one place (what federation avoids), scored on the "
                  "pooled held-out rows")
    table.add_row("local learning (mean over sites)", f"{scores['local']:.4f}",
                  "each site alone, on its own rows")
    console.print(table)
    console.print(f"T={opts.trees} trees, maximum depth {opts.depth}, B={opts.bins} bins, "
                  f"{over}, {rounds} aggregation rounds; wall time {wall:.1f}s. "
                  "FedForest should be close to the centralized forest and better than local "
                  "learning when the sites are heterogeneous.")


def _print_where(out: Path, audit: dict[str, Any]) -> None:
    db = out / "audit.db"
    status = "[green]OK[/green]" if audit["ok"] else "[red]PROBLEMS[/red]"
    console.print(f"audit log: {audit['entries']} entries, {audit['receipts_checked']} client "
                  f"receipts cross-checked: {status}; entries with per-client plaintext: "
                  f"{audit['plaintext_entries']}")
    for problem in audit["problems"][:5]:
        console.print(f"  [red]problem:[/red] {escape(problem)}")
    console.print(f"model:     {out / 'model.json'}\n"
                  f"audit log: {db}\n"
                  f"receipts:  {out / 'receipts'} (one file per site)\n"
                  f"logs:      {out / 'logs'}", markup=False, soft_wrap=True)
    fedforest = own_command()
    console.print("next, try:\n"
                  f"  {fedforest} audit show --db {shlex.quote(str(db))}\n"
                  f"  {fedforest} audit verify --db {shlex.quote(str(db))} "
                  f"--receipts {shlex.quote(str(out / 'receipts'))}",
                  highlight=False, soft_wrap=True, markup=False)
