"""HTTPS simulation vs in-process run: wall time, ratio, bytes per client vs O(T 2^M d B S).

    python benchmarks/transport.py --dataset breast_cancer --clients 4 --trees 10 --depth 4

(The paper-scale setting n=100k, K=10, T=50, depth 8 needs a 100k-row dataset name from
fedforest_secure.datasets; pass --dataset and --max-rows accordingly.)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from sqlalchemy import select

from client_app.simulate import SimulateOptions, run_simulation
from fedforest_secure.federation import run_in_process
from fedforest_secure.protocol import Task, layout_size
from server_app.db import Database, RoundRow
from server_app.jobspec import build_config, load_job_spec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="breast_cancer")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--trees", type=int, default=10)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--bins", type=int, default=16)
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--profile", default="open")
    ap.add_argument("--out", type=Path, default=Path("fedforest-bench"))
    a = ap.parse_args()
    opts = SimulateOptions(dataset=a.dataset, clients=a.clients, profile=a.profile, out=a.out,
                           trees=a.trees, depth=a.depth, bins=a.bins, max_rows=a.max_rows)
    res = run_simulation(opts)
    config = build_config(load_job_spec(a.out / "job.toml"))
    import numpy as np

    from client_app.sim_data import load_table  # noqa: F401  (same data files as the run)

    parts = []
    for k in range(a.clients):
        tab = np.loadtxt(a.out / "sites" / f"client-{k}.csv", delimiter=",", skiprows=1,
                         ndmin=2)
        parts.append((tab[:, :-1], tab[:, -1].astype(np.int64) if config.task ==
                      "classification" else tab[:, -1]))
    t0 = time.perf_counter()
    run_in_process(config, parts)
    t_inproc = time.perf_counter() - t0
    db = Database(f"sqlite:///{(a.out / 'server.db').resolve()}")
    up = down = 0
    with db.session() as s:
        for rr in s.scalars(select(RoundRow)):
            down += len(rr.task_blob)
            up += 8 * layout_size(Task.from_bytes(rr.task_blob).layout)
    bound = 8 * config.n_estimators * 2 ** config.max_depth * config.n_features * \
        config.n_bins * config.n_stats
    t = Table(title="transport benchmark")
    for col in ("HTTPS wall s", "in-process s", "ratio", "upload B/client",
                "download B/client", "8*T*2^M*d*B*S"):
        t.add_column(col, justify="right")
    t.add_row(f"{res['wall_s']:.1f}", f"{t_inproc:.1f}", f"{res['wall_s'] / t_inproc:.1f}",
              f"{up:,}", f"{down:,}", f"{bound:,}")
    Console().print(t)


if __name__ == "__main__":
    main()
