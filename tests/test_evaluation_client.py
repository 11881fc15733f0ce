"""The site's side of evaluation jobs: which table it scores, and its ledger against a server
that re-asks an evaluation over fewer sites in a second job (differencing), deciding from facts
that do not depend on the site's rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from client_app.evaluation import EvalLedger, LedgeredEvalWorker, site_worker
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


def _ledgered(config: JobConfig, k: int, rows: tuple[np.ndarray, np.ndarray],
              state: Path, *, again: bool = False) -> LedgeredEvalWorker:
    """Site ``k``'s client of an evaluation job, with its ledger in ``state`` (``again``: the
    site's ``--evaluate-again``)."""
    worker = site_worker(config, k, None, rows, state, evaluate_again=again)
    assert isinstance(worker, LedgeredEvalWorker)
    return worker


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
    # a restarted client of job A passes the check before joining (it then leaves the secure
    # round it answered: its round keys died)
    for k, s in enumerate(sites):
        _ledgered(job_a, k, s, states[k]).check()
    # other held-out rows are another question
    more = [(np.vstack([X, X[:1]]), np.concatenate([y, y[:1]])) for X, y in sites[:3]]
    _secure_sum(job_b, [site_worker(job_b, k, None, s, states[k])
                        for k, s in enumerate(more)])


def test_the_same_forest_in_another_file_cannot_isolate_a_site_either(
        setting: dict[str, Any], tmp_path: Path) -> None:
    """The server re-formats the model file and changes what predictions do not use (its
    meta): another file digest, the same forest. Over fewer sites the second job would
    isolate site 3 again; each site refuses it, since it already answered an evaluation on
    its rows."""
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
    with pytest.raises(RefusedRequest, match="another evaluation of the held-out rows this "
                                             "site already answered in job 'eval-a'") as exc:
        _secure_sum(job_b, [site_worker(job_b, k, None, s, states[k])
                            for k, s in enumerate(sites[:3])])
    assert exc.value.code == "evaluated_before"
    # a restarted client of job A is no repeat before it joins
    for k, s in enumerate(sites):
        _ledgered(job_a, k, s, states[k]).check()


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
    """Under secure aggregation a site whose ledger already holds one of the job's models on
    the same held-out rows declines the job before joining, telling the server the code
    `evaluated_before`, so the other sites never wait out a round's deadline for it."""
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
                    n_classes=2, profile=load_profile("secure").to_dict()),
        feature_bounds=((-1.0, 1.0),) * 2, target_bound=1.0)
    schema = {"features": [{"name": f"x{j}", "kind": "continuous", "bounds": [-1.0, 1.0]}
                           for j in range(2)],
              "target": {"name": "y", "kind": "classification", "classes": ["0", "1"]}}
    (tmp_path / "s.toml").write_text(tomli_w.dumps(schema))
    held = (X, (y > 0).astype(int))
    state = ClientState(tmp_path / "state")
    EvalLedger(state.root).check_and_record("ev-1", spec.digests, table_digest(*held),
                                            evaluation="e-1", resumed=False)

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
    if who == "a":  # one job's line, rewritten each time (a retried round)
        ledger.check_and_record("ev-a", ("m-a",), "rows", evaluation="e-a", resumed=True,
                                again=True)
    else:  # a new job's line each time
        ledger.check_and_record(f"ev-b{i}", (f"m-b{i}",), "rows", evaluation=f"e-b{i}",
                                resumed=False, again=True)
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


# --- the same per-site sums asked again by a job that is not byte-for-byte the first one ---

def _variant(text: str, *, reverse: bool = False, constant_tree: bool = False) -> str:
    """Another file for the same forest: its trees reversed, or one constant tree
    ([0.5, 0.5]) appended (every class decision unchanged)."""
    import json as _json

    doc = _json.loads(text)
    if reverse:
        doc["trees"] = doc["trees"][::-1]
    if constant_tree:
        t0 = doc["trees"][0]
        leaf = {k: ([v[0]] if isinstance(v, list) else v) for k, v in t0.items()}
        leaf.update(feature=[-1], left=[-1], right=[-1], kind=[0], missing_left=[False],
                    threshold=[0.0], gain=[0.0], value=[[0.5, 0.5]], n=[1.0],
                    impurity=[0.0], sets={})
        doc["trees"].append(leaf)
    return _json.dumps(doc, indent=2)


