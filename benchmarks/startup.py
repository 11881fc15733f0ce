"""CPU seconds a ``fedforest`` process spends starting: this working tree against a base commit.

    python benchmarks/startup.py                    # against main, 15 runs of each
    python benchmarks/startup.py --base HEAD~3 --runs 25

Each measured command runs in a fresh interpreter, its user + system CPU read from the kernel
(``wait4``); the runs of the two versions alternate (this tree, the base, the base, this tree,
...), so a load that comes and goes on a shared machine falls on both. The base is a ``git
archive`` export of the commit in a temporary directory; each version is first on
``PYTHONPATH`` and the commands run from an empty directory, so neither imports the other's
modules. Printed: the median CPU of each command for each version and their ratio, as a Markdown
table, with the machine's load average before and after.

The commands: ``fedforest --help``; the server's modules (``import server_app.app``, what
``fedforest server`` imports besides the command line); a site's client (``import
fedforest_cli.cli, client_app.runner``, what ``fedforest client`` imports before it connects).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _cli import at_least

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {
    "fedforest --help": ["-m", "fedforest_cli", "--help"],
    "import server_app.app": ["-c", "import server_app.app"],
    "import fedforest_cli.cli, client_app.runner": [
        "-c", "import fedforest_cli.cli, client_app.runner"],
}


def cpu_of(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """User + system CPU seconds of one run of ``argv``; a failing run stops the benchmark
    with what it said."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    proc.stderr.close()
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(argv)} exited {proc.returncode}: "
                 f"{err.decode(errors='replace').strip()[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def export(base: str, into: Path) -> str:
    """``git archive`` of ``base`` extracted into ``into``; returns the commit's short hash."""
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", base],
                                capture_output=True, text=True, check=True).stdout.strip()
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit],
                             capture_output=True, check=True).stdout
    except subprocess.CalledProcessError as exc:
        sys.exit(f"error: --base {base}: {exc.stderr.decode(errors='replace').strip()}"
                 if isinstance(exc.stderr, bytes) else f"error: --base {base}: {exc.stderr}")
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return commit


def env_for(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
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
        for name, tree in trees.items():
            check_tree(tree, envs[name], empty)
        load_before = os.getloadavg()
        cpu: dict[tuple[str, str], list[float]] = {}
        for i in range(args.runs):
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for label, command in COMMANDS.items():
                for name in order:
                    cpu.setdefault((label, name), []).append(
                        cpu_of([sys.executable, *command], envs[name], empty))
        load_after = os.getloadavg()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; this tree {head()} against "
          f"{args.base} ({commit}); Python {platform.python_version()}, {os.cpu_count()} CPUs; "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
          f"median of {args.runs} runs each, alternating")
    print()
    print("| command | this tree CPU s | base CPU s | this / base |")
    print("|---|---:|---:|---:|")
    for label in COMMANDS:
        new = statistics.median(cpu[(label, "this tree")])
        old = statistics.median(cpu[(label, "base")])
        print(f"| `{label}` | {new:.3f} | {old:.3f} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
