"""verify_log on what a forger or a crash leaves that the log's API never writes: values SQLite
keeps behind the log's back (text in an integer or blob column, text that is not UTF-8, JSON
nested too deeply to parse), and receipts files with a hostile or torn line. Each is a problem
line (or, for a crash's torn last receipt line, a note), never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_audit_verify import JOB, build_job, label, sql

from fedforest_secure.audit import AuditLog, Receipt, read_receipts, verify_log, write_receipt
from fedforest_secure.errors import AuditError

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[AuditLog, Path]]:
    log = AuditLog(tmp_path / "audit.db")
    receipts = tmp_path / "receipts"
    build_job(log, receipts)
    yield log, receipts
    log.close()


NOT_UTF8 = "CAST(X'FFFE' AS TEXT)"


@pytest.mark.parametrize(("value", "error"), [
    ("'hello'", "the database holds str, not bytes"),
    (NOT_UTF8,
     "OperationalError: Could not decode to UTF-8 column 'data' with text '\ufffd\ufffd'"),
])
@pytest.mark.parametrize("replay", [False, True])
def test_an_array_rewritten_as_text_is_named_and_the_arrays_after_it_are_checked(
        setup: tuple[AuditLog, Path], value: str, error: str, replay: bool) -> None:
    """The first stored array becomes text; of the arrays after it, one is deleted and one
    changed: each is named as what it is (none of the intact ones as missing)."""
    log, receipts = setup
    sql(log, f"UPDATE audit_arrays SET data = {value} WHERE seq = 4 AND name = 'aggregate'")
    sql(log, "DELETE FROM audit_arrays WHERE seq = 5")
    sql(log, "UPDATE audit_arrays SET data = :d WHERE seq = 6 AND name = 'aggregate'", d=b"x")
    report = verify_log(log, receipts_dir=receipts, replay=replay)
    arrays = [p for p in report.problems if "replay" not in p]
    assert arrays == [
        f"{label(4)}: stored array 'aggregate' cannot be read ({error}): the array was rewritten",
        f"{label(6)}: stored array 'aggregate' does not match its digest (array changed)",
        f"{label(5)}: stored array 'data' is missing"]


def test_an_array_rewritten_as_text_is_read_as_bytes_that_fail_their_digest(
        setup: tuple[AuditLog, Path]) -> None:
    log, _ = setup
    sql(log, "UPDATE audit_arrays SET data = 'hello' WHERE seq = 4 AND name = 'aggregate'")
    entry = log.entries(job_id=JOB)[3]
    assert log.stored_arrays(JOB, 4)["aggregate"] == b"hello"
    with pytest.raises(AuditError, match="stored bytes do not match their sha256"):
        log.array(entry, "aggregate")


@pytest.mark.parametrize(("value", "shown"), [("'three'", "'three'"), ("1.5", "1.5")])
def test_a_round_id_column_that_is_not_the_payloads_integer_is_named(
        setup: tuple[AuditLog, Path], value: str, shown: str) -> None:
    """Round 1's entry with its query column set to text, or to 1.5: a query for round 1 no
    longer finds it, and verify says so (int() would have read 1.5 as 1)."""
    log, receipts = setup
    sql(log, f"UPDATE audit_entries SET round_id = {value} WHERE seq = 6")
    assert [e.seq for e in log.entries(job_id=JOB, round_id=1)] == [8]  # the split only
    report = verify_log(log, receipts_dir=receipts)
    assert report.problems == [
        f"{label(6)}: round_id column ({shown}) disagrees with the payload (1)"]


def test_a_seq_column_that_is_no_integer_is_a_problem_naming_the_row(
        setup: tuple[AuditLog, Path]) -> None:
    log, receipts = setup
    sql(log, "UPDATE audit_entries SET seq = 'x9' WHERE seq = 9")
    for given in (log, log.engine):
        report = verify_log(given, receipts_dir=receipts, replay=True)
        assert report.problems == [
            f"row 9 of the audit log (job '{JOB}') has seq 'x9', not an integer: the audit "
            "database was changed behind the log's back"]
    with pytest.raises(AuditError, match="the last entry of job 'job-1' has seq 'x9'"):
        log.tip(JOB)  # text sorts after numbers: the server's next append stops here


@pytest.mark.parametrize("column", ["payload", "job_id"])
def test_text_the_database_cannot_return_is_a_problem_not_a_traceback(
        setup: tuple[AuditLog, Path], column: str) -> None:
    log, receipts = setup
    sql(log, f"UPDATE audit_entries SET {column} = CAST(X'7B22FF227D' AS TEXT) WHERE seq = 7")
    (problem,) = verify_log(log, receipts_dir=receipts, replay=True).problems
    assert problem.startswith("the audit log's entries cannot be read (OperationalError: "
                              f"Could not decode to UTF-8 column '{column}'")
    assert problem.endswith("): a value was changed behind the log's back, or the database "
                            "failed")


def test_a_payload_nested_too_deeply_to_parse_is_a_problem_not_a_traceback(
        setup: tuple[AuditLog, Path]) -> None:
    log, receipts = setup
    sql(log, "UPDATE audit_entries SET payload = :p WHERE seq = 7", p='{"a":' + DEEP + "}")
    report = verify_log(log, receipts_dir=receipts, replay=True)
    assert f"{label(7)}: unreadable payload or arrays (JSON nested too deeply to read)" \
        in report.problems, report.problems


def test_a_receipt_line_nested_too_deeply_to_parse_is_malformed(
        setup: tuple[AuditLog, Path]) -> None:
    log, receipts = setup
    (receipts / "evil.jsonl").write_text(DEEP + "\n")
    assert verify_log(log, receipts_dir=receipts).problems == [
        "receipt evil.jsonl:1: malformed (JSON nested too deeply to read)"]


def _tear_last_line(path: Path) -> str:
    """Cut the file's last line short, as a client killed while writing it leaves it."""
    raw = path.read_bytes()
    path.write_bytes(raw[:-30])
    lines = raw.count(b"\n")
    return f"{path.name}:{lines}"


