"""HTTPS simulation vs in-process run: wall time, ratio, bytes per client vs O(T 2^M d B S).

    python benchmarks/transport.py --dataset breast_cancer --clients 4 --trees 10 --depth 4
    python benchmarks/transport.py --dataset synthetic-100000 --clients 10 --trees 50 --depth 8

``synthetic-<n>`` is a synthetic regression table of n rows and d = 20 features. Bytes sent per
client are counted by each client's transport (request bodies plus ~200 bytes of HTTP per
request) and include the secure-aggregation messages; the paper's bound counts 8-byte words of
the summable statistics only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from client_app.simulate import SimulateOptions, run_simulation
from fedforest_secure.federation import run_in_process
from server_app.jobspec import build_config, load_job_spec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="breast_cancer")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--trees", type=int, default=10)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--bins", type=int, default=16)
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--profile", default="secure")
    ap.add_argument("--deadline", type=float, default=600.0)
    ap.add_argument("--skip-in-process", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("fedforest-bench"))
    a = ap.parse_args()
    opts = SimulateOptions(dataset=a.dataset, clients=a.clients, profile=a.profile, out=a.out,
                           trees=a.trees, depth=a.depth, bins=a.bins, max_rows=a.max_rows,
                           round_deadline=a.deadline)
    res = run_simulation(opts)
    config = build_config(load_job_spec(a.out / "job.toml"))
    t_inproc = float("nan")
    if not a.skip_in_process:
        parts = []
        for k in range(a.clients):
            tab = np.loadtxt(a.out / "sites" / f"client-{k}.csv", delimiter=",", skiprows=1,
                             ndmin=2)
            parts.append((tab[:, :-1], tab[:, -1].astype(np.int64) if config.task ==
                          "classification" else tab[:, -1]))
        t0 = time.perf_counter()
        run_in_process(config, parts)
        t_inproc = time.perf_counter() - t0
    stats = [json.loads(p.read_text()) for p in sorted((a.out / "clients").glob("*/stats.json"))]
    sent = max(s["bytes_sent"] for s in stats)
    recv = max(s["bytes_received"] for s in stats)
    n_stats = config.n_stats
    bound = 8 * config.n_estimators * 2 ** config.max_depth * config.n_features * \
        config.n_bins * n_stats
    t = Table(title=f"transport benchmark: {a.dataset}, K={a.clients}, T={a.trees}, "
                    f"M={a.depth}, B={a.bins}, profile {a.profile}")
    for col in ("HTTPS wall s", "in-process s", "ratio", "rounds", "sent B/client",
                "received B/client", "8*T*2^M*d*B*S"):
        t.add_column(col, justify="right")
    t.add_row(f"{res['wall_s']:.1f}", f"{t_inproc:.1f}", f"{res['wall_s'] / t_inproc:.1f}",
              str(res["rounds"]), f"{sent:,}", f"{recv:,}", f"{bound:,}")
    Console().print(t)


if __name__ == "__main__":
    main()
