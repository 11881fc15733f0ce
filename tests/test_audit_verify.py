"""verify_log: an honest log verifies; every tampering done behind the API's back is named."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from fedforest_secure.audit import (
    GENESIS,
    AuditLog,
    FailedReceipt,
    JobRecorder,
    ModelReceipt,
    Receipt,
    RefusedReceipt,
    SentReceipt,
    upload_digest,
    verify_log,
    write_receipt,
)
from fedforest_secure.audit.entry import Entry
from fedforest_secure.audit.receipts import parse_receipt
from fedforest_secure.errors import AuditError
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind

JOB = "job-1"
CLIENTS = ("alice", "bob")
# seq: 1 job_created, 2-3 joins, 4 round 0, 5 disclosure, 6 round 1, 7 dp_spend, 8 split, 9 model
KINDS = ["job_created", "client_joined", "client_joined", "round", "disclosure", "round",
         "dp_spend", "split", "model"]


def _task(round_id: int) -> Task:
    layout = (Block("totals", (2, 3), (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)),)
    return Task(job_id=JOB, round_id=round_id, kind=TaskKind.HISTOGRAM, level=round_id,
                params={"nodes": [0, 1]}, arrays={"thresholds": np.linspace(0, 1, 4)},
                layout=layout)


def build_job(log: AuditLog, receipts: Path, *, sent: bool = False) -> None:
    """A small job; each client keeps a receipt per upload and one of the model, as a real
    client would (with ``sent``, each upload's receipt follows its sent record)."""
    rec = log.job(JOB)
    rec.job_created(schema={"features": ["x"]}, hyperparameters={"n_estimators": 1},
                    profile={"name": "secure"})
    for c in CLIENTS:
        rec.client_joined(c)
    for round_id in (0, 1):
        seq, head = log.tip(JOB)  # the server announces this with the task
        uploads = {c: upload_digest(f"{c}/{round_id}".encode()) for c in CLIENTS}
        for c in CLIENTS:
            if sent:
                write_receipt(receipts, SentReceipt(JOB, round_id, c, "ee" * 32, uploads[c],
                                                    head, seq))
            write_receipt(receipts, Receipt(JOB, round_id, c, uploads[c], head, seq))
        rec.round(_task(round_id), uploads=uploads, aggregate=np.arange(6.0) + round_id,
                  masked=True)
        if round_id == 0:
            rec.disclosure(client="alice", item="sketch", data=np.arange(3.0), round_id=0)
    rec.dp_spend(epsilon=0.5, delta=1e-6, mechanism="gaussian", total_epsilon=0.5,
                 total_delta=1e-6)
    rec.split([{"tree": 0, "node": 0, "feature": "x", "threshold": 0.5}], round_id=1)
    rec.model(digest="cd" * 32)
    seq, head = log.tip(JOB)  # the server announces this with the model
    for c in CLIENTS:
        write_receipt(receipts, ModelReceipt(JOB, c, "cd" * 32, head, seq),
                      filename=f"{c}-model.jsonl")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[AuditLog, Path]]:
    log = AuditLog(tmp_path / "audit.db")
    receipts = tmp_path / "receipts"
    build_job(log, receipts)
    yield log, receipts
    log.close()


def sql(log: AuditLog, statement: str, **params: object) -> None:
    with log.engine.begin() as conn:
        conn.execute(text(statement), params)


def label(seq: int) -> str:
    return f"job '{JOB}' seq {seq} ({KINDS[seq - 1]})"


def test_honest_log_verifies(setup: tuple[AuditLog, Path]) -> None:
    log, receipts = setup
    report = verify_log(log, receipts_dir=receipts)
    assert report.ok, report.problems
    assert report.entries_checked == 9 and report.receipts_checked == 6
    assert report.running == [] and report.notes == []  # the job ended: its model
    assert [e.kind for e in log.entries()] == KINDS
    report.raise_for_problems()


def test_verify_by_url_and_by_path(setup: tuple[AuditLog, Path], tmp_path: Path) -> None:
    assert verify_log(tmp_path / "audit.db").ok
    assert verify_log(f"sqlite:///{tmp_path / 'audit.db'}", job_id=JOB).ok
    assert verify_log(setup[0].engine).ok


@pytest.mark.parametrize("seq", range(1, 10))
def test_changed_payload_is_named(setup: tuple[AuditLog, Path], seq: int) -> None:
    log, _ = setup
    sql(log, "UPDATE audit_entries SET payload = :pre || substr(payload, 2) WHERE seq = :s",
        pre='{"aa":0,', s=seq)
    report = verify_log(log)
    assert not report.ok
    assert any(p.startswith(label(seq)) and "hash mismatch" in p for p in report.problems)


@pytest.mark.parametrize(("column", "value"), [
    ("kind", "client_dropped"), ("timestamp", "2000-01-01T00:00:00.000000+00:00"),
    ("job_id", "job-2"), ("hash", "e" * 64), ("arrays", "{}")])
def test_changed_columns_are_detected(setup: tuple[AuditLog, Path], column: str,
                                      value: str) -> None:
    log, _ = setup
    sql(log, f"UPDATE audit_entries SET {column} = :v WHERE seq = 4", v=value)
    report = verify_log(log)
    assert not report.ok
    assert any("seq 4" in p for p in report.problems)


def test_non_canonical_payload_text_is_detected(setup: tuple[AuditLog, Path]) -> None:
    log, _ = setup
    sql(log, "UPDATE audit_entries SET payload = replace(payload, ',', ', ') WHERE seq = 1")
    problems = verify_log(log).problems
    assert any(p.startswith(label(1)) and "canonical" in p for p in problems)


def test_round_id_column_is_checked(setup: tuple[AuditLog, Path]) -> None:
    log, _ = setup
    sql(log, "UPDATE audit_entries SET round_id = 7 WHERE seq = 6")
    assert any(p.startswith(label(6)) and "round_id column" in p
               for p in verify_log(log).problems)


@pytest.mark.parametrize(("seq", "name"), [(4, "aggregate"), (4, "task/thresholds"),
                                           (5, "data")])
def test_changed_stored_array_is_named(setup: tuple[AuditLog, Path], seq: int,
                                       name: str) -> None:
    log, _ = setup
    entry = log.entries(job_id=JOB)[seq - 1]
    before = log.array(entry, name)
    with log.engine.begin() as conn:
        blob = conn.execute(text("SELECT data FROM audit_arrays WHERE seq = :s AND name = :n"),
                            {"s": seq, "n": name}).scalar_one()
        forged = blob[:-8] + np.float64(before.ravel()[-1] + 1).tobytes()
        conn.execute(text("UPDATE audit_arrays SET data = :d WHERE seq = :s AND name = :n"),
                     {"d": forged, "s": seq, "n": name})
    report = verify_log(log)
    assert [p for p in report.problems if p.startswith(label(seq))] == [
        f"{label(seq)}: stored array {name!r} does not match its digest (array changed)"]
    with pytest.raises(AuditError, match="sha256"):
        log.array(entry, name)


def test_missing_and_extra_arrays_are_named(setup: tuple[AuditLog, Path]) -> None:
    log, _ = setup
    sql(log, "DELETE FROM audit_arrays WHERE seq = 5")
    sql(log, "INSERT INTO audit_arrays (job_id, seq, name, data) VALUES (:j, 6, 'extra', :d)",
        j=JOB, d=b"x")
    problems = verify_log(log).problems
    assert f"{label(5)}: stored array 'data' is missing" in problems
    assert f"{label(6)}: stored array 'extra' is not listed in the entry" in problems


@pytest.mark.parametrize("seq", range(1, 9))
def test_deleted_entry_is_named(setup: tuple[AuditLog, Path], seq: int) -> None:
    log, _ = setup
    sql(log, "DELETE FROM audit_entries WHERE seq = :s", s=seq)
    problems = verify_log(log).problems
    assert any(p.startswith(f"job '{JOB}': seq {seq} missing") and label(seq + 1) in p
               for p in problems), problems
    assert any(p.startswith(label(seq + 1)) and "prev_hash" in p for p in problems)


def test_truncated_tail_is_caught_by_receipts(setup: tuple[AuditLog, Path]) -> None:
    log, receipts = setup
    sql(log, "DELETE FROM audit_entries WHERE seq >= 6")
    sql(log, "DELETE FROM audit_arrays WHERE seq >= 6")
    assert verify_log(log).ok  # a clean prefix of a chain is a valid chain...
    problems = verify_log(log, receipts_dir=receipts).problems
    # ...but both round-1 receipts find no round entry, both model receipts no model
    assert sum("round 1): the log has no round entry" in p for p in problems) == 2
    assert sum("model): the log has no entry seq 9" in p for p in problems) == 2
    assert sum("model): the log has no model entry" in p for p in problems) == 2
    assert len(problems) == 6


