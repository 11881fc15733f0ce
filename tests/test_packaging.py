"""The source distribution carries the licence, every file the README links to (docs,
threat model) and everything else the repository tracks (the tests' helpers and vectors, the
docs' figures), as MANIFEST.in names them; the licence the metadata declares is shipped."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: shipped by setuptools itself: the packages (with their package data and the extension's
#: sources, from pyproject.toml and setup.py) and the build files
PACKAGES = ("fedforest_secure/", "server_app/", "client_app/", "fedforest_cli/")
BUILD_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in")


def _manifest_covers(path: str) -> bool:
    for line in (ROOT / "MANIFEST.in").read_text().splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "include" and path in words[1:]:
            return True
        if words[0] == "recursive-include" and path.startswith(words[1].rstrip("/") + "/") \
                and any(fnmatch.fnmatch(Path(path).name, pat) for pat in words[2:]):
            return True
    return False


def test_every_file_the_readme_links_to_is_in_the_source_distribution() -> None:
    links = set(re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", (ROOT / "README.md").read_text()))
    assert "threat_model.md" in links and any(p.startswith("docs/") for p in links)
    for path in sorted(links):
        assert (ROOT / path).exists(), path
        assert _manifest_covers(path), f"{path} is linked from README.md but not in MANIFEST.in"


def test_every_tracked_file_outside_the_packages_is_in_the_source_distribution() -> None:
    """An unpacked sdist runs its tests (conftest.py, the helper modules, tests/vectors) and
    has the figures and tables the docs link to."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True,
                             text=True, check=True, timeout=60).stdout.splitlines()
    assert "tests/conftest.py" in tracked  # the listing is the project's
    left_out = [path for path in tracked if not path.startswith(PACKAGES)
                and path not in BUILD_FILES and not _manifest_covers(path)]
    assert left_out == []


def test_the_declared_licence_is_shipped() -> None:
    toml = tomllib.loads((ROOT / "pyproject.toml").read_text())
    meta = toml["project"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    # the SPDX string form and license-files: setuptools 77 and later
    assert toml["build-system"]["requires"] == ["setuptools>=77"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert _manifest_covers("LICENSE")


def test_the_compiled_loops_sources_exist_and_their_header_ships() -> None:
    """setup.py builds the extension from files that exist; the header they share (not a
    source, so not shipped by setuptools on its own) is in MANIFEST.in."""
    text = (ROOT / "setup.py").read_text()
    sources = re.findall(r'"(fedforest_secure/_ckernels[\w]*\.[ch])"', text)
    assert "fedforest_secure/_ckernels.c" in sources and "fedforest_secure/_ckernels.h" in sources
    for path in sources:
        assert (ROOT / path).exists(), path
    assert sorted(p.name for p in (ROOT / "fedforest_secure").glob("_ckernels*.[ch]")) == \
        sorted(Path(p).name for p in sources)
    assert _manifest_covers("fedforest_secure/_ckernels.h")
