"""Commands that a help text or a script tells the user to run work as written, and the
evaluation walkthrough never removes a directory it did not write."""

from __future__ import annotations

import gzip
import re
import shlex
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_cli.sim_processes import child_env
from fedforest_secure.audit import AuditLog

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_the_export_prune_suggests_runs_as_written(tmp_path: Path) -> None:
    """`fedforest server prune --help` names the command that keeps the audit log: with the
    placeholders filled in, it writes the job's compressed export."""
    from fedforest_cli import server_cli

    doc = " ".join((server_cli.prune_cmd.__doc__ or "").split())
    found = re.search(r"`(fedforest audit export [^`]*)`", doc)
    assert found is not None, doc
    with AuditLog(tmp_path / "audit.db") as log:
        log.job("job-a").client_joined("site-0")
    out = tmp_path / "job-a.jsonl.gz"
    args = shlex.split(found.group(1).replace("AUDIT_DB", str(tmp_path / "audit.db"))
                       .replace("JOB.jsonl.gz", str(out)).replace("JOB", "job-a"))[1:]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert '"client_joined"' in gzip.decompress(out.read_bytes()).decode()


def _walkthrough(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "evaluation_walkthrough.py"),
                           *args], capture_output=True, text=True, env=child_env(),
                          timeout=120, check=False)


def test_the_walkthrough_keeps_a_directory_it_did_not_write(tmp_path: Path) -> None:
    kept = tmp_path / "notes"
    kept.mkdir()
    (kept / "notes.txt").write_text("precious")
    done = _walkthrough("--out", str(kept))
    assert done.returncode != 0
    assert "holds files and is not the output of an earlier run" in done.stderr
    assert (kept / "notes.txt").read_text() == "precious"


def test_the_walkthrough_says_an_unknown_dataset_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "walk"
    done = _walkthrough("--out", str(out), "--dataset", "nosuch")
    assert done.returncode != 0
    assert "error: --dataset: unknown dataset 'nosuch'" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()
