"""What an evaluation job scores: the models, the bins of its curves, what it may disclose.

An :class:`EvalSpec` travels inside the job's :class:`~fedforest_secure.config.JobConfig`
(``config.evaluation``, a JSON mapping), so every site and the server read the same one, and
the audit log's ``job_created`` entry records it. The models travel as the exact text of their
files: the SHA-256 of that text (:attr:`EvalSpec.digests`) is the digest a training job's audit
log records for its model, so an auditor can tell which trained model was evaluated.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import MAX_MODELS
from ..errors import FedForestError
from ..model import ForestModel, finite_number

if TYPE_CHECKING:
    from ..config import JobConfig

__all__ = ["EvalSpec", "EvaluationError", "MAX_EVAL_ROWS", "MAX_MODELS", "load_forest",
           "model_digest"]

#: Held-out rows one site scores at most (the fixed-point encoding is sized for it).
MAX_EVAL_ROWS = 1 << 24
_MAX_SCORE_BINS = 1000
_MAX_CAL_BINS = 100
_MAX_PVA_BINS = 200
#: sklearn's log-loss clips probabilities to [eps, 1 - eps] with the float64 machine epsilon.
SKLEARN_LOG_LOSS_FLOOR = float(np.finfo(np.float64).eps)
#: Under DP the log-loss clips probabilities at this floor unless the job says otherwise: a
#: row's loss is at most -log(floor) = 6.9, the sensitivity of the summed loss.
DP_LOG_LOSS_FLOOR = 1e-3
#: Default score bins without and with DP.
EXACT_SCORE_BINS = 100
DP_SCORE_BINS = 20


class EvaluationError(FedForestError, ValueError):
    """An evaluation job or model that does not fit (wrong task, features, classes, size)."""


def load_forest(text: str) -> ForestModel:
    """A forest from a model file's text: the server's ``fedforest-secure/model/v1`` file, or an
    estimator file (``FedForest*.save``) that embeds one (a regressor's ``y_offset`` is added
    to its leaf values, so the forest predicts what the estimator predicts)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvaluationError(f"a model file is not JSON: {exc}") from None
    offset: Any = 0.0
    if isinstance(doc, dict) and isinstance(doc.get("model"), dict):
        offset = doc.get("y_offset") or 0.0
        if not finite_number(offset):
            raise EvaluationError(f"not a FedForest model file (y_offset must be a finite "
                                  f"number, got {json.dumps(offset, default=repr)[:40]})")
        offset = float(offset)
        doc = doc["model"]  # an estimator file: its forest
    try:
        forest = ForestModel.from_dict(doc)
    except (ValueError, KeyError, TypeError) as exc:
        raise EvaluationError(f"not a FedForest model file ({exc})") from None
    if offset and forest.task == "regression":
        for tree in forest.trees:
            tree.value = tree.value + offset
    return forest


