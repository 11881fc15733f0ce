"""The evaluation round in process: sites answer the one task, refuse what their profile does
not allow, and the sum gives the pooled metrics under every profile."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from sklearn import metrics as skm
from sklearn.datasets import load_breast_cancer, load_diabetes

from fedforest_secure import FedForestClassifier, FedForestRegressor
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import ProtocolError, RefusedRequest
from fedforest_secure.evaluation import EvalSpec, EvaluationError
from fedforest_secure.evaluation.coordinator import EvalCoordinator
from fedforest_secure.evaluation.inprocess import eval_config, evaluate_in_process
from fedforest_secure.evaluation.worker import SITE_STATS, EvalWorker
from fedforest_secure.privacy import load_profile
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind

TOL = 1e-9


@pytest.fixture(scope="module")
def cancer() -> dict[str, Any]:
    X, y = load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(y))
    tr, te = idx[:400], idx[400:]
    h = rng.integers(0, 3, size=len(tr))
    models = [FedForestClassifier(n_estimators=4, max_depth=d, random_state=0)
              .fit(X[tr], y[tr], client=h).model_ for d in (2, 4)]
    site = rng.integers(0, 4, size=len(te))
    return {"models": models, "sites": [(X[te][site == k], y[te][site == k]) for k in range(4)],
            "X": X[te], "y": y[te]}


def _config(data: dict[str, Any], profile: Any = "secure", **spec_kw: Any) -> JobConfig:
    spec = EvalSpec(models=tuple(m.to_json() for m in data["models"]),
                    names=("shallow", "deep"), **spec_kw)
    prof = profile if isinstance(profile, dict) else load_profile(profile).to_dict()
    return eval_config("eval-job", spec, task="classification", n_features=30, n_clients=4,
                       n_classes=2, profile=prof)


def test_every_profile_gives_the_pooled_metrics_and_open_equals_secure(cancer: dict) -> None:
    results = {p: evaluate_in_process(_config(cancer, p), cancer["sites"])
               for p in ("open", "secure")}
    for i, model in enumerate(cancer["models"]):
        proba = model.predict_values(cancer["X"])
        y = cancer["y"]
        for res in results.values():
            m = res.models[i].metrics
            assert m["accuracy"] == pytest.approx(skm.accuracy_score(y, proba.argmax(1)),
                                                  abs=TOL)
            assert m["log_loss"] == pytest.approx(skm.log_loss(y, proba), abs=TOL)
            assert m["brier"] == pytest.approx(skm.brier_score_loss(y, proba[:, 1]), abs=TOL)
        assert results["open"].models[i].metrics == results["secure"].models[i].metrics
    assert results["secure"].models[0].digest == EvalSpec(
        models=(cancer["models"][0].to_json(),)).digests[0]


def test_the_coordinator_and_a_site_each_parse_the_model_files_once(
        cancer: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model file of 50 deep trees takes ~0.1 s to parse: the coordinator (checking the
    models, naming their classes in the result) and each site (checking, scoring) parse
    each file once."""
    from fedforest_secure.evaluation import spec as spec_module

    parsed: list[str] = []
    real = spec_module.load_forest

    def counting(text: str) -> Any:
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(spec_module, "load_forest", counting)
    res = evaluate_in_process(_config(cancer), cancer["sites"])
    assert [m.name for m in res.models] == ["shallow", "deep"]
    n_files = len(cancer["models"])
    assert len(parsed) == n_files * (1 + len(cancer["sites"])), len(parsed)