def _isolated_blocks(job_a: JobConfig, job_b: JobConfig, sites: list[Any],
                     model_b: int = 0) -> list[str]:
    """Without ledgers: the blocks of site 3's statistics that (job A over the 4 sites) -
    (job B over sites 0-2) gives to a millionth."""
    a = _secure_sum(job_a, [EvalWorker(job_a, *s) for s in sites])
    b = _secure_sum(job_b, [EvalWorker(job_b, *s) for s in sites[:3]])
    own = EvalWorker(job_a, *sites[3]).statistics()
    return [n for n, arr in own.items() if b[n][model_b].shape == arr[0].shape
            and np.allclose(a[n][0] - b[n][model_b], arr[0], rtol=1e-6, atol=1e-9)]


def _second_job_refused(job_a: JobConfig, job_b: JobConfig, sites: list[Any],
                        tmp_path: Path) -> RefusedRequest:
    """With each site's ledger: job A over the 4 sites, then job B over sites 0-2 is refused
    (before anything leaves a site, and in the round), as another evaluation of rows each site
    answered job A on."""
    states = [tmp_path / f"site-{k}" for k in range(4)]
    for d in states:
        d.mkdir()
    _secure_sum(job_a, [site_worker(job_a, k, None, s, states[k])
                        for k, s in enumerate(sites)])
    for k, s in enumerate(sites[:3]):  # each site declines before it joins
        worker = site_worker(job_b, k, None, s, states[k])
        assert isinstance(worker, LedgeredEvalWorker)
        with pytest.raises(RefusedRequest):
            worker.check()
    with pytest.raises(RefusedRequest) as exc:
        _secure_sum(job_b, [site_worker(job_b, k, None, s, states[k])
                            for k, s in enumerate(sites[:3])])
    assert exc.value.code == "evaluated_before"
    assert "another evaluation of the held-out rows this site already answered in job " \
        "'eval-a' (a site answers one evaluation job per held-out set)" in str(exc.value)
    return exc.value


@pytest.fixture(scope="module")
def ten_trees(setting: dict[str, Any]) -> str:
    """A forest whose trees summed in reverse order differ in the last bits."""
    X, y = load_breast_cancer(return_X_y=True)
    text: str = FedForestClassifier(n_estimators=10, max_depth=4, random_state=1).fit(
        X[:300], y[:300]).model_.to_json()
    return text


def test_the_same_forest_with_its_trees_reversed_cannot_isolate_a_site(
        setting: dict[str, Any], ten_trees: str, tmp_path: Path) -> None:
    """Its statistics differ from the first file's by rounding only (the trees' outputs are
    summed in another order), and its file digest differs: the site refuses it all the same,
    as a second evaluation of its rows."""
    sites = setting["sites"]
    spec_a = EvalSpec(models=(ten_trees,))
    spec_b = EvalSpec(models=(_variant(ten_trees, reverse=True),))
    own_a = EvalWorker(_config(spec_a, "a", 4), *sites[0]).statistics()
    own_b = EvalWorker(_config(spec_b, "b", 4), *sites[0]).statistics()
    assert any(not np.array_equal(own_a[n], own_b[n]) for n in own_a)  # not the same bytes
    job_a, job_b = _config(spec_a, "eval-a", 4), _config(spec_b, "eval-b", 3)
    assert _isolated_blocks(job_a, job_b, sites) == list(own_a)  # the attack: every block
    _second_job_refused(job_a, job_b, sites, tmp_path)


def test_the_same_forest_with_other_metric_settings_cannot_isolate_a_site(
        setting: dict[str, Any], tmp_path: Path) -> None:
    """Other score and calibration bins and another log-loss floor, in a re-formatted file:
    the confusion matrix, log-loss and Brier sums do not depend on the bins, so they would be
    handed over exactly; the site refuses the second evaluation of its rows."""
    spec, sites = setting["spec"], setting["sites"]
    other = EvalSpec(models=(_variant(spec.models[0]),), score_bins=99, calibration_bins=9,
                     log_loss_floor=1e-9)
    assert other.digests != spec.digests
    job_a, job_b = _config(spec, "eval-a", 4), _config(other, "eval-b", 3)
    assert {"confusion", "log_loss", "brier"} <= set(_isolated_blocks(job_a, job_b, sites))
    _second_job_refused(job_a, job_b, sites, tmp_path)


