"""Federated k-fold cross-validation of one hyper-parameter, on evaluation rounds.

Each site splits its own rows into ``k`` folds (a permutation seeded by the CV seed and the
site's index; under DP each row's fold is drawn from that row's values, :func:`site_folds`; no
row and no fold label leaves the site). For every fold ``f`` and candidate
value ``v`` a forest is trained through the real protocol on every site's rows outside fold
``f``; then one evaluation round (the ``evaluate`` task and secure sum of an evaluation job)
scores the fold's forests, one per value, on every site's fold-``f`` rows. The folds' summed
statistics add up to the statistics of every row's out-of-fold prediction, so the
cross-validated metric of a value is the metric of that total (the pooled out-of-fold metric);
the per-fold metrics give its spread. Everything runs in one process here
(:func:`~fedforest_secure.federation.run_in_process`, :func:`.inprocess.evaluate_in_process`);
across institutions the same rounds run as ``k x |values|`` training jobs on fold-filtered
tables and ``k`` evaluation jobs.

Privacy cost (:func:`privacy_cost`). Without DP the server sees the aggregates of
``k x |values|`` trainings on overlapping subsets of the rows (every row is in ``k - 1`` of
each value's ``k`` training sets) and ``k`` evaluation sums, each over the rows of one fold:
``k |values|`` times the aggregates of one training, and a server holding two trainings that
differ by one fold can difference them (fold-sized, not record-sized, sets). Under DP a record
takes part in ``(k - 1) |values|`` training jobs and in exactly one evaluation release (folds
are disjoint: parallel composition); their Rényi curves add up and the total is converted
once, so a cross-validation of ``|values|`` values with ``k`` folds costs each record the
composition of ``(k - 1) |values|`` training budgets plus one evaluation budget.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._bootstrap import record_uniforms
from ..config import JobConfig
from .inprocess import eval_config, evaluate_in_process
from .layout import eval_layout
from .metrics import CLASSIFICATION_METRICS, REGRESSION_METRICS, metrics
from .spec import EvalSpec, EvaluationError

if TYPE_CHECKING:
    from ..estimators import FedForestClassifier, FedForestRegressor

__all__ = ["CrossValidation", "choosable_metrics", "cross_validate", "privacy_cost",
           "site_folds"]

#: Metrics where lower is better.
_LOWER = frozenset({"log_loss", "brier", "ece", "mse", "rmse", "mae"})
#: Metrics where higher is better.
_HIGHER = frozenset({"accuracy", "balanced_accuracy", "precision_macro", "recall_macro",
                     "f1_macro", "roc_auc", "average_precision", "r2"})


def choosable_metrics(task: str) -> tuple[str, ...]:
    """The metrics a cross-validation can choose by for ``task``, sorted: those an evaluation
    computes that have a better direction (not the row count, a bound or the signed mean
    error)."""
    names = CLASSIFICATION_METRICS if task == "classification" else REGRESSION_METRICS
    return tuple(sorted(set(names) & (_LOWER | _HIGHER)))


def site_folds(n_rows: int, folds: int, seed: int, site: int,
               rows: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """The fold of each of a site's rows: a seeded permutation, folds of equal size (+-1).

    Given the site's ``rows`` ``(X, y)`` (under DP), each row's fold comes from that row's
    values alone (:func:`~fedforest_secure._bootstrap.record_uniforms`): adding or removing
    one record moves no other record to another fold, which the privacy cost assumes (a
    permutation of the table would redraw them all). The folds' sizes then vary (a binomial
    share of the rows each)."""
    ss = np.random.SeedSequence([seed, 0xCF, site])
    if rows is not None:
        X, y = rows
        if len(y) != n_rows:
            raise ValueError(f"{len(y)} rows given for a site of {n_rows}")
        u = record_uniforms(np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64),
                            int(ss.generate_state(1, np.uint64)[0]), stream=0)
        fold: np.ndarray = np.minimum((u * folds).astype(np.int64), folds - 1)
        return fold
    perm = np.random.default_rng(ss).permutation(n_rows)
    out = np.empty(n_rows, dtype=np.int64)
    out[perm] = np.arange(n_rows) % folds
    return out


@dataclass
class CrossValidation:
    """The outcome of :func:`cross_validate`.

    Attributes
    ----------
    param : str
    values : list
    folds : int
    metric : str
    cv : dict of str to float
        Per value (``str(value)``): the metric of the pooled out-of-fold statistics.
    per_fold : dict of str to list of float
        Per value: the metric of each fold's evaluation round.
    best : Any
        The value with the best ``cv`` metric.
    privacy : dict
        :func:`privacy_cost`.
    """

    param: str
    values: list[Any]
    folds: int
    metric: str
    cv: dict[str, float]
    per_fold: dict[str, list[float]]
    best: Any
    privacy: dict[str, Any] = field(default_factory=dict)


def _estimator(task: str) -> type[FedForestClassifier] | type[FedForestRegressor]:
    from ..estimators import FedForestClassifier, FedForestRegressor

    return FedForestClassifier if task == "classification" else FedForestRegressor


def _fit(task: str, params: Mapping[str, Any], X: np.ndarray, y: np.ndarray,
         h: np.ndarray) -> tuple[str, JobConfig]:
    """A forest trained in process on the sites' rows (``h``: site of each row): its file's
    text (the estimator format, so a regressor's offset travels with it) and its config."""
    est = _estimator(task)(**params).fit(X, y, client=h)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.json"
        est.save(path)
        return path.read_text(), est.config_


def _check_class_codes(sites: Sequence[tuple[Any, Any]], n_classes: int) -> None:
    """Every site's targets are class codes ``0..n_classes - 1``."""
    if n_classes < 2:
        raise EvaluationError(f"classification needs n_classes >= 2, got {n_classes}")
    for k, (_, y) in enumerate(sites):
        arr = np.asarray(y)
        try:
            codes = arr.astype(np.float64)
        except (TypeError, ValueError):
            codes = None
        if codes is None or not np.isfinite(codes).all() or (codes != np.round(codes)).any() \
                or (codes.size and (codes.min() < 0 or codes.max() >= n_classes)):
            bad = next((v for v in arr.tolist() if not (isinstance(v, int | float) and
                                                         0 <= v < n_classes and v == int(v))),
                       arr.tolist()[0] if arr.size else None)
            raise EvaluationError(f"site {k}'s targets must be class codes 0..{n_classes - 1} "
                                  f"(got {bad!r}): encode the labels in the schema's class "
                                  "order first")


def cross_validate(sites: Sequence[tuple[np.ndarray, np.ndarray]], *, task: str, param: str,
                   values: Sequence[Any], folds: int = 3, metric: str | None = None,
                   profile: Any = "secure", params: Mapping[str, Any] | None = None,
                   n_classes: int = 0, seed: int = 0) -> CrossValidation:
    """Cross-validate ``param`` over ``values`` (module docstring).

    Parameters
    ----------
    sites : one ``(X, y)`` per site (class codes ``0..n_classes - 1`` for classification)
    task : ``"classification"`` or ``"regression"``
    param : an estimator parameter (e.g. ``"max_depth"``)
    values : its candidate values
    folds : ``k``, from 2 to the rows of the smallest site (each site splits its own rows)
    metric : the metric to choose by (default accuracy / R^2)
    profile : the privacy profile of the trainings and the evaluation rounds
    params : the estimators' other parameters
    """
    from ..privacy import PrivacyProfile, load_profile

    if folds < 2:
        raise EvaluationError("cross-validation needs at least 2 folds")
    if not values:
        raise EvaluationError("no values to cross-validate")
    names = [f"{param}={v}" for v in values]
    twice = next((n for k, n in enumerate(names) if n in names[:k]), None)
    if twice is not None:
        raise EvaluationError(f"{twice} is listed twice: give each candidate value once")
    rows = [len(y) for _, y in sites]
    if rows and folds > min(rows):
        k = rows.index(min(rows))
        n = f"{rows[k]} row{'s' if rows[k] != 1 else ''}"
        raise EvaluationError(f"{folds} folds: each site splits its own rows into the folds, "
                              f"and site {k} has {n}; use at most {rows[k]} folds")
    metric = metric or ("accuracy" if task == "classification" else "r2")
    if metric not in choosable_metrics(task):
        raise EvaluationError(f"cannot choose by {metric!r}; the {task} metrics are "
                              f"{', '.join(choosable_metrics(task))}")
    cls = _estimator(task)
    known = sorted(cls().get_params())
    if param not in known:
        raise EvaluationError(f"{cls.__name__} has no parameter {param!r}; it has "
                              f"{', '.join(known)}")
    if task == "classification":
        _check_class_codes(sites, n_classes)
    prof = profile if isinstance(profile, PrivacyProfile) else load_profile(profile)
    base = {"random_state": seed, **dict(params or {}), "profile": prof}
    # under DP each record's fold is its own draw (privacy_cost counts one record's part)
    fold_of = [site_folds(len(y), folds, seed, k, (X, y) if prof.dp is not None else None)
               for k, (X, y) in enumerate(sites)]
    for k, fo in enumerate(fold_of):  # under DP a small site's rows may all draw one fold
        lone = np.unique(fo)
        if lone.size == 1:
            raise EvaluationError(
                f"site {k}'s {len(fo)} row{'s' if len(fo) != 1 else ''} all fall in fold "
                f"{int(lone[0])} (under DP each row's fold is drawn from its own values), so "
                "that fold's models would train without the site: use fewer folds, or "
                "another --seed")
    empty = [f for f in range(folds) if not any((fo == f).any() for fo in fold_of)]
    if empty:  # under DP: scored on noise alone
        raise EvaluationError(f"no site has a row in fold {empty[0]} (under DP each row's fold "
                              "is drawn from its own values), so it would be scored on no "
                              "row: use fewer folds, or another --seed")
    y_all = np.concatenate([np.asarray(y, dtype=np.float64) for _, y in sites])
    rng = (float(y_all.min()), float(y_all.max())) if task == "regression" else None
    if rng is not None and rng[0] == rng[1]:
        rng = (rng[0], rng[0] + 1.0)
    totals: list[dict[str, np.ndarray]] | None = None
    per_fold: dict[str, list[float]] = {n: [] for n in names}
    layout = None
    configs: list[JobConfig] = []
    ev_cfg: JobConfig | None = None
    for f in range(folds):
        train = [(X[fo != f], y[fo != f]) for (X, y), fo in zip(sites, fold_of, strict=True)]
        X_tr = np.concatenate([X for X, _ in train])
        y_tr = np.concatenate([y for _, y in train])
        h_tr = np.concatenate([np.full(len(y), k) for k, (_, y) in enumerate(train)])
        if task == "classification":
            absent = sorted(set(range(n_classes)) - {int(c) for c in np.unique(y_tr)})
            if absent:
                raise EvaluationError(
                    f"fold {f}: its training rows hold no row of class {absent[0]}: the "
                    f"class is too rare for {folds} folds (each fold's models are trained "
                    "on the other folds' rows); use fewer folds")
        texts = []
        for v in values:
            text, cfg = _fit(task, {**base, param: v}, X_tr, y_tr, h_tr)
            texts.append(text)
            if f == 0:
                configs.append(cfg)
        spec = EvalSpec(models=tuple(texts), names=tuple(names), target_range=rng)
        ev_cfg = eval_config(f"cv-fold-{f}", spec, task=task, n_features=X_tr.shape[1],
                             n_clients=len(sites), n_classes=n_classes,
                             target_bound=max(abs(rng[0]), abs(rng[1])) if rng else 0.0,
                             profile=prof.to_dict())
        held = [(X[fo == f], y[fo == f]) for (X, y), fo in zip(sites, fold_of, strict=True)]
        res = evaluate_in_process(ev_cfg, held)
        layout = eval_layout(spec, task, n_classes, ev_cfg.target_bound, prof.dp is not None)
        sums = [{k: np.asarray(v, dtype=np.float64) for k, v in m.sums.items()}
                for m in res.models]
        totals = sums if totals is None else [
            {k: t[k] + s[k] for k in t} for t, s in zip(totals, sums, strict=True)]
        for name, m in zip(names, res.models, strict=True):
            per_fold[name].append(m.metrics[metric])
    if layout is None or totals is None or ev_cfg is None:  # pragma: no cover - folds >= 2
        raise EvaluationError("no fold was evaluated")
    with np.errstate(all="ignore"):
        cv = {n: metrics(t, layout)[metric] for n, t in zip(names, totals, strict=True)}
    scored = [(cv[n], v) for n, v in zip(names, values, strict=True) if np.isfinite(cv[n])]
    if not scored:
        raise EvaluationError(f"no value has a finite {metric}")
    pick = min if metric in _LOWER else max
    best = pick(scored, key=lambda t: t[0])[1]
    return CrossValidation(param, list(values), folds, metric, cv, per_fold, best,
                           privacy_cost(configs, ev_cfg, folds))


def privacy_cost(trainings: Sequence[JobConfig], evaluation: JobConfig,
                 folds: int) -> dict[str, Any]:
    """What a record's privacy costs in a cross-validation whose per-value training jobs are
    ``trainings`` (one configuration per value) and whose evaluation rounds are like
    ``evaluation`` (module docstring). Under DP, ``epsilon`` is the accountant's conversion of
    the composed Rényi curve: ``folds - 1`` of every value's training plus one evaluation."""
    out: dict[str, Any] = {"folds": folds, "values": len(trainings),
                           "trainings_per_record": (folds - 1) * len(trainings),
                           "evaluation_releases_per_record": 1,
                           "training_jobs": folds * len(trainings), "evaluation_rounds": folds}
    dp = evaluation.dp
    if not dp or any(c.dp is None for c in trainings):
        out["dp"] = False
        return out
    from ..privacy.accountant import ORDERS, epsilon_of_curve
    from ..privacy.allocation import job_noise
    from ..secure_sum import noise_units
    from .noise import eval_noise

    delta = float(dp["delta"])
    total = np.zeros_like(ORDERS)
    train_eps = []
    for cfg in trainings:
        plan = job_noise(cfg, noise_units(cfg))
        curve = sum((plan.cost(level).rdp() for level in plan.levels), np.zeros_like(ORDERS))
        train_eps.append(epsilon_of_curve(curve, float(plan.delta)))
        total = total + (folds - 1) * curve
    ev = eval_noise(evaluation).cost().rdp()
    total = total + ev
    out.update({"dp": True, "delta": delta, "training_epsilon": train_eps,
                "evaluation_epsilon": epsilon_of_curve(ev, delta),
                "epsilon": epsilon_of_curve(total, delta)})
    return out
