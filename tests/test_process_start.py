"""How a ``fedforest`` process starts: every server and client of a federation (and of the
tests) is one."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from fedforest_cli.sim_processes import child_env

ROOT = Path(__file__).resolve().parents[1]


def test_the_fedforest_process_freezes_what_its_imports_made_before_the_command_runs() -> None:
    """``python -m fedforest_cli`` and the installed ``fedforest`` script run ``main``, which
    moves the objects of the command's imports out of the collector's reach (``gc.freeze``)
    before the command runs: the count of frozen objects is what the command sees."""
    seen = subprocess.run(
        [sys.executable, "-c",
         "import gc, fedforest_cli.cli as cli\n"
         "cli.app = lambda **kw: print(gc.get_freeze_count(), kw['prog_name'])\n"
         "from fedforest_cli.__main__ import main\n"
         "main()\n"],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False)
    assert seen.returncode == 0, seen.stderr
    frozen, prog = seen.stdout.split()
    assert prog == "fedforest"
    assert int(frozen) > 10_000  # the modules, classes and functions of typer, numpy, ...
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fedforest"] == "fedforest_cli.__main__:main"