def test_the_forest_plus_a_constant_tree_cannot_isolate_a_sites_confusion_matrix(
        setting: dict[str, Any], tmp_path: Path) -> None:
    """A constant tree [0.5, 0.5] added to the forest changes every probability but no class
    decision: the confusion matrix alone would be handed over exactly."""
    spec, sites = setting["spec"], setting["sites"]
    plus = EvalSpec(models=(_variant(spec.models[0], constant_tree=True),))
    job_a, job_b = _config(spec, "eval-a", 4), _config(plus, "eval-b", 3)
    assert _isolated_blocks(job_a, job_b, sites) == ["confusion"]
    _second_job_refused(job_a, job_b, sites, tmp_path)


def test_the_same_forest_as_the_second_model_of_a_job_cannot_isolate_a_site(
        setting: dict[str, Any], ten_trees: str, tmp_path: Path) -> None:
    """The job's first model is a new one: the site refuses the job as a second evaluation of
    its rows, whatever its models."""
    spec, sites = setting["spec"], setting["sites"]
    both = EvalSpec(models=(ten_trees, _variant(spec.models[0], constant_tree=True)),
                    names=("x", "y"))
    job_a, job_b = _config(spec, "eval-a", 4), _config(both, "eval-b", 3)
    assert "confusion" in _isolated_blocks(job_a, job_b, sites, model_b=1)
    _second_job_refused(job_a, job_b, sites, tmp_path)


def test_another_model_on_the_same_rows_is_declined_unless_the_site_evaluates_again(
        setting: dict[str, Any], ten_trees: str, tmp_path: Path) -> None:
    """An honest second evaluation of a different forest on the same rows: by default each
    site declines it (one evaluation per held-out set); sites started with --evaluate-again
    answer it, and still refuse a third job scoring the second one's model file again."""
    spec, sites = setting["spec"], setting["sites"]
    other = EvalSpec(models=(ten_trees,))
    job_a, job_b = _config(spec, "eval-a", 4), _config(other, "eval-b", 3)
    states = _states(tmp_path)
    _secure_sum(job_a, [_ledgered(job_a, k, s, states[k]) for k, s in enumerate(sites)])
    for k, s in enumerate(sites[:3]):
        with pytest.raises(RefusedRequest, match="already answered in job 'eval-a'") as exc:
            _ledgered(job_b, k, s, states[k]).check()
        assert exc.value.code == "evaluated_before"
    b = _secure_sum(job_b, [_ledgered(job_b, k, s, states[k], again=True)
                            for k, s in enumerate(sites[:3])])
    assert b["confusion"][0].sum() == sum(len(s[1]) for s in sites[:3])
    again = _config(other, "eval-c", 3)
    with pytest.raises(RefusedRequest, match="already scored it on in job 'eval-b'"):
        _secure_sum(again, [_ledgered(again, i, sites[k], states[k], again=True)
                            for i, k in enumerate((1, 2, 3))])


def test_the_same_held_out_rows_in_another_order_are_recognised(
        setting: dict[str, Any], tmp_path: Path) -> None:
    spec, sites = setting["spec"], setting["sites"]
    job_a, job_b = _config(spec, "eval-a", 4), _config(spec, "eval-b", 3)
    states = [tmp_path / f"site-{k}" for k in range(4)]
    for d in states:
        d.mkdir()
    _secure_sum(job_a, [site_worker(job_a, k, None, s, states[k])
                        for k, s in enumerate(sites)])
    rng = np.random.default_rng(0)
    shuffled = []
    for X, y in sites[:3]:
        order = rng.permutation(len(y))
        shuffled.append((X[order], y[order]))
    with pytest.raises(RefusedRequest, match="already scored it on in job 'eval-a'"):
        _secure_sum(job_b, [site_worker(job_b, k, None, s, states[k])
                            for k, s in enumerate(shuffled)])


