"""The outcome of an evaluation: metrics and curves per model, from the summed statistics.

:class:`EvalResult` is what an evaluation job produces (the server stores its JSON where a
training job stores its model; its SHA-256 goes into the audit log's ``model`` entry). It is a
pure function of the released sums (and, if sites disclosed them, their own statistics), so
anyone holding the audit log can recompute it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .layout import EvalLayout
from .metrics import calibration_curve, metrics, predicted_vs_actual, roc_curve

__all__ = ["FORMAT", "EvalResult", "ModelResult", "build_result", "metric_noise"]

FORMAT = "fedforest-secure/evaluation/v1"
_DRAWS = 200


def _clean(obj: Any) -> Any:
    """JSON-ready: NaN and infinities become None, arrays lists."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, float | np.floating):
        v = float(obj)
        return v if math.isfinite(v) else None
    return obj


@dataclass
class ModelResult:
    """One model's evaluation.

    Attributes
    ----------
    name, digest : str
        The model's label and the SHA-256 of its file.
    metrics : dict of str to float
        From the summed statistics (NaN where undefined).
    noise_std : dict of str to float
        Under DP: the standard deviation of each metric that the evaluation's own noise
        causes (Monte Carlo over the calibrated noise of the sum); empty without DP.
    curves : dict
        ``roc`` (per ROC class: ``fpr``, ``tpr``), ``calibration`` (per ROC class:
        ``prob_true``, ``prob_pred``, ``rows``), ``pva`` (regression: ``pred``, ``actual``,
        ``rows``). A ROC class is keyed by its index in the schema's classes (``"1"`` alone
        for two classes, the positive one): :attr:`EvalResult.classes` names it.
    sums : dict of str to list
        The summed statistics (nested lists of the block shapes).
    per_site : dict of str to dict
        Metrics of each site that disclosed its statistics, by site index.
    """

    name: str
    digest: str
    metrics: dict[str, float]
    noise_std: dict[str, float] = field(default_factory=dict)
    curves: dict[str, Any] = field(default_factory=dict)
    sums: dict[str, Any] = field(default_factory=dict)
    per_site: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class EvalResult:
    """Every model's evaluation, with what the evaluation released.

    ``classes`` (classification): the label of each class index, in the schema's order (the
    keys of the curves, the rows and columns of the ``confusion`` sums); None when the models
    do not name their classes (and in result files written before results carried them):
    the indices are then the schema's order, not the sorted order of an estimator's
    ``classes_``. The document leaves the key out when it is None.
    """

    job_id: str
    task: str
    models: list[ModelResult]
    contributors: int
    dp: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    classes: list[str] | None = None

    def model(self, name: str) -> ModelResult:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        out = {"format": FORMAT, "job_id": self.job_id, "task": self.task,
               "contributors": self.contributors, "dp": _clean(self.dp),
               "settings": _clean(self.settings),
               "models": [_clean(vars(m)) for m in self.models]}
        if self.classes is not None:  # left out: the document of a result without labels
            out["classes"] = list(self.classes)
        return out

    def class_label(self, key: str | int) -> str | None:
        """The label of the class with index ``key`` (a curve's key), or None without
        labels."""
        i = int(key)
        return self.classes[i] if self.classes is not None and 0 <= i < len(self.classes) \
            else None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> EvalResult:
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document")

        def num(v: Any) -> float:
            return float("nan") if v is None else float(v)

        models = [ModelResult(name=str(m["name"]), digest=str(m["digest"]),
                              metrics={k: num(v) for k, v in m["metrics"].items()},
                              noise_std={k: num(v) for k, v in m.get("noise_std", {}).items()},
                              curves=dict(m.get("curves", {})), sums=dict(m.get("sums", {})),
                              per_site={str(s): {k: num(v) for k, v in ms.items()}
                                        for s, ms in m.get("per_site", {}).items()})
                  for m in d["models"]]
        classes = d.get("classes")
        return cls(job_id=str(d["job_id"]), task=str(d["task"]), models=models,
                   contributors=int(d["contributors"]), dp=d.get("dp"),
                   settings=dict(d.get("settings", {})),
                   classes=None if classes is None else [str(c) for c in classes])


