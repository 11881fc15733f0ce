"""Checks of a job at ``create-job``: what would otherwise fail only once training started.

:func:`check_job` refuses (:class:`~server_app.settings.ConfigError`, saying what to change)

* a job whose profile uses secure aggregation with fewer than 3 sites (the sum of two sites
  tells each site the other's vector; the clients refuse such rounds, so the job would abort at
  its first round);
* missing public bounds under a profile that needs them (the secure sketch's grid, the
  fixed-point scale of a regression target, DP sensitivities);
* anything the coordinator itself refuses to start with (it is built once, here);

and says what the DP allocation rule chose for a DP job's forest fields that the job file
leaves out (:func:`~server_app.jobspec.build_config` applies the rule the estimators use, sized
from ``public_rows``), so that the operator sees it before the job runs: the non-DP defaults,
50 trees of depth 8, would drown every release in noise. The caller prints the notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError
from fedforest_secure.schema import Schema
from fedforest_secure.secagg import job_threshold

from .engine import new_coordinator
from .jobspec import JobSpec, build_config, parse_schema, resolve_profile
from .settings import ConfigError

__all__ = ["CheckedJob", "DP_RULE_FIELDS", "check_job"]

#: Sites a round of secure aggregation needs (the clients refuse fewer).
MIN_SECURE_SITES = 3
#: The ``[forest]`` keys the DP allocation rule decides when a DP job file leaves them out.
DP_RULE_FIELDS = ("n_estimators", "max_depth", "n_bins", "max_features", "bootstrap", "method")


@dataclass(frozen=True)
class CheckedJob:
    """The spec to store and what to tell the operator about it."""

    spec: JobSpec
    notes: list[str] = field(default_factory=list)


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
            f"vector, so the clients refuse it); the job file names {n}: {', '.join(spec.clients)}."
            ' Add sites, or train these with profile = "open"')
    if spec.min_clients is not None and profile.get("secure_aggregation") and \
            spec.min_clients < MIN_SECURE_SITES:
        raise ConfigError(f"min_clients = {spec.min_clients}: rounds of secure aggregation need "
                          f"at least {MIN_SECURE_SITES} sites; set min_clients >= "
                          f"{MIN_SECURE_SITES} or leave it out")
    if spec.min_clients is not None and profile.get("secure_aggregation"):
        t = job_threshold(float(profile.get("threshold", 1.0)), n)
        if spec.min_clients < t:
            raise ConfigError(f"min_clients = {spec.min_clients} is below the secure "
                              f"aggregation threshold t = {t} ({profile.get('threshold')} of "
                              f"{n} sites): a round needs t sites whatever min_clients says; "
                              f"set min_clients >= {t} or leave it out")
    floor = int(profile.get("min_clients", 1) or 1)
    if n < floor:
        raise ConfigError(f"profile {name!r} refuses sums over fewer than {floor} sites "
                          f"(min_clients); the job file names {n}: {', '.join(spec.clients)}. Add "
                          "sites, or choose a profile whose min_clients allows them")
    if spec.min_clients is not None and spec.min_clients < floor:
        raise ConfigError(f"min_clients = {spec.min_clients} is below the profile's "
                          f"min_clients = {floor}: a round closed with fewer sites would "
                          f"release a sum the profile refuses; set min_clients >= {floor} or "
                          "leave it out")
    if spec.schema_text is not None:  # TOML or JSON, read as build_config reads it
        _check_bounds(parse_schema(spec.schema_text), profile, name,
                      json_schema=spec.schema_text.lstrip().startswith("{"))
    config = build_config(spec)
    try:
        new_coordinator(config)
    except (FedForestError, ValueError) as exc:
        raise ConfigError(f"job {spec.id!r} cannot start: {exc}") from None
    # an evaluation job has no forest: the DP rule's forest fields are no news to it
    notes = _dp_notes(spec, profile, config) if profile.get("dp") and spec.kind == "train" \
        else []
    return CheckedJob(spec, notes)


def _check_bounds(schema: Schema, profile: dict[str, Any], name: str, *,
                  json_schema: bool) -> None:
    """Refuse a schema without the public bounds the profile needs; the advice is in the
    schema's own format (TOML or JSON)."""
    bounds = '`"bounds": [lo, hi]`' if json_schema else "`bounds = [lo, hi]`"
    missing = [f.name for f in schema.features if f.kind == "continuous" and f.bounds is None]
    needs = []
    if profile.get("sketch") == "secure_cdf":
        needs.append("the secure sketch builds its grid inside them")
    if profile.get("dp"):
        needs.append("differential privacy takes its sensitivities from them")
    if missing and needs:
        raise ConfigError(
            f"profile {name!r} needs public bounds for every continuous feature ("
            f"{'; '.join(needs)}); the job's schema has none for {', '.join(missing)}. Agree on "
            f"them from domain knowledge, never from one site's data, and add {bounds} to "
            "each (docs/configuration.md)")
    target = schema.target
    where = '"target"' if json_schema else "[target]"
    if target.kind == "regression" and target.bounds is None and (
            profile.get("fixed_point") or profile.get("dp")):
        raise ConfigError(
            f"profile {name!r} encodes sums in fixed point, scaled by the target's public "
            f"bounds; the job's schema's {where} {target.name!r} has none. Add {bounds} to "
            f"{where}")


def _dp_notes(spec: JobSpec, profile: dict[str, Any], config: JobConfig) -> list[str]:
    """What the DP allocation rule chose for the forest fields the job file leaves out
    (:func:`~server_app.jobspec.build_config` applies it), for the operator to read."""
    chosen = [k for k in DP_RULE_FIELDS if k not in spec.forest.model_fields_set]
    if not chosen:
        return []
    values = {"n_estimators": config.n_estimators, "max_depth": config.max_depth,
              "n_bins": config.n_bins, "max_features": config.max_features,
              "bootstrap": config.sampling == "bootstrap", "method": config.method}
    rows = (f"public_rows = {spec.public_rows}" if spec.public_rows is not None else
            f"public_rows absent: 100 per site = {100 * len(spec.clients)}")
    shown = ", ".join(f"{k} = {values[k]!r}" for k in chosen)
    return [f"DP job: [forest] leaves {', '.join(chosen)} to the DP allocation rule "
            f"(epsilon = {profile['dp']['epsilon']}, {rows}): {shown}. Set them in [forest] "
            "to choose otherwise"]