def test_swapped_entries_are_named(setup: tuple[AuditLog, Path]) -> None:
    log, _ = setup
    sql(log, "UPDATE audit_entries SET seq = -1 WHERE seq = 4")
    sql(log, "UPDATE audit_entries SET seq = 4 WHERE seq = 5")
    sql(log, "UPDATE audit_entries SET seq = 5 WHERE seq = -1")
    problems = verify_log(log).problems
    assert any(p.startswith(f"job '{JOB}' seq 4 (disclosure): hash mismatch") for p in problems)
    assert any(p.startswith(f"job '{JOB}' seq 5 (round): hash mismatch") for p in problems)
    assert any("seq 5 (round): stored before seq 4" in p for p in problems)


def test_rows_reinserted_out_of_order_are_named(setup: tuple[AuditLog, Path]) -> None:
    log, _ = setup
    cols = "job_id, seq, kind, round_id, timestamp, payload, arrays, prev_hash, hash"
    with log.engine.begin() as conn:
        conn.execute(text(f"CREATE TEMP TABLE t AS SELECT {cols} FROM audit_entries "
                          "WHERE seq = 3"))
        conn.execute(text("DELETE FROM audit_entries WHERE seq = 3"))
        conn.execute(text(f"INSERT INTO audit_entries ({cols}) SELECT {cols} FROM t"))
    assert verify_log(log).problems == [f"{label(4)}: stored before seq 3 (entries reordered)"]


def test_broken_prev_hash_link_is_named(setup: tuple[AuditLog, Path]) -> None:
    log, _ = setup
    sql(log, "UPDATE audit_entries SET prev_hash = :p WHERE seq = 7", p="1" * 64)
    sql(log, "UPDATE audit_entries SET prev_hash = 'zz' WHERE seq = 2")
    problems = verify_log(log).problems
    assert f"{label(7)}: prev_hash does not link to the hash of seq 6" in problems
    assert f"{label(2)}: prev_hash is not a sha256 hex digest" in problems


def test_genesis_link_is_checked(setup: tuple[AuditLog, Path]) -> None:
    log, _ = setup
    sql(log, "UPDATE audit_entries SET prev_hash = :p WHERE seq = 1", p="1" * 64)
    assert f"{label(1)}: prev_hash does not link to the genesis value" in \
        verify_log(log).problems


def rewrite_from(log: AuditLog, seq: int, change: dict[str, object]) -> None:
    """Rewrite a chain like a careful forger: change entry ``seq``, recompute every later hash."""
    entries = log.entries(job_id=JOB)
    prev = entries[seq - 2].hash if seq > 1 else GENESIS
    with log.engine.begin() as conn:
        for e in entries[seq - 1:]:
            payload = {**e.payload, **change} if e.seq == seq else e.payload
            new = Entry.build(job_id=e.job_id, seq=e.seq, kind=e.kind, timestamp=e.timestamp,
                              payload=payload, arrays=e.arrays, prev_hash=prev)
            conn.execute(text("UPDATE audit_entries SET payload = :pl, prev_hash = :p, "
                              "hash = :h WHERE job_id = :j AND seq = :s"),
                         {"pl": new.payload_json, "p": new.prev_hash, "h": new.hash,
                          "j": JOB, "s": e.seq})
            prev = new.hash


def test_rewritten_chain_is_caught_by_receipts(setup: tuple[AuditLog, Path]) -> None:
    log, receipts = setup
    forged = {"alice": upload_digest(b"forged"), "bob": upload_digest(b"bob/0")}
    rewrite_from(log, 4, {"uploads": forged})
    assert verify_log(log).ok  # the chain alone is consistent again
    problems = verify_log(log, receipts_dir=receipts).problems
    assert any(p.startswith("receipt alice.jsonl:1 (client 'alice', job 'job-1', round 0)")
               and "upload digest differs" in p for p in problems), problems
    assert any(p.startswith("receipt alice.jsonl:2 (client 'alice', job 'job-1', round 1)")
               and "chain head seen at seq 5 differs" in p and "log rewritten" in p
               for p in problems), problems
    assert not any(p.startswith("receipt bob.jsonl:1") for p in problems)


def test_receipt_disagreeing_with_log_is_named(setup: tuple[AuditLog, Path]) -> None:
    log, receipts = setup
    head = log.entries(job_id=JOB)[2].hash
    write_receipt(receipts, Receipt(JOB, 1, "bob", upload_digest(b"other"), head, 3))
    write_receipt(receipts, Receipt(JOB, 0, "carol", upload_digest(b"c"), head, 3))
    write_receipt(receipts, Receipt(JOB, 9, "bob", upload_digest(b"b"), head, 40))
    write_receipt(receipts, Receipt("job-x", 0, "bob", upload_digest(b"b"), GENESIS, 0))
    (receipts / "junk.jsonl").write_text('{"job_id": "job-1"}\nnot json\n')
    report = verify_log(log, receipts_dir=receipts)
    problems = report.problems
    assert "receipt bob.jsonl:3 (client 'bob', job 'job-1', round 1): upload digest differs " \
           "from the one in round entry seq 6" in problems
    assert "receipt carol.jsonl:1 (client 'carol', job 'job-1', round 0): round entry seq 4 " \
           "does not list this client's upload" in problems
    assert any(p.startswith("receipt bob.jsonl:4") and "no entry seq 40" in p for p in problems)
    assert any(p.startswith("receipt bob.jsonl:4") and "no round entry" in p for p in problems)
    assert "job 'job-x' is not in the log (1 receipt(s) of it, first bob.jsonl:5); the log " \
           "holds 'job-1': to check the log of one job against a site's receipts of several, " \
           "give --job" in problems
    assert sum(p.startswith("receipt junk.jsonl:") and "malformed" in p for p in problems) == 2
    assert len(problems) == 7


def test_a_second_job_created_entry_in_one_chain_is_named(tmp_path: Path) -> None:
    """A chain holds one job: a job id created again on the same audit log (e.g. by a second
    server database) appends a second ``job_created`` to the first job's chain."""
    with AuditLog(tmp_path / "audit.db") as log:
        for _ in range(2):
            log.job(JOB).job_created(schema={"features": ["x"]},
                                     hyperparameters={"n_estimators": 1},
                                     profile={"name": "secure"})
        report = verify_log(log)
    assert report.problems == [
        f"job '{JOB}' seq 2 (job_created): a second job_created entry in the chain (the "
        "first is seq 1): a chain holds one job, so the job id was created again on this "
        "audit log"]


def test_receipts_dir_must_exist(setup: tuple[AuditLog, Path], tmp_path: Path) -> None:
    report = verify_log(setup[0], receipts_dir=tmp_path / "nope")
    assert not report.ok and "does not exist" in report.problems[0]


def test_job_filter(setup: tuple[AuditLog, Path]) -> None:
    log, receipts = setup
    log.job("job-2").client_joined("zed")
    sql(log, "UPDATE audit_entries SET payload = '{\"client\":\"eve\"}' WHERE job_id = 'job-2'")
    assert verify_log(log, receipts, job_id=JOB).ok
    assert not verify_log(log, receipts).ok
    assert verify_log(log, job_id="nope").problems == ["job 'nope' is not in the log"]


def test_missing_database_is_a_problem_not_a_new_file(tmp_path: Path) -> None:
    report = verify_log(tmp_path / "none.db")
    assert not report.ok and not (tmp_path / "none.db").exists()
    with pytest.raises(AuditError, match="does not verify"):
        report.raise_for_problems()