def test_a_torn_last_receipt_line_is_a_note_and_ignored(setup: tuple[AuditLog, Path]) -> None:
    log, receipts = setup
    where = _tear_last_line(receipts / "alice.jsonl")
    assert where == "alice.jsonl:2"
    report = verify_log(log, receipts_dir=receipts)
    assert report.ok, report.problems
    assert report.receipts_checked == 5
    (note,) = report.notes
    assert note.startswith(f"receipt {where}: the file's last line is cut short (")
    assert note.endswith("), as a client that stopped while writing it leaves it: it is "
                         "ignored (the client's next receipt takes its place)")


def test_the_clients_next_receipt_takes_the_place_of_a_torn_last_line(
        setup: tuple[AuditLog, Path]) -> None:
    """The client restarted after the crash and wrote its receipt again: the torn line is
    gone, and the file verifies without a note."""
    log, receipts = setup
    path = receipts / "alice.jsonl"
    receipt = next(r for w, r in read_receipts(receipts) if w == "alice.jsonl:2")
    assert isinstance(receipt, Receipt)
    whole = path.read_bytes()
    _tear_last_line(path)
    write_receipt(receipts, receipt)
    assert path.read_bytes() == whole
    report = verify_log(log, receipts_dir=receipts)
    assert report.ok and not report.notes, (report.problems, report.notes)


def test_a_last_line_cut_just_before_its_newline_is_kept(setup: tuple[AuditLog, Path]) -> None:
    """A receipt whole but for its newline is a receipt: the next one starts a line after it."""
    log, receipts = setup
    path = receipts / "alice.jsonl"
    receipt = next(r for w, r in read_receipts(receipts) if w == "alice.jsonl:2")
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])
    write_receipt(receipts, receipt)
    assert path.read_bytes() == whole + whole.splitlines(keepends=True)[-1]


def test_a_damaged_receipt_line_that_others_follow_is_a_problem(
        setup: tuple[AuditLog, Path]) -> None:
    """A line cut short in the middle of the file (edited by hand, or written by a client
    that kept a torn line) is no torn last line: a problem until it is deleted."""
    log, receipts = setup
    path = receipts / "alice.jsonl"
    last = path.read_bytes().splitlines(keepends=True)[-1]
    _tear_last_line(path)
    with path.open("ab") as fh:
        fh.write(b"\n" + last)
    problems = verify_log(log, receipts_dir=receipts).problems
    assert len(problems) == 1 and problems[0].startswith(
        "receipt alice.jsonl:2: malformed ("), problems


def test_a_last_line_that_is_json_but_no_receipt_is_not_torn(
        setup: tuple[AuditLog, Path]) -> None:
    log, receipts = setup
    with (receipts / "alice.jsonl").open("a") as fh:
        fh.write('{"job_id": "job-1"}')  # whole JSON, no newline: not cut short
    problems = verify_log(log, receipts_dir=receipts).problems
    assert problems == ["receipt alice.jsonl:3: malformed (a receipt has exactly the fields "
                        "job_id, round_id, client, upload_digest, chain_head_seen, seq_seen)"]


def test_torn_model_receipts_leave_the_model_uncovered(setup: tuple[AuditLog, Path]) -> None:
    """Ignoring a torn line hides nothing: the receipts it would have held are missing, and
    what only they cover is not covered."""
    log, receipts = setup
    for client in ("alice", "bob"):
        _tear_last_line(receipts / f"{client}-model.jsonl")
    report = verify_log(log, receipts_dir=receipts)
    assert len(report.notes) == 2
    assert f"job '{JOB}': the model entry ({label(9)}) is covered by no receipt (none of " \
        "these receipts pins the chain up to it)" in report.problems, report.problems
