"""Server disk after N federated jobs, before and after ``fedforest server prune``.

    nice -n 10 python benchmarks/retention.py --jobs 8 --dataset breast_cancer --clients 4 \
        --profile secure --trees 10 --depth 4

One server (real uvicorn over TLS, SQLite databases) and K client processes per job, the jobs
one after the other on the same site tables (``job-1`` ... ``job-N``). Then, side by side in one
run: the sizes of the server database (file + write-ahead log + spool), the audit database and
each job's audit export (JSON lines, gzip) after the N jobs, and again after
``fedforest server prune --keep-days 0`` (every finished job: rounds, uploads, spooled vectors;
models and the audit log stay). Printed as a table and as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fedforest_cli.sim_data import prepare_sites, write_job_toml
from fedforest_cli.sim_processes import stop
from fedforest_cli.simulate import (
    SimulateOptions,
    free_port,
    start_client,
    start_server,
    wait_healthy,
    write_server_config,
)


def size(path: Path) -> int:
    """Bytes of a file or of every file below a directory (0 if absent)."""
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return 0


def disk(out: Path) -> dict[str, int]:
    return {"server.db": size(out / "server.db"), "server.db-wal": size(out / "server.db-wal"),
            "server.db.spool": size(out / "server.db.spool"),
            "audit.db": size(out / "audit.db"), "audit.db-wal": size(out / "audit.db-wal")}


def fedforest(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "fedforest_cli", *args], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"fedforest {' '.join(args)} -> {res.returncode}\n{res.stdout}"
                         f"{res.stderr}")
    return res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--dataset", default="breast_cancer")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--profile", default="secure")
    ap.add_argument("--trees", type=int, default=10)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--bins", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("retention-run"))
    args = ap.parse_args()

    from fedforest_secure.pki import init_dev_pki
    from server_app.admin import ServerAdmin
    from server_app.jobspec import load_job_spec
    from server_app.settings import load_settings

    out = args.out.resolve()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    names = [f"client-{k}" for k in range(args.clients)]
    certs = out / "certs"
    init_dev_pki(certs, args.clients, client_names=names)
    port = free_port()
    server_toml = write_server_config(out, port, certs)
    opts = SimulateOptions(dataset=args.dataset, clients=args.clients, profile=args.profile,
                           out=out, trees=args.trees, depth=args.depth, bins=args.bins)
    sim = prepare_sites(opts, out, names, server_toml)  # creates the first job
    forest = {"n_estimators": args.trees, "max_depth": args.depth, "n_bins": args.bins,
              "min_samples_leaf": 5}
    jobs = [sim.job_id]
    with ServerAdmin.from_settings(load_settings(server_toml)) as admin:
        for j in range(2, args.jobs + 1):
            path = out / f"job-{j}.toml"
            write_job_toml(path, f"job-{j}", names, args.profile, 60.0,
                           {**forest, "random_state": j})
            admin.create_job(load_job_spec(path))
            jobs.append(f"job-{j}")
    url = f"https://127.0.0.1:{port}"
    server = start_server(server_toml, out / "server.log")
    t0 = time.monotonic()
    try:
        wait_healthy(url, certs / "ca.pem", server, cert=certs / f"{names[0]}.pem",
                     key=certs / f"{names[0]}.key")
        for job in jobs:
            procs = [start_client(site, url, job, certs, out / "state" / job / site.name,
                                  out / f"{job}-{site.name}.log",
                                  out / "state" / job / f"{site.name}.model.json",
                                  profile=args.profile) for site in sim.sites]
            codes = [p.wait() for p in procs]
            if codes != [0] * len(procs):
                raise SystemExit(f"{job}: client exit codes {codes} (logs in {out})")
            print(f"{job} done", flush=True)
    finally:
        stop(server, grace=30)
    wall = time.monotonic() - t0
    before = disk(out)
    exports = {}
    for job in jobs:
        plain, packed = out / f"{job}.jsonl", out / f"{job}.jsonl.gz"
        for path in (plain, packed):
            fedforest("audit", "export", "--db", str(out / "audit.db"), "--format", "jsonl",
                      "--job", job, "--out", str(path))
        exports[job] = (size(plain), size(packed))
    pruned = fedforest("server", "prune", "--config", str(server_toml), "--keep-days", "0")
    after = disk(out)
    model_bytes = size(out / "state" / jobs[0] / f"{names[0]}.model.json")
    print(f"{args.jobs} jobs ({args.dataset}, {args.clients} clients, profile {args.profile}, "
          f"T={args.trees} M={args.depth} B={args.bins}) in {wall:.0f} s; {pruned.strip()}")
    print(f"{'file':<18} {'after jobs MB':>14} {'after prune MB':>15}")
    for key in before:
        print(f"{key:<18} {before[key] / 1e6:>14.2f} {after[key] / 1e6:>15.2f}")
    total_b, total_a = sum(before.values()), sum(after.values())
    print(f"{'total':<18} {total_b / 1e6:>14.2f} {total_a / 1e6:>15.2f}")
    plain = sum(p for p, _ in exports.values()) / len(exports)
    packed = sum(g for _, g in exports.values()) / len(exports)
    print(f"audit export per job: {plain / 1e3:.0f} kB JSON lines, {packed / 1e3:.0f} kB gzip; "
          f"model file {model_bytes / 1e3:.0f} kB")
    result: dict[str, Any] = {"jobs": args.jobs, "wall_s": wall, "before": before,
                              "after": after, "exports": exports, "model_bytes": model_bytes,
                              "cpus": os.cpu_count()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