def test_receipt_validation() -> None:
    ok = Receipt(JOB, 0, "a", "a" * 64, GENESIS, 0)
    assert Receipt.from_json(json.loads(json.dumps(ok.to_json()))) == ok
    bads: list[dict[str, Any]] = [
        {"seq_seen": 1}, {"upload_digest": "xyz"}, {"round_id": -1}, {"client": ""},
        {"chain_head_seen": "b" * 64}]
    for bad in bads:
        with pytest.raises(ValueError):
            dataclasses.replace(ok, **bad)
    with pytest.raises(ValueError):
        Receipt.from_json({**ok.to_json(), "extra": 1})
    sent = SentReceipt(JOB, 0, "a", "e" * 64, "a" * 64, GENESIS, 0)
    assert parse_receipt(json.loads(json.dumps(sent.to_json()))) == sent
    for bad in [{"task_digest": "xyz"}, {"seq_seen": 1}, {"round_id": -1}]:
        with pytest.raises(ValueError):
            dataclasses.replace(sent, **bad)
    with pytest.raises(ValueError, match="a sent record has exactly the fields"):
        parse_receipt({k: v for k, v in sent.to_json().items() if k != "task_digest"})
    failed = FailedReceipt(JOB, "a", "a" * 64, 3)
    assert parse_receipt(json.loads(json.dumps(failed.to_json()))) == failed
    for bad in [{"seq_seen": 0}, {"chain_head_seen": "xyz"}, {"client": ""}]:
        with pytest.raises(ValueError):
            dataclasses.replace(failed, **bad)
    with pytest.raises(ValueError, match="a failure receipt has exactly the fields"):
        parse_receipt({**failed.to_json(), "model_digest": "cd" * 32})


@pytest.mark.parametrize("holds", ["nothing", "another job's receipts"])
def test_a_rewritten_job_without_receipts_in_the_directory_does_not_verify(
        setup: tuple[AuditLog, Path], tmp_path: Path, holds: str) -> None:
    # the forger rewrites job-1's chain; the auditor points --receipts at a directory with no
    # receipt of job-1 (the wrong folder, or another job's): nothing vouches for the chain
    log, _ = setup
    rewrite_from(log, 4, {"uploads": {"alice": upload_digest(b"forged"),
                                      "bob": upload_digest(b"bob/0")}})
    assert verify_log(log).ok  # the chain alone is consistent again
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if holds != "nothing":
        write_receipt(elsewhere, Receipt("job-2", 0, "bob", upload_digest(b"b"), GENESIS, 0))
        log.job("job-2").client_joined("bob")
    report = verify_log(log, receipts_dir=elsewhere, job_id=JOB)
    assert not report.ok
    assert report.problems == [
        f"job '{JOB}': no receipt in {elsewhere} is of this job, so its rounds and model "
        "are unreceipted (a rewritten chain would verify)"]


def test_a_job_with_no_rounds_needs_no_receipt(setup: tuple[AuditLog, Path],
                                                tmp_path: Path) -> None:
    log, receipts = setup
    log.job("job-2").client_joined("zed")  # joined, never trained: nothing to receipt
    assert verify_log(log, receipts_dir=receipts).ok


def test_a_file_that_is_not_a_database_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    junk = tmp_path / "notes.db"
    junk.write_text("not a database\n")
    report = verify_log(junk)
    assert not report.ok
    assert report.problems == [f"cannot read the audit log at {junk}: file is not a database"]
    with pytest.raises(AuditError, match="file is not a database"):
        AuditLog(junk, create=False)
    with pytest.raises(AuditError, match="file is not a database"):
        AuditLog(junk)  # a server's [audit_database] naming the wrong file


def test_an_unreachable_audit_database_names_its_url_without_the_password() -> None:
    pytest.importorskip("psycopg")
    report = verify_log("postgresql+psycopg://fed:s3cret@127.0.0.1:1/audit")
    assert not report.ok and len(report.problems) == 1
    assert "s3cret" not in report.problems[0]
    assert report.problems[0].startswith(
        "cannot read the audit log at postgresql+psycopg://fed:***@127.0.0.1:1/audit: ")


@pytest.mark.parametrize("append", ["model", "dp_spend", "client_joined", "disclosure"])
def test_entries_appended_after_the_model_do_not_verify(setup: tuple[AuditLog, Path],
                                                        append: str) -> None:
    """The server writes nothing after a finished job's model: properly chained entries
    appended there (a second model with another digest, a spend past the budget, a site that
    never joined, a disclosure nobody made) are named, with receipts or without."""
    log, receipts = setup
    rec = log.job(JOB)
    if append == "model":
        rec.model(digest="ef" * 32)
    elif append == "dp_spend":
        rec.dp_spend(epsilon=100.0, delta=1e-6, mechanism="gaussian", total_epsilon=100.5,
                     total_delta=1e-6)
    elif append == "client_joined":
        rec.client_joined("mallory")
    else:
        rec.disclosure(client="bob", item="rows", data=np.arange(3.0))
    for report in (verify_log(log), verify_log(log, receipts_dir=receipts)):
        assert not report.ok
        assert any(f"job '{JOB}': seq 10 ({append}) comes after the job's model entry (seq 9)"
                   in p for p in report.problems), report.problems


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_member_verifies_the_export_it_fetched_against_its_receipts(
        setup: tuple[AuditLog, Path], tmp_path: Path, suffix: str) -> None:
    """`GET /v1/jobs/{job}/audit` serves what `audit export --format jsonl` writes: `audit
    verify --db <export>` checks it (chains, arrays, receipts) and `audit show` reads it; an
    edited line is named."""
    import gzip

    from typer.testing import CliRunner

    from fedforest_cli.audit_cli import audit_app

    log, receipts = setup
    run = CliRunner().invoke
    export = tmp_path / f"job{suffix}"
    res = run(audit_app, ["export", "--db", str(tmp_path / "audit.db"), "--format", "jsonl",
                          "--job", JOB, "--out", str(export)])
    assert res.exit_code == 0, res.output
    res = run(audit_app, ["verify", "--db", str(export), "--receipts", str(receipts)])
    assert res.exit_code == 0 and "OK: 9 entries in 1 job(s), 6 receipt(s) checked" in res.output
    assert run(audit_app, ["show", "--db", str(export)]).exit_code == 0
    opener = gzip.open if suffix.endswith(".gz") else open
    with opener(export, "rt", encoding="utf-8") as fh:
        lines = fh.readlines()
    lines[8] = lines[8].replace('"cd' + "cd" * 31, '"ef' + "ef" * 31)  # the model's digest
    with opener(export, "wt", encoding="utf-8") as fh:
        fh.writelines(lines)
    res = run(audit_app, ["verify", "--db", str(export), "--receipts", str(receipts)])
    assert res.exit_code == 1 and f"PROBLEM {label(9)}: hash mismatch" in res.output