@pytest.mark.parametrize("offset", [0.0, 3e6])
def test_regression_forests_are_scored_like_sklearn_on_the_pooled_rows(offset: float) -> None:
    """Near zero, with the evaluation's own target range; 3e6 away, with the job's centre
    (target_offset, the bounds' middle) and half-width: the fixed-point sums are centred, so the
    metrics are as exact as near zero (with the offset at 0 and the bound at 3e6 + 350 the
    ring's unit would be about 0.4, and the MSE off by that much)."""
    X, y = load_diabetes(return_X_y=True)
    y = y + offset
    rng = np.random.default_rng(1)
    idx = rng.permutation(len(y))
    tr, te = idx[:330], idx[330:]
    model = FedForestRegressor(n_estimators=4, max_depth=3, random_state=0).fit(
        X[tr], y[tr], client=rng.integers(0, 3, size=len(tr))).model_
    lo, hi = float(y.min()), float(y.max())
    profile = load_profile("secure").to_dict()
    if offset == 0.0:
        spec = EvalSpec(models=(model.to_json(),), target_range=(lo, hi))
        config = eval_config("reg", spec, task="regression", n_features=10, n_clients=3,
                             target_bound=hi, profile=profile)
    else:
        config = replace(eval_config("reg", EvalSpec(models=(model.to_json(),)),
                                     task="regression", n_features=10, n_clients=3,
                                     target_bound=(hi - lo) / 2, profile=profile),
                         target_offset=(lo + hi) / 2)
    site = rng.integers(0, 3, size=len(te))
    res = evaluate_in_process(config, [(X[te][site == k], y[te][site == k]) for k in range(3)])
    pred = model.predict(X[te])
    m = res.models[0].metrics
    assert m["r2"] == pytest.approx(skm.r2_score(y[te], pred), abs=TOL)
    assert m["mse"] == pytest.approx(skm.mean_squared_error(y[te], pred), rel=TOL)
    assert m["mae"] == pytest.approx(skm.mean_absolute_error(y[te], pred), rel=TOL)


def test_a_site_answers_one_question_per_job(cancer: dict) -> None:
    config = _config(cancer)
    worker = EvalWorker(config, *cancer["sites"][0])
    task = EvalCoordinator(config).next_task()
    assert task is not None
    first = worker.handle(task)
    assert worker.handle(task) is first  # a retried round: the same reply
    again = replace(task, round_id=2)
    with pytest.raises(RefusedRequest, match="already answered"):
        worker.handle(again)


def test_a_site_refuses_statistics_its_configuration_does_not_define(cancer: dict) -> None:
    config = _config(cancer)
    worker = EvalWorker(config, *cancer["sites"][0])
    task = EvalCoordinator(config).next_task()
    assert task is not None
    other = replace(task, layout=(*task.layout, Block("extra", (1, 1), (StatKind.COUNT,))))
    with pytest.raises(ProtocolError, match="does not define"):
        worker.handle(other)
    junk = replace(task, params={"purpose": "x"})
    with pytest.raises(ProtocolError, match="does not use"):
        worker.handle(junk)
    training = Task(job_id="eval-job", round_id=1, kind=TaskKind.SKETCH, level=0)
    with pytest.raises(ProtocolError, match="does not answer sketch"):
        worker.handle(training)


def test_per_site_statistics_only_where_the_sites_profile_allows_them(cancer: dict) -> None:
    asking = _config(cancer, per_site=True)
    task = EvalCoordinator(asking).next_task()
    assert task is not None and task.disclose == (SITE_STATS,)
    with pytest.raises(RefusedRequest, match="forbids disclosing") as info:
        EvalWorker(asking, *cancer["sites"][0]).handle(task)
    assert info.value.code == "disclosure"  # the refusal's reason, as the server is told
    allowed = _config(cancer, load_profile("secure", site_metrics=True).to_dict(),
                      per_site=True)
    res = evaluate_in_process(allowed, cancer["sites"])
    assert sorted(res.models[0].per_site) == ["0", "1", "2", "3"]
    X0, y0 = cancer["sites"][0]
    pred = cancer["models"][0].predict(X0)
    assert res.models[0].per_site["0"]["accuracy"] == pytest.approx(
        skm.accuracy_score(y0, pred), abs=TOL)
    with pytest.raises(ValueError, match="site_metrics"):
        load_profile("secure-dp", site_metrics=True)


def test_a_site_below_the_abstention_threshold_contributes_zeros(cancer: dict) -> None:
    prof = load_profile("secure", abstain_below=40).to_dict()
    config = _config(cancer, prof)
    sizes = [len(y) for _, y in cancer["sites"]]
    small = [k for k, n in enumerate(sizes) if n < 40]
    assert small, sizes
    worker = EvalWorker(config, *cancer["sites"][small[0]])
    task = EvalCoordinator(config).next_task()
    assert task is not None
    assert worker.abstains and not worker.handle(task).summable.any()
    res = evaluate_in_process(config, cancer["sites"])
    assert res.models[0].metrics["n"] == sum(n for n in sizes if n >= 40)