def _int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise EvaluationError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def model_digest(text: str) -> str:
    """SHA-256 of a model file's text: how an evaluation names the models it scores, and the
    digest a training job's audit log records."""
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class EvalSpec:
    """One evaluation job's parameters.

    Attributes
    ----------
    models : tuple of str
        The text of each model file (at most :data:`MAX_MODELS`).
    names : tuple of str
        A label per model (default ``model-0``, ``model-1``, ...).
    score_bins : int or None
        ROC and precision-recall curves come from counts of rows per score bin: ``G`` equal
        bins of the predicted probability on [0, 1] (sklearn's ``calibration_curve`` edges).
        None: 100 without DP, 20 with DP (every bin carries its own noise).
    calibration_bins : int
        Bins of the calibration (reliability) curve, equal on [0, 1].
    pva_bins : int
        Regression: bins of the prediction over the target range for the predicted-vs-actual
        plot.
    log_loss_floor : float or None
        Probabilities are clipped to [floor, 1 - floor] in the log-loss. None: sklearn's
        (float64 eps) without DP, :data:`DP_LOG_LOSS_FLOOR` with DP (a row's loss is then at
        most ``-log(floor)``, the sensitivity of the summed loss).
    per_site : bool
        Ask every site for its own statistics in the clear (per-site metrics); a site answers
        only if its profile has ``site_metrics = true``.
    target_range : (float, float) or None
        Regression: the public range of the target (the schema's bounds); predictions and
        targets are clipped to it under every profile (the sums' fixed-point scale and the
        DP noise are set from it) and the plot's bins cover it. A forest trained on this
        schema predicts within it (its leaves average targets within it); a model trained
        elsewhere whose predictions leave it is scored on the clipped predictions.
    """

    models: tuple[str, ...]
    names: tuple[str, ...] = ()
    score_bins: int | None = None
    calibration_bins: int = 10
    pva_bins: int = 20
    log_loss_floor: float | None = None
    per_site: bool = False
    target_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not self.models:
            raise EvaluationError("an evaluation needs at least one model")
        if len(self.models) > MAX_MODELS:
            raise EvaluationError(f"an evaluation scores at most {MAX_MODELS} models, "
                                  f"got {len(self.models)}")
        if not all(isinstance(m, str) for m in self.models):
            raise EvaluationError("models must be the text of model files")
        names = self.names or tuple(f"model-{i}" for i in range(len(self.models)))
        if len(names) != len(self.models) or len(set(names)) != len(names) \
                or not all(isinstance(n, str) and n.strip() for n in names):
            raise EvaluationError("names must be one distinct, non-empty label per model")
        object.__setattr__(self, "names", tuple(names))
        if self.score_bins is not None:
            _int_in("score_bins", self.score_bins, 2, _MAX_SCORE_BINS)
        _int_in("calibration_bins", self.calibration_bins, 1, _MAX_CAL_BINS)
        _int_in("pva_bins", self.pva_bins, 1, _MAX_PVA_BINS)
        floor = self.log_loss_floor
        if floor is not None and not (isinstance(floor, float) and 0 < floor < 0.5):
            raise EvaluationError(f"log_loss_floor must be a float in (0, 0.5), got {floor!r}")
        if not isinstance(self.per_site, bool):
            raise EvaluationError("per_site must be true or false")
        if self.target_range is not None:
            lo, hi = (float(v) for v in self.target_range)
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise EvaluationError(f"target_range must be finite with lo < hi, got "
                                      f"{self.target_range!r}")
            object.__setattr__(self, "target_range", (lo, hi))

    # ------------------------------------------------------------------ derived
    @property
    def digests(self) -> tuple[str, ...]:
        """SHA-256 of each model file's text (what a training job's audit log records)."""
        return tuple(model_digest(m) for m in self.models)

    def forests(self) -> list[ForestModel]:
        """The models, parsed (once per spec: a forest of 50 deep trees is a file of a few MB,
        ~0.1 s to parse, and an evaluation checks, scores and names its models' classes).
        Shared: read them, do not change them."""
        return list(self._parsed)

    @cached_property
    def _parsed(self) -> tuple[ForestModel, ...]:
        return tuple(load_forest(m) for m in self.models)

    def bins(self, dp: bool) -> int:
        """The score bins in effect."""
        if self.score_bins is not None:
            return self.score_bins
        return DP_SCORE_BINS if dp else EXACT_SCORE_BINS

    def floor(self, dp: bool) -> float:
        """The log-loss clipping floor in effect."""
        if self.log_loss_floor is not None:
            return self.log_loss_floor
        return DP_LOG_LOSS_FLOOR if dp else SKLEARN_LOG_LOSS_FLOOR

    def class_labels(self, n_classes: int) -> list[str] | None:
        """The label of each class index ``0..n_classes - 1`` (the schema's order, in which
        the sites count the classes), as the models' files name their classes; None when no
        model names them, or models name them differently (a
        job with a schema refuses such models: ``server_app.evaljob``). Labels that read as
        the indices themselves (a schema whose classes are "0" and "1") are labels too."""
        named = {tuple(str(c) for c in f.classes) for f in self.forests()
                 if f.task == "classification" and f.classes is not None}
        if len(named) != 1:
            return None
        labels = named.pop()
        return list(labels) if len(labels) == n_classes else None

    def check_models(self, task: str, n_features: int, n_classes: int) -> None:
        """Every model is a forest for this task, these features and these classes."""
        for name, forest in zip(self.names, self.forests(), strict=True):
            if forest.task != task:
                raise EvaluationError(f"model {name!r} is a {forest.task} forest; the "
                                      f"evaluation data are for {task}")
            if forest.n_features != n_features:
                raise EvaluationError(f"model {name!r} takes {forest.n_features} features; "
                                      f"the schema has {n_features}")
            if task == "classification" and forest.n_classes != n_classes:
                raise EvaluationError(f"model {name!r} predicts {forest.n_classes} classes; "
                                      f"the schema has {n_classes}")
            if forest.uses_client:
                raise EvaluationError(f"model {name!r} splits on the site indicator H, which "
                                      "held-out rows of another job do not carry")

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return {"models": list(self.models), "names": list(self.names),
                "digests": list(self.digests), "score_bins": self.score_bins,
                "calibration_bins": self.calibration_bins, "pva_bins": self.pva_bins,
                "log_loss_floor": self.log_loss_floor, "per_site": self.per_site,
                "target_range": list(self.target_range) if self.target_range else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalSpec:
        """Validate a mapping (``config.evaluation``); a wrong ``digests`` list is refused."""
        if not isinstance(data, Mapping):
            raise EvaluationError("an evaluation spec must be a mapping")
        known = {"models", "names", "digests", "score_bins", "calibration_bins", "pva_bins",
                 "log_loss_floor", "per_site", "target_range"}
        extra = sorted(set(data) - known)
        if extra:
            raise EvaluationError(f"unknown evaluation fields {extra}")
        models = data.get("models")
        if not isinstance(models, Sequence) or isinstance(models, str):
            raise EvaluationError("models must be a list of model files' text")
        rng = data.get("target_range")
        floor = data.get("log_loss_floor")
        spec = cls(models=tuple(models), names=tuple(data.get("names") or ()),
                   score_bins=data.get("score_bins"),
                   calibration_bins=data.get("calibration_bins", 10),
                   pva_bins=data.get("pva_bins", 20),
                   log_loss_floor=float(floor) if isinstance(floor, int | float)
                   and not isinstance(floor, bool) else floor,
                   per_site=data.get("per_site", False),
                   target_range=tuple(rng) if isinstance(rng, Sequence) else rng)
        digests = data.get("digests")
        if digests is not None and list(digests) != list(spec.digests):
            raise EvaluationError("the evaluation's model digests do not match its models")
        return spec

    @classmethod
    def of(cls, config: JobConfig) -> EvalSpec:
        """The spec of an evaluation job's configuration."""
        if config.evaluation is None:
            raise EvaluationError(f"job {config.job_id!r} is not an evaluation job")
        return cls.from_dict(config.evaluation)