def test_a_sites_copy_without_arrays_verifies_against_its_receipts_and_cannot_replay(
        setup: tuple[AuditLog, Path], tmp_path: Path) -> None:
    """A site's copy of its job's log holds no array bytes (the server serves it so): `audit
    verify --receipts` checks the chain and the receipts on the digests and says, in a note,
    what was not checked; `--replay` says the copy holds no arrays and where the whole log
    comes from; `show` gives the arrays' sizes; a changed digest is still named; an export of
    the copy stays without arrays, and importing it says why it cannot."""
    from typer.testing import CliRunner

    from fedforest_cli.audit_cli import audit_app
    from fedforest_secure.audit import export_jsonl, import_jsonl

    log, receipts = setup
    run = CliRunner().invoke
    copy = tmp_path / "site-copy.jsonl"
    with copy.open("w", encoding="utf-8") as fh:
        export_jsonl(log, fh, JOB, include_arrays=False)
    res = run(audit_app, ["verify", "--db", str(copy), "--receipts", str(receipts)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        f"NOTE job '{JOB}': the arrays of 3 entries (the rounds' aggregates, the sites' "
        "disclosures) are not in this log, as the server serves its sites the log: their "
        "SHA-256 digests are in the entries, so the chain and the receipts verify; the arrays "
        "themselves are not checked",
        "OK: 9 entries in 1 job(s), 6 receipt(s) checked"]
    res = run(audit_app, ["verify", "--db", str(copy), "--replay"])
    assert res.exit_code == 1
    assert res.output.splitlines()[0] == (
        f"PROBLEM job '{JOB}' replay: this log holds no arrays to replay (the server serves "
        "its sites the log without the rounds' aggregates and disclosures, unless its "
        "server.toml sets audit_arrays_for_sites = true); replay the whole log, which the "
        f"server's operator exports with `fedforest audit export --db <audit database> "
        f"--format jsonl --job {JOB} --out {JOB}.jsonl`, or verify this one without --replay")
    shown = run(audit_app, ["show", "--db", str(copy)], terminal_width=300)
    assert shown.exit_code == 0, shown.output
    assert "size=6 (not in this copy of the log)" in shown.output
    assert "UNREADABLE" not in shown.output
    lines = copy.read_text(encoding="utf-8").splitlines()
    assert not any("data" in json.loads(line) for line in lines)
    again = tmp_path / "again.jsonl"
    res = run(audit_app, ["export", "--db", str(copy), "--format", "jsonl", "--out",
                          str(again)])
    assert res.exit_code == 0, res.output
    assert again.read_text(encoding="utf-8").splitlines() == lines
    with AuditLog.in_memory() as target, pytest.raises(AuditError) as err:
        import_jsonl(target, lines)
    assert str(err.value) == (
        f"job '{JOB}' seq 1 (job_created): cannot import: the export holds no array data "
        "(written without arrays, as a server serves its sites their job's log); import the "
        "complete export `fedforest audit export --format jsonl` writes from the audit "
        "database")
    doc = json.loads(lines[3])  # the round of seq 4: its aggregate's digest changed
    doc["arrays"]["aggregate"]["sha256"] = "ab" * 32
    lines[3] = json.dumps(doc)
    copy.write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = run(audit_app, ["verify", "--db", str(copy), "--receipts", str(receipts)])
    assert res.exit_code == 1 and f"PROBLEM {label(4)}: hash mismatch" in res.output


def test_damaged_receipt_files_are_problems_not_tracebacks(setup: tuple[AuditLog, Path]
                                                           ) -> None:
    log, receipts = setup
    with (receipts / "alice.jsonl").open("ab") as fh:
        fh.write(b"\xff\xfe not utf-8\n")
    (receipts / "folder.jsonl").mkdir()
    problems = verify_log(log, receipts_dir=receipts).problems
    assert any(p.startswith("receipt alice.jsonl:3: malformed") for p in problems), problems
    assert any(p.startswith("receipt folder.jsonl: malformed (not a file)") for p in problems)
    file_given = verify_log(log, receipts_dir=receipts / "bob.jsonl").problems
    assert file_given == [f"receipts directory {receipts / 'bob.jsonl'} is a file: give the "
                          "directory that holds the sites' receipts files"]


def test_a_damaged_entry_is_an_error_of_export_and_unreadable_in_show(
        setup: tuple[AuditLog, Path], tmp_path: Path) -> None:
    """The moment to archive a log as evidence is when it is damaged: export says which entry
    it cannot write and what keeps it (CSV), show marks it, neither is a traceback."""
    from typer.testing import CliRunner

    from fedforest_cli.audit_cli import audit_app

    log, _ = setup
    sql(log, "UPDATE audit_entries SET payload = '{not json' WHERE seq = 4")
    sql(log, "UPDATE audit_entries SET arrays = '[]' WHERE seq = 6")
    run = CliRunner().invoke
    db = str(tmp_path / "audit.db")
    out = tmp_path / "evidence.jsonl"
    res = run(audit_app, ["export", "--db", db, "--format", "jsonl", "--out", str(out)])
    assert res.exit_code == 1 and f"{label(4)} cannot be written as JSON lines" in res.output
    assert not out.exists() and not list(tmp_path.glob(".*.part"))
    res = run(audit_app, ["export", "--db", db, "--format", "csv", "--out",
                          str(tmp_path / "e.csv")])
    assert res.exit_code == 0 and "{not json" in (tmp_path / "e.csv").read_text()
    res = run(audit_app, ["show", "--db", db])
    assert res.exit_code == 0 and "UNREADABLE" in res.output


def test_a_site_checks_one_jobs_log_against_its_receipts_of_several_jobs(
        setup: tuple[AuditLog, Path], tmp_path: Path) -> None:
    """A site keeps one receipts file for all its jobs and fetches the log of one: without
    --job every other job is named once, with the hint; with --job the log verifies."""
    log, receipts = setup
    for r in range(3):
        write_receipt(receipts, Receipt("job-0", r, "bob", upload_digest(b"x"), GENESIS, 0))
    report = verify_log(log, receipts_dir=receipts)
    assert report.problems == [
        "job 'job-0' is not in the log (3 receipt(s) of it, first bob.jsonl:3); the log holds "
        "'job-1': to check the log of one job against a site's receipts of several, give --job"]
    assert verify_log(log, receipts_dir=receipts, job_id=JOB).ok


def _round_zero_receipted(log: AuditLog, receipts: Path) -> JobRecorder:
    """A secure job's chain up to its round 0, whose uploads every client receipted (the
    receipts pin the chain before the round's entry)."""
    rec = log.job(JOB)
    rec.job_created(schema={"features": ["x"]}, hyperparameters={"n_estimators": 1},
                    profile={"name": "secure"})
    for c in CLIENTS:
        rec.client_joined(c)
    seq, head = log.tip(JOB)
    uploads = {c: upload_digest(f"{c}/0".encode()) for c in CLIENTS}
    for c in CLIENTS:
        write_receipt(receipts, Receipt(JOB, 0, c, uploads[c], head, seq))
    rec.round(_task(0), uploads=uploads, aggregate=np.arange(6.0), masked=True)
    return rec


def test_a_failed_jobs_aborted_round_and_unreceipted_last_round_are_not_problems(
        tmp_path: Path) -> None:
    """A job fails in round 1's upload step (its uploads are receipted, the log has the
    round's abort, not a round entry) and no site keeps a receipt after round 0's entry:
    the log verifies, with a note saying round 0's aggregate is vouched for by the chain
    only. The same tail without the abort is a job still running in this log: a note too,
    saying so, and the job is named in ``running``."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _round_zero_receipted(log, receipts)
        unfinished = verify_log(log, receipts_dir=receipts)
        assert unfinished.ok and len(unfinished.running) == 1, unfinished.problems
        assert [n.split(": ", 1)[1] for n in unfinished.notes] == [
            f"its last round (job '{JOB}' seq 4 (round)) is covered by no receipt yet (the "
            "receipts pin the chain up to seq 3): the sites' next uploads or their model "
            "receipts cover it"]
        seq, head = log.tip(JOB)
        for c in CLIENTS:
            write_receipt(receipts, Receipt(JOB, 1, c, upload_digest(f"{c}/1".encode()),
                                            head, seq))
        rec.round_aborted(1, reason="round 1: only 1 masked upload")
        report = verify_log(log, receipts_dir=receipts)
        assert report.ok, report.problems
        assert report.receipts_checked == 4
        assert report.notes == [  # visible: only the server says no sum came out
            f"job '{JOB}' round 1: 2 receipt(s) of uploads (first alice.jsonl:2), and the log "
            "says the round was aborted: that no sum of it was released is the server's word "
            "only"]
        # round 1's receipts pin seq 4 (round 0's entry): the tail is covered; without them
        # (a job that failed before any upload of round 1) it is a note
        for f in receipts.iterdir():
            f.write_text("".join(f.read_text().splitlines(keepends=True)[:1]))
        report = verify_log(log, receipts_dir=receipts)
        assert report.ok, report.problems
        assert report.notes == [
            f"job '{JOB}' failed (job '{JOB}' seq 5 (round_aborted)) before any site kept a "
            f"receipt after its last round (job '{JOB}' seq 4 (round)): that round's aggregate "
            "is vouched for by the chain only"]


def test_a_job_that_failed_between_rounds_has_a_note_not_a_problem(tmp_path: Path) -> None:
    """Sites drop after round 0 until too few remain, and the job fails before issuing round 1
    (no round of it was aborted): its ``job_failed`` entry ends the chain, and round 0's
    unreceipted aggregate is a note. The same chain without that entry is a job still running
    in this log (a note saying so); with a site's model receipt of the job, a problem."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _round_zero_receipted(log, receipts)
        rec.client_dropped(CLIENTS[0], round_id=1, reason="deadline")
        cut = verify_log(log, receipts_dir=receipts)
        assert cut.ok and cut.running == [
            f"job '{JOB}' has not ended in this log (no model, job_failed or round_aborted "
            "entry; checked up to seq 5, round 0)"], cut.problems
        assert len(cut.notes) == 1 and "covered by no receipt yet" in cut.notes[0]
        seq, head = log.tip(JOB)
        write_receipt(receipts, ModelReceipt(JOB, "bob", "cd" * 32, head, seq),
                      filename="bob-model.jsonl")
        hidden = verify_log(log, receipts_dir=receipts)
        assert any("the log has no model entry (deleted?), yet" in p  # it reaches the pin
                   for p in hidden.problems), hidden.problems
        (receipts / "bob-model.jsonl").unlink()
        rec.job_failed(reason="only 1 clients remain, fewer than the required 2; training "
                              "stopped")
        report = verify_log(log, receipts_dir=receipts)
    assert report.ok, report.problems
    assert report.notes == [
        f"job '{JOB}' failed (job '{JOB}' seq 6 (job_failed)) before any site kept a receipt "
        f"after its last round (job '{JOB}' seq 4 (round)): that round's aggregate is vouched "
        "for by the chain only"]


def _failed_with_receipts(log: AuditLog, receipts: Path) -> JobRecorder:
    """A secure job that fails after round 0 (too few sites remain), whose two sites were told
    it failed and keep a failure receipt of the chain head the server announced then."""
    rec = _round_zero_receipted(log, receipts)
    rec.client_dropped(CLIENTS[0], round_id=1, reason="deadline")
    rec.job_failed(reason="only 1 clients remain, fewer than the required 2; training stopped")
    seq, head = log.tip(JOB)
    for c in CLIENTS:
        write_receipt(receipts, FailedReceipt(JOB, c, head, seq))
    return rec


def test_a_failed_job_its_sites_hold_failure_receipts_of_verifies_without_notes(
        tmp_path: Path) -> None:
    """The failure receipts pin the chain up to the job_failed entry: the job's last round is
    covered by them (no note saying it is the chain's word only), and the job is not running."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        _failed_with_receipts(log, receipts)
        report = verify_log(log, receipts_dir=receipts)
    assert report.ok, report.problems
    assert report.notes == [] and report.running == []
    assert report.receipts_checked == 4


@pytest.mark.parametrize("cut", [4, 5])
def test_a_failed_jobs_log_cut_before_its_failure_is_named_by_the_failure_receipts(
        tmp_path: Path, cut: int) -> None:
    """The server cuts a failed job's log after seq ``cut`` (its failure entry gone, so the
    chain reads as a job still running): the sites' failure receipts pin the entry the log no
    longer holds, a problem, not "OK so far"."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        _failed_with_receipts(log, receipts)
        sql(log, "DELETE FROM audit_entries WHERE seq > :s", s=cut)
        sql(log, "DELETE FROM audit_arrays WHERE seq > :s", s=cut)
        report = verify_log(log, receipts_dir=receipts)
    assert not report.ok and report.running == []
    assert f"receipt alice.jsonl:2 (client 'alice', job '{JOB}', failed): the log has no entry " \
           "seq 6" in report.problems[0], report.problems
    assert any("the log has no round_aborted or job_failed entry (deleted?), yet the server "
               "told the client the job failed" in p for p in report.problems)


