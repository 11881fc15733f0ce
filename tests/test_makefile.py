"""The Makefile's virtualenv step: an interpreter older than the project's requires-python is
refused before anything is installed, with a message saying what to do."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def _min_python() -> str:
    found = re.findall(r"^MIN_PYTHON := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert len(found) == 1
    return found[0]


def test_the_makefile_asks_for_the_python_pyproject_requires() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"] == f">={_min_python()}"


def _interpreter(path: Path) -> Path:
    """A stand-in for an interpreter: runs ``-c`` code in this one, refuses anything else (so
    a Makefile that went on to create the virtualenv or install would fail here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\n[ "$1" = "-c" ] && exec {sys.executable} "$@"\n'
                    'echo "not run: $*" >&2; exit 97\n')
    path.chmod(0o755)
    return path


def _make(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(ROOT / "Makefile", cwd / "Makefile")
    (cwd / "pyproject.toml").touch()
    (cwd / "setup.py").touch()
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    # a version after this interpreter's stands for the project's, so this one is too old
    return subprocess.run(["make", "--no-print-directory", *args, "MIN_PYTHON=99.0"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("folder", "quote"), [("bin", ""), ("my py", '"')],
                         ids=["plain", "a space, in double quotes"])
def test_a_too_old_python_makes_no_virtualenv(tmp_path: Path, folder: str, quote: str) -> None:
    python = _interpreter(tmp_path / folder / "python3")
    named = f"{quote}{python}{quote}"  # as the user wrote PYTHON=
    res = _make(tmp_path, "demo", f"PYTHON={named}")
    assert res.returncode == 2
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert res.stderr.splitlines()[0] == (
        f"{named} is Python {have}; FedForest Secure needs Python 99.0 or later. Name a "
        "newer one: make demo PYTHON=python99.0")
    assert not (tmp_path / ".venv").exists()


def test_a_virtualenv_of_a_too_old_python_is_refused_before_installing(tmp_path: Path) -> None:
    _interpreter(tmp_path / ".venv" / "bin" / "python")
    res = _make(tmp_path, "demo", "PYTHON=python3")
    assert res.returncode == 2
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert res.stderr.splitlines()[0] == (
        f".venv was made by Python {have}; FedForest Secure needs Python 99.0 or later. "
        "Remove it and make it again with a newer one: rm -rf .venv; make demo "
        "PYTHON=python99.0")
    assert "not run" not in res.stderr and not (tmp_path / ".venv" / ".installed").exists()
