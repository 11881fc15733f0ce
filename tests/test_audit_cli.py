"""`fedforest audit show|verify|export` through typer's CliRunner."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from fedforest_cli.audit_cli import audit_app
from fedforest_secure.audit import (
    AuditLog,
    ModelReceipt,
    Receipt,
    import_jsonl,
    read_csv,
    upload_digest,
    verify_entries,
    verify_log,
    write_receipt,
)
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind

runner = CliRunner()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A finished job at ``tmp_path/audit.db`` with receipts in ``tmp_path/receipts``."""
    path = tmp_path / "audit.db"
    with AuditLog(path) as log:
        rec = log.job("j1")
        rec.job_created(schema={}, hyperparameters={}, profile="secure")
        rec.client_joined("alice")
        head, seq = log.head("j1"), 2
        digest = upload_digest(b"alice-0")
        write_receipt(tmp_path / "receipts", Receipt("j1", 0, "alice", digest, head, seq))
        task = Task(job_id="j1", round_id=0, kind=TaskKind.SKETCH, level=0,
                    layout=(Block("totals", (1, 1), (StatKind.COUNT,)),))
        rec.round(task, uploads={"alice": digest}, aggregate=np.array([12.0]), masked=True)
        rec.disclosure(client="alice", item="sketch", data=np.arange(3.0), round_id=0)
    return path


