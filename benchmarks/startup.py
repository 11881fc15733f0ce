"""CPU seconds a ``fedforest`` process spends starting: this working tree against a base commit.

    python benchmarks/startup.py                    # against main, 15 runs of each
    python benchmarks/startup.py --base HEAD~3 --runs 25

Each measured command runs in a fresh interpreter, its user + system CPU read from the kernel
(``wait4``); the runs of the two versions alternate (this tree, the base, the base, this tree,
...), so a load that comes and goes on a shared machine falls on both. The base is a ``git
archive`` export of the commit in a temporary directory; each version is first on
``PYTHONPATH`` and the commands run from an empty directory, so neither imports the other's
modules; one untimed run of each command first compiles each version's bytecode. Printed: the
median CPU of each command for each version and their ratio, as a Markdown table, with the
machine's load average before and after.

The commands: ``fedforest --help``; ``fedforest client`` up to its check of ``--data`` (a
file that is not there: it exits 2 with the client's modules imported, before it reads the
schema and the table); ``fedforest client`` up to its first request, the offer (a valid
schema and table, the default profile; the server's port closed: it exits 2 when the request
is refused; a client loads the DP stack only once an offer says the job has DP, so not here:
commits up to ``4118f99`` loaded it before this request unless the site pinned a profile
without DP); ``fedforest server`` up to
serving (uvicorn's ``Server.run`` replaced by a return: the settings read, the database
opened, the app built, the socket bound); and the imports alone: the server's modules
(``import server_app.app``) and the command line with a site's client (``import
fedforest_cli.cli, client_app.runner``).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _cli import at_least

ROOT = Path(__file__).resolve().parents[1]

#: ``fedforest server`` in this process, with uvicorn's serving loop replaced by a return
_SERVER = ("import sys, uvicorn\n"
           "uvicorn.Server.run = lambda self, sockets=None: None\n"
           "sys.argv = ['fedforest', *sys.argv[1:]]\n"
           "from fedforest_cli.__main__ import main\n"
           "main()\n")


def commands(work: Path) -> dict[str, tuple[list[str], int]]:
    """What is measured: the arguments of ``python`` and the exit status each run must end
    with; ``work`` holds the server's configuration and databases."""
    config = work / "server.toml"
    # the databases beside server.toml (relative names are read from its directory)
    config.write_text('host = "127.0.0.1"\ndatabase = "sqlite:///server.db"\n'
                      'audit_database = "audit.db"\n')
    site_files(work)
    client = ["client", "--server", "https://127.0.0.1:9", "--token", "t", "--job", "j",
              "--schema", str(work / "schema.toml"), "--data", str(work / "missing.csv")]
    joining = ["client", "--insecure-dev", "--server", "http://127.0.0.1:{port}", "--token",
               "t", "--job", "j", "--schema", str(work / "schema.toml"), "--data",
               str(work / "site.csv"), "--retry-budget", "0", "--state-dir",
               str(work / "state"), "--quiet"]
    return {
        "fedforest --help": (["-m", "fedforest_cli", "--help"], 0),
        "fedforest client (to its check of --data)": (["-m", "fedforest_cli", *client], 2),
        "fedforest client (to its first request)": (["-m", "fedforest_cli", *joining], 2),
        "fedforest server (to serving)": (
            ["-c", _SERVER, "server", "--config", str(config), "--insecure-dev", "--port",
             "{port}"], 0),
        "import server_app.app": (["-c", "import server_app.app"], 0),
        "import fedforest_cli.cli, client_app.runner": (
            ["-c", "import fedforest_cli.cli, client_app.runner"], 0),
    }


