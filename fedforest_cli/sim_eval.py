"""Scores for ``fedforest simulate``: FedForest (evaluated federated: the sites score the model
on their own held-out rows, the server sums) vs a centralized forest and local learning (the
references, scored on the held-out rows pooled, which only a simulation can do)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from fedforest_secure.evaluation.result import EvalResult

    from .sim_data import SimData, SimulateOptions

__all__ = ["evaluate"]


def _score(task: str, y: np.ndarray, pred: np.ndarray) -> float:
    if task == "classification":
        return float(np.mean(np.asarray(pred).astype(np.int64) == y.astype(np.int64)))
    from sklearn.metrics import r2_score

    return float(r2_score(y, pred))


def _rf(task: str, opts: SimulateOptions) -> Any:
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    cls = RandomForestClassifier if task == "classification" else RandomForestRegressor
    return cls(n_estimators=opts.trees, max_depth=opts.depth, min_samples_leaf=5,
               max_features=1 / 3, random_state=opts.seed, n_jobs=1)


def evaluate(model: Any, sim: SimData, opts: SimulateOptions,
             federated: EvalResult | None = None) -> dict[str, Any]:
    """The scores; FedForest's from the federated evaluation when given (else from the pooled
    held-out rows)."""
    task = sim.task
    key = "accuracy" if task == "classification" else "r2"
    pooled = _score(task, sim.y_test, model.predict(sim.X_test))
    fed = pooled if federated is None else federated.models[0].metrics[key]
    noise = None if federated is None else federated.models[0].noise_std.get(key)
    X_all = np.concatenate([s.X for s in sim.sites])
    y_all = np.concatenate([s.y for s in sim.sites])
    central = _score(task, sim.y_test, _rf(task, opts).fit(X_all, y_all).predict(sim.X_test))
    local = []
    for s in sim.sites:
        if task == "classification" and len(np.unique(s.y)) < 2:
            local.append(_score(task, sim.y_test, np.full(sim.y_test.shape, s.y[0])))
            continue
        local.append(_score(task, sim.y_test, _rf(task, opts).fit(s.X, s.y).predict(sim.X_test)))
    return {"metric": "accuracy" if task == "classification" else "R2", "fedforest": fed,
            "fedforest_noise": noise, "fedforest_pooled": pooled,
            "federated": federated is not None, "centralized": central,
            "local": float(np.mean(local)), "local_per_site": local}
