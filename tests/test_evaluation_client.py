"""The site's side of evaluation jobs: which table it scores, and its ledger against a server
that re-asks an evaluation over fewer sites in a second job (differencing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from client_app.evaluation import site_worker
from client_app.runner import ClientOptions, run_client
from fedforest_secure import FedForestClassifier
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError, RefusedRequest
from fedforest_secure.evaluation import EvalSpec
from fedforest_secure.evaluation.coordinator import EvalCoordinator
from fedforest_secure.evaluation.encoding import decode_statistics
from fedforest_secure.evaluation.inprocess import eval_config
from fedforest_secure.evaluation.noise import config_layout
from fedforest_secure.evaluation.worker import EvalWorker
from fedforest_secure.privacy import load_profile
from fedforest_secure.secure_sum import RingAggregator


@pytest.fixture(scope="module")
def setting() -> dict[str, Any]:
    X, y = load_breast_cancer(return_X_y=True)
    model = FedForestClassifier(n_estimators=3, max_depth=3, random_state=0).fit(
        X[:300], y[:300]).model_
    rng = np.random.default_rng(2)
    site = rng.integers(0, 4, size=len(y) - 300)
    sites = [(X[300:][site == k], y[300:][site == k]) for k in range(4)]
    return {"spec": EvalSpec(models=(model.to_json(),)), "sites": sites}


def _config(spec: EvalSpec, job: str, n: int) -> JobConfig:
    return eval_config(job, spec, task="classification", n_features=30, n_clients=n,
                       n_classes=2, profile=load_profile("secure").to_dict())


def _secure_sum(config: JobConfig, workers: list[Any]) -> dict[str, np.ndarray]:
    task = EvalCoordinator(config).next_task()
    assert task is not None
    total = RingAggregator(config).aggregate(task, {k: w.handle(task)
                                                    for k, w in enumerate(workers)})
    return decode_statistics(config_layout(config), total, dp=False)


def test_a_site_refuses_to_be_isolated_by_a_second_evaluation_over_fewer_sites(
        setting: dict[str, Any], tmp_path: Path) -> None:
    spec, sites = setting["spec"], setting["sites"]
    job_a, job_b = _config(spec, "eval-a", 4), _config(spec, "eval-b", 3)
    # the attack: the same model over the 4 sites, then over 3 of them, in a second job; the
    # difference of the two sums is site 3's own statistics
    a = _secure_sum(job_a, [EvalWorker(job_a, *s) for s in sites])
    b = _secure_sum(job_b, [EvalWorker(job_b, *s) for s in sites[:3]])
    own = EvalWorker(job_a, *sites[3]).statistics()
    for name, arr in own.items():
        np.testing.assert_allclose(a[name] - b[name], arr, atol=1e-9)
    # the defence: each site's ledger (its state directory) remembers that it scored this
    # model on these rows in job A, and refuses job B before anything leaves the site
    states = [tmp_path / f"site-{k}" for k in range(4)]
    for d in states:
        d.mkdir()
    _secure_sum(job_a, [site_worker(job_a, k, None, s, states[k])
                        for k, s in enumerate(sites)])
    with pytest.raises(RefusedRequest, match="already scored it on in job 'eval-a'") as exc:
        _secure_sum(job_b, [site_worker(job_b, k, None, s, states[k])
                            for k, s in enumerate(sites[:3])])
    assert exc.value.code == "evaluated_before"  # the words that reach the operator
    # job A itself may be answered again (a restarted client of the same job)
    _secure_sum(job_a, [site_worker(job_a, k, None, s, states[k])
                        for k, s in enumerate(sites)])
    # other held-out rows are another question
    more = [(np.vstack([X, X[:1]]), np.concatenate([y, y[:1]])) for X, y in sites[:3]]
    _secure_sum(job_b, [site_worker(job_b, k, None, s, states[k])
                        for k, s in enumerate(more)])


def test_the_same_forest_in_another_file_cannot_isolate_a_site_either(
        setting: dict[str, Any], tmp_path: Path) -> None:
    """The server re-formats the model file and changes what predictions do not use (its
    meta): another file digest, the same forest. Over fewer sites the second job would
    isolate site 3 again; each site refuses it, since it would send the same statistics for
    the model as in the first job."""
    import json as _json

    spec, sites = setting["spec"], setting["sites"]
    doc = _json.loads(spec.models[0])
    doc["meta"] = {**doc.get("meta", {}), "note": "the same forest"}
    disguised = EvalSpec(models=(_json.dumps(doc, indent=1),))
    assert disguised.digests != spec.digests
    job_a, job_b = _config(spec, "eval-a", 4), _config(disguised, "eval-b", 3)
    states = [tmp_path / f"site-{k}" for k in range(4)]
    for d in states:
        d.mkdir()
    _secure_sum(job_a, [site_worker(job_a, k, None, s, states[k])
                        for k, s in enumerate(sites)])
    with pytest.raises(RefusedRequest, match="statistics of a model on these held-out rows "
                                             "that it already sent in job 'eval-a'") as exc:
        _secure_sum(job_b, [site_worker(job_b, k, None, s, states[k])
                            for k, s in enumerate(sites[:3])])
    assert exc.value.code == "evaluated_before"
    # job A answered again (a restarted client) is no repeat
    _secure_sum(job_a, [site_worker(job_a, k, None, s, states[k])
                        for k, s in enumerate(sites)])


def test_a_site_needs_the_table_its_jobs_kind_scores(setting: dict[str, Any],
                                                     tmp_path: Path) -> None:
    config = _config(setting["spec"], "eval-a", 4)
    with pytest.raises(FedForestError, match="--eval-data"):
        site_worker(config, 0, setting["sites"][0], None, tmp_path)
    training = JobConfig(job_id="t", task="classification", n_features=30, n_clients=4,
                         n_classes=2, criterion="gini")
    with pytest.raises(FedForestError, match="--data"):
        site_worker(training, 0, None, setting["sites"][0], tmp_path)
    opts = ClientOptions(server="https://127.0.0.1:1", token="t", job="j", data=None,
                         schema=tmp_path / "schema.toml", ca=None)
    with pytest.raises(FedForestError, match="--eval-data"):
        run_client(opts)


def test_a_site_that_scored_the_model_before_declines_the_job_before_joining(
        tmp_path: Path) -> None:
    """Under every profile (open included, where no round can be refused) a site whose ledger
    already holds one of the job's models on the same held-out rows declines the job before
    joining, telling the server the code `evaluated_before`, so the other sites never wait
    out a round's deadline for it."""
    import dataclasses
    import io
    import json

    import tomli_w

    from client_app import runner
    from client_app.evaluation import EvalLedger, table_digest
    from client_app.log import SiteLog
    from client_app.state import ClientState

    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, size=(60, 2))
    y = np.clip(X[:, 0] + 0.1 * rng.normal(size=60), -1, 1)
    model = FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(
        X, (y > 0).astype(int), client=np.arange(60) % 3).model_
    spec = EvalSpec(models=(model.to_json(),))
    cfg = dataclasses.replace(
        eval_config("ev-2", spec, task="classification", n_features=2, n_clients=3,
                    n_classes=2, profile=load_profile("open").to_dict()),
        feature_bounds=((-1.0, 1.0),) * 2, target_bound=1.0)
    schema = {"features": [{"name": f"x{j}", "kind": "continuous", "bounds": [-1.0, 1.0]}
                           for j in range(2)],
              "target": {"name": "y", "kind": "classification", "classes": ["0", "1"]}}
    (tmp_path / "s.toml").write_text(tomli_w.dumps(schema))
    held = (X, (y > 0).astype(int))
    state = ClientState(tmp_path / "state")
    EvalLedger(state.root).check_and_record("ev-1", spec.digests, table_digest(*held))

    sent: list[tuple[str, str, object]] = []

    class Offering:
        def get_json(self, path: str, params: object = None) -> object:
            sent.append(("GET", path, None))
            return {"job_id": "ev-2", "client_index": 0, "client_name": "site-0",
                    "config": json.loads(cfg.to_json()), "status": "waiting"}

        def post_json(self, path: str, body: object = None) -> object:
            sent.append(("POST", path, body))
            return {"status": "declined"}

    opts = ClientOptions(server="https://fedforest.example.org", token="t", job="ev-2",
                         data=None, eval_data=tmp_path / "held.csv", schema=tmp_path / "s.toml",
                         ca=None, state_dir=state.root, quiet=True)
    with pytest.raises(RefusedRequest, match="already scored it on in job 'ev-1'"):
        runner._run(opts, Offering(), state, None, None,  # type: ignore[arg-type]
                    SiteLog(stream=io.StringIO()), None, held)
    assert sent[1:] == [("POST", "/v1/jobs/ev-2/decline", {"reason": "evaluated_before"})]


_RECORD = """\
import sys
from client_app.evaluation import EvalLedger
root, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ledger = EvalLedger(root)
for i in range(n):
    if who == "a":  # one job's line, rewritten with each of its statistics
        ledger.check_and_record("ev-a", ("m-a",), "rows", statistics=(f"s{i}",))
    else:  # a new job's line each time
        ledger.check_and_record(f"ev-b{i}", (f"m-b{i}",), "rows")
"""


def test_two_evaluation_clients_recording_at_once_lose_no_line_of_the_ledger(
        tmp_path: Path) -> None:
    """Two clients of evaluation jobs share the site's state directory: one rewrites its
    job's line while the other appends new ones; no job's line is lost (a lost line would let
    a later job score that model on those rows again)."""
    import json
    import subprocess
    import sys

    from fedforest_cli.sim_processes import child_env

    n = 150
    procs = [subprocess.Popen([sys.executable, "-c", _RECORD, str(tmp_path), who, str(n)],
                              env=child_env()) for who in ("a", "b")]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    lines = (tmp_path / "evaluations.jsonl").read_text().splitlines()
    jobs = sorted(json.loads(line)["job"] for line in lines)
    assert jobs == sorted(["ev-a"] + [f"ev-b{i}" for i in range(n)])
