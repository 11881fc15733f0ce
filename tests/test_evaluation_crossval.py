"""Federated k-fold cross-validation: folds stay at the sites, the cross-validated metric is
the metric of the pooled out-of-fold predictions, and its privacy cost composes."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from sklearn import metrics as skm

from fedforest_secure import FedForestClassifier
from fedforest_secure.config import JobConfig
from fedforest_secure.evaluation import EvalSpec, EvaluationError
from fedforest_secure.evaluation.crossval import cross_validate, privacy_cost, site_folds
from fedforest_secure.evaluation.inprocess import eval_config
from fedforest_secure.privacy import load_profile

TOL = 1e-9


def test_each_site_splits_its_own_rows_into_equal_folds() -> None:
    f = site_folds(23, 4, seed=1, site=0)
    assert sorted(np.bincount(f, minlength=4)) == [5, 6, 6, 6]
    assert np.array_equal(f, site_folds(23, 4, seed=1, site=0))
    assert not np.array_equal(f, site_folds(23, 4, seed=1, site=1))


def test_under_dp_one_added_or_removed_record_moves_no_other_records_fold() -> None:
    """The privacy cost counts one record's trainings and one evaluation: a record added to a
    site (or removed from it) must leave every other record in its fold, whatever its place
    in the table."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3)).round(2)
    y = rng.integers(0, 2, size=300).astype(float)
    f = site_folds(300, 3, seed=0, site=0, rows=(X, y))
    new = (np.vstack([X[:150], [[9.0, 9.0, 9.0]], X[150:]]), np.r_[y[:150], 1.0, y[150:]])
    g = site_folds(301, 3, seed=0, site=0, rows=new)
    assert np.array_equal(np.delete(g, 150), f)
    assert np.array_equal(site_folds(299, 3, seed=0, site=0, rows=(X[1:], y[1:])), f[1:])
    order = rng.permutation(300)  # the folds go with the rows, not their places
    assert np.array_equal(site_folds(300, 3, seed=0, site=0, rows=(X[order], y[order])),
                          f[order])
    dup = site_folds(302, 3, seed=0, site=0, rows=(np.vstack([X, X[:2]]), np.r_[y, y[:2]]))
    assert np.array_equal(dup[:300], f)  # copies of a row are records of their own
    assert sorted(np.bincount(f, minlength=3)) == sorted(np.bincount(f, minlength=3))
    assert 80 <= np.bincount(f, minlength=3).min()  # about a third each (binomial shares)
    assert not np.array_equal(f, site_folds(300, 3, seed=0, site=1, rows=(X, y)))
    assert not np.array_equal(f, site_folds(300, 3, seed=1, site=0, rows=(X, y)))