def test_a_model_appended_to_a_failed_job_is_named_by_the_failure_receipts(
        tmp_path: Path) -> None:
    """A server that told its sites the job failed, then logged a model after the failure
    (no site holds a receipt of it): the failure receipts name the model entry."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _failed_with_receipts(log, receipts)
        rec.model(digest="cd" * 32)
        report = verify_log(log, receipts_dir=receipts)
    assert any(f"the log has a model entry (job '{JOB}' seq 7 (model)), yet the server told "
               "the client the job failed" in p for p in report.problems), report.problems


def test_a_failure_receipt_pinning_a_head_before_the_failure_entry_is_a_problem(
        tmp_path: Path) -> None:
    """The server announced the job's failure with a chain head before the failure's entry
    (the entry written later, or rewritten): the receipt does not cover it."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _round_zero_receipted(log, receipts)
        seq, head = log.tip(JOB)
        write_receipt(receipts, FailedReceipt(JOB, "alice", head, seq))
        rec.job_failed(reason="the server was stopped")
        report = verify_log(log, receipts_dir=receipts)
    assert any("the chain head announced with the job's failure (seq 4) does not cover the "
               f"log's job '{JOB}' seq 5 (job_failed)" in p for p in report.problems), \
        report.problems


def test_a_round_rewritten_as_aborted_is_named_in_a_note(setup: tuple[AuditLog, Path],
                                                         tmp_path: Path) -> None:
    """A server that released round 1's sum, then logged the round as aborted (its entry and
    everything after it deleted, an abort appended, no model receipt kept): the receipts of
    the round's uploads do not fail the check, but a note names the round and says that no
    sum was released is the server's word only."""
    log, receipts = setup
    for f in receipts.glob("*-model.jsonl"):
        f.unlink()
    sql(log, "DELETE FROM audit_entries WHERE job_id = :j AND seq >= 6", j=JOB)
    log.close()
    with AuditLog(tmp_path / "audit.db") as forged:
        forged.job(JOB).round_aborted(1, reason="round 1: only 1 masked upload")
        report = verify_log(forged, receipts_dir=receipts)
    assert any(n.startswith(f"job '{JOB}' round 1: 2 receipt(s) of uploads") and
               "the server's word only" in n for n in report.notes), report.notes


def test_a_dropped_sites_own_receipts_leave_the_rounds_after_its_drop_to_a_note(
        tmp_path: Path) -> None:
    """alice is dropped after round 0 and checks the honest log with her own receipts: the
    round after her drop and the model are not hers to vouch for (a note saying whose
    receipts can, and one naming bob, of whom the directory holds no receipt), not a problem.
    The same receipts of a site not dropped leave a problem."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _round_zero_receipted(log, receipts)
        (receipts / "bob.jsonl").unlink()
        rec.client_dropped("alice", round_id=1, reason="deadline")
        rec.round(_task(1), uploads={"bob": upload_digest(b"bob/1")},
                  aggregate=np.arange(6.0), masked=True)
        rec.model(digest="cd" * 32)
        report = verify_log(log, receipts_dir=receipts)
        assert report.ok, report.problems
        assert report.notes == [
            f"job '{JOB}': these receipts are of sites the log says were dropped (alice (seq "
            f"5)): the entries after seq 3, job '{JOB}' seq 6 (round) and job '{JOB}' seq 7 "
            "(model) among them, are vouched for by the other sites' receipts only: add "
            "theirs to check them",
            f"job '{JOB}': no receipt in {receipts} is of bob, a member the log says joined "
            "or took part in its rounds: what the log says that site sent and received is the "
            "server's word only (add that site's receipts file to check it)"]
        sql(log, "DELETE FROM audit_entries WHERE seq = 5")  # no drop: a cut chain is named
        assert any("covered by no receipt" in p
                   for p in verify_log(log, receipts_dir=receipts).problems)


def test_a_site_dropped_before_any_round_listed_it_is_noted_as_only_said_to_have_joined(
        tmp_path: Path) -> None:
    """carol joins and is dropped before round 0 closes; alice and bob receipt round 0 and the
    model, and carol's honest receipts file holds nothing of the job: the note on carol says
    that she joined is the server's word only (no receipts file of hers could say more), not
    to add her file. Without bob's file, bob gets the note asking for it."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        rec = log.job(JOB)
        rec.job_created(schema={"features": ["x"]}, hyperparameters={"n_estimators": 1},
                        profile={"name": "secure"})
        for c in ("alice", "bob", "carol"):
            rec.client_joined(c)
        rec.client_dropped("carol", round_id=0, reason="deadline")
        seq, head = log.tip(JOB)
        ups = {c: upload_digest(f"{c}/0".encode()) for c in ("alice", "bob")}
        for c, digest in ups.items():
            write_receipt(receipts, Receipt(JOB, 0, c, digest, head, seq))
        rec.round(_task(0), uploads=ups, aggregate=np.arange(6.0), masked=True)
        rec.model(digest="cd" * 32)
        seq, head = log.tip(JOB)
        for c in ups:
            write_receipt(receipts, ModelReceipt(JOB, c, "cd" * 32, head, seq))
        (receipts / "carol.jsonl").write_text("")
        carol = (f"job '{JOB}': no receipt in {receipts} is of carol, a member the log says "
                 "joined and was dropped (seq 5) before any round listed its upload: a site "
                 "that uploaded nothing keeps no receipt of the job, so that it joined is the "
                 "server's word only")
        report = verify_log(log, receipts_dir=receipts)
        assert report.ok, report.problems
        assert report.notes == [carol]
        (receipts / "bob.jsonl").unlink()
        assert verify_log(log, receipts_dir=receipts).notes == [
            carol,
            f"job '{JOB}': no receipt in {receipts} is of bob, a member the log says joined "
            "or took part in its rounds: what the log says that site sent and received is the "
            "server's word only (add that site's receipts file to check it)"]