def test_a_site_that_evaluates_again_answers_another_regression_forest_on_the_same_rows(
        tmp_path: Path) -> None:
    """With --evaluate-again a second regression forest on the same rows goes ahead (its row
    count and sums of y and y^2 are those of the first job: no reason to refuse); without it,
    it is declined; the first forest's file again is refused either way."""
    from sklearn.datasets import load_diabetes

    from fedforest_secure import FedForestRegressor

    X, y = load_diabetes(return_X_y=True)
    texts = [FedForestRegressor(n_estimators=n, max_depth=3, random_state=0).fit(
        X[:300], y[:300]).model_.to_json() for n in (3, 5)]

    def config(text: str, job: str) -> JobConfig:
        spec = EvalSpec(models=(text,), target_range=(25.0, 346.0), pva_bins=8)
        return eval_config(job, spec, task="regression", n_features=10, n_clients=3,
                           target_bound=346.0, profile=load_profile("secure").to_dict())

    sites = [(X[300 + 40 * k:340 + 40 * k], y[300 + 40 * k:340 + 40 * k]) for k in range(3)]
    states = [tmp_path / f"site-{k}" for k in range(3)]
    for d in states:
        d.mkdir()
    first, second = config(texts[0], "eval-a"), config(texts[1], "eval-b")
    _secure_sum(first, [_ledgered(first, k, s, states[k]) for k, s in enumerate(sites)])
    with pytest.raises(RefusedRequest, match="already answered in job 'eval-a'"):
        _ledgered(second, 0, sites[0], states[0]).check()
    _secure_sum(second, [_ledgered(second, k, s, states[k], again=True)
                         for k, s in enumerate(sites)])
    again = config(texts[0], "eval-c")
    for allowed in (False, True):
        with pytest.raises(RefusedRequest, match="already scored it on in job 'eval-a'"):
            _ledgered(again, 0, sites[0], states[0], again=allowed).check()


def test_an_older_ledger_line_keyed_by_the_rows_in_file_order_counts_for_those_rows(
        setting: dict[str, Any], tmp_path: Path) -> None:
    """An older ledger line holds the model digests, one digest of all of a model's
    statistics (not read) and the rows' digest in file order: on the same rows in the same
    order, the same model is refused, and so is another evaluation."""
    import hashlib
    import json

    spec, sites = setting["spec"], setting["sites"]
    X, y = sites[0]
    h = hashlib.sha256()  # the rows key older ledgers wrote
    for arr in (np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(y)):
        h.update(str(arr.shape).encode() + arr.dtype.str.encode())
        h.update(arr.tobytes())
    own = EvalWorker(_config(spec, "eval-a", 4), X, y).statistics()
    fingerprint = hashlib.sha256(b"".join(np.ascontiguousarray(a[0]).tobytes()
                                          for a in own.values())).hexdigest()
    (tmp_path / "evaluations.jsonl").write_text(json.dumps(
        {"job": "eval-a", "models": list(spec.digests), "rows": h.hexdigest(),
         "statistics": [fingerprint]}) + "\n")
    for job_b, said in ((_config(spec, "eval-b", 3), "already scored it on in job 'eval-a'"),
                        (_config(EvalSpec(models=(_variant(spec.models[0]),)), "eval-b", 3),
                         "already answered in job 'eval-a'")):  # the same forest, another file
        worker = site_worker(job_b, 0, None, (X, y), tmp_path)
        assert isinstance(worker, LedgeredEvalWorker)
        with pytest.raises(RefusedRequest, match=said):
            worker.check()


def test_a_ledger_line_cut_short_is_named_with_its_file_and_line_not_a_json_error(
        setting: dict[str, Any], tmp_path: Path) -> None:
    """A client stopped while writing its ledger line leaves half a line: the next check
    names the ledger's path and the line, and says what to do. It is not a decline reason
    (not a FedForestError): the site's own file needs mending, the job may still be right."""
    spec, sites = setting["spec"], setting["sites"]
    X, y = sites[0]
    EvalLedger(tmp_path).check_and_record("eval-a", spec.digests, "other rows",
                                          evaluation="e-a", resumed=False)
    ledger = tmp_path / "evaluations.jsonl"
    ledger.write_text(ledger.read_text() + '{"job": "eval-c", "models')
    worker = site_worker(_config(spec, "eval-b", 3), 0, None, (X, y), tmp_path)
    assert isinstance(worker, LedgeredEvalWorker)
    with pytest.raises(ValueError, match=rf"{ledger} line 2 is not a ledger entry .*delete "
                                         r"that line") as exc:
        worker.check()
    assert not isinstance(exc.value, FedForestError)


# --- a job id met again: the same evaluation resumed, or another one under the same name ---

def _states(tmp_path: Path, n: int = 4) -> list[Path]:
    states = [tmp_path / f"site-{k}" for k in range(n)]
    for d in states:
        d.mkdir()
    return states


