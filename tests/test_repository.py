"""What the repository tracks: no private keys, databases or run output (a benchmark or demo
writes those into the working directory; .gitignore keeps them out)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: file endings of what a run writes and a repository must never hold
RUN_OUTPUT = (".key", ".ed25519", ".db", ".db-wal", ".db-shm", ".sqlite")


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout.splitlines()


def test_no_private_keys_databases_or_run_directories_are_tracked() -> None:
    files = _tracked()
    assert "pyproject.toml" in files  # the listing is the project's
    bad = [f for f in files if f.endswith(RUN_OUTPUT)
           or f.split("/", 1)[0] in ("fedforest-bench", "fedforest-run")]
    assert bad == []


def test_the_run_directories_are_ignored() -> None:
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "fedforest-bench/" in ignored and "fedforest-run/" in ignored and "*.db" in ignored
