"""HTTPS simulation vs in-process run: wall time, ratio, bytes per client vs O(T 2^M d B S).

    python benchmarks/transport.py --dataset breast_cancer --clients 4 --trees 10 --depth 4
    python benchmarks/transport.py --dataset synthetic-100000 --clients 10 --trees 50 --depth 8

``synthetic-<n>`` is a synthetic regression table of n rows and d = 20 features.

Times, side by side on the same machine and data:

* **training**: HTTPS from the first round issued to the job done (read from the server's
  database: every client has joined and loaded its table), against the in-process
  :func:`~fedforest_secure.federation.run_in_process` on the same site tables, same profile
  (it masks too under ``secure``). This is the issue's ratio (target <= 1.5). Each HTTPS client
  builds its worker (its table's codes and bootstrap) before it joins, outside the span; so the
  in-process run is given its ten workers built beforehand, outside its timing too.
* **end to end**: the whole ``fedforest simulate`` (certificates, K + 1 process start-ups, joins,
  training, the centralized and local baselines, audit verification), for reference.
* **CPU**: user + system seconds of the server (from the training job's start to its end,
  as the server logs them) and of the clients' training (from their join to the job's end; the
  model's fetch and check after it not counted), against the in-process run's own
  (``cpu_ratio_training``); the JSON also has every child process's whole CPU
  (``https_cpu_s``: start-ups and the evaluation job included; the centralized and local
  baselines are fitted in this process and are not in it). The difference,
  server + clients less in process, is the CPU the transport costs (requests, TLS, JSON, the
  database, the audit log), printed per HTTP request of all clients.

**Phases**: where the HTTPS training's wall time went, summed over its rounds, from the server's
``event=round`` log lines: how long each secure-aggregation phase stayed open (advertise;
share: open until every client's shares are in, which each posts from a second thread as it
starts computing; upload: the rest of the computing, the masking and the uploads; sign;
unmask) and ``close``, the server's own step after the last phase (the sum, the coordinator's
next level, the audit records).

Bytes sent and received per client are counted by each client's transport (bodies plus ~200
bytes of HTTP per request) from its start to the job's end: the secure-aggregation messages and
the tasks are in them, the model's download after the job is not. The summable payload is what the
paper counts: 8 bytes per entry of every round's summable vector (``layout_size`` of each task),
and its bound ``8 T 2^M d_sampled B S`` (``d_sampled``: the features a node evaluates); the
uploaded vectors are the words the clients actually send (``StatCodec.words``: under secure
aggregation a regression grid's cell, count and sum y, is packed into one word). The
aggregation rounds (tasks with a summable vector) are counted per tree level.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import resource
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
from _cli import at_least, print_table
from rich.table import Table

from fedforest_cli.simulate import SimulateOptions, run_simulation
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError
from fedforest_secure.federation import run_in_process
from fedforest_secure.model import ForestModel
from fedforest_secure.protocol import Task, layout_size
from fedforest_secure.worker import Worker, client_seed
from server_app.engine import round_codec
from server_app.jobspec import build_config, load_job_spec


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _training_span(db: Path, config: JobConfig
                   ) -> tuple[float, int, int, int, dict[int, int]]:
    """(seconds from the first round issued to the last round closed, rounds, summable bytes
    per client (8 per entry), uploaded vector bytes per client (8 per word: packed grid
    cells one word each), aggregation rounds per tree level) of the training job from the
    server's database (simulate runs an evaluation job after it). An aggregation round is one
    whose task asks a summable vector (a non-empty layout)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        t0, t1, n = con.execute("SELECT min(issued_at), max(closed_at), count(*) FROM rounds "
                                "WHERE job_id = ?", (config.job_id,)).fetchone()
        entries = words = 0
        per_level: dict[int, int] = {}
        for (blob,) in con.execute("SELECT task_blob FROM rounds WHERE job_id = ?",
                                   (config.job_id,)):
            task = Task.from_bytes(blob)
            size = layout_size(task.layout)
            codec = round_codec(config, task)
            entries += size
            words += size if codec is None else codec.words
            if size:
                per_level[task.level] = per_level.get(task.level, 0) + 1
    finally:
        con.close()
    return float(t1 - t0), int(n), 8 * entries, 8 * words, dict(sorted(per_level.items()))


def _server_log(out: Path) -> str:
    """The server's log of a ``fedforest simulate`` run into ``out``."""
    return (out / "logs" / "server.log").read_text(errors="replace")


