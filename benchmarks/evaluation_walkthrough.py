"""The deployment walk-through of docs/deployment.md, "Federated evaluation", run end to end.

    python benchmarks/evaluation_walkthrough.py --out /tmp/walk
    python benchmarks/evaluation_walkthrough.py --out /tmp/walk-dp --eval-profile secure-dp

Every step is a ``fedforest`` command in its own process, as an operator and four sites would
run them on loopback: certificates, the server, four sites registered, two training jobs on the
same federation (profile ``secure``, and ``secure-dp`` with epsilon = 1), then one evaluation
job (``fedforest evaluate``) that scores both models on each site's held-out rows, which never
leave the site. It prints the table and leaves ``evaluation-eval.png/.md/.json`` next to the
models in ``--out``; the numbers of docs/deployment.md come from these runs.

A site scores a model on its held-out rows once (its ledger refuses a second evaluation job of
the same model on the same rows), so the exact and the DP evaluation are separate runs.

Each site runs all its clients (both training jobs, then the evaluation) on one state
directory, as a site would: its identity key, its receipts and its evaluation ledger live
there. Should a client fail, or the server exit, the script stops the other processes at once
and prints the failing ones' last log lines; ``--timeout`` bounds the training and the
evaluation each (default: 10 times ``--round-deadline``, the jobs' round deadline).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tomli_w

from fedforest_cli.sim_data import _partition, load_table, schema_dict, write_csv, write_schema
from fedforest_cli.simulate import free_port, wait_for_job, write_server_config


def _fedforest(*args: str, env: dict[str, str] | None = None, log: Path | None = None,
               wait: bool = True) -> subprocess.Popen[bytes] | str:
    cmd = [sys.executable, "-m", "fedforest_cli", *args]
    if not wait:
        out = log.open("ab") if log is not None else subprocess.DEVNULL
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
    done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise SystemExit(f"fedforest {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


#: a process the script waits for: its name (``<job>.<site>``, ``evaluate``), the process and
#: the log file its output goes to
_Watched = tuple[str, subprocess.Popen[bytes], Path]

#: log lines printed of each process that failed or did not end
_TAIL = 12


def _tail(log: Path, lines: int = _TAIL) -> str:
    """The last ``lines`` lines of ``log``, indented (a note when there is none)."""
    try:
        text = log.read_text(errors="replace").rstrip().splitlines()[-lines:]
    except OSError as exc:
        return f"    (no log: {exc.strerror})"
    return "\n".join(f"    {line}" for line in text) if text else "    (empty log)"


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Kill the processes still running and reap them."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass


def _wait_all(procs: Sequence[_Watched], timeout: float, what: str,
              server: _Watched | None = None) -> None:
    """Wait until every process of ``procs`` has exited with 0.

    The first that exits otherwise, the ``server`` exiting, or ``timeout`` seconds passing
    ends the wait: the processes still running are killed, and SystemExit says which failed
    (or did not end) with the last lines of their logs. Waiting on would gain nothing: this
    script needs every site, and a job's other clients would only wait out their deadlines.
    """
    deadline = time.monotonic() + timeout
    while True:
        failed = [(name, proc.returncode, log) for name, proc, log in procs
                  if proc.poll() not in (None, 0)]
        if server is not None and server[1].poll() is not None:
            failed.insert(0, ("the server", server[1].returncode, server[2]))
        running = [(name, log) for name, proc, log in procs if proc.poll() is None]
        if not running and not failed:
            return
        if failed or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    _stop([proc for _, proc, _ in procs])
    if failed:
        head = f"error: {what} failed: " + ", ".join(f"{name} exited with {code}"
                                                      for name, code, _ in failed)
        if running:
            head += f"; stopped the others still running: {', '.join(n for n, _ in running)}"
        shown = [(name, log) for name, _, log in failed]
    else:
        head = (f"error: {what} did not end within {timeout:.0f} s (--timeout); stopped "
                f"those still running: {', '.join(n for n, _ in running)}")
        shown = running
    parts = [head] + [f"--- {name}: last lines of {log}\n{_tail(log)}" for name, log in shown]
    raise SystemExit("\n".join(parts))


#: the file that marks an --out directory as this script's (the next run may replace it)
_MARKER = ".evaluation-walkthrough"


def _clear_earlier_run(out: Path) -> None:
    """Remove ``out`` if an earlier run of this script wrote it; refuse any other non-empty
    directory (or a file) there, so a mistyped ``--out`` never deletes a user's files."""
    if not out.exists():
        return
    if not out.is_dir():
        raise SystemExit(f"error: --out {out} is a file, not a directory")
    if any(out.iterdir()) and not (out / _MARKER).is_file():
        raise SystemExit(f"error: --out {out} holds files and is not the output of an earlier "
                         "run of this script (the run would replace it): choose another "
                         "--out, or empty it yourself")
    shutil.rmtree(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="banknote")
    ap.add_argument("--sites", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("evaluation-walkthrough"))
    ap.add_argument("--eval-profile", default="secure")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--round-deadline", type=float, default=120.0,
                    help="the round deadline of every job, seconds (default 120)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds the training (both jobs) and the evaluation may take each "
                         "before the script stops them (default: 10 round deadlines)")
    args = ap.parse_args()
    if args.round_deadline <= 0 or (args.timeout is not None and args.timeout <= 0):
        ap.error("--round-deadline and --timeout are positive numbers of seconds")
    timeout: float = args.timeout or 10 * args.round_deadline
    out: Path = args.out.resolve()
    try:  # a dataset name that is not one is said before anything is written or removed
        X, y, task, feat = load_table(args.dataset)
    except (ValueError, FileNotFoundError) as exc:  # not one; its data file is not there
        raise SystemExit(f"error: --dataset: {exc}") from None
    _clear_earlier_run(out)
    (out / "logs").mkdir(parents=True)
    (out / _MARKER).write_text("written by benchmarks/evaluation_walkthrough.py\n")
    t0 = time.monotonic()

    # the sites' tables: 80 % to train on, 20 % held out, both at the site
    rng = np.random.default_rng(args.seed)
    held = rng.random(len(y)) < 0.2
    part = _partition(y, task, args.sites, 0.5, args.seed)
    names = [f"site-{k}" for k in range(args.sites)]
    write_schema(out / "schema.toml", schema_dict(X, y, task, feat))
    for k, name in enumerate(names):
        mine = part == k
        write_csv(out / f"{name}.csv", X[mine & ~held], y[mine & ~held], feat, task)
        write_csv(out / f"{name}.test.csv", X[mine & held], y[mine & held], feat, task)
    print(f"{args.dataset}: {len(y)} rows over {args.sites} sites, {int(held.sum())} held out")

    # 1-3: certificates, server configuration, the sites registered
    _fedforest("pki", "init", "--out", str(out / "certs"), *sum((["--name", n] for n in names),
                                                                  []))
    server_toml = write_server_config(out, free_port(), out / "certs")
    tokens = {}
    for name in names:
        text = str(_fedforest("server", "add-client", name, "--config", str(server_toml)))
        tokens[name] = text.strip().splitlines()[-1]

    # two training jobs of the same federation: secure, and secure-dp
    for job, profile in (("train-secure", "secure"), ("train-dp", "secure-dp")):
        doc: dict[str, object] = {"id": job, "clients": names, "schema": "schema.toml",
                                  "profile": profile, "round_deadline": args.round_deadline,
                                  "public_rows": len(y)}
        if profile == "secure":
            doc["forest"] = {"n_estimators": 20, "max_depth": 6, "n_bins": 16}
        else:
            doc["privacy"] = {"epsilon": args.epsilon}
        (out / f"{job}.toml").write_text(tomli_w.dumps(doc))
        _fedforest("server", "create-job", "--config", str(server_toml), "--job",
                   str(out / f"{job}.toml"))
    server = _fedforest("server", "--config", str(server_toml), wait=False,
                        log=out / "logs" / "server.log")
    assert isinstance(server, subprocess.Popen)
    url = f"https://127.0.0.1:{server_toml.read_text().split('port = ')[1].split()[0]}"
    watched = ("server", server, out / "logs" / "server.log")
    procs: list[_Watched] = []  # every process started below, killed if the script stops
    try:
        time.sleep(2.0)
        for job, profile in (("train-secure", "secure"), ("train-dp", "secure-dp")):
            for name in names:
                pin = str(out / f"{job}.profile.toml") if profile == "secure-dp" else profile
                if profile == "secure-dp":
                    from fedforest_secure.privacy import load_profile

                    (out / f"{job}.profile.toml").write_text(
                        load_profile("secure-dp", epsilon=args.epsilon).to_toml())
                procs.append(_site(out, url, name, tokens[name], job, pin,
                                   ["--data", str(out / f"{name}.csv"), "--out",
                                    str(out / f"{job}.{name}.model.json")], len(names)))
        _wait_all(procs, timeout, "training", server=watched)
        for job, label in (("train-secure", "secure"), ("train-dp", "secure-dp")):
            shutil.copyfile(out / f"{job}.{names[0]}.model.json", out / f"{label}.json")
        t_train = time.monotonic() - t0

        # the evaluation job: both models on every site's held-out rows
        (out / "eval.toml").write_text(tomli_w.dumps({
            "id": "eval", "clients": names, "schema": "schema.toml",
            "profile": args.eval_profile, "round_deadline": args.round_deadline,
            **({"privacy": {"epsilon": args.epsilon}}
               if args.eval_profile == "secure-dp" else {})}))
        evaluate = _fedforest("evaluate", "--config", str(server_toml), "--job",
                              str(out / "eval.toml"), "--models", str(out / "secure.json"),
                              str(out / "secure-dp.json"), wait=False,
                              log=out / "logs" / "evaluate.log")
        assert isinstance(evaluate, subprocess.Popen)
        procs = [("evaluate", evaluate, out / "logs" / "evaluate.log")]
        _wait_for_job(out / "server.db", "eval", procs[0], min(timeout, 300.0))
        pin = args.eval_profile
        if args.eval_profile == "secure-dp":
            pin = str(out / "train-dp.profile.toml")
        procs += [_site(out, url, name, tokens[name], "eval", pin,
                        ["--eval-data", str(out / f"{name}.test.csv")], len(names))
                  for name in names]
        _wait_all(procs, timeout, "evaluation", server=watched)
    finally:
        _stop([proc for _, proc, _ in procs])  # none left when the script stops early
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            _stop([server])
    print((out / "logs" / "evaluate.log").read_text())
    print(f"wall time: training {t_train:.0f} s, evaluation "
          f"{time.monotonic() - t0 - t_train:.0f} s")


