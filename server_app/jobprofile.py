"""A job's privacy profile: the job file's ``profile`` with its ``[privacy]`` table applied.

``[privacy]`` overrides the profile's keys. A ``[dp]`` key may be written directly
(``epsilon = 2.0``) or in a ``[privacy.dp]`` table; either way it overrides that one key of the
profile's ``[dp]`` section, whose other keys stay. A key written both ways is refused (neither
reading wins silently), and so is a ``[dp]`` key for a profile without a ``[dp]`` section
unless ``[privacy.dp]`` gives the section whole (``epsilon`` and ``delta``).

A shipped profile's name means that profile's settings, since the sites' status and logs show
the job's profile by its name only (:mod:`fedforest_secure.privacy.names`, the rule
:func:`~fedforest_secure.privacy.load_profile` applies too):

* a name claiming a shipped profile (its name, or its name and a space or ``(``), given by
  ``[privacy] name`` or by a profile file's ``name``, is refused unless it is the name the
  settings get from that rule, and the refusal names what differs;
* a shipped profile that ``[privacy]`` changes without naming it is named after the base and
  the changes, e.g. ``secure-dp (epsilon = 2.0)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedforest_secure.errors import ProfileError
from fedforest_secure.privacy import DPConfig, PrivacyProfile, load_profile
from fedforest_secure.privacy.names import checked_name, claimed_base, derived_name, shown_value

from .settings import ConfigError

__all__ = ["job_profile"]

_DP_ONLY = frozenset(DPConfig.model_fields) - frozenset(PrivacyProfile.model_fields)
_DP_REQUIRED = tuple(k for k, f in DPConfig.model_fields.items() if f.is_required())
_value = shown_value


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
        not validate, or a name claiming a shipped profile for other settings.
    """
    base = load_profile(name)
    over = dict(overrides)
    given = over.pop("name", None)
    dp = _dp_overrides(base, over)
    if dp is not None:
        over["dp"] = dp
    if given is None:  # the file's own name, for the file's own settings
        base = _renamed(base, _checked(
            base.name, base, f"the profile file {name} names itself {_value(base.name)}",
            f"give it a name of its own: name = \"...\" in {name}"))
    # named as the base is, or (a base named like a shipped profile) after it and the changes
    prof = load_profile(base, **over) if over else base
    if given is None:
        return prof
    named = PrivacyProfile.from_dict({**prof.model_dump(), "name": given})  # a valid name
    claimed = claimed_base(prof.name)
    unnamed = prof.name if claimed is None else derived_name(prof, claimed)
    return _renamed(named, _checked(
        named.name, named, f"[privacy] name = {_value(given)}",
        'give it a name of its own ([privacy] name = "..."), or leave name out (the server '
        f"then names the profile {unnamed!r})"))


def _checked(name: str, profile: PrivacyProfile, said: str, fix: str) -> str:
    """:func:`~fedforest_secure.privacy.names.checked_name`, its refusal a ConfigError (the
    message names the job file's key, no profile needs naming before it)."""
    try:
        return checked_name(name, profile, said, fix)
    except ProfileError as exc:
        raise ConfigError(str(exc)) from None


def _renamed(profile: PrivacyProfile, name: str) -> PrivacyProfile:
    return profile if name == profile.name else profile.model_copy(update={"name": name})
