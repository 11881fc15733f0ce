"""Whether a model's own schema reads rows as the evaluation job's schema does.

A training job's model carries the schema it was trained on (``ForestModel.schema``); the sites
of an evaluation job encode their held-out rows with the job's schema (its digest is the one
their schema file must have), and score every model on those codes. The two must agree on
everything that sets the codes or the scoring: the features (names, order, kind, categorical
levels in their order), the target's kind and its classes in their order. Where the job's
schema only narrows the rows the sites accept, the rows are encoded and scored as the model
was trained, so the job may differ:

- a continuous feature's bounds: they decide which values a site accepts (a tree routes any
  number);
- ``missing``: a feature the model's schema allows to be missing may be ``forbidden`` in the
  job (its rows have the cell); the other way is refused (a missing cell would take the path
  of a split that never learnt where such rows go);
- a regression target's bounds: the job's must contain the model's. They decide which
  targets a site accepts and the range predictions are clipped to; a forest predicts within
  its own bounds (its leaves average targets within them), so within wider ones it is scored
  on its own predictions, while narrower ones would clip them.

A model without a schema (an estimator fitted elsewhere, or a training job created with
``[data]`` facts and no schema file) is checked by its feature names and classes only
(``server_app.evaljob``).

The server checks this when it creates the job; each site checks it again against its own
schema file before it joins, in case a server created the job anyway.
"""

from __future__ import annotations

from ..schema import Feature, Schema, Target
from .spec import EvalSpec, EvaluationError

__all__ = ["check_model_schemas", "schema_difference"]


def _listed(labels: list[str]) -> str:
    return ", ".join(map(repr, labels))


def _feature_difference(was: Feature, now: Feature, where: str) -> str | None:
    name = repr(was.name)
    if was.kind != now.kind:
        return f"feature {name} is {was.kind} there and {now.kind} in {where}"
    if was.levels != now.levels:
        return (f"feature {name} has the levels {_listed(was.levels or [])} there, in this "
                f"order, and {_listed(now.levels or [])} in {where}")
    if now.may_miss and not was.may_miss:
        return (f"feature {name} has missing = {was.missing!r} there and {now.missing!r} in "
                f"{where}")
    return None


def _target_difference(was: Target, now: Target, where: str) -> str | None:
    if was.kind != now.kind:
        return f"the target is a {was.kind} target there and a {now.kind} target in {where}"
    if was.classes != now.classes:
        return (f"the target's classes are {_listed(was.classes or [])} there, in this order, "
                f"and {_listed(now.classes or [])} in {where}")
    if was.bounds is not None and not _contains(now.bounds, was.bounds):
        def shown(b: tuple[float, float] | None) -> str:
            return "none" if b is None else f"[{b[0]}, {b[1]}]"
        return (f"the target's bounds are {shown(was.bounds)} there and {shown(now.bounds)} "
                f"in {where}, which would clip its predictions (the job's bounds must contain "
                "the model's)")
    return None


def _contains(outer: tuple[float, float] | None, inner: tuple[float, float]) -> bool:
    return outer is not None and outer[0] <= inner[0] and inner[1] <= outer[1]


def schema_difference(trained: Schema, schema: Schema, where: str) -> str | None:
    """The first difference between a model's schema (``trained``) and the schema its rows are
    encoded with (``schema``, called ``where`` in the text) that changes the codes or the
    scoring, in words; None if there is none."""
    if trained.feature_names != schema.feature_names:
        return (f"the features are {', '.join(trained.feature_names)} there and "
                f"{', '.join(schema.feature_names)} in {where}")
    for was, now in zip(trained.features, schema.features, strict=True):
        diff = _feature_difference(was, now, where)
        if diff is not None:
            return diff
    return _target_difference(trained.target, schema.target, where)


def check_model_schemas(spec: EvalSpec, schema: Schema, *, site: bool = False) -> None:
    """Refuse a model whose own schema encodes rows otherwise than ``schema``: the job's
    schema (``site`` False: the server creating the job), or the site's schema file (``site``
    True: a site before it joins).

    Raises
    ------
    EvaluationError
        Naming the model and the first difference.
    """
    where = "this site's schema file" if site else "the job's schema"
    for name, forest in zip(spec.names, spec.forests(), strict=True):
        if forest.schema is None:
            continue
        diff = schema_difference(Schema.from_dict(forest.schema, stored=True), schema, where)
        if diff is None:
            continue
        head = (f"model {name!r} was trained on a schema that differs from {where}: {diff}. ")
        if site:
            raise EvaluationError(
                head + "This site would score the model on other codes than it was trained "
                "on: the server's operator can evaluate it under the schema of its training "
                "job (the model file's \"schema\"), or evaluate a model trained on this schema")
        raise EvaluationError(
            head + "The sites encode their held-out rows with the job's schema, so they would "
            "score the model on other codes than it was trained on: evaluate it under the "
            "schema of its training job (the model file's \"schema\"), or evaluate a model "
            "trained on this schema")
