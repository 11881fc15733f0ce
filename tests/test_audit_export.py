"""Exports round-trip; views tell a secure job (sums only) from an open one (plaintext seen)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import numpy as np
import pytest
from rich.console import Console

from fedforest_secure.audit import (
    AuditLog,
    contains_per_client_plaintext,
    export_csv,
    export_jsonl,
    import_jsonl,
    read_csv,
    render_tables,
    summarize_array,
    upload_digest,
    verify_entries,
    verify_log,
)
from fedforest_secure.errors import AuditError
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind


def run_job(log: AuditLog, job_id: str, *, secure: bool) -> None:
    """Two rounds; the open job also discloses per-client sketches, as the paper's profile does."""
    rec = log.job(job_id)
    rec.job_created(schema={"features": ["x", "z"]}, hyperparameters={"max_depth": 2},
                    profile={"name": "secure" if secure else "open"})
    for c in ("a", "b", "c"):
        rec.client_joined(c)
    layout = (Block("totals", (1, 2), (StatKind.COUNT, StatKind.SUM)),)
    for r in (0, 1):
        task = Task(job_id=job_id, round_id=r, kind=TaskKind.SKETCH, level=r, layout=layout,
                    disclose=() if secure else ("sketch",))
        uploads = {c: upload_digest(f"{job_id}{c}{r}".encode()) for c in ("a", "b", "c")}
        rec.round(task, uploads=uploads, aggregate=np.array([30.0, -4.5]), masked=secure)
        if not secure:
            for c in ("a", "b", "c"):
                rec.disclosure(client=c, item="sketch", data=np.linspace(0, 1, 5), round_id=r)
    rec.abstained(count=1, round_id=1)
    rec.client_dropped("c", round_id=1, reason="deadline")
    rec.model(digest="ef" * 32, n_trees=1)


@pytest.fixture
def log() -> Iterator[AuditLog]:
    log = AuditLog.in_memory()
    run_job(log, "secure-job", secure=True)
    run_job(log, "open-job", secure=False)
    yield log
    log.close()


def test_jsonl_round_trips_into_a_fresh_log(log: AuditLog) -> None:
    buf = io.StringIO()
    assert export_jsonl(log, buf) == len(log.entries())
    with AuditLog.in_memory() as copy:
        assert import_jsonl(copy, io.StringIO(buf.getvalue())) == len(log.entries())
        strip = [e.__class__(**{**e.__dict__, "row_id": None}) for e in log.entries()]
        assert [e.__class__(**{**e.__dict__, "row_id": None}) for e in copy.entries()] == strip
        for e in copy.entries():
            assert copy.stored_arrays(e.job_id, e.seq) == log.stored_arrays(e.job_id, e.seq)
        assert verify_log(copy).ok
        again = io.StringIO()
        export_jsonl(copy, again)
        assert again.getvalue() == buf.getvalue()


def test_jsonl_of_one_job(log: AuditLog) -> None:
    buf = io.StringIO()
    export_jsonl(log, buf, "secure-job")
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert {x["job_id"] for x in lines} == {"secure-job"}
    assert lines[0]["format"] == "fedforest-audit/1" and lines[0]["seq"] == 1


def test_import_checks_every_entry(log: AuditLog) -> None:
    buf = io.StringIO()
    export_jsonl(log, buf, "secure-job")
    lines = buf.getvalue().splitlines()
    tampered = json.loads(lines[4])
    tampered["payload"]["clients"] = ["a", "b"]
    with AuditLog.in_memory() as copy, pytest.raises(AuditError, match="seq 5"):
        import_jsonl(copy, [*lines[:4], json.dumps(tampered)])
    with pytest.raises(AuditError, match="does not extend"):
        import_jsonl(log, lines[:1])  # already there
    with AuditLog.in_memory() as copy, pytest.raises(AuditError, match="does not extend"):
        import_jsonl(copy, lines[1:])  # gap at the start
    no_arrays = io.StringIO()
    export_jsonl(log, no_arrays, "secure-job", include_arrays=False)
    with AuditLog.in_memory() as copy, pytest.raises(AuditError, match="array"):
        import_jsonl(copy, no_arrays.getvalue().splitlines())
    with AuditLog.in_memory() as copy, pytest.raises(AuditError, match="line 1"):
        import_jsonl(copy, ["{not json"])


def test_csv_round_trips_and_can_be_verified_alone(log: AuditLog) -> None:
    buf = io.StringIO()
    assert export_csv(log, buf) == len(log.entries())
    back = read_csv(io.StringIO(buf.getvalue()))
    assert [e.__dict__ | {"row_id": None} for e in log.entries()] == \
        [e.__dict__ for e in back]
    assert verify_entries(back).ok
    forged = buf.getvalue().replace('"count"":1', '"count"":0')
    assert forged != buf.getvalue()
    problems = verify_entries(read_csv(io.StringIO(forged))).problems
    assert any("(abstained): hash mismatch" in p for p in problems)
    with pytest.raises(AuditError, match="columns"):
        read_csv(io.StringIO("a,b\n1,2\n"))


def test_secure_job_shows_only_digests_and_sums(log: AuditLog) -> None:
    assert contains_per_client_plaintext(log, "secure-job") == []
    rounds = log.entries(job_id="secure-job", kind="round")
    for e in rounds:
        assert set(e.arrays) == {"aggregate"}  # the sum only; uploads appear as digests
        assert all(len(d) == 64 for d in e.payload["uploads"].values())


def test_open_job_shows_per_client_plaintext(log: AuditLog) -> None:
    seen = contains_per_client_plaintext(log, "open-job")
    kinds = [e.kind for e in seen]
    assert kinds.count("disclosure") == 6 and kinds.count("round") == 2
    first = next(e for e in seen if e.kind == "disclosure")
    np.testing.assert_array_equal(log.array(first, "data"), np.linspace(0, 1, 5))
    with pytest.raises(AuditError):
        contains_per_client_plaintext(log, "nope")


def _render(log: AuditLog, **kw: object) -> str:
    console = Console(width=200, record=True)
    for table in render_tables(log, **kw):  # type: ignore[arg-type]
        console.print(table)
    return console.export_text()


def test_show_renders_what_the_server_saw(log: AuditLog) -> None:
    secure = _render(log, job_id="secure-job")
    assert "masked uploads, sum only" in secure and "no per-client plaintext" in secure
    assert "size=2 min=-4.5 max=30 sum=25.5" in secure and "totals(1, 2)" in secure
    assert "PLAINTEXT" not in secure
    opened = _render(log, job_id="open-job", round_id=1)
    assert "PER-CLIENT PLAINTEXT: sketch" in opened and "PLAINTEXT uploads" in opened
    assert "4 entries with per-client plaintext" in opened


def test_summaries() -> None:
    assert str(summarize_array(np.zeros(0))) == "size=0"
    s = summarize_array(np.array([[1, 2], [3, 4]]))
    assert (s.size, s.minimum, s.maximum, s.total) == (4, 1.0, 4.0, 10.0)


def test_show_gives_each_entry_its_time(log: AuditLog) -> None:
    """When a site dropped or a round closed: each row carries its entry's timestamp (UTC, to
    the second), as the export does."""
    entries = log.entries(job_id="secure-job")
    shown = _render(log, job_id="secure-job")
    assert "time (UTC)" in shown
    for e in entries:
        assert e.timestamp[:19].replace("T", " ") in shown
