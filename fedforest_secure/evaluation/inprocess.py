"""An evaluation with every site in this process, through the real protocol.

The reference transport, as :func:`~fedforest_secure.federation.run_in_process` is for training:
one :class:`~.worker.EvalWorker` per site, the :class:`~.coordinator.EvalCoordinator`, and the
aggregator the profile calls for (plain sums, or the fixed-point ring, masked under secure
aggregation). Over HTTPS the same objects exchange the same task and vectors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..config import JobConfig
from ..federation import make_aggregator
from .coordinator import EvalCoordinator
from .result import EvalResult
from .spec import EvalSpec
from .worker import EvalWorker

__all__ = ["eval_config", "evaluate_in_process"]


def eval_config(job_id: str, spec: EvalSpec, *, task: str, n_features: int, n_clients: int,
                profile: Mapping[str, Any], n_classes: int = 0,
                target_bound: float = 0.0) -> JobConfig:
    """The configuration of an evaluation job (forest fields at their defaults)."""
    return JobConfig(job_id=job_id, task=task, n_features=n_features, n_clients=n_clients,
                     n_classes=n_classes, target_bound=target_bound,
                     criterion="gini" if task == "classification" else "mse",
                     profile=dict(profile), evaluation=spec.to_dict())


def evaluate_in_process(config: JobConfig, sites: Sequence[tuple[np.ndarray, np.ndarray]]
                        ) -> EvalResult:
    """Evaluate the job's models on every site's held-out rows (one ``(X, y)`` per site, in
    site-index order); the rows are never pooled."""
    if len(sites) != config.n_clients:
        raise ValueError(f"config expects {config.n_clients} sites, got {len(sites)}")
    workers = [EvalWorker(config, X, y) for X, y in sites]
    coord = EvalCoordinator(config)
    agg = make_aggregator(config)
    while (task := coord.next_task()) is not None:
        replies = {k: w.handle(task) for k, w in enumerate(workers)}
        total = agg.aggregate(task, replies)
        coord.submit(task.round_id, total,
                     {k: r.disclosed for k, r in replies.items() if r.disclosed},
                     participants=list(range(len(workers))))
    return coord.result()