def _server_cpu(text: str, job_id: str) -> tuple[float, float]:
    """The server's CPU seconds when the job ``job_id`` finished (its log ``text`` has them),
    and those it spent from the job's start to its end (its start-up and the joins left out),
    or NaN."""
    job = re.escape(job_id)
    done = re.findall(rf"event=job_done job={job} .*server_cpu_s=([0-9.]+)", text)
    started = re.findall(rf"event=job_started job={job} .*server_cpu_s=([0-9.]+)", text)
    at_done = float(done[-1]) if done else float("nan")
    return at_done, at_done - float(started[-1]) if started else float("nan")


def _phase_seconds(text: str, job_id: str) -> dict[str, float]:
    """Seconds the training job's rounds spent in each phase and in the server's close,
    summed over its rounds, from the ``event=round`` lines of the server's log ``text``
    (``phase_s`` and ``close_s``; :mod:`server_app.logs`). Empty if the log has none."""
    totals: dict[str, float] = {}
    for line in re.findall(rf"event=round job={re.escape(job_id)} .*", text):
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        for item in filter(None, fields.get("phase_s", "").split(",")):
            name, _, sec = item.partition(":")
            totals[name] = totals.get(name, 0.0) + float(sec)
        if "close_s" in fields:
            totals["close"] = totals.get("close", 0.0) + float(fields["close_s"])
    return totals


def _trees(model: ForestModel) -> dict[str, Any]:
    """The forest itself (the HTTPS model file also carries the job's schema, its class labels
    and site names, which the in-process model has not)."""
    d = model.to_dict()
    for k in ("meta", "feature_names", "schema", "clients", "classes"):
        d.pop(k, None)
    return d


