"""Rounds whose ``sketch_counts`` hold one count per node, as servers before per-slot counts
stored and logged them, are read back as those servers used them: the audit replay of such a
log verifies, and a restarted server resumes a job whose stored rounds hold them. An upload
with one count per node is refused, naming the upgrade.

``vectors/audit_log_node_sketch_counts.db.gz`` is the audit log (SQLite, gzipped) of an open
job (``tests/test_audit_replay.py``'s ``_run_job`` with ``test_integration_missing.py``'s
``_parts_with_holes`` and ``_job_dir_with_holes``: quantile sketches of features with missing
values) run by commit a019a9d, the last before per-slot counts.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select
from state_driver import answer_until_done, join_sites

from fedforest_secure.audit import AuditLog, verify_log
from fedforest_secure.audit.replay import replay_job
from fedforest_secure.errors import InvalidMessage
from fedforest_secure.federation import client_seed
from fedforest_secure.protocol import Task, check_disclosures, pack, unpack
from fedforest_secure.protocol.uploads import spread_node_counts
from fedforest_secure.worker import Worker
from server_app.audit_hook import NullAudit
from server_app.auth import add_client
from server_app.db import Database, JobRow, RoundRow
from server_app.jobspec import build_config, load_job_spec
from server_app.runtime import ServerState

K = 3
JOB = "job-a"
VECTOR = Path(__file__).parent / "vectors" / "audit_log_node_sketch_counts.db.gz"


def test_a_log_with_one_sketch_count_per_node_replays_and_verifies(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    db.write_bytes(gzip.decompress(VECTOR.read_bytes()))
    with AuditLog(db, create=False) as log:
        counts = [log.array(e, "data") for e in log.entries(job_id=JOB)
                  if e.kind == "disclosure" and e.payload.get("item") == "sketch_counts"]
        assert counts and all(c.ndim == 1 for c in counts)  # the old format, logged as sent
        assert replay_job(log, JOB) == []
        report = verify_log(log, replay=True)
        assert report.ok, report.problems


def _job_toml(job_dir, root: Path, parts: list, feat: list[str]) -> Path:
    """An open job whose nodes each draw 3 of the 4 features (3 slots per node)."""
    path = Path(job_dir(root, parts, feat, n_clients=K))
    path.write_text(path.read_text() + "max_features = 3\n")  # [forest] is the last table
    return path


def _sketch_task(tiny_parts, job_dir, tmp_path: Path) -> tuple[Task, dict[str, np.ndarray]]:
    """The first sketch task of an open job and a client's answer to it."""
    parts, feat = tiny_parts
    config = build_config(load_job_spec(_job_toml(job_dir, tmp_path / "job", parts, feat)))
    worker = Worker(config, *parts[0], client_index=0, seed=client_seed(config, 0))
    from fedforest_secure.coordinator import Coordinator

    task = Coordinator(config).next_task()
    assert task is not None and "sketch_points" in task.disclose
    return task, dict(worker.handle(task).disclosed)


def test_one_count_per_node_is_spread_across_the_slots_and_refused_in_an_upload(
        tiny_parts, job_dir, tmp_path: Path) -> None:
    task, disclosed = _sketch_task(tiny_parts, job_dir, tmp_path)
    rows, m = task.arrays["features"].shape
    assert m == 3
    assert disclosed["sketch_counts"].shape == (rows, m)
    node = disclosed["sketch_counts"][:, 0].copy()  # no missing values: every slot the same
    old = {**disclosed, "sketch_counts": node}
    with pytest.raises(InvalidMessage) as err:
        check_disclosures(old, task)
    assert str(err.value) == (
        "disclosed item 'sketch_counts' holds one count per node, as clients of fedforest "
        "versions before per-slot sketch counts send; it must be one per node and slot, of "
        f"shape {(rows, m)}: upgrade the site's fedforest to the server's version")
    spread = spread_node_counts(old, task)
    np.testing.assert_array_equal(spread["sketch_counts"], disclosed["sketch_counts"])
    check_disclosures(spread, task)
    assert spread_node_counts(disclosed, task) is disclosed


def _sketched_rounds(db: Database) -> list[RoundRow]:
    with db.session() as s:
        return [rr for rr in s.scalars(select(RoundRow).where(RoundRow.job_id == JOB))
                if rr.disclosed_blob and any(n.endswith("/sketch_counts")
                                             for n in unpack(rr.disclosed_blob)[1])]


def _run(root: Path, parts: list, feat: list[str], job_dir, *, restart: bool) -> str:
    """The job's model, run straight through, or with a restart once two sketch rounds are
    closed whose stored counts are then rewritten to one per node (the old format)."""
    root.mkdir()
    db = Database(f"sqlite:///{root / 'server.db'}")
    for k in range(K):
        add_client(db, f"client-{k}")
    state = ServerState(db, NullAudit())
    state.create_job(load_job_spec(_job_toml(job_dir, root / "job", parts, feat)))
    rows, workers = join_sites(db, state, JOB, parts[:K])
    if restart:
        assert not answer_until_done(state, JOB, rows, workers,
                                     stop=lambda: len(_sketched_rounds(db)) >= 2)
        with db.session() as s:
            for rr in s.scalars(select(RoundRow).where(RoundRow.job_id == JOB)):
                if not rr.disclosed_blob:
                    continue
                head, arrays = unpack(rr.disclosed_blob)
                rr.disclosed_blob = pack(head, {
                    n: a[:, 0].copy() if n.endswith("/sketch_counts") else a
                    for n, a in arrays.items()})
        assert all(a.ndim == 1 for rr in _sketched_rounds(db)
                   for n, a in unpack(rr.disclosed_blob)[1].items()
                   if n.endswith("/sketch_counts"))
        state = ServerState(db, NullAudit())  # a new process: the job is rebuilt
    assert answer_until_done(state, JOB, rows, workers)
    with db.session() as s:
        assert s.get(JobRow, JOB).status == "done"
    model = state.model(rows[0], JOB)
    db.dispose()
    return model


def test_a_restarted_server_resumes_rounds_stored_with_one_count_per_node(
        tiny_parts, job_dir, tmp_path: Path) -> None:
    parts, feat = tiny_parts
    straight = _run(tmp_path / "a", parts, feat, job_dir, restart=False)
    assert _run(tmp_path / "b", parts, feat, job_dir, restart=True) == straight
