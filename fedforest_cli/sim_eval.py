"""Scores for ``fedforest simulate``: FedForest vs centralized vs local learning."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .sim_data import SimData
    from .simulate import SimulateOptions

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


def evaluate(model: Any, sim: SimData, opts: SimulateOptions) -> dict[str, Any]:
    task = sim.task
    fed = _score(task, sim.y_test, model.predict(sim.X_test))
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
            "centralized": central, "local": float(np.mean(local)),
            "local_per_site": local}