def test_a_round_and_model_logged_after_every_site_was_dropped_are_a_problem(
        tmp_path: Path) -> None:
    """A server tells every site it was dropped after round 0 (so none keeps a later
    receipt), then logs a round and a model of its own making: nobody is left to vouch for
    them, so every site's receipts together fail the check instead of a note asking for the
    other sites' receipts (there are none). A site the log drops only after them took part:
    its receipts must cover them. One site left in the job keeps alice's receipts a note."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _round_zero_receipted(log, receipts)
        for c in CLIENTS:
            rec.client_dropped(c, round_id=1, reason="deadline")
        rec.round(_task(1), uploads={"bob": upload_digest(b"bob/1")},
                  aggregate=np.arange(6.0), masked=True)
        rec.model(digest="cd" * 32)
        report = verify_log(log, receipts_dir=receipts)
        assert not report.ok
        assert report.problems == [
            f"job '{JOB}': the log says every site of the job was dropped (alice, bob) before "
            f"job '{JOB}' seq 7 (round): job '{JOB}' seq 7 (round) and job '{JOB}' seq 8 "
            "(model) came after the last site left, so no site's receipt can cover them (a "
            "server that drops every site can write any ending)"]
        rec.client_joined("mallory")  # a site only the server's word has seen join
        assert [p for p in verify_log(log, receipts_dir=receipts).problems
                if "every site of the job was dropped" in p], "a late join vouched for them"
        sql(log, "DELETE FROM audit_entries WHERE seq = 9")
        rec.client_dropped("bob", round_id=2, reason="deadline")  # bob, also after them:
        sql(log, "DELETE FROM audit_entries WHERE seq = 6")  # he took part, his receipts
        report = verify_log(log, receipts_dir=receipts)      # must cover them
        assert any("the last round (job 'job-1' seq 7 (round)) is covered by no receipt" in p
                   for p in report.problems), report.problems
        sql(log, "DELETE FROM audit_entries WHERE seq = 9")  # bob stays: alice's is a note
        (receipts / "bob.jsonl").unlink()
        report = verify_log(log, receipts_dir=receipts)
        assert not any("every site" in p for p in report.problems)
        assert any("vouched for by the other sites' receipts only" in n for n in report.notes)


@pytest.mark.parametrize("replay", [False, True])
def test_an_entry_rewritten_with_a_payload_that_is_no_object_is_a_problem_not_a_traceback(
        setup: tuple[AuditLog, Path], replay: bool) -> None:
    """A forger rewrites the model entry's payload as a JSON list (hash recomputed): verify
    with receipts (and --replay) names it, as the chain check alone did, without a traceback."""
    log, receipts = setup
    entries = log.entries(job_id=JOB)
    last = entries[-1]
    forged = Entry.build(job_id=JOB, seq=last.seq, kind=last.kind, timestamp=last.timestamp,
                         payload=[], arrays={}, prev_hash=entries[-2].hash)
    sql(log, "UPDATE audit_entries SET payload = :pl, hash = :h WHERE seq = :s",
        pl=forged.payload_json, h=forged.hash, s=last.seq)
    report = verify_log(log, receipts_dir=receipts, replay=replay)
    assert not report.ok
    assert any("seq 9 (model)" in p and "unreadable" in p for p in report.problems), \
        report.problems


def test_a_state_dir_given_as_the_receipts_folder_is_named(setup: tuple[AuditLog, Path],
                                                           tmp_path: Path) -> None:
    """A client's --state-dir holds its receipts in a `receipts` folder: given the state
    directory instead, verify says where they are."""
    log, receipts = setup
    state = tmp_path / "state"
    state.mkdir()
    receipts.rename(state / "receipts")
    (state / "stats.json").write_text("{}")
    problems = verify_log(log, receipts_dir=state).problems
    assert f"{state} looks like a client's --state-dir: its receipts are in " \
           f"{state / 'receipts'}" in problems, problems
    assert verify_log(log, receipts_dir=state / "receipts").ok


def _running_job(log: AuditLog, receipts: Path, *, ahead: bool = False) -> None:
    """A job still running when its log was downloaded: rounds 0 and 1 logged (seq 4 and 5),
    each round's uploads receipted by both sites; then the sites uploaded to round 2 (their
    receipts pin seq 5, the log's last entry: the open round, which the log does not hold
    yet). With ``ahead`` they also uploaded to round 3, pinning seq 6: an entry the server
    announced that this log does not hold."""
    rec = _round_zero_receipted(log, receipts)
    seq, head = log.tip(JOB)
    uploads = {c: upload_digest(f"{c}/1".encode()) for c in CLIENTS}
    for c in CLIENTS:
        write_receipt(receipts, Receipt(JOB, 1, c, uploads[c], head, seq))
    rec.round(_task(1), uploads=uploads, aggregate=np.arange(6.0), masked=True)
    seq, head = log.tip(JOB)
    rounds = ((2, (seq, head)), (3, (seq + 1, "ab" * 32))) if ahead else ((2, (seq, head)),)
    for r, (s, h) in rounds:
        for c in CLIENTS:
            write_receipt(receipts, Receipt(JOB, r, c, upload_digest(f"{c}/{r}".encode()),
                                            h, s))


RUNNING = (f"job '{JOB}' has not ended in this log (no model, job_failed or round_aborted "
           "entry; checked up to seq 5, round 1)")


def test_a_running_jobs_open_round_receipts_are_a_note_and_the_verdict_says_so(
        tmp_path: Path) -> None:
    """A site checks the log of a job still running against its receipts: its receipts of the
    rounds the log does not hold yet go beyond it, a note and no problem; the receipts of
    round 2 that pin the log's last entry are still checked. `audit verify` exits 0 with a
    verdict saying the job has not ended in this log and to verify again after it ends."""
    from typer.testing import CliRunner

    from fedforest_cli.audit_cli import audit_app

    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        _running_job(log, receipts)
    report = verify_log(tmp_path / "audit.db", receipts_dir=receipts, job_id=JOB)
    assert report.ok, report.problems
    assert report.running == [RUNNING]
    assert report.notes == [
        f"{RUNNING}: 2 receipt(s) of later rounds (first alice.jsonl:3) go beyond it: the job "
        "is still running, or was when the log was downloaded"]
    assert report.receipts_checked == 6
    res = CliRunner().invoke(audit_app, ["verify", "--db", str(tmp_path / "audit.db"),
                                         "--receipts", str(receipts), "--job", JOB])
    assert res.exit_code == 3, res.output  # not a pass: the job's end is not in the log
    assert "PROBLEM" not in res.output
    assert res.output.splitlines()[-1].startswith(
        f"OK so far: 5 entries in 1 job(s), 6 receipt(s) checked; {RUNNING}: verify again "
        "after it ends")


def test_a_receipt_pinning_an_entry_past_the_running_logs_end_is_a_problem(
        tmp_path: Path) -> None:
    """A site's receipt pins seq 6, which the server announced, and the log ends at seq 5: the
    log is cut (or was fetched before): a problem, never skipped as a running job's."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        _running_job(log, receipts, ahead=True)
        problems = verify_log(log, receipts_dir=receipts).problems
    assert len(problems) == 2 and all(
        "round 3): the log has no entry seq 6 (deleted or truncated; or the log was fetched "
        "before the site saw that entry: fetch it again)" in p for p in problems), problems


@pytest.mark.parametrize("cut", [4, 5, 6, 7])
def test_a_finished_jobs_log_cut_before_its_end_never_passes(
        setup: tuple[AuditLog, Path], cut: int) -> None:
    """The server cuts a finished job's log after seq ``cut`` and the sites hold no model
    receipt (the job failed, or they were dropped): verify never exits 0. Where a receipt
    pins an entry the log no longer holds it fails; otherwise the log is indistinguishable
    from a running job's, and the verdict is "OK so far" with exit code 3, which a site whose
    job has ended reads as a cut log."""
    from typer.testing import CliRunner

    from fedforest_cli.audit_cli import audit_app

    log, receipts = setup
    for f in receipts.glob("*-model.jsonl"):
        f.unlink()
    sql(log, "DELETE FROM audit_entries WHERE seq > :s", s=cut)
    sql(log, "DELETE FROM audit_arrays WHERE seq > :s", s=cut)
    res = CliRunner().invoke(audit_app, ["verify", "--db", str(receipts.parent / "audit.db"),
                                         "--receipts", str(receipts)])
    assert res.exit_code in (1, 3), res.output
    if cut < 5:  # round 1's receipts pin seq 5
        assert res.exit_code == 1 and "the log has no entry seq 5" in res.output