def test_show(db: Path) -> None:
    result = runner.invoke(audit_app, ["show", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "j1" in result.output and "round/sketch" in result.output
    assert "PER-CLIENT PLAINTEXT" in result.output


def test_show_one_round_by_url(db: Path) -> None:
    result = runner.invoke(audit_app, ["show", "--db", f"sqlite:///{db}", "--job", "j1",
                                       "--round", "0"])
    assert result.exit_code == 0, result.output
    assert "client_joined" not in result.output and "round/sketch" in result.output


def test_show_unknown_job_round_or_db(db: Path, tmp_path: Path) -> None:
    assert runner.invoke(audit_app, ["show", "--db", str(db), "--job", "zz"]).exit_code == 1
    result = runner.invoke(audit_app, ["show", "--db", str(db), "--job", "j1", "--round", "999"])
    assert result.exit_code == 1 and "round 999 is not in the log of job 'j1'" in result.output
    result = runner.invoke(audit_app, ["show", "--db", str(tmp_path / "none.db")])
    assert result.exit_code == 1 and "no audit log" in result.output


def test_verify_ok(db: Path) -> None:
    with AuditLog(db) as log:  # the job ends: its model, and the client's receipt of it
        log.job("j1").model(digest="cd" * 32)
        seq, head = log.tip("j1")
    write_receipt(db.parent / "receipts", ModelReceipt("j1", "alice", "cd" * 32, head, seq))
    result = runner.invoke(audit_app, ["verify", "--db", str(db), "--receipts",
                                       str(db.parent / "receipts")])
    assert result.exit_code == 0, result.output
    assert "OK: 5 entries in 1 job(s), 2 receipt(s) checked" in result.output


def test_verify_reports_each_problem(db: Path) -> None:
    with AuditLog(db) as log, log.engine.begin() as conn:
        conn.execute(text("UPDATE audit_entries SET payload = :p WHERE seq = 2"),
                     {"p": '{"client":"mallory"}'})
        conn.execute(text("DELETE FROM audit_entries WHERE seq = 3"))
    result = runner.invoke(audit_app, ["verify", "--db", str(db)])
    assert result.exit_code == 1
    assert "PROBLEM job 'j1' seq 2 (client_joined): hash mismatch" in result.output
    assert "PROBLEM job 'j1': seq 3 missing (deleted?) before job 'j1' seq 4" in result.output
    assert "PROBLEM job 'j1' seq 4 (disclosure): prev_hash does not link" in result.output
    assert "FAILED" in result.output


def test_verify_reports_bad_receipt(db: Path) -> None:
    receipts = db.parent / "receipts"
    write_receipt(receipts, Receipt("j1", 0, "bob", upload_digest(b"x"), "0" * 64, 0))
    result = runner.invoke(audit_app, ["verify", "--db", str(db), "--receipts", str(receipts)])
    assert result.exit_code == 1
    assert "PROBLEM receipt bob.jsonl:1 (client 'bob', job 'j1', round 0)" in result.output


def test_verify_missing_db(tmp_path: Path) -> None:
    result = runner.invoke(audit_app, ["verify", "--db", str(tmp_path / "none.db")])
    assert result.exit_code == 1 and "no audit log" in result.output


def test_export_jsonl_round_trips(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "log.jsonl"
    result = runner.invoke(audit_app, ["export", "--db", str(db), "--format", "jsonl",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    with AuditLog.in_memory() as copy, out.open() as fp:
        assert import_jsonl(copy, fp) == 4
        assert copy.head("j1") == AuditLog(db).head("j1")
        assert verify_log(copy).ok


def test_export_csv_to_stdout(db: Path) -> None:
    result = runner.invoke(audit_app, ["export", "--db", f"sqlite:///{db}", "--format", "csv",
                                       "--job", "j1"])
    assert result.exit_code == 0
    body = result.stdout
    assert body.startswith("job_id,seq,kind,round_id,timestamp,payload,arrays,prev_hash,hash")
    entries = read_csv(io.StringIO(body[: body.index("exported")] if "exported" in body
                                   else body))
    assert len(entries) == 4 and verify_entries(entries).ok


def test_export_rejects_unknown_format(db: Path) -> None:
    result = runner.invoke(audit_app, ["export", "--db", str(db), "--format", "xml"])
    assert result.exit_code == 2


def test_export_jsonl_stdout_is_json(db: Path) -> None:
    result = runner.invoke(audit_app, ["export", "--db", str(db), "--format", "jsonl"])
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
    assert [json.loads(ln)["seq"] for ln in lines] == [1, 2, 3, 4]


def test_the_client_command_and_runner_load_without_sqlalchemy() -> None:
    """A site's client writes receipts through fedforest_secure.audit but never opens an SQL
    store: importing the command line and the client runtime leaves SQLAlchemy (and the
    server's web stack) unloaded; the audit names that need it load on first use."""
    import subprocess
    import sys

    code = ("import sys, fedforest_cli.cli, client_app.runner\n"
            "heavy = {'sqlalchemy', 'fastapi', 'uvicorn', 'starlette'}\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))\n"
            "from fedforest_secure.audit import AuditLog\n"
            "print('sqlalchemy' in sys.modules, AuditLog.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["[]", "True fedforest_secure.audit.log"]


def test_every_public_audit_name_resolves_and_unknown_names_raise() -> None:
    import fedforest_secure.audit as audit

    for name in audit.__all__:
        assert getattr(audit, name) is not None
        assert name in dir(audit)
    with pytest.raises(AttributeError, match="no_such_name"):
        audit.no_such_name  # noqa: B018


def test_export_of_a_job_not_in_the_log_is_an_error_not_an_empty_file(db: Path,
                                                                        tmp_path: Path) -> None:
    out = tmp_path / "typo.csv"
    result = runner.invoke(audit_app, ["export", "--db", str(db), "--format", "csv",
                                       "--job", "j-typo", "--out", str(out)])
    assert result.exit_code == 1 and "job 'j-typo' is not in the log" in result.output
    assert not out.exists()


def test_show_puts_a_dp_spends_running_total_before_its_own_share(tmp_path: Path) -> None:
    """A dp_spend row shows the job's composed ε so far first (the releases' own ε add up to
    more than the budget, zCDP composes them to less), rounded for reading."""
    path = tmp_path / "audit.db"
    with AuditLog(path) as log:
        rec = log.job("j1")
        rec.job_created(schema={}, hyperparameters={}, profile="secure-dp")
        rec.dp_spend(epsilon=0.3681824243645183, delta=1e-6, round_id=1,
                     mechanism="gaussian_discrete (distributed)", total_epsilon=0.3681824243645183,
                     total_delta=1e-6, rho=0.004, xi=0.0, sigma_client={"count": [209.3]})
        rec.dp_spend(epsilon=0.9147765690306243, delta=1e-6, round_id=2,
                     mechanism="gaussian_discrete (distributed)", total_epsilon=0.99999999999924,
                     total_delta=1e-6, rho=0.02, xi=0.0, sigma_client={"count": [46.2]})
    result = CliRunner().invoke(audit_app, ["show", "--db", str(path)], terminal_width=250)
    assert result.exit_code == 0, result.output
    assert "total_epsilon=0.3682 total_delta=1e-06 epsilon=0.3682" in result.output
    assert "total_epsilon=1 total_delta=1e-06 epsilon=0.9148" in result.output


def _export(db: Path, out: Path) -> None:
    result = runner.invoke(audit_app, ["export", "--db", str(db), "--format", "jsonl",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("line", "problem"), [
    (lambda first: first.replace('"seq": 1,', '"seq": 1e400,'),
     "export line 1: malformed (cannot convert float infinity to integer)"),
    (lambda first: '{"format": "fedforest-audit/1", "payload": ' + "[" * 100_000
     + "]" * 100_000 + "}", "export line 1: malformed (JSON nested too deeply to read)"),
])
def test_a_hostile_export_line_fails_verify_with_its_line(db: Path, tmp_path: Path, line,
                                                          problem: str) -> None:
    """What a malicious server serves a site to verify: a verdict naming the line."""
    _export(db, tmp_path / "log.jsonl")
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    hostile = tmp_path / "hostile.jsonl"
    hostile.write_text("\n".join([line(lines[0]), *lines[1:]]) + "\n")
    result = runner.invoke(audit_app, ["verify", "--db", str(hostile)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), \
        result.exception
    assert result.output.splitlines() == [
        f"PROBLEM {problem}", "FAILED: 1 problem(s); 0 entries in 0 job(s), 0 receipt(s) checked"]


def test_a_compressed_export_with_damaged_data_fails_verify(tmp_path: Path) -> None:
    import gzip

    raw = bytearray(gzip.compress(b'{"format": "fedforest-audit/1"}\n' * 200, mtime=0))
    for i in range(20, 40):  # inside the deflate stream, past the 10-byte header
        raw[i] ^= 0xFF
    damaged = tmp_path / "damaged.jsonl.gz"
    damaged.write_bytes(bytes(raw))
    result = runner.invoke(audit_app, ["verify", "--db", str(damaged)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), \
        result.exception
    problem, verdict = result.output.splitlines()
    # what zlib says of the data after this prefix depends on its version
    assert problem.startswith(f"PROBLEM cannot read the export {damaged}: Error -3 while "
                              "decompressing data: "), problem
    assert verdict == "FAILED: 1 problem(s); 0 entries in 0 job(s), 0 receipt(s) checked"


@pytest.mark.parametrize("command", [["show"], ["export", "--format", "csv"],
                                     ["export", "--format", "jsonl"]])
def test_show_and_export_of_a_log_with_unreadable_rows_are_errors(db: Path,
                                                                   command: list[str]) -> None:
    with AuditLog(db) as log, log.engine.begin() as conn:
        conn.execute(text("UPDATE audit_entries SET payload = CAST(X'7B22FF227D' AS TEXT) "
                          "WHERE seq = 2"))
    result = runner.invoke(audit_app, [*command, "--db", str(db)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert "error: the audit log's rows cannot be read (OperationalError: Could not decode " \
        "to UTF-8 column 'payload'" in result.output


@pytest.mark.parametrize("command", ["show", "verify", "export"])
def test_the_db_help_says_where_a_postgresql_password_goes_instead_of_the_command_line(
        command: str) -> None:
    res = runner.invoke(audit_app, [command, "--help"], env={"COLUMNS": "1000"})
    assert res.exit_code == 0
    said = " ".join(res.output.replace("│", " ").split())
    assert ("Other users of this machine can read a command line: give a PostgreSQL password "
            "in ~/.pgpass or PGPASSWORD, not in the URL.") in said, said


# a # and non-ASCII: a guard (SQLAlchemy keeps a # of the path), not a case that was broken
@pytest.mark.parametrize("dirname", ["e%41", "q?", "h#1 é"])
def test_verify_reads_a_log_whose_path_holds_url_characters(db: Path, tmp_path: Path,
                                                            dirname: str) -> None:
    """``--db e%41/audit.db`` opened ``eA/audit.db`` and ``--db q?/audit.db`` opened ``q``:
    a log that exists was reported missing. The path is the file's, whatever it holds."""
    with AuditLog(db) as log:
        log.job("j1").model(digest="cd" * 32)
    moved = tmp_path / dirname / "audit.db"
    moved.parent.mkdir()
    db.rename(moved)
    result = runner.invoke(audit_app, ["verify", "--db", str(moved)])
    assert result.exit_code == 0, result.output
    assert "OK: 5 entries in 1 job(s), 0 receipt(s) checked" in result.output
