"""Attack 4: the tail of an audit log (last round, model entry) rewritten or cut off.

A whole job runs through the server state in process; every client keeps a receipt of each
upload (the chain head announced with the task) and, at the end, a model receipt (the model
file's SHA-256 and the chain head announced with it). A careful forger rewrites the last
round's aggregate and the model entry, recomputing every hash and the model digest the replay
yields, or deletes the model entry: ``verify_log(receipts, replay=True)`` names it. Without
model receipts the last round is covered by no receipt, and verification says so.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from audit_forgery import forge
from sqlalchemy import text
from state_driver import answer_until_done, join_sites

from fedforest_secure.audit import (
    AuditLog,
    ModelReceipt,
    Receipt,
    verify_log,
    write_receipt,
)
from fedforest_secure.audit.replay import replay_job
from fedforest_secure.config import JobConfig
from fedforest_secure.protocol import Task
from server_app.audit_hook import open_audit
from server_app.auth import add_client
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState, TaskOffer

K = 3
JOB = "job-a"


def _run_job(root: Path, parts: list, feat: list[str], job_dir) -> tuple[Path, Path]:
    job_toml = job_dir(root / "job", parts, feat, n_clients=K)
    db = Database(f"sqlite:///{root / 'server.db'}")
    for k in range(K):
        add_client(db, f"client-{k}")
    audit = open_audit(f"sqlite:///{root / 'audit.db'}")
    state = ServerState(db, audit)
    state.create_job(load_job_spec(job_toml))
    rows, workers = join_sites(db, state, JOB, parts[:K])
    receipts = root / "receipts"
    def receipt(k: int, o: TaskOffer, task: Task, body: bytes) -> None:
        write_receipt(receipts, Receipt(JOB, task.round_id, f"client-{k}",
                                        hashlib.sha256(body).hexdigest(),
                                        str(o.audit_head), int(o.audit_seq or 0)))

    assert answer_until_done(state, JOB, rows, workers, uploaded=receipt)
    audit.close()  # type: ignore[attr-defined]
    with AuditLog(root / "audit.db", create=False) as log:
        seq, head = log.tip(JOB)
    for k in range(K):  # what each client keeps when it downloads the model
        model = state.model(rows[k], JOB)
        write_receipt(receipts, ModelReceipt(JOB, f"client-{k}",
                                             hashlib.sha256(model.encode()).hexdigest(),
                                             head, seq))
    db.dispose()
    return root / "audit.db", receipts


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory, tiny_parts, job_dir) -> tuple[Path, Path]:
    parts, feat = tiny_parts
    return _run_job(tmp_path_factory.mktemp("tail"), parts, feat, job_dir)


def _rewrite(log: AuditLog, seq: int, *, aggregate: np.ndarray | None = None,
             payload: dict[str, object] | None = None, delete: bool = False) -> None:
    """Change (or delete) entry ``seq`` and recompute every later hash, like a careful forger."""
    if not delete:
        forge(log, JOB, seq, aggregate=aggregate, payload=payload)
        return
    entries = log.entries(job_id=JOB)
    if seq != entries[-1].seq:
        raise ValueError("only the last entry is deleted here")
    with log.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_entries WHERE job_id = :j AND seq = :s"),
                     {"j": JOB, "s": seq})
        conn.execute(text("DELETE FROM audit_arrays WHERE job_id = :j AND seq = :s"),
                     {"j": JOB, "s": seq})


def _replayed_model_digest(log: AuditLog) -> str:
    """What a forger computes: the model the (forged) logged aggregates yield."""
    from fedforest_secure.audit.entry import canonical_json
    from fedforest_secure.audit.replay import _disclosures, _replay_round
    from fedforest_secure.coordinator import Coordinator

    entries = log.entries(job_id=JOB)
    created = next(e for e in entries if e.kind == "job_created").payload
    coord = Coordinator(JobConfig.from_json(canonical_json(created["config"])))
    index = {str(name): k for k, name in enumerate(created["clients"])}
    disclosed = _disclosures(log, entries, index)
    for e in entries:
        if e.kind == "round":
            assert _replay_round(log, coord, e, index, disclosed) is None
    schema = created.get("schema")  # the stored model file: the forest, schema and site names
    text = coord.result().for_job(schema if isinstance(schema, str) else None,
                                  [str(c) for c in created["clients"]]).to_json()
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture()
def copy(finished: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    db, receipts = finished
    out = tmp_path / "audit.db"
    out.write_bytes(db.read_bytes())
    return out, receipts


def test_the_honest_log_verifies_with_receipts_and_replay(copy: tuple[Path, Path]) -> None:
    db, receipts = copy
    report = verify_log(db, receipts, replay=True)
    assert report.ok, report.problems


def test_attack4_a_rewritten_last_round_and_model_entry_are_caught(
        copy: tuple[Path, Path]) -> None:
    db, receipts = copy
    with AuditLog(db, create=False) as log:
        rounds = [e for e in log.entries(job_id=JOB) if e.kind == "round"]
        last = rounds[-1]
        forged = log.array(last, "aggregate").copy()
        forged[: max(1, forged.size // 2)] *= 3.0
        _rewrite(log, last.seq, aggregate=forged)
        assert replay_job(log, JOB), "the replay sees the forged aggregate in the model"
        model = log.entries(job_id=JOB, kind="model")[0]
        _rewrite(log, model.seq, payload={"digest": _replayed_model_digest(log)})
        assert replay_job(log, JOB) == []  # the forger's log replays
    report = verify_log(db, receipts, replay=True)
    assert not report.ok, "a rewritten last round and model entry pass verify --receipts --replay"


def test_attack4_a_deleted_model_entry_is_caught(copy: tuple[Path, Path]) -> None:
    db, receipts = copy
    with AuditLog(db, create=False) as log:
        model = log.entries(job_id=JOB, kind="model")[0]
        _rewrite(log, model.seq, delete=True)
    report = verify_log(db, receipts, replay=True)
    assert not report.ok, "a log without its model entry passes verify --receipts --replay"


def test_a_member_no_receipt_in_the_directory_vouches_for_is_named_in_a_note(
        copy: tuple[Path, Path], tmp_path: Path) -> None:
    """Every site's receipts file but client-0's: the log verifies (the others' receipts pin
    its chain to the end), and a NOTE names the member the log lists in its rounds that no
    receipt in the directory is of. With every site's file there is no such note."""
    db, receipts = copy
    assert verify_log(db, receipts).notes == []
    two = tmp_path / "two-sites"
    two.mkdir()
    for k in (1, 2):
        name = f"client-{k}.jsonl"
        (two / name).write_bytes((receipts / name).read_bytes())
    report = verify_log(db, two)
    assert report.ok, report.problems
    assert report.notes == [
        f"job {JOB!r}: no receipt in {two} is of client-0, a member the log says joined or "
        "took part in its rounds: what the log says that site sent and received is the "
        "server's word only (add that site's receipts file to check it)"]
    one = tmp_path / "one-site"
    one.mkdir()
    (one / "client-2.jsonl").write_bytes((receipts / "client-2.jsonl").read_bytes())
    assert verify_log(db, one).notes == [
        f"job {JOB!r}: no receipt in {one} is of client-0, client-1, members the log says "
        "joined or took part in its rounds: what the log says those sites sent and received "
        "is the server's word only (add those sites' receipts files to check it)"]


def test_without_a_model_receipt_the_unreceipted_tail_is_named(copy: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    db, receipts = copy
    rounds_only = tmp_path / "rounds-only"
    rounds_only.mkdir()
    for path in receipts.glob("*.jsonl"):
        lines = [ln for ln in path.read_text().splitlines() if '"kind"' not in ln]
        (rounds_only / path.name).write_text("\n".join(lines) + "\n")
    report = verify_log(db, rounds_only)
    assert any("the last round" in p and "covered by no receipt" in p for p in report.problems)
    assert any("the model entry" in p and "covered by no receipt" in p
               for p in report.problems)


def test_a_model_receipt_names_a_model_the_log_does_not_hold(copy: tuple[Path, Path]) -> None:
    db, receipts = copy
    with AuditLog(db, create=False) as log:
        seq, head = log.tip(JOB)
    write_receipt(receipts, ModelReceipt(JOB, "client-9", "ab" * 32, head, seq),
                  filename="extra.jsonl")
    try:
        problems = verify_log(db, receipts).problems
    finally:
        (receipts / "extra.jsonl").unlink()
    assert len(problems) == 1 and "the client received model abababab" in problems[0]