def test_a_running_jobs_unreceipted_last_round_is_a_note(tmp_path: Path) -> None:
    """The sites' receipts were copied before any of them uploaded after round 1's entry (a
    site stalled, say): the last round is covered by no receipt yet, a note."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        _running_job(log, receipts)
        for f in receipts.iterdir():  # round 0's receipts only
            f.write_text("".join(f.read_text().splitlines(keepends=True)[:1]))
        report = verify_log(log, receipts_dir=receipts)
    assert report.ok, report.problems
    assert report.running == [RUNNING]
    assert report.notes == [
        f"{RUNNING}: its last round (job '{JOB}' seq 5 (round)) is covered by no receipt yet "
        "(the receipts pin the chain up to seq 3): the sites' next uploads or their model "
        "receipts cover it"]


def test_a_running_looking_log_of_a_job_whose_model_a_site_holds_does_not_verify(
        tmp_path: Path) -> None:
    """A site that received the job's model knows it ended: a log without its end (the
    server hiding it) fails, the receipts beyond the log and the model receipt named."""
    from typer.testing import CliRunner

    from fedforest_cli.audit_cli import audit_app

    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        _running_job(log, receipts)
    write_receipt(receipts, ModelReceipt(JOB, "alice", "cd" * 32, "ef" * 32, 9),
                  filename="alice-model.jsonl")
    report = verify_log(tmp_path / "audit.db", receipts_dir=receipts)
    assert not report.ok and report.running == [] and report.notes == []
    assert any("(client 'alice', job 'job-1', model): the log has no model entry (deleted? "
               "or this log was read before the job ended: fetch it again)" in p
               for p in report.problems), report.problems
    assert sum("the log has no round entry for this round" in p for p in report.problems) == 2
    res = CliRunner().invoke(audit_app, ["verify", "--db", str(tmp_path / "audit.db"),
                                         "--receipts", str(receipts)])
    assert res.exit_code == 1 and res.output.splitlines()[-1].startswith("FAILED: ")


@pytest.mark.parametrize("forgery", ["edited", "rewritten"])
def test_a_tampered_entry_of_a_running_job_does_not_verify(tmp_path: Path,
                                                           forgery: str) -> None:
    """An entry of a running job's log edited (hash mismatch), or rewritten with every later
    hash recomputed (round 2's receipts pin the changed chain head): still a problem."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        _running_job(log, receipts)
        if forgery == "edited":
            sql(log, "UPDATE audit_entries SET payload = :p WHERE seq = 2",
                p='{"client":"mallory"}')
        else:
            rewrite_from(log, 4, {"uploads": {c: upload_digest(b"forged") for c in CLIENTS}})
        report = verify_log(log, receipts_dir=receipts)
    assert report.running == [RUNNING]  # the verdict is FAILED all the same
    expected = ("seq 2 (client_joined): hash mismatch" if forgery == "edited"
                else "round 2): chain head seen at seq 5 differs")
    assert any(expected in p for p in report.problems), report.problems


def test_a_sent_record_its_upload_receipt_follows_is_counted_once(tmp_path: Path) -> None:
    """A client records each upload before it sends it, then its receipt when the server
    answers: the pair is one upload, checked once, and adds no note."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        build_job(log, receipts, sent=True)
        assert len((receipts / "alice.jsonl").read_text().splitlines()) == 4
        report = verify_log(log, receipts_dir=receipts)
    assert report.ok, report.problems
    assert report.notes == [] and report.receipts_checked == 6


def _stopped_while_uploading(receipts: Path, line: int = 2) -> None:
    """alice was stopped while her upload of round 1 waited for its answer: her receipt of it
    (line ``line`` of her file) is the sent record only."""
    path = receipts / "alice.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    confirmed = Receipt.from_json(json.loads(lines[line - 1]))
    lines[line - 1] = json.dumps(SentReceipt(
        confirmed.job_id, confirmed.round_id, confirmed.client, "ee" * 32,
        confirmed.upload_digest, confirmed.chain_head_seen, confirmed.seq_seen).to_json()) + "\n"
    path.write_text("".join(lines))


def test_an_unconfirmed_upload_the_log_lists_is_checked(setup: tuple[AuditLog, Path]) -> None:
    """The server summed alice's upload of round 1, and alice stopped before its answer came:
    her sent record is checked against the round entry like a receipt (no note), and pins the
    chain head she saw, so a chain rewritten before it is still named."""
    log, receipts = setup
    _stopped_while_uploading(receipts)
    report = verify_log(log, receipts_dir=receipts)
    assert report.ok, report.problems
    assert report.notes == [] and report.receipts_checked == 6
    rewrite_from(log, 4, {"uploads": {c: upload_digest(f"{c}/0".encode()) for c in CLIENTS},
                          "aggregate_note": "forged"})
    problems = verify_log(log, receipts_dir=receipts).problems
    assert any(p.startswith("receipt alice.jsonl:2 (client 'alice', job 'job-1', round 1, "
                            "sent): chain head seen at seq 5 differs") for p in problems), \
        problems


def test_an_unconfirmed_upload_the_log_lists_otherwise_is_a_problem(
        setup: tuple[AuditLog, Path]) -> None:
    """The log lists an upload of alice in round 1 that is not the one she sent, and none of
    her records is of it: named, as a receipt's other digest is."""
    log, receipts = setup
    _stopped_while_uploading(receipts)
    rewrite_from(log, 6, {"uploads": {"alice": upload_digest(b"forged"),
                                      "bob": upload_digest(b"bob/1")}})
    problems = verify_log(log, receipts_dir=receipts).problems
    assert "receipt alice.jsonl:2 (client 'alice', job 'job-1', round 1, sent): round entry " \
           "seq 6 lists another upload of this client than the one it sent, and none of its " \
           "records is of that upload (log rewritten? or the site also uploaded from another " \
           "--state-dir)" in problems, problems


@pytest.mark.parametrize("end", ["closed without it", "aborted"])
def test_an_unconfirmed_upload_the_log_does_not_hold_is_a_note(tmp_path: Path,
                                                               end: str) -> None:
    """alice was stopped while her upload of round 1 was on its way, before the server
    received it: the round closed with bob's upload only (alice dropped), or was aborted.
    Her sent record is a note saying so, not a problem."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _round_zero_receipted(log, receipts)
        seq, head = log.tip(JOB)
        write_receipt(receipts, SentReceipt(JOB, 1, "alice", "ee" * 32,
                                            upload_digest(b"alice/1"), head, seq))
        write_receipt(receipts, Receipt(JOB, 1, "bob", upload_digest(b"bob/1"), head, seq))
        if end == "aborted":
            rec.round_aborted(1, reason="round 1: only 1 masked upload")
        else:
            rec.client_dropped("alice", round_id=1, reason="deadline")
            rec.round(_task(1), uploads={"bob": upload_digest(b"bob/1")},
                      aggregate=np.arange(6.0), masked=True)
            rec.model(digest="cd" * 32)
            seq, head = log.tip(JOB)
            write_receipt(receipts, ModelReceipt(JOB, "bob", "cd" * 32, head, seq),
                          filename="bob-model.jsonl")
        report = verify_log(log, receipts_dir=receipts)
    assert report.ok, report.problems
    why = ("the log says the round was aborted" if end == "aborted"
           else "round entry seq 6 does not list this client's upload")
    sent = (f"receipt alice.jsonl:2 (client 'alice', job 'job-1', round 1, sent): an upload "
            f"the site sent and the server never confirmed, not in the log ({why}): the site "
            "stopped before the server received it, or the round went on without it")
    assert sent in report.notes, report.notes
    assert len(report.notes) == (2 if end == "aborted" else 1), report.notes  # and bob's


def test_a_receipt_is_on_disk_when_written_and_takes_the_place_of_a_cut_last_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """write_receipt syncs the file (and the directory of a new file) before it returns; a
    last line a crash cut short holds no receipt, and the next receipt takes its place."""
    import os

    from fedforest_secure.audit import read_receipts

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    folder = tmp_path / "receipts"
    first = Receipt(JOB, 0, "alice", "a" * 64, GENESIS, 0)
    write_receipt(folder, first)
    assert len(synced) == 2  # the file, then the directory that now names it
    with (folder / "alice.jsonl").open("a") as fh:
        fh.write('{"job_id": "job-1", "round')  # a crash in the middle of a line
    sent = SentReceipt(JOB, 1, "alice", "e" * 64, "b" * 64, "c" * 64, 3)
    write_receipt(folder, sent)
    assert len(synced) == 3
    read = list(read_receipts(folder))
    assert read == [("alice.jsonl:1", first), ("alice.jsonl:2", sent)]


@pytest.mark.parametrize("appended", ["client_joined", "dp_spend", "client_dropped"])
def test_entries_appended_after_a_failed_jobs_end_do_not_verify(tmp_path: Path,
                                                                appended: str) -> None:
    """A failed job's chain ends with its failure: an entry the server appends after it (a
    site joining, a spend, a drop accusing a site), with every hash recomputed and every
    failure receipt present, is a problem, as one after a finished job's model is."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _failed_with_receipts(log, receipts)
        if appended == "client_joined":
            rec.client_joined("mallory")
        elif appended == "dp_spend":
            rec.dp_spend(epsilon=9.0, delta=1e-6, mechanism="gaussian", total_epsilon=9.0,
                         total_delta=1e-6)
        else:
            rec.client_dropped(CLIENTS[1], round_id=1, reason="refused: invalid_message")
        report = verify_log(log, receipts_dir=receipts)
    assert f"job '{JOB}': seq 7 ({appended}) comes after the job's failure (job '{JOB}' seq 6 " \
           "(job_failed)): nothing follows a failed job's end (appended?)" in report.problems


