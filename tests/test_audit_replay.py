"""``verify_log(replay=True)``: a server's log binds each task by its digest, and replaying the
logged aggregates through the coordinator must reproduce every task digest and the model.

A full job runs through :class:`~server_app.runtime.ServerState` in process (open profile, so
the rounds carry disclosed sketches too), then forged logs are checked: a careful forger who
rewrites an aggregate (or a task digest) and re-hashes the rest of the chain passes the plain
chain check but not the replay.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from audit_forgery import forge
from sqlalchemy import text
from state_driver import answer_until_done, join_sites

from fedforest_secure.audit import AuditLog, Entry, verify_log
from fedforest_secure.audit.replay import replay_job
from server_app.audit_hook import open_audit
from server_app.auth import add_client
from server_app.db import Database
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

K = 3
JOB = "job-a"


def _run_job(root: Path, parts: list, feat: list[str], job_dir) -> Path:
    """Run the whole job against the server state (no HTTP); returns the audit database."""
    job_toml = job_dir(root / "job", parts, feat, n_clients=K)
    db = Database(f"sqlite:///{root / 'server.db'}")
    for k in range(K):
        add_client(db, f"client-{k}")
    audit = open_audit(f"sqlite:///{root / 'audit.db'}")
    state = ServerState(db, audit)
    state.create_job(load_job_spec(job_toml))
    rows, workers = join_sites(db, state, JOB, parts[:K])
    assert answer_until_done(state, JOB, rows, workers)
    audit.close()  # type: ignore[attr-defined]
    db.dispose()
    return root / "audit.db"


@pytest.fixture(scope="module")
def job_log(tmp_path_factory: pytest.TempPathFactory, tiny_parts, job_dir) -> Path:
    parts, feat = tiny_parts
    return _run_job(tmp_path_factory.mktemp("replay"), parts, feat, job_dir)


@pytest.fixture()
def log(job_log: Path, tmp_path: Path) -> Iterator[AuditLog]:
    copy = tmp_path / "audit.db"
    copy.write_bytes(job_log.read_bytes())
    with AuditLog(copy, create=False) as opened:
        yield opened


def _rounds(log: AuditLog) -> list[Entry]:
    return [e for e in log.entries(job_id=JOB) if e.kind == "round"]


def test_a_servers_log_replays_and_keeps_tasks_as_digests(log: AuditLog) -> None:
    rounds = _rounds(log)
    assert len(rounds) > 3
    assert all(set(e.arrays) == {"aggregate"} for e in rounds)  # no task arrays stored
    assert all(e.payload["task_arrays"] for e in rounds)        # described, bound by digest
    created = log.entries(job_id=JOB, kind="job_created")[0].payload
    assert created["clients"] == [f"client-{k}" for k in range(K)] and created["config"]
    assert replay_job(log, JOB) == []
    report = verify_log(log, replay=True)
    assert report.ok, report.problems


def _forge(log: AuditLog, seq: int, *, aggregate: np.ndarray | None = None,
           payload: dict[str, object] | None = None) -> None:
    forge(log, JOB, seq, aggregate=aggregate, payload=payload)


def test_a_rewritten_aggregate_is_caught_by_the_replay(log: AuditLog) -> None:
    rounds = _rounds(log)
    first = rounds[0]
    forged = log.array(first, "aggregate").copy()
    forged[: max(1, forged.size // 2)] *= 1.5  # other sums: other candidates and splits
    _forge(log, first.seq, aggregate=forged)
    assert verify_log(log).ok  # the chain alone is consistent again
    problems = verify_log(log, replay=True).problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"job {JOB!r} replay: job {JOB!r} seq ")
    assert "does not follow from the logged configuration and the aggregates" in problems[0] \
        or "the model the logged aggregates yield" in problems[0]


def test_a_task_digest_the_rules_do_not_produce_is_named(log: AuditLog) -> None:
    target = _rounds(log)[2]
    _forge(log, target.seq, payload={"task_digest": hashlib.sha256(b"other").hexdigest()})
    assert verify_log(log).ok
    problems = replay_job(log, JOB)
    assert problems == [
        f"job {JOB!r} replay: {target.label}: round {target.round_id}'s task does not follow "
        "from the logged configuration and the aggregates before it (replayed round "
        f"{target.round_id}, digest {target.payload['task_digest'][:16]}..., logged "
        f"{hashlib.sha256(b'other').hexdigest()[:16]}...)"]


def test_a_forged_model_digest_is_named(log: AuditLog) -> None:
    model = log.entries(job_id=JOB, kind="model")[0]
    _forge(log, model.seq, payload={"digest": "0" * 64})
    problems = replay_job(log, JOB)
    assert len(problems) == 1 and "the model the logged aggregates yield" in problems[0]


def test_a_log_without_the_configuration_cannot_be_replayed(log: AuditLog) -> None:
    created = log.entries(job_id=JOB, kind="job_created")[0]
    body = {k: v for k, v in created.payload.items() if k != "config"}
    # an entry without the configuration (its hash left stale: not the point here)
    with log.engine.begin() as conn:
        conn.execute(text("UPDATE audit_entries SET payload = :pl WHERE job_id = :j AND "
                          "seq = :s"), {"pl": json.dumps(body, sort_keys=True,
                                                         separators=(",", ":")),
                                        "j": JOB, "s": created.seq})
    problems = replay_job(log, JOB)
    assert len(problems) == 1 and "cannot replay" in problems[0]


@pytest.mark.parametrize("profile", ["open", ["secure"], 3])
def test_a_configuration_whose_profile_is_no_mapping_does_not_load(log: AuditLog,
                                                                   profile: object) -> None:
    created = log.entries(job_id=JOB, kind="job_created")[0]
    _forge(log, created.seq, payload={"config": {**created.payload["config"],
                                                 "profile": profile}})
    assert verify_log(log).ok  # the chain alone is consistent again
    assert verify_log(log, replay=True).problems == [
        f"job {JOB!r} replay: {created.label}: the configuration does not load (profile must "
        f"be a mapping of the profile's sections, not a {type(profile).__name__})"]


def test_a_forged_split_decision_is_named_by_the_replay(log: AuditLog) -> None:
    """`audit show` displays the logged split decisions: a split rewritten with the chain
    re-hashed (another feature and threshold) is not the decision the coordinator takes on the
    logged sums."""
    split = log.entries(job_id=JOB, kind="split")[0]
    splits = [dict(s) for s in split.payload["splits"]]
    splits[0]["feature"], splits[0]["threshold"] = 0, 1.0
    if split.payload["splits"][0].get("feature") == 0:
        splits[0]["feature"] = 1
    _forge(log, split.seq, payload={"splits": splits})
    assert verify_log(log).ok  # the chain alone is consistent again
    problems = replay_job(log, JOB)
    assert len(problems) == 1 and problems[0].endswith(
        "the logged split decisions are not the ones the coordinator takes on the logged sums")


def test_an_evaluation_result_stored_before_results_named_their_classes_still_replays() -> None:
    """An older server stored an evaluation's result without its ``classes`` list; the
    replay takes that text (the same numbers) as well as today's, and nothing else."""
    import dataclasses
    from types import SimpleNamespace

    from fedforest_secure import FedForestClassifier
    from fedforest_secure.audit.replay import _check_model
    from fedforest_secure.evaluation import EvalSpec
    from fedforest_secure.evaluation.coordinator import EvalCoordinator
    from fedforest_secure.evaluation.inprocess import eval_config, evaluate_in_process
    from fedforest_secure.privacy import load_profile

    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(90, 2)), np.arange(90) % 3
    model = FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(
        X, y, client=np.arange(90) % 3).model_
    model = dataclasses.replace(model, classes=["b", "a", "c"])
    config = eval_config("ev", EvalSpec(models=(model.to_json(),)), task="classification",
                         n_features=2, n_clients=3, n_classes=3,
                         profile=load_profile("open").to_dict())
    sites = [(X[k::3], y[k::3]) for k in range(3)]
    result = evaluate_in_process(config, sites)
    assert result.classes == ["b", "a", "c"]
    coord = EvalCoordinator(config)
    coord._result, coord._pending = result, None  # the state after the logged round

    def entry(text: str) -> SimpleNamespace:
        return SimpleNamespace(label="model entry",
                               payload={"digest": hashlib.sha256(text.encode()).hexdigest()})

    old = json.loads(result.to_json())
    del old["classes"]
    old_text = json.dumps(old, sort_keys=True, allow_nan=False)
    assert _check_model(coord, entry(result.to_json()), None, []) == []
    assert _check_model(coord, entry(old_text), None, []) == []
    old["models"][0]["metrics"]["accuracy"] = 0.5
    forged = _check_model(coord, entry(json.dumps(old, sort_keys=True)), None, [])
    assert len(forged) == 1 and "the model the logged aggregates yield has digest" in forged[0]