def _wait_for_job(db: Path, job: str, evaluate: _Watched, timeout: float) -> None:
    """Wait until ``fedforest evaluate`` has created ``job``; SystemExit with its last log
    lines when it exits first or ``timeout`` seconds pass."""
    name, proc, log = evaluate
    deadline = time.monotonic() + timeout
    while True:
        try:
            wait_for_job(db, job, timeout=1.0)
            return
        except TimeoutError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"error: {name} exited with {proc.returncode} before it created "
                             f"job {job}\n--- {name}: last lines of {log}\n{_tail(log)}")
        if time.monotonic() > deadline:
            _stop([proc])
            raise SystemExit(f"error: {name} did not create job {job} within {timeout:.0f} s; "
                             f"stopped it\n--- {name}: last lines of {log}\n{_tail(log)}")


def _site(out: Path, url: str, name: str, token: str, job: str, profile: str,
          table: list[str], n_sites: int) -> _Watched:
    """One site's ``fedforest client``, pinning the job's profile and its number of sites;
    its state directory is the site's, whichever job the client is of."""
    log = out / "logs" / f"{job}.{name}.log"
    proc = _fedforest("client", "--server", url, "--job", job, "--schema",
                      str(out / "schema.toml"), *table, "--ca", str(out / "certs" / "ca.pem"),
                      "--cert", str(out / "certs" / f"{name}.pem"), "--key",
                      str(out / "certs" / f"{name}.key"), "--state-dir",
                      str(out / "state" / name), "--profile", profile,
                      "--clients", str(n_sites), "--quiet",
                      env={"FEDFOREST_TOKEN": token}, wait=False, log=log)
    assert isinstance(proc, subprocess.Popen)
    return f"{job}.{name}", proc, log


if __name__ == "__main__":
    main()
