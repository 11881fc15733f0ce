"""How the secure profile's cost grows with the number of sites K.

Two measurements, each a table (Markdown), a PNG plot and a JSON file:

``protocol``
    One secure-aggregation round in one process, with the real client and server state machines
    of :mod:`fedforest_secure.secagg` (what a round costs whatever the transport): per client
    and per round, the CPU seconds of its steps (parse the server's JSON messages, share keys,
    mask, sign the survivor set, unmask) and the bytes it sends and receives (the JSON messages
    and the 8-byte words of the masked vector); the server's CPU seconds per round (every
    check, serialising its messages, the share routing, the reconstruction and unmasking). A
    server with per-client messages (``setup_for`` / ``unmask_request_for``, the SecAgg+ graph)
    sends those, any other the broadcast, so the script also measures older checkouts
    (``PYTHONPATH=<checkout>``). Graphs: ``complete`` (every pair of clients shares masks)
    and ``secagg+`` (the SecAgg+ sparse graph of degree ``k = 2 ceil(log2 K)``, neighbours from
    the round's public seed). Steady state: the rounds after the first (the key advert rides on
    the previous round's unmask response). Each series is fitted by ``a + b K`` and by
    ``a + b log2 K`` (coefficients and relative residuals); the table says which fits (smaller
    relative residual).

``https``
    A whole secure job over HTTPS on 127.0.0.1 (``fedforest server`` and K ``fedforest client``
    processes, TLS with client certificates, SQLite), on kin8nm from ``../shared/data`` split
    over K sites: per round, the clients' training CPU (mean per client), the server's CPU
    (its whole life, start-up included), the bytes each client sent and received, the HTTP
    requests per client; the wall time of the training (first round issued to the last closed)
    and the number of rounds. ``secagg+`` pins, at every site, the secure profile with
    ``neighbours = 2 ceil(log2 K)`` (the sites' own profile asks for the sparse graph).

    python benchmarks/scale.py protocol --clients 10 25 50 100 --out scale-protocol
    python benchmarks/scale.py https --clients 10 25 50 100 --trees 10 --depth 5 --out scale-https

Everything runs on one machine: the ``https`` clients share its cores, so their wall time grows
with K even where per-client costs do not; read the CPU and byte columns for the growth law.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _cli import at_least

__all__ = ["fit_growth", "main"]


# ------------------------------------------------------------------------------ fitting
def fit_growth(ks: Sequence[int], values: Sequence[float]) -> dict[str, Any]:
    """Least-squares fits of ``values`` by ``a + b K`` and ``a + b log2 K``; ``law`` names the
    better one (smaller root-mean-square relative residual)."""
    k = np.asarray(ks, dtype=float)
    v = np.asarray(values, dtype=float)
    out: dict[str, Any] = {}
    for name, x in (("K", k), ("log K", np.log2(k))):
        design = np.column_stack([np.ones_like(x), x])
        coef, *_ = np.linalg.lstsq(design, v, rcond=None)
        pred = design @ coef
        rel = float(np.sqrt(np.mean(((v - pred) / v) ** 2)))
        out[name] = {"a": float(coef[0]), "b": float(coef[1]), "rel_rms": rel}
    out["law"] = min(("K", "log K"), key=lambda n: out[n]["rel_rms"])
    # the growth ratio over the measured range, against K's own
    out["growth"] = float(v[-1] / v[0]) if v[0] > 0 else float("nan")
    out["k_growth"] = float(k[-1] / k[0])
    return out


def degree_for(k: int) -> int:
    """The SecAgg+ degree of this benchmark: ``2 ceil(log2 K)`` neighbours (at most K - 1)."""
    return min(k - 1, 2 * math.ceil(math.log2(k)))


# ------------------------------------------------------------------------------ protocol
def _jsize(msg: Any) -> int:
    return len(msg.model_dump_json())


def protocol_round_costs(k: int, graph: str, length: int, rounds: int = 3,
                         seed: int = 0) -> dict[str, Any]:
    """Mean per-client and server costs of the steady-state rounds (all but the first)."""
    from nacl.signing import SigningKey

    from fedforest_secure.secagg import (
        RoundSetup,
        SecAggClient,
        SecAggServer,
        ShareDelivery,
        SurvivorSet,
        UnmaskRequest,
        parse,
    )

    neighbours = None if graph == "complete" else degree_for(k)
    if neighbours is not None and neighbours >= k - 1:
        neighbours = None  # the sparse graph of a small federation is the complete graph
    ids = list(range(k))
    keys = {u: SigningKey.generate() for u in ids}
    directory = {u: bytes(keys[u].verify_key) for u in ids}
    clients = {u: SecAggClient(u, "scale", keys[u], directory, n_clients=k, threshold=0.67,
                               neighbours=neighbours) for u in ids}
    rng = np.random.default_rng(seed)
    cpu = np.zeros(k)
    steps: dict[str, float] = {}  # client CPU seconds by step, all clients together
    sent = np.zeros(k)
    recv = np.zeros(k)
    server_cpu = 0.0
    next_adverts: dict[int, Any] = {}
    measured = 0
    steady = False

    def client(u: int, fn: Any, *args: Any, **kw: Any) -> Any:
        t0 = time.process_time()
        out = fn(*args, **kw)
        if steady:
            spent = time.process_time() - t0
            cpu[u] += spent
            name = getattr(fn, "__name__", "?")
            steps[name] = steps.get(name, 0.0) + spent
        return out

    def serve(fn: Any, *args: Any) -> Any:
        nonlocal server_cpu
        t0 = time.process_time()
        out = fn(*args)
        if steady:
            server_cpu += time.process_time() - t0
        return out

    for r in range(rounds):
        steady = r > 0
        vectors = {u: rng.integers(0, 1 << 63, size=length, dtype=np.uint64) for u in ids}
        expected = np.zeros(length, dtype=np.uint64)
        for u in ids:  # before masking: the vectors are masked in place
            np.add(expected, vectors[u], out=expected)
        digest = bytes([r % 256]) * 32
        server = SecAggServer("scale", r, f"q{r}", digest, length, 0.67, directory, neighbours,
                              streaming=True)
        for u in ids:
            advert = next_adverts.get(u) or client(u, clients[u].advertise, r)
            if u not in next_adverts and steady:
                sent[u] += _jsize(advert)
            serve(server.receive_advert, advert)
        setup = serve(server.setup)
        # a server that makes each client its own setup and unmask request (the SecAgg+ graph:
        # the client's group only) sends those; otherwise every client gets the broadcast.
        # Messages travel as JSON: the server serialises (a broadcast once), the client parses.
        own = getattr(server, "sparse", False)
        setup_json = serve(setup.model_dump_json)
        for u in ids:
            text = serve(server.setup_for(u).model_dump_json) if own else setup_json
            bundle = client(u, clients[u].share_keys, client(u, parse, RoundSetup, text))
            serve(server.receive_shares, bundle)
            if steady:
                recv[u] += len(text)
                sent[u] += _jsize(bundle)
        deliveries = serve(server.deliver_shares)
        for u in ids:
            text = serve(deliveries[u].model_dump_json)
            delivery = client(u, parse, ShareDelivery, text)
            header, masked = client(u, clients[u].mask, delivery, vectors[u], inplace=True)
            serve(server.receive_upload, header, masked)
            if steady:
                recv[u] += len(text)
                sent[u] += _jsize(header) + 8 * length
        survivor_set = serve(server.request_signatures)
        survivors_json = serve(survivor_set.model_dump_json)
        for u in survivor_set.survivors:
            sig = client(u, clients[u].sign_survivors,
                         client(u, parse, SurvivorSet, survivors_json))
            serve(server.receive_signature, sig)
            if steady:
                recv[u] += len(survivors_json)
                sent[u] += _jsize(sig)
        request = serve(server.request_unmask)
        request_json = serve(request.model_dump_json)
        for u in request.survivors:
            text = serve(server.unmask_request_for(u).model_dump_json) if own else request_json
            nxt = client(u, clients[u].advertise, r + 1)
            response = client(u, clients[u].unmask, client(u, parse, UnmaskRequest, text),
                              next_advert=nxt)
            serve(server.receive_unmask, response)
            if steady:
                recv[u] += len(text)
                sent[u] += _jsize(response)
        total = serve(server.finish)
        if not np.array_equal(total, expected):
            raise RuntimeError("the secure sum differs from the plain sum")
        next_adverts = dict(server.next_adverts)
        measured += int(steady)
    return {"K": k, "graph": graph, "neighbours": neighbours or k - 1, "length": length,
            "client_cpu_ms": 1e3 * float(cpu.mean()) / measured,
            "client_cpu_ms_max": 1e3 * float(cpu.max()) / measured,
            "server_cpu_ms": 1e3 * server_cpu / measured,
            "client_sent_kb": float(sent.mean()) / measured / 1e3,
            "client_recv_kb": float(recv.mean()) / measured / 1e3,
            **{f"client_{name}_ms": 1e3 * v / k / measured for name, v in sorted(steps.items())}}


def run_protocol(a: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for graph in a.graphs:
        for k in a.clients:
            row = protocol_round_costs(k, graph, a.length, rounds=a.rounds)
            rows.append(row)
            print(f"{graph:9s} K={k:4d}: client {row['client_cpu_ms']:8.1f} ms, server "
                  f"{row['server_cpu_ms']:8.1f} ms, sent {row['client_sent_kb']:8.1f} kB, "
                  f"received {row['client_recv_kb']:8.1f} kB", flush=True)
    return rows


# ------------------------------------------------------------------------------ https
def _db_rounds(db: Path) -> tuple[float, int]:
    """(seconds from the first round issued to the last closed, rounds) from the server DB."""
    import sqlite3

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        t0, t1, n = con.execute("SELECT min(issued_at), max(closed_at), count(*) FROM rounds"
                                ).fetchone()
    finally:
        con.close()
    return float(t1 - t0), int(n)


def _wait_rusage(proc: subprocess.Popen[bytes], timeout: float) -> float:
    """Wait for ``proc`` (at most ``timeout`` s, then kill it); its CPU seconds (user + sys)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return float(ru.ru_utime + ru.ru_stime)
        if time.monotonic() > deadline:
            proc.kill()
        time.sleep(0.1)


