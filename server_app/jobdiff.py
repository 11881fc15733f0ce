"""What a job file sets otherwise than the stored job of its id.

``fedforest evaluate --job eval.toml`` waits for the existing evaluation job of the file's id
instead of creating it again; it does so only when that job is the one the file describes.
:func:`differences` names, as ``job.toml`` names them, the settings of a spec that the stored
job has otherwise: its sites, profile, schema or ``[data]``, deadline, ``min_clients``, the
``[forest]`` and ``[evaluation]`` fields (the configuration both sides agree on,
:class:`~fedforest_secure.config.JobConfig`, compared field by field).
"""

from __future__ import annotations

import json
from typing import Any

from fedforest_secure.config import JobConfig

from .db import JobRow
from .jobspec import JobSpec, build_config, default_min_clients, stored_schema_text

__all__ = ["differences"]

#: Fields of the configuration a job's schema (or its ``[data]`` table) gives.
_FACTS = frozenset({"task", "n_features", "n_classes", "feature_kinds", "n_levels",
                    "missing_allowed", "feature_bounds", "target_bound", "target_offset"})
#: Fields compared elsewhere, or not set by a job file: the id, the number of sites (the
#: sites are compared by name), and an evaluation's models (the caller compares them by
#: digest and says which) and their labels unless the file names them itself.
_SKIPPED = frozenset({"job_id", "n_clients", "profile", "evaluation"})
_SKIPPED_EVALUATION = frozenset({"models", "digests", "names"})
#: A profile's own label and text: changed with its settings (a shipped profile changed by
#: ``[privacy]`` is named after the changes), said only when nothing else differs.
_PROFILE_LABELS = ("name", "description")


def differences(spec: JobSpec, job: JobRow, *, names_given: bool = False) -> list[str]:
    """What ``spec`` (a job file as :func:`~server_app.jobspec.load_job_spec` read it) sets
    otherwise than the stored ``job``, each as ``"<setting> (stored: …; job file: …)"``; empty
    if the file describes that job. ``names_given``: the file's ``[evaluation] names`` label
    its models (they are compared too); the labels taken from the model files' names are
    not, as the same models may be given from files of other names.

    Raises
    ------
    ConfigError
        The spec itself is invalid (as create-job would say).
    """
    stored_spec: dict[str, Any] = json.loads(job.spec_json)
    new = build_config(spec)
    # the stored configuration read as the server reads it, written as a new one is written
    old: dict[str, Any] = json.loads(JobConfig.from_json(job.config_json).to_json())
    fresh: dict[str, Any] = json.loads(new.to_json())
    out: list[str] = []
    if stored_spec.get("kind", "train") != spec.kind:
        out.append(_said("kind", stored_spec.get("kind", "train"), spec.kind))
        old.pop("evaluation", None)  # one of them has none: its fields are no news
        fresh.pop("evaluation", None)
    if list(stored_spec.get("clients", [])) != spec.clients:
        out.append(_said("clients", stored_spec.get("clients", []), spec.clients))
    if old.get("profile") != fresh.get("profile"):
        named = (str(stored_spec.get("profile")), spec.profile)
        out.append(_said("profile", *named) if named[0] != named[1]
                   else "profile settings: " + ", ".join(
                       _profile_changes(old.get("profile") or {}, fresh.get("profile") or {})))
    schema_differs = stored_schema_text(job.spec_json) != spec.schema_text
    if schema_differs:
        out.append("schema (the schema file's text)")
    if job.round_deadline_s != spec.round_deadline:
        out.append(_said("round_deadline", job.round_deadline_s, spec.round_deadline))
    wanted = default_min_clients(spec, new.profile)
    if job.min_clients != wanted:
        out.append(_said("min_clients", job.min_clients, wanted))
    for key in sorted((set(old) | set(fresh)) - _SKIPPED):
        if old.get(key) == fresh.get(key):
            continue
        if key in _FACTS:
            if schema_differs:
                continue  # the schema's facts follow from its text, said above
            where = "the schema's" if spec.schema_text is not None else "[data]"
            out.append(_said(f"{where} {key}", old.get(key), fresh.get(key)))
        else:
            out.append(_said(f"[forest] {key}", old.get(key), fresh.get(key)))
    was, now = old.get("evaluation") or {}, fresh.get("evaluation") or {}
    skipped = _SKIPPED_EVALUATION - ({"names"} if names_given else set())
    for key in sorted((set(was) | set(now)) - skipped):
        if was.get(key) != now.get(key):
            out.append(_said(f"[evaluation] {key}", was.get(key), now.get(key)))
    return out


def _profile_changes(was: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The settings of a profile of the same name (its file edited, or its ``[privacy]``
    table) that differ, a ``[dp]`` key by its own name, as ``[privacy]`` writes it."""
    def flat(profile: dict[str, Any]) -> dict[str, Any]:
        dp = profile.get("dp")
        out = {k: v for k, v in profile.items() if k != "dp"}
        if isinstance(dp, dict):
            out.update({(f"dp.{k}" if k in profile else k): v for k, v in dp.items()})
        elif dp is not None:
            out["dp"] = dp
        return out

    old, new = flat(was), flat(now)
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if not keys:  # alike once flat (an empty [dp] against none): the profiles' own keys
        old, new = was, now
        keys = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    shown = [k for k in keys if k not in _PROFILE_LABELS] or keys
    return [_said(k, old.get(k), new.get(k)) for k in shown]


def _said(name: str, stored: object, given: object) -> str:
    return f"{name} (stored: {_shown(stored)}; job file: {_shown(given)})"


def _shown(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list | tuple):
        return ", ".join(_shown(v) for v in value) if len(value) <= 10 else \
            f"{len(value)} entries"
    if isinstance(value, str):
        return value
    return json.dumps(value)
