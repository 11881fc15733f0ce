"""Checks of a job at ``create-job``: what would otherwise fail only once training started.

:func:`check_job` refuses (:class:`~server_app.settings.ConfigError`, saying what to change)

* a job whose profile uses secure aggregation with fewer than 3 sites (the sum of two sites
  tells each site the other's vector; the clients refuse such rounds, so the job would abort at
  its first round);
* missing public bounds under a profile that needs them (the secure sketch's grid, the
  fixed-point scale of a regression target, DP sensitivities);
* anything the coordinator itself refuses to start with (it is built once, here);

and completes a DP job whose ``[forest]`` leaves the forest's shape open (sets neither
``n_estimators`` nor ``max_depth``) with the settings the estimators use under DP
(:func:`~fedforest_secure.privacy.allocation.dp_forest_settings`, sized from the job's public
``rows``) instead of the non-DP defaults, whose 50 trees of depth 8 would drown every release
in noise. The caller prints the notes it returns.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

from fedforest_secure.errors import FedForestError
from fedforest_secure.schema import Schema

from .engine import new_coordinator
from .jobspec import JobSpec, build_config, resolve_profile
from .settings import ConfigError

__all__ = ["CheckedJob", "DP_SHAPE_KEYS", "check_job"]

#: Sites a round of secure aggregation needs (the clients refuse fewer).
MIN_SECURE_SITES = 3
#: The ``[forest]`` keys the DP rule decides when a DP job leaves them out.
DP_SHAPE_KEYS = ("n_estimators", "max_depth", "n_bins", "max_features", "method",
                 "row_sampling")


@dataclass(frozen=True)
class CheckedJob:
    """The spec to store (DP defaults applied) and what to tell the operator about it."""

    spec: JobSpec
    notes: list[str] = field(default_factory=list)


def _schema(spec: JobSpec) -> Schema | None:
    if spec.schema_text is None:
        return None
    try:
        return Schema.from_dict(tomllib.loads(spec.schema_text))
    except (ValueError, tomllib.TOMLDecodeError):
        return None  # a JSON schema or an invalid one: build_config says what is wrong


def check_job(spec: JobSpec) -> CheckedJob:
    """Refuse what would fail mid-job; apply the DP forest defaults where they are due.

    Raises
    ------
    ConfigError
        Naming the problem and what to change in job.toml or schema.toml.
    """
    profile = resolve_profile(spec.profile, spec.profile_overrides)
    name = profile.get("name", spec.profile)
    n = len(spec.clients)
    if profile.get("secure_aggregation") and n < MIN_SECURE_SITES:
        raise ConfigError(
            f"profile {name!r} uses secure aggregation, which needs at least "
            f"{MIN_SECURE_SITES} sites (the sum of two sites tells each one the other's "
            f"vector, so the clients refuse it); job.toml names {n}: {', '.join(spec.clients)}."
            ' Add sites, or train these with profile = "open"')
    if spec.min_clients is not None and profile.get("secure_aggregation") and \
            spec.min_clients < MIN_SECURE_SITES:
        raise ConfigError(f"min_clients = {spec.min_clients}: rounds of secure aggregation need "
                          f"at least {MIN_SECURE_SITES} sites; set min_clients >= "
                          f"{MIN_SECURE_SITES} or leave it out")
    schema = _schema(spec)
    if schema is not None:
        _check_bounds(schema, profile, name)
    notes: list[str] = []
    if profile.get("dp"):
        spec, notes = _dp_defaults(spec, profile, schema)
    config = build_config(spec)
    try:
        new_coordinator(config)
    except (FedForestError, ValueError) as exc:
        raise ConfigError(f"job {spec.id!r} cannot start: {exc}") from None
    return CheckedJob(spec, notes)


def _check_bounds(schema: Schema, profile: dict[str, Any], name: str) -> None:
    missing = [f.name for f in schema.features if f.kind == "continuous" and f.bounds is None]
    needs = []
    if profile.get("sketch") == "secure_cdf":
        needs.append("the secure sketch builds its grid inside them")
    if profile.get("dp"):
        needs.append("differential privacy takes its sensitivities from them")
    if missing and needs:
        raise ConfigError(
            f"profile {name!r} needs public bounds for every continuous feature ("
            f"{'; '.join(needs)}); schema.toml has none for {', '.join(missing)}. Agree on "
            "them from domain knowledge, never from one site's data, and add "
            "`bounds = [lo, hi]` to each (docs/configuration.md)")
    target = schema.target
    if target.kind == "regression" and target.bounds is None and (
            profile.get("fixed_point") or profile.get("dp")):
        raise ConfigError(
            f"profile {name!r} encodes sums in fixed point, scaled by the target's public "
            f"bounds; schema.toml's [target] {target.name!r} has none. Add "
            "`bounds = [lo, hi]` to [target]")


def _dp_defaults(spec: JobSpec, profile: dict[str, Any], schema: Schema | None
                 ) -> tuple[JobSpec, list[str]]:
    from fedforest_secure.privacy.allocation import dp_forest_settings

    explicit = spec.forest.model_fields_set
    if explicit & {"n_estimators", "max_depth"}:
        return spec, []  # the operator chose the forest's shape
    open_keys = [k for k in DP_SHAPE_KEYS if k not in explicit and k != "row_sampling"]
    if spec.rows is None:
        raise ConfigError(
            f"profile {profile.get('name')!r} adds DP noise, and [forest] leaves the forest's "
            "shape to the defaults (50 trees of depth 8, sized for no noise: every release "
            "would drown). Set `rows = N` in job.toml (a public count, or lower bound, of the "
            "rows at all sites together) and create-job chooses n_estimators, max_depth, "
            "n_bins, max_features and method by the DP rule the estimators use; or set them "
            "in [forest]")
    if schema is not None:
        d, classes = schema.n_features, schema.n_classes
        task = "classification" if schema.is_classification else "regression"
    elif spec.data is not None:
        d, classes, task = spec.data.n_features, spec.data.n_classes, spec.data.task
    else:
        raise ConfigError("a job needs a schema file or a [data] table")
    dp = profile["dp"]
    method = spec.forest.method if "method" in explicit else "random"
    rule = dp_forest_settings(float(dp["epsilon"]), spec.rows, d, classes, task,
                              delta=float(dp["delta"]), method=method).as_params()
    chosen: dict[str, Any] = {}
    for key in open_keys:
        chosen[key] = rule[key]
    if "row_sampling" not in explicit and "bootstrap" not in explicit:
        chosen["row_sampling"] = rule["sampling"]
        chosen["bootstrap"] = rule["sampling"] == "bootstrap"
    forest = spec.forest.model_copy(update=chosen)
    shown = ", ".join(f"{k} = {v!r}" for k, v in chosen.items())
    note = (f"DP job: [forest] settings chosen by the DP rule for epsilon = {dp['epsilon']} "
            f"and rows = {spec.rows}: {shown} (set them in [forest] to override)")
    return spec.model_copy(update={"forest": forest}), [note]