def https_job(k: int, graph: str, a: argparse.Namespace, *, rtt_ms: float | None = None,
              name: str | None = None) -> dict[str, Any]:
    """One secure job over HTTPS; with ``rtt_ms``, the clients reach the server through a
    :class:`~_latency.LatencyProxy` adding that round-trip time (0: the proxy alone)."""
    from _latency import LatencyProxy

    from fedforest_cli.sim_data import prepare_sites
    from fedforest_cli.simulate import (
        SimulateOptions,
        _job_status,
        free_port,
        start_client,
        start_server,
        wait_healthy,
        write_server_config,
    )
    from fedforest_secure.pki import init_dev_pki

    out = (a.out / (name or f"{graph}-K{k}")).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    profile = a.profile
    if graph == "secagg+":  # the sites' own profile asks for the sparse graph
        from fedforest_secure.privacy import load_profile

        plus = load_profile(a.profile, name=f"{a.profile}-plus", neighbours=degree_for(k))
        profile = str(out / "secure-plus.toml")
        Path(profile).write_text(plus.to_toml())
    names = [f"client-{i}" for i in range(k)]
    init_dev_pki(out / "certs", k, client_names=names)
    port = free_port()
    server_toml = write_server_config(out, port, out / "certs")
    opts = SimulateOptions(dataset=a.dataset, clients=k, alpha=a.alpha, profile=profile,
                           out=out, trees=a.trees, depth=a.depth, bins=a.bins,
                           round_deadline=a.deadline)
    sim = prepare_sites(opts, out, names, server_toml)
    url = f"https://127.0.0.1:{port}"
    server = start_server(server_toml, out / "server.log")
    procs = []
    proxy = LatencyProxy(port, rtt_ms / 1e3) if rtt_ms is not None else None
    try:
        wait_healthy(url, out / "certs" / "ca.pem", server, timeout=300,
                     cert=out / "certs" / "client-0.pem", key=out / "certs" / "client-0.key")
        if proxy is not None:
            proxy.__enter__()
            url = f"https://127.0.0.1:{proxy.port}"
        if a.per_process <= 1:
            for site in sim.sites:
                procs.append(start_client(site, url, sim.job_id, out / "certs",
                                          out / "clients" / site.name, out / f"{site.name}.log",
                                          out / "clients" / f"{site.name}.model.json",
                                          profile=profile, n_clients=k))
        else:  # the clients as threads, per_process of them in each process
            for start in range(0, k, a.per_process):
                procs.append(_start_client_group(sim.sites[start:start + a.per_process], url,
                                                 sim.job_id, out, profile, k))
        client_cpu = [_wait_rusage(p, a.timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.terminate()
        server_cpu = _wait_rusage(server, 30)
        if proxy is not None:
            proxy.__exit__(None, None, None)
    codes = [p.returncode for p in procs]
    n_procs = len(procs)
    status = _job_status(out / "server.db", sim.job_id)
    train_s, rounds = _db_rounds(out / "server.db")
    stats = [json.loads(p.read_text()) for p in sorted((out / "clients").glob("*/stats.json"))]
    log = (out / "server.log").read_text(errors="replace")
    found = re.findall(r"server_cpu_s=([0-9.]+)", log)
    return {"K": k, "graph": graph, "neighbours": degree_for(k) if graph == "secagg+" else k - 1,
            "rounds": rounds, "train_s": train_s,
            "ok": codes == [0] * n_procs and len(stats) == k and status["status"] == "done",
            "client_processes": n_procs,
            "model_digest": status["model_digest"],
            "connections": proxy.connections if proxy is not None else None,
            "server_cpu_s": float(found[-1]) if found else server_cpu,
            # a process of threads cannot tell its clients' CPU apart: then the processes' CPU
            # per client (start-up included) stands in
            "client_train_cpu_s": (float(np.mean([s["cpu_training_s"] for s in stats]))
                                   if n_procs == k else float(np.sum(client_cpu)) / k),
            # CPU of the client processes, per client (a process of threads counts all of them)
            "client_process_cpu_s": float(np.sum(client_cpu)) / k,
            "client_sent_mb": float(np.mean([s["bytes_sent"] for s in stats])) / 1e6,
            "client_recv_mb": float(np.mean([s["bytes_received"] for s in stats])) / 1e6,
            "requests_per_client": float(np.mean([s.get("requests", float("nan"))
                                                  for s in stats]))}


def _start_client_group(sites: Sequence[Any], url: str, job: str, out: Path, profile: str,
                        k: int) -> subprocess.Popen[bytes]:
    """One process running ``sites`` as threads of ``client_app.runner.run_client`` (each
    with its own TLS identity, token, state directory and transport)."""
    import sys

    from fedforest_cli.sim_processes import child_env
    from fedforest_secure.files import write_atomic

    spec = [{"server": url, "token": s.token, "job": job, "data": str(s.csv),
             "schema": str(s.schema), "ca": str(out / "certs" / "ca.pem"),
             "cert": str(out / "certs" / f"{s.name}.pem"),
             "key": str(out / "certs" / f"{s.name}.key"),
             "state_dir": str(out / "clients" / s.name),
             "model_out": str(out / "clients" / f"{s.name}.model.json"),
             "retry_budget_s": 600.0, "quiet": True, "profile": profile, "n_clients": k}
            for s in sites]
    path = out / f"group-{sites[0].name}.json"
    write_atomic(path, json.dumps(spec), mode=0o600)  # the sites' tokens: the user's only
    with (out / f"group-{sites[0].name}.log").open("ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "fedforest_cli.client_group",
                                 str(path)], stdout=fh, stderr=subprocess.STDOUT,
                                env=child_env())


def run_https(a: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for graph, k in ((g, k) for g in a.graphs for k in a.clients):
        row = https_job(k, graph, a)
        r = max(row["rounds"], 1)
        row.update({"server_cpu_ms_per_round": 1e3 * row["server_cpu_s"] / r,
                    "client_cpu_ms_per_round": 1e3 * row["client_train_cpu_s"] / r,
                    "client_sent_kb_per_round": 1e3 * row["client_sent_mb"] / r,
                    "client_recv_kb_per_round": 1e3 * row["client_recv_mb"] / r})
        rows.append(row)
        print(json.dumps(row), flush=True)
        if not row["ok"]:
            raise SystemExit(f"K={k}: the job did not finish (logs in {a.out / f'{graph}-K{k}'})")
    return rows


# ------------------------------------------------------------------------------ output
_PROTOCOL_COLS = [("client_cpu_ms", "client CPU ms/round"),
                  ("server_cpu_ms", "server CPU ms/round"),
                  ("client_sent_kb", "client sent kB/round"),
                  ("client_recv_kb", "client received kB/round")]
_STEP_COLS = [("client_parse_ms", "parse messages"), ("client_advertise_ms", "advertise"),
              ("client_share_keys_ms", "share keys"), ("client_mask_ms", "mask"),
              ("client_sign_survivors_ms", "sign"), ("client_unmask_ms", "unmask")]
_HTTPS_COLS = [("client_cpu_ms_per_round", "client CPU ms/round"),
               ("server_cpu_ms_per_round", "server CPU ms/round"),
               ("client_sent_kb_per_round", "client sent kB/round"),
               ("client_recv_kb_per_round", "client received kB/round")]


def markdown(rows: list[dict[str, Any]], cols: list[tuple[str, str]], extra: Sequence[str] = ()
             ) -> str:
    head = ["graph", "K", *extra, *[title for _, title in cols]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["graph"], str(r["K"]), *[_fmt(r[e]) for e in extra],
                 *[_fmt(r[key]) for key, _ in cols]]
        lines.append("| " + " | ".join(cells) + " |")
    fits = []
    for graph in sorted({r["graph"] for r in rows}):
        sub = [r for r in rows if r["graph"] == graph]
        if len(sub) < 3:
            continue
        for key, title in cols:
            f = fit_growth([r["K"] for r in sub], [r[key] for r in sub])
            lin, log = f["K"], f["log K"]
            fits.append(f"| {graph} | {title} | {f['growth']:.2f}x for {f['k_growth']:.0f}x K "
                        f"| {lin['a']:.3g} + {lin['b']:.3g} K | {lin['rel_rms']:.3f} "
                        f"| {log['a']:.3g} + {log['b']:.3g} log2 K | {log['rel_rms']:.3f} "
                        f"| {f['law']} |")
    if fits:
        lines += ["", "| graph | series | growth | a + bK | rel. RMS | a + b log2 K | rel. RMS "
                      "| fits |", "|---|---|---|---|---|---|---|---|", *fits]
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"
    return str(v)


def plot(rows: list[dict[str, Any]], cols: list[tuple[str, str]], path: Path, title: str
         ) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cols), figsize=(4.2 * len(cols), 3.6))
    for ax, (key, label) in zip(np.atleast_1d(axes), cols, strict=True):
        for graph in sorted({r["graph"] for r in rows}):
            sub = sorted((r for r in rows if r["graph"] == graph), key=lambda r: r["K"])
            ax.plot([r["K"] for r in sub], [r[key] for r in sub], marker="o", label=graph)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("sites K")
        ax.set_title(label, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    np.atleast_1d(axes)[0].legend()
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("protocol", help="one secure-aggregation round in process")
    p.add_argument("--length", type=int, default=20_000, help="entries of the summed vector")
    p.add_argument("--rounds", type=at_least(2, "the first round is not counted"), default=3,
                   help="rounds run, at least 2 (the first is not counted)")
    h = sub.add_parser("https", help="whole secure jobs over HTTPS on 127.0.0.1")
    h.add_argument("--dataset", default="kin8nm")
    h.add_argument("--trees", type=int, default=10)
    h.add_argument("--depth", type=int, default=5)
    h.add_argument("--bins", type=int, default=16)
    h.add_argument("--alpha", type=float, default=10.0, help="Dirichlet split of the rows")
    h.add_argument("--profile", default="secure")
    h.add_argument("--deadline", type=float, default=600.0)
    h.add_argument("--timeout", type=float, default=3600.0)
    for q in (p, h):
        q.add_argument("--graphs", nargs="+", default=["complete", "secagg+"],
                       choices=["complete", "secagg+"])
        q.add_argument("--clients", type=int, nargs="+", default=[10, 25, 50, 100])
        q.add_argument("--out", type=Path, default=Path("scale-run"))
    h.add_argument("--per-process", type=int, default=1,
                   help="clients per process (threads; 1: a process per client, as deployed)")
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(args)
    if a.what == "protocol" and min(a.clients) < 3:
        p.error(f"--clients {min(a.clients)}: at least 3 (secure aggregation sums over at "
                "least 3 clients)")
    a.out.mkdir(parents=True, exist_ok=True)
    extra: tuple[str, ...]
    if a.what == "protocol":
        rows = run_protocol(a)
        cols, extra = _PROTOCOL_COLS, ("neighbours",)
        title = f"one secure-aggregation round, {a.length:,} entries"
    else:
        rows = run_https(a)
        cols, extra = _HTTPS_COLS, ("neighbours", "rounds", "train_s")
        title = f"secure job over HTTPS: {a.dataset}, T={a.trees}, depth {a.depth}"
    (a.out / f"{a.what}.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows, cols, extra)
    if a.what == "protocol":  # where a client's CPU goes, by step (ms per client and round)
        table += "\n\nclient CPU ms per round, by step:\n\n" + markdown(rows, _STEP_COLS)
    (a.out / f"{a.what}.md").write_text(table + "\n")
    plot(rows, cols, a.out / f"{a.what}.png", title)
    print(table)
    print(f"written: {a.out / (a.what + '.md')}, .json, .png")


if __name__ == "__main__":
    main()