def test_under_dp_a_site_whose_rows_all_draw_one_fold_is_refused_before_any_training(
        tiny_parts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """That fold's models would train without the site (a smaller federation, or a job of
    too few sites): named, with what to do."""
    from fedforest_secure.evaluation import crossval

    parts, _ = tiny_parts
    small = (parts[2][0][:3], parts[2][1][:3])
    seed = next(s for s in range(200)
                if np.unique(site_folds(3, 3, s, 2, rows=small)).size == 1)
    monkeypatch.setattr(crossval, "_fit", lambda *a, **k: pytest.fail("a forest was trained"))
    fold = int(site_folds(3, 3, seed, 2, rows=small)[0])
    with pytest.raises(EvaluationError, match=re.escape(
            f"site 2's 3 rows all fall in fold {fold} (under DP each row's fold is drawn from "
            "its own values), so that fold's models would train without the site: use fewer "
            "folds, or another --seed")):
        cross_validate([parts[0], parts[1], small], task="classification", param="max_depth",
                       values=[1, 2], folds=3, profile="secure-dp", n_classes=2, seed=seed)


def test_under_dp_a_fold_no_sites_row_draws_is_refused_before_any_training(
        tiny_parts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedforest_secure.evaluation import crossval

    parts, _ = tiny_parts
    sites = [(X[:4], y[:4]) for X, y in parts[:3]]

    def folds_of(seed: int) -> list[np.ndarray]:
        return [site_folds(4, 3, seed, k, rows=s) for k, s in enumerate(sites)]

    seed = next(s for s in range(500)
                if all(np.unique(f).size > 1 for f in folds_of(s))
                and len(set(np.concatenate(folds_of(s)).tolist())) < 3)
    empty = min({0, 1, 2} - set(np.concatenate(folds_of(seed)).tolist()))
    monkeypatch.setattr(crossval, "_fit", lambda *a, **k: pytest.fail("a forest was trained"))
    with pytest.raises(EvaluationError, match=re.escape(
            f"no site has a row in fold {empty} (under DP each row's fold is drawn from its own "
            "values), so it would be scored on no row: use fewer folds, or another --seed")):
        cross_validate(sites, task="classification", param="max_depth", values=[1, 2],
                       folds=3, profile="secure-dp", n_classes=2, seed=seed)


def test_the_cross_validated_metric_is_that_of_the_pooled_out_of_fold_predictions(
        tiny_parts: Any) -> None:
    parts, _ = tiny_parts
    sites = parts[:3]
    params = {"n_estimators": 3, "min_samples_leaf": 3}
    res = cross_validate(sites, task="classification", param="max_depth", values=[1, 3],
                         folds=2, profile="secure", params=params, n_classes=2, seed=4)
    folds = [site_folds(len(y), 2, 4, k) for k, (_, y) in enumerate(sites)]
    for depth in (1, 3):
        y_true, y_pred, proba = [], [], []
        for f in range(2):
            tr = [(X[fo != f], y[fo != f]) for (X, y), fo in zip(sites, folds, strict=True)]
            est = FedForestClassifier(max_depth=depth, random_state=4, profile="secure",
                                      **params).fit(
                np.concatenate([X for X, _ in tr]), np.concatenate([y for _, y in tr]),
                client=np.concatenate([np.full(len(y), k) for k, (_, y) in enumerate(tr)]))
            for (X, y), fo in zip(sites, folds, strict=True):
                y_true.append(y[fo == f])
                proba.append(est.predict_proba(X[fo == f]))
                y_pred.append(proba[-1].argmax(axis=1))
        yt, yp = np.concatenate(y_true), np.concatenate(y_pred)
        assert res.cv[f"max_depth={depth}"] == pytest.approx(skm.accuracy_score(yt, yp),
                                                             abs=TOL)
    assert res.best in (1, 3) and res.privacy["dp"] is False
    assert res.privacy["trainings_per_record"] == 2 and res.privacy["training_jobs"] == 4


def _train_config(depth: int, epsilon: float) -> JobConfig:
    return JobConfig(job_id="t", task="classification", n_features=4, n_clients=4,
                     n_classes=2, criterion="gini", max_depth=depth, n_estimators=8,
                     max_features=2, n_bins=4, method="histogram", bootstrap=False,
                     feature_bounds=((0.0, 1.0),) * 4,
                     profile=load_profile("secure-dp", epsilon=epsilon).to_dict())


def test_the_privacy_cost_composes_every_training_of_a_record_and_one_evaluation(
        tiny_parts: Any) -> None:
    parts, _ = tiny_parts
    model = FedForestClassifier(n_estimators=2, max_depth=2).fit(*parts[0]).model_
    ev = eval_config("e", EvalSpec(models=(model.to_json(),)), task="classification",
                     n_features=4, n_clients=4, n_classes=2,
                     profile=load_profile("secure-dp", epsilon=1.0).to_dict())
    trainings = [_train_config(d, 1.0) for d in (1, 2, 3)]
    costs = {k: privacy_cost(trainings, ev, k) for k in (2, 3, 5)}
    for k, c in costs.items():
        assert c["dp"] and c["trainings_per_record"] == (k - 1) * 3
        assert c["training_epsilon"] == pytest.approx([1.0] * 3, rel=1e-6)
        assert c["evaluation_epsilon"] == pytest.approx(1.0, rel=1e-6)
        # more than any one release, less than adding the epsilons up (basic composition)
        assert 1.0 < c["epsilon"] < (k - 1) * 3 + 1
    assert costs[2]["epsilon"] < costs[3]["epsilon"] < costs[5]["epsilon"]
    assert privacy_cost(trainings, eval_config(
        "e", EvalSpec(models=(model.to_json(),)), task="classification", n_features=4,
        n_clients=4, n_classes=2, profile=load_profile("secure").to_dict()), 3)["dp"] is False


@pytest.mark.parametrize("task,metric,names", [
    ("classification", "r2", "accuracy, average_precision, balanced_accuracy, brier, ece, "
                             "f1_macro, log_loss, precision_macro, recall_macro, roc_auc"),
    ("regression", "accuracy", "mae, mse, r2, rmse"),
    ("classification", "n", "accuracy, average_precision"),
])
def test_an_unknown_metric_is_refused_before_any_training(
        tiny_parts: Any, monkeypatch: pytest.MonkeyPatch, task: str, metric: str,
        names: str) -> None:
    from fedforest_secure.evaluation import crossval

    def no_training(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a forest was trained")

    monkeypatch.setattr(crossval, "_fit", no_training)
    parts, _ = tiny_parts
    with pytest.raises(EvaluationError, match=f"cannot choose by {metric!r}; the {task} "
                                              f"metrics are {names}"):
        cross_validate(parts[:3], task=task, param="max_depth", values=[1, 2], folds=2,
                       metric=metric, profile="open", n_classes=2)


def test_an_unknown_parameter_is_refused_with_the_estimators_parameters(
        tiny_parts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedforest_secure.evaluation import crossval

    monkeypatch.setattr(crossval, "_fit", lambda *a, **k: pytest.fail("a forest was trained"))
    parts, _ = tiny_parts
    with pytest.raises(EvaluationError, match=r"FedForestClassifier has no parameter "
                                              r"'max_dept'; it has .*max_depth, max_features"):
        cross_validate(parts[:3], task="classification", param="max_dept", values=[1, 2],
                       folds=2, profile="open", n_classes=2)


def test_the_choosable_metrics_are_the_ones_an_evaluation_computes() -> None:
    from fedforest_secure.evaluation.crossval import choosable_metrics
    from fedforest_secure.evaluation.metrics import CLASSIFICATION_METRICS, REGRESSION_METRICS

    assert set(choosable_metrics("classification")) < set(CLASSIFICATION_METRICS)
    assert set(choosable_metrics("regression")) < set(REGRESSION_METRICS)
    assert "n" not in choosable_metrics("classification")
    assert "mean_error" not in choosable_metrics("regression")


def test_a_value_given_twice_is_refused_naming_it(
        tiny_parts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedforest_secure.evaluation import crossval

    monkeypatch.setattr(crossval, "_fit", lambda *a, **k: pytest.fail("a forest was trained"))
    parts, _ = tiny_parts
    with pytest.raises(EvaluationError, match=r"max_depth=2 is listed twice: give each "
                                              r"candidate value once"):
        cross_validate(parts[:3], task="classification", param="max_depth", values=[2, 4, 2],
                       folds=2, profile="open", n_classes=2)


def test_more_folds_than_the_smallest_site_has_rows_are_refused_before_any_training(
        tiny_parts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedforest_secure.evaluation import crossval

    monkeypatch.setattr(crossval, "_fit", lambda *a, **k: pytest.fail("a forest was trained"))
    parts, _ = tiny_parts
    sites = [parts[0], (parts[1][0][:7], parts[1][1][:7]), parts[2]]
    with pytest.raises(EvaluationError, match=r"8 folds: each site splits its own rows into "
                                              r"the folds, and site 1 has 7 rows; use at most "
                                              r"7 folds"):
        cross_validate(sites, task="classification", param="max_depth", values=[1, 2],
                       folds=8, profile="open", n_classes=2)


def test_class_labels_and_a_class_missing_from_a_folds_training_rows_are_told_what_to_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Targets given as text labels are refused before any training, asking for class codes;
    a class so rare that one fold's training rows have none of it is named with the fold, not
    blamed on a schema."""
    from fedforest_secure.evaluation import crossval

    rng = np.random.default_rng(1)
    sites = [(rng.normal(size=(30, 2)), np.array(["apple", "mango"] * 15)) for _ in range(3)]
    monkeypatch.setattr(crossval, "_fit", lambda *a, **k: pytest.fail("a forest was trained"))
    with pytest.raises(EvaluationError, match=r"site 0's targets must be class codes 0..1 "
                                              r"\(got 'apple'\)"):
        cross_validate(sites, task="classification", param="max_depth", values=[1, 2],
                       folds=2, profile="open", n_classes=2)
    monkeypatch.undo()
    rare = []
    for k in range(3):
        y = np.array([0, 1] * 15)
        if k == 0:
            y[0] = 2  # one row of class 2, at one site
        rare.append((rng.normal(size=(30, 2)), y))
    with pytest.raises(EvaluationError, match=r"fold \d: its training rows hold no row of "
                                              r"class 2"):
        cross_validate(rare, task="classification", param="max_depth", values=[1],
                       folds=2, profile="open", n_classes=3)


def test_the_cross_validation_figures_of_docs_privacy_md_are_the_commands() -> None:
    """privacy.md section 2.7: `fedforest cross-validate --param max_depth --values 2,4,6
    --folds 3 --profile secure --trees 10` (seeded, the same in every run) gives the page's
    out-of-fold accuracies for depths 2, 4, 6."""
    from pathlib import Path

    from typer.testing import CliRunner

    from fedforest_cli.cli import app

    page = (Path(__file__).resolve().parents[1] / "docs" / "privacy.md").read_text("utf-8")
    found = re.search(r"against (\d\.\d+), (\d\.\d+), (\d\.\d+) with\s+`--profile secure`",
                      page)
    assert found is not None
    res = CliRunner().invoke(app, ["cross-validate", "--param", "max_depth", "--values",
                                   "2,4,6", "--folds", "3", "--profile", "secure", "--trees",
                                   "10"])
    assert res.exit_code == 0, res.output
    got = dict(re.findall(r"│ ([246]) +│ +(\d\.\d{4}) │", res.output))
    assert [f"{float(got[d]):.3f}" for d in "246"] == list(found.groups())
