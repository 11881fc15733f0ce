"""A job's privacy profile: the job file's ``profile`` with its ``[privacy]`` table applied.

``[privacy]`` overrides the profile's keys. A ``[dp]`` key may be written directly
(``epsilon = 2.0``) or in a ``[privacy.dp]`` table; either way it overrides that one key of the
profile's ``[dp]`` section, whose other keys stay. A key written both ways is refused (neither
reading wins silently), and so is a ``[dp]`` key for a profile without a ``[dp]`` section
unless ``[privacy.dp]`` gives the section whole (``epsilon`` and ``delta``).

A shipped profile's name means that profile's settings, since the sites' status and logs show
the job's profile by its name only:

* a profile named like a shipped one (by ``[privacy] name`` or by a profile file's ``name``)
  whose settings differ from it is refused, naming the settings that differ;
* a shipped profile that ``[privacy]`` changes without naming it is named after the base and
  the changes, e.g. ``secure-dp (epsilon = 2.0)``.

The labels ``name`` and ``description`` are no settings (the sites' pin check ignores them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fedforest_secure.privacy import DPConfig, PrivacyProfile, available_profiles, load_profile
from fedforest_secure.privacy.pinning import PROFILE_LABELS

from .settings import ConfigError

__all__ = ["job_profile"]

_DP_ONLY = frozenset(DPConfig.model_fields) - frozenset(PrivacyProfile.model_fields)
_DP_REQUIRED = tuple(k for k, f in DPConfig.model_fields.items() if f.is_required())


def _value(v: Any) -> str:
    """A setting's value as a TOML file writes it (``true``, ``"clear"``, ``2.0``)."""
    return "absent" if v is None else json.dumps(v)


def _settings(profile: PrivacyProfile) -> dict[str, Any]:
    """The profile's settings, one per key, ``[dp]`` keys included by their own names (a
    profile without ``[dp]``: its required keys absent, the others at their defaults)."""
    out = {k: v for k, v in profile.to_dict().items() if k not in PROFILE_LABELS and k != "dp"}
    dp = profile.dp.model_dump(mode="json") if profile.dp is not None else {
        k: None if f.is_required() else f.get_default(call_default_factory=True)
        for k, f in DPConfig.model_fields.items()}
    out.update(dp)
    return out


def _differences(job: PrivacyProfile, shipped: PrivacyProfile) -> list[tuple[str, Any, Any]]:
    mine, theirs = _settings(job), _settings(shipped)
    return [(k, mine.get(k), theirs.get(k)) for k in mine | theirs
            if mine.get(k) != theirs.get(k)]


def _dp_overrides(base: PrivacyProfile, over: dict[str, Any]) -> dict[str, Any] | None:
    """The ``[dp]`` section after the job file's ``[dp]`` keys (popped from ``over``); None
    if the file gives none."""
    flat = {k: over.pop(k) for k in list(over) if k in _DP_ONLY}
    table = over.pop("dp", None)
    if table is not None and not isinstance(table, Mapping):
        raise ConfigError(f"[privacy] dp = {_value(table)}: write the [dp] keys in a "
                          "[privacy.dp] table, or directly in [privacy]")
    table = dict(table or {})
    twice = sorted(set(flat) & set(table))
    if twice:
        k = twice[0]
        raise ConfigError(f"[privacy] sets {k} twice, as [privacy] {k} = {_value(flat[k])} and "
                          f"[privacy.dp] {k} = {_value(table[k])}: keep one of them")
    given = {**flat, **table}
    if not given:
        return None
    if base.dp is None:
        missing = [k for k in _DP_REQUIRED if k not in given]
        if missing:
            keys = ", ".join(sorted(given))
            raise ConfigError(
                f"[privacy] {keys}: profile {base.name!r} has no [dp] section for these to "
                f"override; give the section whole in a [privacy.dp] table (with "
                f"{' and '.join(_DP_REQUIRED)}), or start from profile = \"secure-dp\"")
        return given
    return {**base.dp.model_dump(), **given}


def job_profile(name: str, overrides: Mapping[str, Any]) -> PrivacyProfile:
    """The profile ``name`` (shipped, or a profile file's path) with the ``[privacy]`` table
    ``overrides`` applied.

    Raises
    ------
    ConfigError, ProfileError
        A key given twice, a ``[dp]`` key without a section to override, a profile that does
        not validate, or a shipped profile's name on other settings.
    """
    shipped_names = available_profiles()
    base = load_profile(name)
    over = dict(overrides)
    dp = _dp_overrides(base, over)
    if dp is not None:
        over["dp"] = dp
    prof = load_profile(base, **over) if over else base
    if "name" in over:
        _refuse_a_false_name(prof, f"[privacy] name = {_value(prof.name)}")
        return prof
    if base.name not in shipped_names:
        return prof
    _refuse_a_false_name(base, f"the profile file {name} names itself {base.name!r}")
    diffs = _differences(prof, load_profile(base.name))
    if not diffs:
        return prof
    changes = ", ".join(f"{k} = {_value(mine)}" for k, mine, _ in diffs)
    return prof.model_copy(update={"name": f"{prof.name} ({changes})"})


def _refuse_a_false_name(profile: PrivacyProfile, said: str) -> None:
    """Refuse ``profile`` if it carries a shipped profile's name on other settings."""
    if profile.name not in available_profiles():
        return
    diffs = _differences(profile, load_profile(profile.name))
    if diffs:
        shown = "; ".join(f"{k} = {_value(mine)} ({profile.name!r}: {_value(theirs)})"
                          for k, mine, theirs in diffs)
        raise ConfigError(
            f"{said}, a shipped profile's name, but its settings differ from that profile's: "
            f"{shown}. The sites and `fedforest status` show a job's profile by its name: "
            "give it a name of its own ([privacy] name = \"...\")")
