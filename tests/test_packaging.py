"""The source distribution carries the licence and every file the README links to (docs,
threat model), as MANIFEST.in names them; the licence the metadata declares is shipped."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def test_the_declared_licence_is_shipped() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == {"text": "Apache-2.0"}
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