def test_models_that_do_not_fit_the_data_are_refused(cancer: dict) -> None:
    spec = EvalSpec(models=(cancer["models"][0].to_json(),))
    with pytest.raises(EvaluationError, match="takes 30 features"):
        EvalCoordinator(eval_config("e", spec, task="classification", n_features=10,
                                    n_clients=3, n_classes=2, profile={"name": "open",
                                    "secure_aggregation": False, "sketch": "quantiles"}))
    with pytest.raises(EvaluationError, match="regression"):
        spec.check_models("regression", 30, 0)
    with pytest.raises(EvaluationError, match="digests do not match"):
        EvalSpec.from_dict({**spec.to_dict(), "digests": ["00" * 32]})


def test_a_dp_evaluation_is_noisy_and_within_the_predicted_noise(cancer: dict) -> None:
    same = {"score_bins": 20, "log_loss_floor": 1e-3}  # the DP defaults, for both
    config = _config(cancer, load_profile("secure-dp", epsilon=8.0).to_dict(), **same)
    exact = evaluate_in_process(_config(cancer, "secure", **same), cancer["sites"])
    noisy = evaluate_in_process(config, cancer["sites"])
    std = noisy.dp["sum_std"]  # type: ignore[index]
    z = []
    for mi in range(2):
        for name, arr in exact.models[mi].sums.items():
            d = (np.asarray(noisy.models[mi].sums[name]) - np.asarray(arr)) / std[name]
            z.extend(d.ravel().tolist())
    z_arr = np.asarray(z)
    assert np.abs(z_arr).max() < 5.5
    assert 0.6 < z_arr.std() < 1.6  # the calibrated scale, not more, not less (n > 400)
    assert noisy.models[0].metrics != exact.models[0].metrics
    acc = noisy.models[0].metrics["accuracy"]
    assert abs(acc - exact.models[0].metrics["accuracy"]) <= 5 * noisy.models[0].noise_std[
        "accuracy"]


def test_a_job_model_with_categorical_levels_is_scored_on_the_sites_encoded_rows() -> None:
    """A site encodes its rows with the job's schema (a categorical column's levels as codes
    0..L-1) before scoring: the models score those codes, not codes read again as labels
    (levels "1".."4": code 0 was an unknown level, code c level c - 1)."""
    from fedforest_secure.schema import Schema

    schema_text = ('[[features]]\nname = "cp"\nkind = "categorical"\n'
                   'levels = ["1", "2", "3", "4"]\n'
                   '[[features]]\nname = "age"\nkind = "continuous"\nbounds = [0.0, 100.0]\n'
                   '[target]\nname = "y"\nkind = "classification"\nclasses = ["0", "1"]\n')
    rng = np.random.default_rng(3)
    labels = rng.choice(["1", "2", "3", "4"], size=400)
    age = rng.uniform(20, 80, size=400).round(1)
    y = ((labels == "3") | (age > 60)).astype(int)
    schema = Schema.from_dict(__import__("tomllib").loads(schema_text))
    X = schema.encode_features({"cp": list(labels), "age": list(age)}, 400)
    model = FedForestClassifier(n_estimators=4, max_depth=3, random_state=0).fit(
        X[:300], y[:300], client=np.arange(300) % 3).model_.for_job(schema_text, ["a", "b", "c"])
    data = {"models": [model, model], "sites": [(X[300:350], y[300:350]),
                                                (X[350:], y[350:])]}
    spec = EvalSpec(models=(model.to_json(), model.to_json()), names=("m", "again"))
    config = eval_config("eval-job", spec, task="classification", n_features=2, n_clients=2,
                         n_classes=2, profile=load_profile("open").to_dict())
    res = evaluate_in_process(config, data["sites"])
    pd = pytest.importorskip("pandas")  # what a user predicts on: the table as it is

    proba = model.predict_values(pd.DataFrame({"cp": labels[300:], "age": age[300:]}))
    assert res.models[0].metrics["accuracy"] == pytest.approx(
        skm.accuracy_score(y[300:], proba.argmax(1)), abs=TOL)
    assert res.models[0].metrics["log_loss"] == pytest.approx(skm.log_loss(y[300:], proba),
                                                              abs=TOL)