def test_a_job_made_again_under_the_same_id_over_fewer_sites_is_refused(
        setting: dict[str, Any], tmp_path: Path) -> None:
    """The server makes "eval-a" again (a fresh database) over sites 0-2: the difference of
    the two sums would be site 3's statistics. Its configuration differs from the first
    "eval-a" the sites answered (3 clients, not 4), so each site checks it like any other
    job and declines it before joining."""
    spec, sites = setting["spec"], setting["sites"]
    job_a, again = _config(spec, "eval-a", 4), _config(spec, "eval-a", 3)
    # the attack, without ledgers
    a = _secure_sum(job_a, [EvalWorker(job_a, *s) for s in sites])
    b = _secure_sum(again, [EvalWorker(again, *s) for s in sites[:3]])
    for name, arr in EvalWorker(job_a, *sites[3]).statistics().items():
        np.testing.assert_allclose(a[name] - b[name], arr, atol=1e-9)
    # with each site's ledger
    states = _states(tmp_path)
    _secure_sum(job_a, [_ledgered(job_a, k, s, states[k]) for k, s in enumerate(sites)])
    said = ("job 'eval-a' scores model {}... on the held-out rows this site already scored it "
            "on in an earlier job also named 'eval-a' (of another configuration); a second "
            "evaluation could isolate this site by differencing. Refusing (to repeat an "
            "evaluation on purpose, delete job 'eval-a''s line from {})")
    for k, s in enumerate(sites[:3]):  # each site declines before it joins
        with pytest.raises(RefusedRequest) as exc:
            _ledgered(again, k, s, states[k]).check()
        assert str(exc.value) == said.format(spec.digests[0][:16],
                                             states[k] / "evaluations.jsonl")
        assert exc.value.code == "evaluated_before"
    with pytest.raises(RefusedRequest, match="an earlier job also named 'eval-a'"):
        _secure_sum(again, [_ledgered(again, k, s, states[k])
                            for k, s in enumerate(sites[:3])])


def test_the_same_job_and_configuration_asked_again_under_secure_aggregation_is_refused(
        setting: dict[str, Any], tmp_path: Path) -> None:
    """The server makes "eval-a" again with the same configuration (4 clients) and fills
    site 3's seat with a client of its own, on rows it knows (or drops site 3 at a deadline):
    the sum less its own client's statistics, subtracted from the first sum, would be site
    3's. A restarted client never answers a secure round again (its round keys died), so a
    site meeting its own earlier answer of this job refuses to answer; before joining it
    passes (a restarted client joins, then leaves the round it answered)."""
    spec, sites = setting["spec"], setting["sites"]
    job_a = _config(spec, "eval-a", 4)
    X, y = load_breast_cancer(return_X_y=True)
    known = EvalWorker(job_a, X[:40], y[:40])  # the server's own client
    # the attack, without ledgers
    a = _secure_sum(job_a, [EvalWorker(job_a, *s) for s in sites])
    b = _secure_sum(job_a, [EvalWorker(job_a, *s) for s in sites[:3]] + [known])
    mine = known.statistics()
    for name, arr in EvalWorker(job_a, *sites[3]).statistics().items():
        np.testing.assert_allclose(a[name] - (b[name] - mine[name]), arr, atol=1e-9)
    # with each site's ledger
    states = _states(tmp_path)
    first = [_ledgered(job_a, k, s, states[k]) for k, s in enumerate(sites)]
    task = EvalCoordinator(job_a).next_task()
    assert task is not None
    replies = [w.handle(task) for w in first]
    # a retried round within a client: the same reply again
    assert all(np.array_equal(w.handle(task).summable, r.summable)
               for w, r in zip(first, replies, strict=True))
    for k, s in enumerate(sites[:3]):
        worker = _ledgered(job_a, k, s, states[k])
        worker.check()  # before joining: passed over
        with pytest.raises(RefusedRequest) as exc:
            worker.handle(task)
        assert str(exc.value) == (
            "job 'eval-a' asks this site again for the statistics it already answered in this "
            "job (the line of an earlier client of this job in this state directory): a "
            "restarted client does not answer a secure round again (its round keys died with "
            "the old process), so this is the job's question asked a second time, and its "
            "sum may hold another set of sites; a second evaluation could isolate this site "
            "by differencing. Refusing (to repeat an evaluation on purpose, delete job "
            f"'eval-a''s line from {states[k] / 'evaluations.jsonl'})")
        assert exc.value.code == "evaluated_before"