def _finite_or_null(value: Any) -> Any:
    """``value`` with every NaN or infinite float as None: JSON has no NaN (a run without the
    in-process reference has no ratio)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="breast_cancer")
    ap.add_argument("--clients", type=at_least(1), default=4)
    ap.add_argument("--trees", type=at_least(1), default=10)
    ap.add_argument("--depth", type=at_least(1), default=4)
    ap.add_argument("--bins", type=at_least(2), default=16)
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--profile", default="secure")
    ap.add_argument("--deadline", type=float, default=600.0)
    ap.add_argument("--skip-in-process", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("fedforest-bench"))
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    a = ap.parse_args(argv)
    opts = SimulateOptions(dataset=a.dataset, clients=a.clients, profile=a.profile, out=a.out,
                           trees=a.trees, depth=a.depth, bins=a.bins, max_rows=a.max_rows,
                           round_deadline=a.deadline)
    cpu0 = _children_cpu()
    try:
        res = run_simulation(opts)
    except (ValueError, FedForestError) as exc:  # a dataset or settings simulate refuses
        ap.error(str(exc))
    cpu_https = _children_cpu() - cpu0
    config = build_config(load_job_spec(a.out / "job.toml"))
    train_s, rounds, summable, uploaded, per_level = _training_span(a.out / "server.db", config)
    t_inproc = cpu_inproc = float("nan")
    same_model: bool | None = None
    if not a.skip_in_process:
        parts = []
        for k in range(a.clients):
            tab = np.loadtxt(a.out / "sites" / f"client-{k}.csv", delimiter=",", skiprows=1,
                             ndmin=2)
            parts.append((tab[:, :-1], tab[:, -1].astype(np.int64) if config.task ==
                          "classification" else tab[:, -1]))
        # built as run_in_process builds them, before the timing: an HTTPS client builds
        # its worker before it joins, outside the training span
        workers = [Worker(config, X, y, client_index=k, seed=client_seed(config, k),
                          keep_last_reply=False, keep_level_order=None)
                   for k, (X, y) in enumerate(parts)]
        c0, t0 = time.process_time(), time.perf_counter()
        model = run_in_process(config, parts, workers=workers)
        t_inproc = time.perf_counter() - t0
        cpu_inproc = time.process_time() - c0
        https_model = ForestModel.from_json((a.out / "model.json").read_text())
        same_model = _trees(model) == _trees(https_model)
    # each client's numbers of the training job (simulate runs an evaluation job after it)
    stats = [json.loads(p.read_text())
             for p in sorted((a.out / "clients").glob(f"*/stats-{config.job_id}.json"))]
    # to the job's end (the model's download after it not counted)
    sent = max(s.get("bytes_sent_training", s["bytes_sent"]) for s in stats)
    cpu_clients = sum(s.get("cpu_training_s", float("nan")) for s in stats)
    requests = max(s.get("requests", 0) for s in stats)
    # the requests of the clients' training span (from the join on), whose CPU is counted
    requests_total = sum(s.get("requests_training", s.get("requests", 0)) for s in stats)
    server_log = _server_log(a.out)
    server_cpu, server_training_cpu = _server_cpu(server_log, config.job_id)
    phases = _phase_seconds(server_log, config.job_id)
    recv = max(s.get("bytes_received_training", s["bytes_received"]) for s in stats)
    # the paper's count, over the d_sampled = max_features features a node evaluates
    bound = 8 * config.n_estimators * 2 ** config.max_depth * config.max_features * \
        config.n_bins * config.n_stats
    out = {"dataset": a.dataset, "clients": a.clients, "trees": a.trees, "depth": a.depth,
           "bins": a.bins, "profile": a.profile, "rounds": rounds,
           "https_training_s": train_s, "in_process_s": t_inproc,
           "ratio": train_s / t_inproc, "https_end_to_end_s": res["wall_s"],
           "https_cpu_s": cpu_https, "in_process_cpu_s": cpu_inproc,
           "clients_training_cpu_s": cpu_clients, "server_cpu_s": server_cpu,
           "server_training_cpu_s": server_training_cpu,
           "cpu_ratio_training": (server_training_cpu + cpu_clients) / cpu_inproc,
           "requests_per_client": requests, "requests_training_total": requests_total,
           "same_model": same_model, "sent_bytes_per_client": sent,
           "received_bytes_per_client": recv, "summable_bytes_per_client": summable,
           "uploaded_vector_bytes_per_client": uploaded,
           "bound_8T2^MdBS": bound, "aggregation_rounds_per_level": per_level,
           "max_aggregation_rounds_per_level": max(per_level.values(), default=0),
           "phase_seconds": phases}
    if not a.skip_in_process:
        # the CPU the HTTPS run spends beyond the in-process run's (requests, TLS, JSON, the
        # database and audit log), and that per request of the clients' training
        overhead = server_training_cpu + cpu_clients - cpu_inproc
        out["overhead_cpu_s"] = overhead
        out["overhead_cpu_ms_per_request"] = 1000 * overhead / max(requests_total, 1)
    t = Table(title=f"transport benchmark: {a.dataset}, K={a.clients}, T={a.trees}, "
                    f"M={a.depth}, B={a.bins}, profile {a.profile}")
    for col in ("HTTPS training s", "in-process s", "ratio", "HTTPS end-to-end s",
                "training CPU s: server + clients / in-proc", "CPU ratio", "rounds",
                "max aggregation rounds per level", "requests per client", "same model"):
        t.add_column(col, justify="right")
    t.add_row(f"{train_s:.1f}", f"{t_inproc:.1f}", f"{train_s / t_inproc:.2f}",
              f"{res['wall_s']:.1f}",
              f"{server_training_cpu:.1f} + {cpu_clients:.1f} / {cpu_inproc:.1f}",
              f"{out['cpu_ratio_training']:.2f}", str(rounds),
              str(max(per_level.values(), default=0)), str(requests), str(same_model))
    print_table(t)
    if "overhead_cpu_s" in out:
        print(f"CPU beyond the in-process run's: {out['overhead_cpu_s']:.2f} s (server + "
              f"clients - in process) over the {requests_total} requests of the clients' "
              f"training: {out['overhead_cpu_ms_per_request']:.2f} ms per request")
    print("aggregation rounds per level: "
          + ", ".join(f"{lvl}: {k}" for lvl, k in per_level.items()))
    if phases:
        p = Table(title="HTTPS training time by phase (summed over rounds; the rest: between "
                        "a close and the next round's first phase)")
        for name in phases:
            p.add_column(name, justify="right")
        p.add_column("rest", justify="right")
        p.add_row(*(f"{sec:.2f} s ({sec / train_s:.0%})" for sec in phases.values()),
                  f"{train_s - sum(phases.values()):.2f} s")
        print_table(p)
    b = Table(title="bytes per client")
    for col in ("sent", "received", "summable payload", "uploaded vectors",
                "8*T*2^M*d_sampled*B*S", "sent / bound", "sent / vectors"):
        b.add_column(col, justify="right")
    b.add_row(f"{sent:,}", f"{recv:,}", f"{summable:,}", f"{uploaded:,}", f"{bound:,}",
              f"{sent / bound:.2f}", f"{sent / uploaded:.2f}")
    print_table(b)
    if a.json is not None:
        a.json.write_text(json.dumps(_finite_or_null(out), indent=2) + "\n")


if __name__ == "__main__":
    main()