def test_a_round_and_a_model_after_a_rounds_abort_do_not_verify(tmp_path: Path) -> None:
    """A round's abort ends the job (no sum of it was released): the same round's entry and a
    model after it are each a problem, though the chain then ends with a model (a server that
    went on after logging the abort)."""
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _round_zero_receipted(log, tmp_path / "receipts")
        rec.client_dropped(CLIENTS[1], round_id=1, reason="missed the round deadline")
        rec.round_aborted(1, reason="only 1 masked uploads")
        rec.round(_task(1), uploads={"alice": "aa" * 32}, aggregate=np.arange(6.0),
                  masked=True)
        rec.model(digest="cd" * 32)
        problems = verify_log(log).problems
    assert problems == [
        f"job '{JOB}': seq {seq} ({kind}) comes after the job's failure (job '{JOB}' seq 6 "
        "(round_aborted)): nothing follows a failed job's end (appended?)"
        for seq, kind in ((7, "round"), (8, "model"))]


def test_a_round_listing_a_site_dropped_in_an_earlier_round_does_not_verify(
        tmp_path: Path) -> None:
    """bob is dropped in round 1: round 1's entry may list him (a secure round's sum holds the
    masked upload of a site dropped after it), round 2's may not."""
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _round_zero_receipted(log, tmp_path / "receipts")
        rec.client_dropped("bob", round_id=1, reason="missed the round deadline (phase sign)")
        both = {c: upload_digest(f"{c}/1".encode()) for c in CLIENTS}
        rec.round(_task(1), uploads=both, aggregate=np.arange(6.0), masked=True)
        assert verify_log(log).problems == []
        rec.round(_task(2), uploads={c: upload_digest(f"{c}/2".encode()) for c in CLIENTS},
                  aggregate=np.arange(6.0), masked=True)
        problems = verify_log(log).problems
    assert problems == [f"job '{JOB}' seq 7 (round): lists site 'bob', which the log dropped "
                        f"in an earlier round (job '{JOB}' seq 5 (client_dropped)): a dropped "
                        "site takes no part in later rounds"]


def test_a_site_joining_twice_does_not_verify(tmp_path: Path) -> None:
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _round_zero_receipted(log, tmp_path / "receipts")
        rec.client_joined("alice")
        problems = verify_log(log).problems
    assert problems == [f"job '{JOB}' seq 5 (client_joined): site 'alice' joined already (job "
                        f"'{JOB}' seq 2 (client_joined)): a site joins a job once"]


@pytest.mark.parametrize(("second", "said"), [(2, "again"), (1, "after round 2")])
def test_a_round_logged_twice_or_going_back_does_not_verify(tmp_path: Path, second: int,
                                                            said: str) -> None:
    """Without receipts or a replay: a round entry whose round id is not above the previous
    round entry's (a server that resumed from an older copy of its database logs rounds
    again)."""
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _round_zero_receipted(log, tmp_path / "receipts")
        for r in (1, 2):
            rec.round(_task(r), uploads={}, aggregate=np.arange(6.0), masked=True)
        assert verify_log(log).ok
        rec.round(_task(second), uploads={}, aggregate=np.arange(6.0), masked=True)
        problems = verify_log(log).problems
    assert problems == [f"job '{JOB}' seq 7 (round): round {second} is logged {said} (job "
                        f"'{JOB}' seq 6 (round)): each round is logged once, in order (a "
                        "server that resumed from an older copy of its database?)"]


def test_a_rounds_abort_then_the_jobs_failure_is_an_honest_end(tmp_path: Path) -> None:
    """A job stopped in a round (cancelled, say) ends with the round's abort and, right after
    it, the job's failure: that verifies; anything after them does not."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        rec = _round_zero_receipted(log, receipts)
        rec.round_aborted(1, reason="cancelled by the operator")
        rec.job_failed(reason="cancelled by the operator")
        assert verify_log(log, receipts_dir=receipts).ok
        rec.client_joined("mallory")
        report = verify_log(log, receipts_dir=receipts)
    assert any("seq 7 (client_joined) comes after the job's failure" in p
               for p in report.problems), report.problems



def _refused_with_receipts(log: AuditLog, receipts: Path) -> JobRecorder:
    """Round 1 of a secure job: bob refuses it, accusing alice (her share did not
    authenticate), and keeps a refusal receipt of the chain head the server answered with."""
    rec = _round_zero_receipted(log, receipts)
    rec.client_dropped("bob", round_id=1, reason="refused: invalid_message (alice's message "
                       "did not authenticate)", accused="alice")
    seq, head = log.tip(JOB)
    write_receipt(receipts, RefusedReceipt(JOB, 1, "bob", head, seq))
    return rec


def test_a_refusal_receipt_verifies_and_parses() -> None:
    ok = RefusedReceipt(JOB, 1, "bob", "ab" * 32, 5)
    assert parse_receipt(json.loads(json.dumps(ok.to_json()))) == ok
    for bad in [{"seq_seen": 0}, {"round_id": -1}, {"chain_head_seen": "xyz"}]:
        with pytest.raises(ValueError):
            dataclasses.replace(ok, **bad)


def test_a_refusing_sites_receipt_catches_its_accusation_rewritten(tmp_path: Path) -> None:
    """The log names the site a refusing site accused; a server that rewrites the accusation
    to blame another site (every hash recomputed) is caught by the refusing site's receipt, as
    is a log cut before its drop."""
    receipts = tmp_path / "receipts"
    with AuditLog(tmp_path / "audit.db") as log:
        _refused_with_receipts(log, receipts)
        assert verify_log(log, receipts_dir=receipts).ok
        rewrite_from(log, 5, {"accused": "carol"})
        report = verify_log(log, receipts_dir=receipts)
        assert any("(client 'bob', job 'job-1', round 1, refused): chain head seen at seq 5 "
                   "differs" in p for p in report.problems), report.problems
    with AuditLog(tmp_path / "cut.db") as log:
        receipts2 = tmp_path / "receipts2"
        _refused_with_receipts(log, receipts2)
        sql(log, "DELETE FROM audit_entries WHERE seq >= 5")
        report = verify_log(log, receipts_dir=receipts2)
        assert any("the log has no entry seq 5" in p for p in report.problems)
        assert any("the log has no client_dropped entry of this client up to seq 5" in p
                   for p in report.problems), report.problems


def test_an_export_holding_some_lines_arrays_and_not_others_is_an_error(
        setup: tuple[AuditLog, Path], tmp_path: Path) -> None:
    """The server's whole export with one round line's ``data`` removed is neither the whole
    log nor a site's copy without arrays: verify and show stop with an error naming the entry,
    rather than checking it as a site's copy."""
    from typer.testing import CliRunner

    from fedforest_cli.audit_cli import audit_app
    from fedforest_secure.audit import export_jsonl

    log, receipts = setup
    whole = tmp_path / "whole.jsonl"
    with whole.open("w", encoding="utf-8") as fh:
        export_jsonl(log, fh, JOB)
    lines = whole.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "round")
    doc = json.loads(lines[i])
    del doc["data"]
    lines[i] = json.dumps(doc)
    whole.write_text("\n".join(lines) + "\n")
    for args in (["verify", "--db", str(whole), "--receipts", str(receipts)],
                 ["show", "--db", str(whole)]):
        res = CliRunner().invoke(audit_app, args)
        assert res.exit_code == 1, res.output
        assert "comes without its array data, beside entries that hold theirs" in res.output
        assert f"{JOB!r}" in res.output or JOB in res.output