def test_a_restarted_client_of_a_job_without_secure_aggregation_sends_its_upload_again(
        setting: dict[str, Any], tmp_path: Path) -> None:
    """Without secure aggregation every upload is the site's own, in the clear: a restarted
    client answers the job's round again with the same reply, and the job keeps one line."""
    import json

    spec, sites = setting["spec"], setting["sites"]
    job = eval_config("eval-o", spec, task="classification", n_features=30, n_clients=4,
                      n_classes=2, profile=load_profile("open").to_dict())
    task = EvalCoordinator(job).next_task()
    assert task is not None
    before = _ledgered(job, 0, sites[0], tmp_path).handle(task)
    restarted = _ledgered(job, 0, sites[0], tmp_path)
    restarted.check()
    assert np.array_equal(restarted.handle(task).summable, before.summable)
    lines = (tmp_path / "evaluations.jsonl").read_text().splitlines()
    assert [json.loads(line)["job"] for line in lines] == ["eval-o"]


def test_another_evaluation_under_the_same_id_is_checked_like_another_job(
        setting: dict[str, Any], ten_trees: str, tmp_path: Path) -> None:
    """"eval-a" made again to score another forest is another evaluation of the rows: declined
    by default; with --evaluate-again it goes ahead, and the first "eval-a"'s line stays
    beside its own, so a third job scoring the first's model again is still refused."""
    import json

    spec, sites = setting["spec"], setting["sites"]
    job_a = _config(spec, "eval-a", 4)
    other = _config(EvalSpec(models=(ten_trees,)), "eval-a", 3)
    states = _states(tmp_path)
    _secure_sum(job_a, [_ledgered(job_a, k, s, states[k]) for k, s in enumerate(sites)])
    with pytest.raises(RefusedRequest, match="already answered in an earlier job also named "
                                             "'eval-a' \\(of another configuration\\)"):
        _ledgered(other, 0, sites[0], states[0]).check()
    _secure_sum(other, [_ledgered(other, k, s, states[k], again=True)
                        for k, s in enumerate(sites[:3])])
    lines = [json.loads(line) for line in
             (states[0] / "evaluations.jsonl").read_text().splitlines()]
    assert [(e["job"], e["models"]) for e in lines] == [
        ("eval-a", list(spec.digests)), ("eval-a", list(EvalSpec.of(other).digests))]
    third = _config(spec, "eval-c", 3)
    with pytest.raises(RefusedRequest, match="already scored it on in job 'eval-a'"):
        _secure_sum(third, [_ledgered(third, k, s, states[k], again=True)
                            for k, s in enumerate(sites[:3])])


def test_a_line_without_the_configurations_digest_is_another_jobs(
        setting: dict[str, Any], tmp_path: Path) -> None:
    """A line written before the ledger kept the configuration's digest may be any
    evaluation named so: a job of that id scoring its model on the same rows is declined,
    naming the line to delete."""
    import json

    from client_app.evaluation import table_digest

    spec, sites = setting["spec"], setting["sites"]
    X, y = sites[0]
    (tmp_path / "evaluations.jsonl").write_text(json.dumps(
        {"job": "eval-a", "models": list(spec.digests), "rows": table_digest(X, y)}) + "\n")
    with pytest.raises(RefusedRequest, match="already scored it on in an earlier job also "
                                             "named 'eval-a'.*delete job 'eval-a''s line"):
        _ledgered(_config(spec, "eval-a", 4), 0, (X, y), tmp_path).check()


