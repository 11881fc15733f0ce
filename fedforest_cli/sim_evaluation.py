"""A federated evaluation on one machine: an evaluation job on a running server and one client
process per site with ``--eval-data`` (used by ``fedforest simulate`` and the tests)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedforest_secure.errors import FedForestError
from fedforest_secure.evaluation.result import EvalResult

from .sim_data import SiteData
from .sim_processes import db_url, signals_held, start_client, stop_all

__all__ = ["EvalRun", "create_eval_job", "run_eval_clients", "wait_job", "write_eval_job"]


@dataclass(frozen=True)
class EvalRun:
    """An evaluation job that ended: its result, and the client processes' exit codes."""

    job_id: str
    result: EvalResult
    exit_codes: list[int]
    wall_s: float


def write_eval_job(path: Path, job_id: str, clients: Sequence[str], profile: str,
                   models: Sequence[Path], *, names: Sequence[str] | None = None,
                   schema: str = "schema.toml", deadline: float = 60.0,
                   extra: dict[str, object] | None = None) -> Path:
    """``job.toml`` of an evaluation job (``kind = "evaluate"``) scoring ``models``."""
    import tomli_w

    ev: dict[str, object] = {"models": [str(Path(m).resolve()) for m in models]}
    if names is not None:
        ev["names"] = list(names)
    ev.update(extra or {})
    doc = {"id": job_id, "kind": "evaluate", "clients": list(clients), "profile": profile,
           "schema": schema, "round_deadline": deadline, "evaluation": ev}
    path.write_text(tomli_w.dumps(doc))
    return path


def create_eval_job(server_toml: Path, job_toml: Path) -> str:
    """Create the job on the server's database (audited); returns its id."""
    from server_app.admin import ServerAdmin
    from server_app.jobspec import load_job_spec
    from server_app.settings import load_settings

    spec = load_job_spec(job_toml)
    with ServerAdmin.from_settings(load_settings(server_toml)) as admin:
        admin.create_job(spec)
    return spec.id


def wait_job(db: Path, job_id: str, procs: Sequence[subprocess.Popen[bytes]],
             timeout: float = 600.0) -> str:
    """Wait until the clients exit (or the timeout); the job's ``model_json`` (its result)."""
    from server_app.admin import ServerAdmin

    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    with ServerAdmin(db_url(db)) as admin:
        job = admin.job(job_id)
    if job is None:
        raise FedForestError(f"job {job_id} not found")
    if job.status != "done" or job.model_json is None:
        raise FedForestError(f"the evaluation job {job_id} ended {job.status}: {job.reason}")
    return job.model_json


def run_eval_clients(sites: Sequence[SiteData], held_out: Sequence[Path], url: str, job_id: str,
                     certs: Path, root: Path, server_db: Path, *, profile: str | None,
                     timeout: float = 600.0) -> EvalRun:
    """Start one client per site on its held-out rows, wait for the job, read its result."""
    t0 = time.monotonic()
    (root / "logs").mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for site, data in zip(sites, held_out, strict=True):
            with signals_held():  # a signal here finds the client recorded, or not started
                procs.append(start_client(site, url, job_id, certs, root / "clients" / site.name,
                                          root / "logs" / f"{site.name}.{job_id}.log",
                                          root / "clients" / f"{site.name}.{job_id}.json",
                                          profile=profile, n_clients=len(sites),
                                          eval_data=data))
        text = wait_job(server_db, job_id, procs, timeout)
        codes = [p.wait(30) for p in procs]
    finally:
        stop_all(procs)
    return EvalRun(job_id, EvalResult.from_json(text), codes, time.monotonic() - t0)