def _curves(layout: EvalLayout, stats: Mapping[str, np.ndarray],
            block_std: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The curves to draw. From noisy sums (``block_std``: their noise) they are
    post-processed for display: counts below zero are zero (a monotone ROC curve), and bins
    whose noisy row count is below twice its noise are left out (the metrics are computed
    from the sums as released)."""
    stats = dict(stats)
    keep = 0.0
    if block_std:
        for name in ("scores", "calib_counts", "pva_counts"):
            if name in stats:
                stats[name] = np.maximum(np.asarray(stats[name], dtype=np.float64), 0.0)
        keep = 2.0 * max(block_std.get("calib_counts", 0.0), block_std.get("pva_counts", 0.0))
    if layout.task == "regression":
        pred, actual, rows = predicted_vs_actual(stats, layout)
        ok = rows > keep
        return {"pva": {"pred": pred[ok], "actual": actual[ok], "rows": rows[ok]}}
    roc, cal = {}, {}
    for i, c in enumerate(layout.roc_classes):
        s = np.asarray(stats["scores"][i])
        fpr, tpr = roc_curve(s[:, 0], s[:, 1])
        roc[str(c)] = {"fpr": fpr, "tpr": tpr}
        t, p, rows = calibration_curve(np.asarray(stats["calib_counts"][i]),
                                       np.asarray(stats["calib_prob"][i]))
        ok = rows > keep
        if block_std:
            t, p = np.clip(t, 0.0, 1.0), np.clip(p, 0.0, 1.0)
        cal[str(c)] = {"prob_true": t[ok], "prob_pred": p[ok], "rows": rows[ok]}
    return {"roc": roc, "calibration": cal}


def metric_noise(layout: EvalLayout, stats: Mapping[str, np.ndarray],
                 block_std: Mapping[str, float], draws: int = _DRAWS,
                 seed: int = 0) -> dict[str, float]:
    """Standard deviation of each metric under Gaussian noise of ``block_std`` (per entry of
    each block) on one model's sums: Monte Carlo, ``draws`` draws, seeded (post-processing of
    public numbers)."""
    rng = np.random.default_rng(seed)
    samples: dict[str, list[float]] = {}
    for _ in range(draws):
        noisy = {k: np.asarray(v, dtype=np.float64) + rng.normal(
            scale=float(block_std.get(k, 0.0)), size=np.shape(v)) for k, v in stats.items()}
        with np.errstate(all="ignore"):
            for k, v in metrics(noisy, layout).items():
                samples.setdefault(k, []).append(v)
    out = {}
    for k, vals in samples.items():
        arr = np.asarray(vals, dtype=np.float64)
        arr = arr[np.isfinite(arr)]
        out[k] = float(arr.std(ddof=1)) if arr.size > 1 else float("nan")
    return out


def build_result(job_id: str, layout: EvalLayout, names: Sequence[str],
                 digests: Sequence[str], sums: Mapping[str, np.ndarray], contributors: int, *,
                 block_std: Mapping[str, float] | None = None,
                 site_stats: Mapping[int, Mapping[str, np.ndarray]] | None = None,
                 dp: dict[str, Any] | None = None,
                 settings: dict[str, Any] | None = None,
                 classes: Sequence[str] | None = None) -> EvalResult:
    """The result of an evaluation from its summed statistics (blocks with a model axis);
    ``classes``: the label of each class index (classification)."""
    models = []
    for m, (name, digest) in enumerate(zip(names, digests, strict=True)):
        stats = {k: np.asarray(v)[m] for k, v in sums.items()}
        with np.errstate(all="ignore"):
            values = metrics(stats, layout, contributors)
        noise = metric_noise(layout, stats, block_std) if block_std else {}
        per_site = {}
        for site, s in sorted((site_stats or {}).items()):
            with np.errstate(all="ignore"):
                per_site[str(site)] = metrics({k: np.asarray(v)[m] for k, v in s.items()},
                                              layout, 1)
        models.append(ModelResult(name, digest, values, noise,
                                  _curves(layout, stats, block_std),
                                  {k: np.asarray(v).tolist() for k, v in stats.items()},
                                  per_site))
    labels = list(classes) if classes is not None and layout.task == "classification" else None
    return EvalResult(job_id, layout.task, models, contributors, dp, dict(settings or {}),
                      labels)
