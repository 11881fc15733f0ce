"""Federated evaluation: how good a model is on held-out rows that are never pooled.

An evaluation job scores one or more trained models on every site's held-out rows. Each site
computes additive statistics of its rows (confusion matrices, log-loss and Brier sums, counts
per score and calibration bin; regression error sums, sums of y and y^2, predicted-vs-actual
bins), sends them through the same rounds as training (secure aggregation, DP noise under a DP
profile, abstention, the audit log), and the server computes the metrics from the sums alone.

Modules, site side to server side:

* :mod:`.spec` -- :class:`EvalSpec`: the models (their files' text) and the bins;
* :mod:`.trained_schema` -- a model's own schema against the job's (the codes it is scored on);
* :mod:`.layout` -- the statistics blocks and their per-record sensitivities;
* :mod:`.stats` -- one site's sums (site side);
* :mod:`.encoding` -- sums as exact integers (limbs), or coarse integers under DP;
* :mod:`.noise` -- DP sensitivities and the calibrated noise of the release;
* :mod:`.worker` -- :class:`~.worker.EvalWorker`, the site's answer to the task;
* :mod:`.coordinator` -- :class:`~.coordinator.EvalCoordinator`, the server's round;
* :mod:`.metrics`, :mod:`.result` -- metrics and curves from the sums;
* :mod:`.inprocess` -- every site in one process (reference transport);
* :mod:`.crossval` -- federated k-fold cross-validation of a hyper-parameter.

The coordinator never imports the worker (import contract in pyproject.toml).
"""

from __future__ import annotations

from .layout import EvalLayout, StatBlock, eval_layout
from .metrics import classification_metrics, metrics, regression_metrics
from .result import EvalResult, ModelResult
from .spec import EvalSpec, EvaluationError, load_forest

__all__ = [
    "EvalLayout",
    "EvalResult",
    "EvalSpec",
    "EvaluationError",
    "ModelResult",
    "StatBlock",
    "classification_metrics",
    "eval_layout",
    "load_forest",
    "metrics",
    "regression_metrics",
]