def site_files(work: Path, rows: int = 200) -> None:
    """A site's ``schema.toml`` and ``site.csv`` (two features, two classes) in ``work``."""
    rng = random.Random(0)
    (work / "schema.toml").write_text(
        '[[features]]\nname = "a"\nkind = "continuous"\nbounds = [0.0, 1.0]\n\n'
        '[[features]]\nname = "b"\nkind = "continuous"\nbounds = [0.0, 1.0]\n\n'
        '[target]\nname = "y"\nkind = "classification"\nclasses = ["0", "1"]\n')
    lines = ["a,b,y"]
    for _ in range(rows):
        a, b = rng.random(), rng.random()
        lines.append(f"{a!r},{b!r},{int(a + b > 1)}")
    (work / "site.csv").write_text("\n".join(lines) + "\n")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_of(argv: list[str], env: dict[str, str], cwd: Path, code: int = 0) -> float:
    """User + system CPU seconds of one run of ``argv`` (``{port}`` in it: a free port); a
    run that does not exit with ``code`` stops the benchmark with what it said."""
    port = str(free_port())
    argv = [a.replace("{port}", port) for a in argv]
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    proc.stderr.close()
    if proc.returncode != code:
        sys.exit(f"error: {' '.join(argv)} exited {proc.returncode}: "
                 f"{err.decode(errors='replace').strip()[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def export(base: str, into: Path) -> str:
    """``git archive`` of ``base`` extracted into ``into``; returns the commit's short hash."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet",
                            "--short", f"{base}^{{commit}}"],
                           capture_output=True, text=True, check=False)
    if found.returncode != 0:
        sys.exit(f"error: --base {base}: not a commit of the repository in {ROOT}")
    commit = found.stdout.strip()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit],
                         capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return commit


def env_for(tree: Path) -> dict[str, str]:
    """The environment of the runs of ``tree``: it first on ``PYTHONPATH``, and bytecode
    written (without ``PYTHONDONTWRITEBYTECODE``), so the untimed run compiles each version's
    modules once and no timed run compiles them again (with it set, every run of the export
    compiled all of its modules, and this tree's runs those changed since it was compiled)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = str(tree)
    return env


def check_tree(tree: Path, env: dict[str, str], cwd: Path) -> None:
    """The packages a run imports are ``tree``'s (not an installed copy's)."""
    code = "import fedforest_cli, server_app; print(fedforest_cli.__file__, server_app.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True,
                         text=True, check=True).stdout.split()
    if not all(Path(f).resolve().is_relative_to(tree.resolve()) for f in out):
        sys.exit(f"error: the runs for {tree} import {out}")


def head() -> str:
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                            "fedforest_secure", "server_app", "client_app", "fedforest_cli"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return commit + (" with changes" if dirty else "")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main", help="the commit to compare with (default main)")
    ap.add_argument("--runs", type=at_least(1), default=15,
                    help="runs of each command for each version (the median is printed)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base_tree, empty = Path(tmp) / "base", Path(tmp) / "cwd"
        base_tree.mkdir()
        empty.mkdir()
        commit = export(args.base, base_tree)
        trees = {"this tree": ROOT, "base": base_tree}
        envs = {name: env_for(tree) for name, tree in trees.items()}
        runs: dict[str, dict[str, tuple[list[str], int]]] = {}
        for name, tree in trees.items():
            check_tree(tree, envs[name], empty)
            work = Path(tmp) / f"work-{len(runs)}"  # each version its own databases
            work.mkdir()
            runs[name] = commands(work)
        for name in trees:  # untimed: the export's bytecode, the server's databases
            for argv, code in runs[name].values():
                cpu_of([sys.executable, *argv], envs[name], empty, code)
        load_before = os.getloadavg()
        cpu: dict[tuple[str, str], list[float]] = {}
        for i in range(args.runs):
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for label in runs["base"]:
                for name in order:
                    argv, code = runs[name][label]
                    cpu.setdefault((label, name), []).append(
                        cpu_of([sys.executable, *argv], envs[name], empty, code))
        load_after = os.getloadavg()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; this tree {head()} against "
          f"{args.base} ({commit}); Python {platform.python_version()}, {os.cpu_count()} CPUs; "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
          f"median of {args.runs} runs each, alternating")
    print()
    print("| command | this tree CPU s | base CPU s | this / base |")
    print("|---|---:|---:|---:|")
    for label in runs["base"]:
        new = statistics.median(cpu[(label, "this tree")])
        old = statistics.median(cpu[(label, "base")])
        print(f"| `{label}` | {new:.3f} | {old:.3f} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