def test_a_client_upgraded_in_the_middle_of_its_job_knows_its_own_ledger_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger knows an evaluation job by its configuration as the server sent it, before
    the client reads in the profile's defaults. A client restarted in the middle of its
    open-profile job after an upgrade that adds a profile setting (one more default filled
    in) finds the line its earlier process wrote as this job's: it sends its same upload
    again and the job keeps one line, not a second one as another job's (under secure
    aggregation the ledger would decline it as "an earlier job also named" it)."""
    import dataclasses
    import io
    import json

    import tomli_w

    from client_app import runner
    from client_app.log import SiteLog
    from client_app.state import ClientState

    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, size=(60, 2))
    y = (X[:, 0] + 0.1 * rng.normal(size=60) > 0).astype(int)
    model = FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(
        X, y, client=np.arange(60) % 3).model_
    cfg = dataclasses.replace(
        eval_config("ev-1", EvalSpec(models=(model.to_json(),)), task="classification",
                    n_features=2, n_clients=3, n_classes=2,
                    profile=load_profile("open").to_dict()),
        feature_bounds=((-1.0, 1.0),) * 2, target_bound=1.0)
    schema = {"features": [{"name": f"x{j}", "kind": "continuous", "bounds": [-1.0, 1.0]}
                           for j in range(2)],
              "target": {"name": "y", "kind": "classification", "classes": ["0", "1"]}}
    (tmp_path / "s.toml").write_text(tomli_w.dumps(schema))
    state = ClientState(tmp_path / "state")

    class Joined(Exception):
        pass

    posted: list[str] = []

    class Offering:
        def get_json(self, path: str, params: object = None) -> object:
            return {"job_id": "ev-1", "client_index": 0, "client_name": "site-0",
                    "config": json.loads(cfg.to_json()), "status": "running"}

        def post_json(self, path: str, body: object = None) -> object:
            posted.append(path)
            raise Joined

    workers: list[Any] = []

    def capturing(*args: Any, **kwargs: Any) -> Any:
        workers.append(site_worker(*args, **kwargs))
        return workers[-1]

    def run() -> None:
        opts = ClientOptions(server="https://fedforest.example.org", token="t", job="ev-1",
                             data=None, eval_data=tmp_path / "held.csv",
                             schema=tmp_path / "s.toml", ca=None, state_dir=state.root,
                             quiet=True)
        with pytest.raises(Joined):  # the check before joining passed
            runner._run(opts, Offering(), state, None, None,  # type: ignore[arg-type]
                        SiteLog(stream=io.StringIO()), None, (X, y))

    monkeypatch.setattr(runner, "site_worker", capturing)
    run()
    task = EvalCoordinator(cfg).next_task()
    assert task is not None
    before = workers[-1].handle(task)  # its line in the ledger
    settings = runner.job_profile_settings
    monkeypatch.setattr(runner, "job_profile_settings",  # the upgrade: one more default
                        lambda profile, **kw: {**settings(profile, **kw), "later": "off"})
    run()
    assert workers[-1].inner.config.profile["later"] == "off"
    assert np.array_equal(workers[-1].handle(task).summable, before.summable)
    lines = (state.root / "evaluations.jsonl").read_text().splitlines()
    assert [json.loads(line)["job"] for line in lines] == ["ev-1"]
    assert posted == ["/v1/jobs/ev-1/join"] * 2  # no decline


# --- a probe job: whether a site takes part must not depend on its held-out rows ---

def _forest_text(template: str, nodes: list[dict[str, Any]]) -> str:
    """``template``'s model file with one tree made of ``nodes`` (the root first)."""
    import json

    keys = ("feature", "gain", "impurity", "kind", "left", "missing_left", "n", "right",
            "threshold", "value")
    doc = json.loads(template)
    doc["trees"] = [{**{k: [node[k] for node in nodes] for k in keys}, "sets": {}}]
    return json.dumps(doc)


def _leaf(value: list[float]) -> dict[str, Any]:
    return {"feature": -1, "gain": 0.0, "impurity": 0.0, "kind": 0, "left": -1,
            "missing_left": False, "n": 100.0, "right": -1, "threshold": 0.0, "value": value}


def _split(feature: int, threshold: float, left: int, right: int) -> dict[str, Any]:
    return {**_leaf([0.9, 0.1]), "feature": feature, "kind": 1, "left": left, "right": right,
            "threshold": threshold}


def _probe(template: str, lo: float, hi: float) -> str:
    """Model B of the probe: the constant model A ([0.9, 0.1]) except for x0 in (lo, hi],
    where it says [0.2, 0.8]."""
    a, b = [0.9, 0.1], [0.2, 0.8]
    return _forest_text(template, [_split(0, lo, 1, 2), _leaf(a), _split(0, hi, 3, 4),
                                   _leaf(b), _leaf(a)])


def _outcome(act: Any, state: Path) -> tuple[str, str] | None:
    """None if ``act()`` passes, else the refusal's code and words (the site's own ledger
    path written ``<ledger>``)."""
    try:
        act()
    except RefusedRequest as exc:
        return exc.code, str(exc).replace(str(state / "evaluations.jsonl"), "<ledger>")
    return None


