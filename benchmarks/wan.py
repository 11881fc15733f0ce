"""A secure job over wide-area links: added round-trip time against loopback.

The same job (dev PKI, the real uvicorn server with TLS and client certificates, K client
processes, profile ``secure``) runs once per setting, one after the other on the same data:
``direct`` (the clients reach the server on 127.0.0.1 as usual), then through
:class:`~_latency.LatencyProxy` on 127.0.0.1 at each ``--rtt`` (milliseconds; 0 is the proxy
without delay, which separates its own cost from the latency's). This machine has no ``tc
netem`` (the kernel lacks the qdisc), so the proxy delays every byte by ``rtt / 2`` in each
direction and the TCP handshake by one ``rtt``; TLS runs end to end through it.

Per setting: the training time (first round issued to the job done, from the server's
database), its ratio to ``direct``, the number of rounds, the HTTP requests each client made
(every request is at least one round trip; ``requests / round`` is what the latency multiplies),
the TCP connections the proxy saw, and whether the model equals the direct run's.

    python benchmarks/wan.py --dataset kin8nm --clients 10 --trees 10 --depth 5 --rtt 0 25 100
    python benchmarks/wan.py --dataset synthetic-100000 --clients 10 --trees 50 --depth 8 \\
        --rtt 50

Everything runs on one machine: the proxy shares its cores with the job (it copies every byte
once more), so the ``0`` row is the fair baseline for the latency's own cost.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scale import https_job

__all__ = ["main"]


def run(a: argparse.Namespace) -> list[dict[str, Any]]:
    settings: list[float | None] = [None, *a.rtt] if a.direct else list(a.rtt)
    rows: list[dict[str, Any]] = []
    for rtt in settings:
        label = "direct" if rtt is None else f"rtt{rtt:g}ms"
        row = https_job(a.clients, "complete", a, rtt_ms=rtt, name=label)
        row["setting"] = "loopback, no proxy" if rtt is None else f"proxy, {rtt:g} ms RTT"
        row["rtt_ms"] = rtt
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not row["ok"]:
            raise SystemExit(f"{label}: the job did not finish (logs in {a.out / label})")
    base = rows[0]
    for row in rows:
        row["ratio"] = row["train_s"] / base["train_s"]
        row["same_model"] = row["model_digest"] == base["model_digest"]
        row["requests_per_round"] = row["requests_per_client"] / max(row["rounds"], 1)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ["link", "training s", "ratio", "rounds", "requests per client",
            "requests per round", "TCP connections (all clients)", "same model"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        conns = "-" if r["connections"] is None else str(r["connections"])
        lines.append(f"| {r['setting']} | {r['train_s']:.1f} | {r['ratio']:.2f} | {r['rounds']} "
                     f"| {r['requests_per_client']:.0f} | {r['requests_per_round']:.1f} "
                     f"| {conns} | {'yes' if r['same_model'] else 'no'} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sub = [r for r in rows if r["rtt_ms"] is not None]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot([r["rtt_ms"] for r in sub], [r["train_s"] for r in sub], marker="o",
            label="through the proxy")
    if rows[0]["rtt_ms"] is None:
        ax.axhline(rows[0]["train_s"], color="grey", linestyle="--", label="loopback, no proxy")
        ax.axhline(1.5 * rows[0]["train_s"], color="red", linestyle=":", label="1.5x loopback")
    ax.set_xlabel("added round-trip time (ms)")
    ax.set_ylabel("training time (s)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="kin8nm")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--trees", type=int, default=10)
    ap.add_argument("--depth", type=int, default=5)
    ap.add_argument("--bins", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=10.0, help="Dirichlet split of the rows")
    ap.add_argument("--profile", default="secure")
    ap.add_argument("--rtt", type=float, nargs="+", default=[0.0, 25.0, 100.0],
                    help="added round-trip times in ms (0: the proxy without delay)")
    ap.add_argument("--no-direct", dest="direct", action="store_false",
                    help="skip the run without the proxy")
    ap.add_argument("--deadline", type=float, default=600.0)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--out", type=Path, default=Path("wan-run"))
    ap.set_defaults(per_process=1)  # a process per site, as deployed
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    rows = run(a)
    (a.out / "wan.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows)
    (a.out / "wan.md").write_text(table + "\n")
    plot(rows, a.out / "wan.png", f"secure job, {a.dataset}, K={a.clients}, T={a.trees}, "
                                  f"depth {a.depth}")
    print(table)
    print(f"written: {a.out / 'wan.md'}, .json, .png")


if __name__ == "__main__":
    main()
