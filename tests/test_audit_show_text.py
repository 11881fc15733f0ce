"""An audit log's text is shown as text: `fedforest audit show` and `verify` of a hostile log.

An audit log can come from another party (the copy of its job's log a server serves a site, a
downloaded export), which writes each entry's text: a job id, a site's name, a reason, an item,
a block's name, a time. Rich markup in it is shown as it is, and each character that is not
printable (a clipboard write, a carriage return, U+2028) as Python writes it (``\\x1b``,
``\\r``, ``\\u2028``), on a terminal and off it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedforest_cli.audit_cli import audit_app
from fedforest_secure.audit import Entry
from fedforest_secure.audit.entry import GENESIS, encode_array

#: rich markup, a clipboard write (OSC 52), a carriage return, a line separator
ATTACK = "[red]x[/red]\x1b]52;c;ZXZpbA==\x07\r\u2028y"
SHOWN = "[red]x[/red]\\x1b]52;c;ZXZpbA==\\x07\\r\\u2028y"
#: what rich writes itself on a terminal: colours and styles
RICH_OWN = re.compile(r"\x1b\[[0-9;]*m")
TIME = "2026-01-02T03:04:05.000000+00:00"


def _hostile_export(path: Path, *, job: str = ATTACK, timestamp: str = TIME) -> Path:
    """A job's log, without its arrays' bytes as a server serves it to a site, whose every
    text is :data:`ATTACK`: a chain that hashes and links correctly."""
    aggregate, _ = encode_array("aggregate", np.array([1.0]))
    data, _ = encode_array("data", np.array([2.0]))
    entries = [
        ("job_created", {"schema": {}, "hyperparameters": {}, "profile": ATTACK}, {}),
        ("client_joined", {"client": ATTACK}, {}),
        ("round", {"round_id": 0, "clients": [ATTACK], "uploads": {ATTACK: "0" * 64},
                   "masked": False, "task_kind": ATTACK,
                   "layout": [{"name": ATTACK, "shape": [1]}]}, {"aggregate": aggregate}),
        ("disclosure", {"client": ATTACK, "item": ATTACK, "round_id": 0}, {"data": data}),
        ("client_dropped", {"client": ATTACK, "reason": ATTACK, "round_id": 1}, {}),
        ("job_failed", {"reason": ATTACK}, {}),
    ]
    prev, lines = GENESIS, []
    for seq, (kind, payload, arrays) in enumerate(entries, start=1):
        entry = Entry.build(job_id=job, seq=seq, kind=kind, timestamp=timestamp,
                            payload=payload, arrays=arrays, prev_hash=prev)
        lines.append(json.dumps({"format": "fedforest-audit/1", **entry.to_json()},
                                ensure_ascii=False))
        prev = entry.hash
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _no_controls(text: str) -> None:
    for c in ("\x1b", "\x07", "\r", "\u2028"):
        assert c not in text, (c, text)


def _rows(out: str) -> list[list[str]]:
    """The cells of a table's rows: each column's text over the row's lines (rich folds a
    long cell onto more lines), without spaces."""
    body = out[out.index("┡"):].splitlines()[1:]
    rows: list[list[str]] = []
    for line in body:
        if not line.startswith("│"):
            break
        cells = [c.replace(" ", "") for c in line.split("│")[1:-1]]
        if cells[0]:  # a row's first line: its seq
            rows.append(cells)
        else:
            rows[-1] = [a + b for a, b in zip(rows[-1], cells, strict=True)]
    return rows


@pytest.mark.parametrize("terminal", [False, True], ids=["redirected", "terminal"])
def test_audit_show_of_a_hostile_log_shows_its_text_escaped_and_its_markup_as_it_is(
        tmp_path: Path, terminal: bool) -> None:
    export = _hostile_export(tmp_path / "log.jsonl")
    env = {"FORCE_COLOR": "1", "COLUMNS": "300"} if terminal else {}
    result = CliRunner().invoke(audit_app, ["show", "--db", str(export)], env=env)
    assert result.exit_code == 0, result.output
    out = result.output
    if terminal:  # rich's own colours: the console was a terminal's
        assert RICH_OWN.search(out), out
        out = RICH_OWN.sub("", out)
    _no_controls(out)
    assert f"auditlogofjob{ATTACK!r}(head" in out.replace(" ", "").replace("\n", "")
    rows = _rows(out)
    assert [row[:3] for row in rows] == [
        ["1", "2026-01-0203:04:05", "job_created"], ["2", "2026-01-0203:04:05", "client_joined"],
        ["3", "2026-01-0203:04:05", f"round/{SHOWN}"], ["4", "2026-01-0203:04:05", "disclosure"],
        ["5", "2026-01-0203:04:05", "client_dropped"], ["6", "2026-01-0203:04:05", "job_failed"]]
    # the sites (clients), the block's name (layout), the disclosed item and a reason (notes)
    assert [row[4] for row in rows] == ["", SHOWN, SHOWN, SHOWN, SHOWN, ""]
    assert rows[2][5] == f"{SHOWN}(1,)"
    assert rows[3][7] == f"PER-CLIENTPLAINTEXT:{SHOWN}"
    assert rows[5][7] == 'reason="[red]x[/red]\\u001b]52;c;ZXZpbA==\\u0007\\r\\u2028y"'


def test_audit_show_shows_a_hostile_time_as_text(tmp_path: Path) -> None:
    export = _hostile_export(tmp_path / "log.jsonl", job="j",
                             timestamp="[b]\x1b[2J\r\u2028[/b]2026-01-02T03:04:05")
    result = CliRunner().invoke(audit_app, ["show", "--db", str(export)])
    assert result.exit_code == 0, result.output
    _no_controls(result.output)
    assert "[b]\\x1b[2J\\r\\u2028[/b]2026" in result.output


def test_audit_verify_of_a_hostile_log_prints_one_escaped_line_per_problem(
        tmp_path: Path) -> None:
    """A replay asked of a site's copy of the log names the job's export command with the
    job's id as the log writes it."""
    export = _hostile_export(tmp_path / "log.jsonl")
    result = CliRunner().invoke(audit_app, ["verify", "--db", str(export), "--replay"])
    assert result.exit_code == 1, result.output
    _no_controls(result.output)
    assert all(line.startswith(("PROBLEM ", "NOTE ", "FAILED: "))
               for line in result.output.splitlines()), result.output
    assert f"--format jsonl --job {SHOWN} --out {SHOWN}.jsonl`" in result.output


def test_an_error_quoting_a_hostile_logs_entry_is_one_line(tmp_path: Path) -> None:
    """An entry whose kind holds a line break and a made-up line is named in the error of
    ``audit show``: the error stays one line, its characters that are not printable escaped."""
    forged = "error: nothing wrong, job j verified"
    entry = Entry.build(job_id="j", seq=1, kind=f"x\n{forged}\x1b[2J", timestamp=TIME,
                        payload={}, arrays={}, prev_hash=GENESIS)
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"format": "fedforest-audit/1", **entry.to_json()}) + "\n",
                    encoding="utf-8")
    res = CliRunner().invoke(audit_app, ["show", "--db", str(path)])
    assert res.exit_code == 1, res.output
    _no_controls(res.output)
    assert "\\n" + forged in res.output, res.output
    assert not any(line.startswith(forged) for line in res.output.split("\n")), res.output