@pytest.fixture()
def probed(setting: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """Every site answered job A (a constant model); the probe job B differs from A only on a
    box of x0 that holds one of site 0's held-out rows and none of site 1's."""
    spec, sites = setting["spec"], setting["sites"]
    x0 = [set(X[:, 0].tolist()) for X, _ in sites]
    v = min(x0[0] - x0[1])
    lo, hi = v - 1e-3, v + 1e-3
    inside = [int(np.sum((X[:, 0] > lo) & (X[:, 0] <= hi))) for X, _ in sites]
    assert inside[0] >= 1 and inside[1] == 0
    a = EvalSpec(models=(_forest_text(spec.models[0], [_leaf([0.9, 0.1])]),))
    b = EvalSpec(models=(_probe(spec.models[0], lo, hi),))
    job_a, job_b = _config(a, "eval-a", 4), _config(b, "probe-1", 4)
    # without a ledger: site 1 would send the same sums for B as for A, site 0 other ones
    own_a = [EvalWorker(job_a, *s).statistics() for s in sites[:2]]
    own_b = [EvalWorker(job_b, *s).statistics() for s in sites[:2]]
    assert np.array_equal(own_a[1]["confusion"], own_b[1]["confusion"])
    assert not np.array_equal(own_a[0]["confusion"], own_b[0]["confusion"])
    states = _states(tmp_path)
    _secure_sum(job_a, [_ledgered(job_a, k, s, states[k]) for k, s in enumerate(sites)])
    return {"job_a": job_a, "job_b": job_b, "states": states, "sites": sites}


def test_whether_a_site_takes_a_probe_job_does_not_depend_on_its_held_out_rows(
        probed: dict[str, Any]) -> None:
    """The server evaluated model A, then offers job B = A except on a small box of x0. Site 0
    has a held-out row in the box, site 1 none: the server sees the same from both, before
    joining and in the round (both decline: each already answered an evaluation on its rows),
    so a decline tells nothing about where a site's rows lie."""
    job_b, states, sites = probed["job_b"], probed["states"], probed["sites"]
    task = EvalCoordinator(job_b).next_task()
    assert task is not None
    before, within = [], []
    for k in (0, 1):
        worker = _ledgered(job_b, k, sites[k], states[k])
        before.append(_outcome(worker.check, states[k]))
        within.append(_outcome(lambda w=worker: w.handle(task), states[k]))
    assert before[0] == before[1]
    assert within[0] == within[1]
    said = ("job 'probe-1' is another evaluation of the held-out rows this site already "
            "answered in job 'eval-a' (a site answers one evaluation job per held-out set); a "
            "second evaluation could isolate this site by differencing. Refusing (to answer it "
            "all the same, with a server you trust, start the client with --evaluate-again; to "
            "repeat an evaluation on purpose, delete job 'eval-a''s line from <ledger>)")
    assert before[0] == within[0] == ("evaluated_before", said)


def test_a_site_that_evaluates_again_takes_a_probe_job_whatever_its_rows(
        probed: dict[str, Any]) -> None:
    """With --evaluate-again both sites answer the probe job, the one with a row in its box and
    the one without alike; model A's own file again is refused by both, before joining and in
    the round."""
    job_b, states, sites = probed["job_b"], probed["states"], probed["sites"]
    task = EvalCoordinator(job_b).next_task()
    assert task is not None
    for k in (0, 1):
        worker = _ledgered(job_b, k, sites[k], states[k], again=True)
        worker.check()
        assert worker.handle(task).summable.size > 0
    a_again = dataclasses.replace(probed["job_a"], job_id="eval-a2")
    task = EvalCoordinator(a_again).next_task()
    assert task is not None
    for k in (0, 1):
        worker = _ledgered(a_again, k, sites[k], states[k], again=True)
        for act in (worker.check, lambda w=worker: w.handle(task)):
            with pytest.raises(RefusedRequest, match="scores model .* on the held-out rows "
                                                     "this site already scored it on in job "
                                                     "'eval-a'") as exc:
                act()
            assert exc.value.code == "evaluated_before"


def test_without_secure_aggregation_a_site_answers_every_evaluation_of_its_rows(
        setting: dict[str, Any], ten_trees: str, tmp_path: Path) -> None:
    """Without secure aggregation every upload is the site's own, in the clear: there is no
    sum to difference, so the ledger refuses no evaluation (another forest, or the same
    model again) and only records each job."""
    import json

    spec, sites = setting["spec"], setting["sites"]
    first = eval_config("eval-1", spec, task="classification", n_features=30, n_clients=4,
                        n_classes=2, profile=load_profile("open").to_dict())
    second = eval_config("eval-2", EvalSpec(models=(ten_trees, *spec.models)),
                         task="classification", n_features=30, n_clients=4, n_classes=2,
                         profile=load_profile("open").to_dict())
    for job in (first, second):
        task = EvalCoordinator(job).next_task()
        assert task is not None
        worker = _ledgered(job, 0, sites[0], tmp_path)
        worker.check()
        assert worker.handle(task).summable is not None
    lines = (tmp_path / "evaluations.jsonl").read_text().splitlines()
    assert [json.loads(line)["job"] for line in lines] == ["eval-1", "eval-2"]
