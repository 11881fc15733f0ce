"""A job the database already holds is read as it was stored: the job file's limits and strict
types (create-job's) never stop a stored job from being joined or finishing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sqlalchemy import select
from state_driver import answer_until_done, join_sites

from server_app.audit_hook import NullAudit
from server_app.auth import add_client
from server_app.db import Database, JobRow
from server_app.jobspec import MAX_RANDOM_STATE, load_job_spec
from server_app.runtime import ServerState

K = 3
JOB = "job-a"
SEED = 2**40  # an earlier version took any random_state >= 0


def _store_as_an_earlier_version_did(db: Database) -> None:
    """The job's stored spec and configuration with a random_state create-job now refuses,
    written into the database's JSON as the earlier version wrote them."""
    with db.session() as sess:
        job = sess.scalar(select(JobRow).where(JobRow.id == JOB))
        assert job is not None
        spec, config = json.loads(job.spec_json), json.loads(job.config_json)
        spec["forest"]["random_state"] = config["random_state"] = SEED
        job.spec_json, job.config_json = json.dumps(spec), json.dumps(config)
        sess.commit()


def test_a_stored_job_past_the_job_files_limits_is_joined_and_finishes(
        tmp_path: Path, tiny_parts, job_dir) -> None:  # type: ignore[no-untyped-def]
    assert SEED > MAX_RANDOM_STATE
    parts, feat = tiny_parts
    job_toml = job_dir(tmp_path / "job", parts, feat, n_clients=K)
    db = Database(f"sqlite:///{tmp_path / 'server.db'}")
    for k in range(K):
        add_client(db, f"client-{k}")
    state = ServerState(db, NullAudit())
    state.create_job(load_job_spec(job_toml))
    _store_as_an_earlier_version_did(db)
    schema = (job_toml.parent / "schema.toml").read_text(encoding="utf-8")

    rows, workers = join_sites(db, state, JOB, parts[:K])
    info = state.join(rows[0], JOB)  # a re-join reads the stored spec again
    assert info["config"]["random_state"] == SEED
    assert info["schema_sha256"] == hashlib.sha256(schema.encode()).hexdigest()
    assert answer_until_done(state, JOB, rows, workers)
    model = json.loads(state.model(rows[0], JOB))
    assert model["feature_names"] == feat
    db.dispose()
