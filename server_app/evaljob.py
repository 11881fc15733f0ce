"""Evaluation jobs in ``job.toml``: ``kind = "evaluate"`` and its ``[evaluation]`` table.

Example::

    id = "eval-2024"
    kind = "evaluate"
    clients = ["hospital-a", "hospital-b", "hospital-c"]
    schema = "schema.toml"
    profile = "secure"

    [evaluation]
    models = ["secure.model.json", "secure-dp.model.json"]   # relative to job.toml
    names = ["secure", "secure-dp"]

The job stores the models' text (``model_texts``), so the server, the sites and the audit log
hold exactly the files that were named; the spec becomes the job's
:class:`~fedforest_secure.evaluation.spec.EvalSpec` (``JobConfig.evaluation``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fedforest_secure.config import JobConfig
from fedforest_secure.evaluation.spec import EvalSpec, EvaluationError
from fedforest_secure.evaluation.trained_schema import check_model_schemas
from fedforest_secure.model import model_text
from fedforest_secure.schema import Schema

from .settings import ConfigError

__all__ = ["EvaluationParams", "embed_models", "evaluation_entry", "evaluation_of",
           "set_models"]


class EvaluationParams(BaseModel):
    """The ``[evaluation]`` table of an evaluation job (``kind = "evaluate"``)."""

    # strict: TOML's true is no number and "yes" no boolean
    model_config = ConfigDict(extra="forbid", strict=True)

    models: list[str] = Field(min_length=1, max_length=16, description=(
        "model files to score (relative to job.toml), e.g. the `model.json` of earlier "
        "training jobs; `fedforest evaluate --models` sets them"))
    names: list[str] | None = Field(default=None, description=(
        "a label per model; absent: the files' names"))
    score_bins: int | None = Field(default=None, ge=2, le=1000, description=(
        "equal bins of the predicted probability for ROC and precision-recall curves; "
        "absent: 100, or 20 under DP"))
    calibration_bins: int = Field(default=10, ge=1, le=100, description=(
        "equal bins of the calibration curve"))
    pva_bins: int = Field(default=20, ge=1, le=200, description=(
        "regression: bins of the prediction for the predicted-vs-actual plot"))
    log_loss_floor: float | None = Field(default=None, gt=0, lt=0.5, description=(
        "probabilities are clipped to [floor, 1 - floor] in the log-loss; absent: "
        "scikit-learn's (float64 eps), or 1e-3 under DP"))
    per_site: bool = Field(default=False, description=(
        "ask every site for its own statistics in the clear (per-site metrics); a site "
        "answers only if its profile sets site_metrics = true"))
    model_texts: list[str] | None = Field(default=None, description=(
        "set by the server: the text of each model file"))


def set_models(raw: dict[str, Any], models: Sequence[Path],
               names: Sequence[str] | None = None) -> None:
    """Make the raw job table an evaluation of ``models`` (paths as given, resolved against
    the working directory), replacing any models the file names and their names (``names``,
    or the files' names by default)."""
    raw["kind"] = "evaluate"
    ev = raw.get("evaluation")
    ev = dict(ev) if isinstance(ev, dict) else {}
    ev["models"] = [str(Path(m).resolve()) for m in models]
    ev.pop("model_texts", None)
    # the file's names label the file's models: other models take ``names`` or their files'
    ev["names"] = list(names) if names is not None else None
    raw["evaluation"] = ev


def embed_models(raw: dict[str, Any], base: Path) -> None:
    """Read the model files an ``[evaluation]`` table names (relative to ``base``) into
    ``model_texts``."""
    ev = raw.get("evaluation")
    if not isinstance(ev, dict) or ev.get("model_texts") is not None:
        return
    models = ev.get("models")
    if not isinstance(models, list):
        return
    texts = []
    for m in models:
        path = Path(str(m)) if Path(str(m)).is_absolute() else base / str(m)
        try:
            texts.append(model_text(path))
        except ValueError as exc:  # unreadable, or not text (an ONNX export, a pickle, ...)
            raise ConfigError(str(exc)) from None
    ev["model_texts"] = texts
    if ev.get("names") is None:
        stems = [Path(str(m)).name.removesuffix(".json") for m in models]
        ev["names"] = stems if len(set(stems)) == len(stems) else None


def _target_range(schema: Schema | None) -> tuple[float, float] | None:
    if schema is None:
        return None
    b = schema.target.bounds
    return None if b is None or schema.is_classification else (float(b[0]), float(b[1]))


def evaluation_of(kind: str, params: EvaluationParams | None, schema: Schema | None,
                  facts: dict[str, Any]) -> dict[str, Any] | None:
    """``JobConfig.evaluation`` of a job: None for a training job, else the validated spec
    (its models checked against the schema's task, features and classes, and a model that
    carries its training schema against the job's schema: the levels, kinds and classes the
    sites encode their rows with)."""
    if kind != "evaluate":
        if params is not None:
            raise ConfigError('an [evaluation] table needs kind = "evaluate"')
        return None
    if params is None or params.model_texts is None:
        raise ConfigError('kind = "evaluate" needs an [evaluation] table naming the models')
    try:
        spec = EvalSpec(models=tuple(params.model_texts), names=tuple(params.names or ()),
                        score_bins=params.score_bins,
                        calibration_bins=params.calibration_bins, pva_bins=params.pva_bins,
                        log_loss_floor=params.log_loss_floor, per_site=params.per_site,
                        target_range=_target_range(schema))
        spec.check_models(str(facts["task"]), int(facts["n_features"]),
                          int(facts.get("n_classes", 0)))
        if schema is not None:
            _check_names(spec, schema)
            check_model_schemas(spec, schema)
    except EvaluationError as exc:
        raise ConfigError(f"evaluation: {exc}") from None
    return spec.to_dict()


def _check_names(spec: EvalSpec, schema: Schema) -> None:
    """Every model that names its feature columns or its classes names them as the schema
    does, in its order: the sites score encoded rows by position, so a model fitted on
    columns in another order, or an estimator's classes sorted where the schema's are not,
    would be scored on the wrong columns or classes."""
    want_f = list(schema.feature_names)
    want_c = [str(c) for c in schema.target.classes or []]
    for name, forest in zip(spec.names, spec.forests(), strict=True):
        if forest.feature_names is not None and list(forest.feature_names) != want_f:
            raise EvaluationError(
                f"model {name!r} takes its features as {', '.join(forest.feature_names)}; the "
                f"schema's are {', '.join(want_f)}, in this order: fit the model on the "
                "schema's columns in the schema's order")
        if not want_c or forest.classes is None:
            continue
        got = [str(c) for c in forest.classes]
        if got != want_c and sorted(got) == sorted(want_c):
            # the schema's labels in another order: read by value, the columns name other
            # classes than the sites count them as (classes [0, 1] under a schema listing
            # "1", "0" are labels fitted on the raw target, or codes: no one can tell which)
            raise EvaluationError(
                f"model {name!r} predicts the classes {', '.join(got)} in that order; the "
                f"schema lists the same labels as {', '.join(want_c)}: the sites count its "
                "probability columns in the schema's order, so each would be read as another "
                "class. Evaluate a model that lists the classes in the schema's order (a "
                "training job's model on this schema), or a schema listing them as "
                f"{', '.join(got)}")
        codes = list(range(len(want_c)))  # an estimator fitted on the schema's class codes
        if forest.classes != codes and got != want_c:
            raise EvaluationError(
                f"model {name!r} predicts the classes {', '.join(map(str, forest.classes))} in "
                f"that order; the schema lists {', '.join(want_c)}: the sites count its "
                "probability columns in the schema's order (a model from a training job on "
                "this schema has them so)")


def evaluation_entry(config: JobConfig) -> dict[str, Any]:
    """What the ``job_created`` audit entry adds for an evaluation job: its kind and each
    model's label with the SHA-256 of its file (the digest its training job logged)."""
    if config.evaluation is None:
        return {}
    spec = EvalSpec.of(config)
    return {"kind": "evaluate", "models": dict(zip(spec.names, spec.digests, strict=True))}
