"""threat_model.md cannot drift from the tests: every test it names exists as a collectable test.

Rows of "Claims and tests" must name tests that are expected to pass (no xfail or skip mark);
rows of "Open vulnerabilities" must name strict xfails whose reason starts with ``VULN``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "threat_model.md"
NODE_RE = re.compile(r"`(tests/[\w/]+\.py::[\w\[\].\-]+)`")
CLAIMS = "8. Claims and tests"
VULNS = "9. Open vulnerabilities"


def section(title: str) -> list[str]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(f"## {title}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    return lines[start + 1:end]


def table_rows(title: str) -> list[str]:
    """Body rows of the first table of a section (header and separator dropped)."""
    rows = [ln for ln in section(title) if ln.startswith("|")]
    assert len(rows) >= 2 and set(rows[1]) <= set("|-: "), f"no table in {title!r}"
    return rows[2:]


def node_ids(title: str) -> list[str]:
    return [n for row in table_rows(title) for n in NODE_RE.findall(row)]


def resolve_test(node_id: str) -> Any:
    """The test function a node id names (its module imported by basename, as pytest does)."""
    path, name = node_id.split("::", 1)
    assert (ROOT / path).is_file(), f"{path} does not exist"
    module = importlib.import_module(Path(path).stem)
    func_name = name.split("[", 1)[0]
    assert func_name.startswith("test_"), f"{node_id}: pytest collects only test_* functions"
    func = getattr(module, func_name, None)
    assert callable(func), f"{node_id}: no such test function"
    return func


def marks(func: Any) -> list[Any]:
    return list(getattr(func, "pytestmark", []))


def test_every_row_names_at_least_one_test() -> None:
    assert table_rows(CLAIMS), CLAIMS
    for title in (CLAIMS, VULNS):  # the open-vulnerabilities table may be empty
        rows = table_rows(title)
        for row in rows:
            assert NODE_RE.search(row), f"row without a test node id in {title!r}: {row[:80]}"
    ids = [row.split("|")[1].strip() for row in table_rows(CLAIMS) + table_rows(VULNS)]
    assert len(ids) == len(set(ids)), "duplicate row ids"


def test_the_table_covers_every_party() -> None:
    text = "\n".join(table_rows(CLAIMS))
    for party in ("curious server", "malicious server", "malicious client", "network attacker",
                  "model reader", "clients"):
        assert party in text, party


def test_claims_name_existing_tests_that_are_expected_to_pass() -> None:
    for nid in node_ids(CLAIMS):
        func = resolve_test(nid)
        bad = [m.name for m in marks(func) if m.name in ("xfail", "skip", "skipif")]
        assert not bad, f"{nid} is marked {bad}: a claim must name a passing test"


def test_vulnerabilities_name_strict_vuln_xfails() -> None:
    ids = node_ids(VULNS)
    for nid in ids:  # none open is fine; every open one must be a strict VULN xfail
        xfails = [m for m in marks(resolve_test(nid)) if m.name == "xfail"]
        assert xfails, f"{nid} is not an xfail"
        assert all(m.kwargs.get("strict") is True for m in xfails), nid
        assert all(str(m.kwargs.get("reason", "")).startswith("VULN") for m in xfails), nid
