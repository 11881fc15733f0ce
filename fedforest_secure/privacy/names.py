"""A shipped profile's name means that profile's settings.

The sites' status and logs show a job's profile by its name only, so the shipped names
(``open``, ``secure``, ``secure-dp``) and every name that starts with one of them followed by a
space or ``(`` (the form of :func:`derived_name`, e.g. ``secure-dp (epsilon = 2.0)``) are
reserved: such a name is taken only for the settings it describes, the name
:func:`derived_name` gives them. Names are compared after Unicode normalisation (NFKC), with
invisible format characters dropped, runs of white space made one space and case ignored, so
``"secure "`` or ``"Secure-DP"`` claim a shipped name as ``"secure"`` does.

The labels ``name`` and ``description`` are no settings (the sites' pin check ignores them).
"""

from __future__ import annotations

import json
import unicodedata
from functools import cache
from typing import Any

from ..errors import ProfileError
from .pinning import PROFILE_LABELS
from .profile import DPConfig, PrivacyProfile, available_profiles, load_profile

__all__ = ["checked_name", "claimed_base", "derived_name", "differences", "shown_value"]


def shown_value(v: Any) -> str:
    """A setting's value as a TOML file writes it (``true``, ``"clear"``, ``2.0``)."""
    return "absent" if v is None else json.dumps(v)


def _normal(name: str) -> str:
    kept = "".join(c for c in unicodedata.normalize("NFKC", name)
                   if unicodedata.category(c) != "Cf")
    return " ".join(kept.split()).casefold()


def claimed_base(name: str) -> str | None:
    """The shipped profile whose name ``name`` claims (itself, or it and a space or ``(``);
    None for a name of its own."""
    seen = _normal(name)
    for base in sorted(available_profiles(), key=len, reverse=True):
        if seen == base or seen.startswith((base + " ", base + "(")):
            return base
    return None


@cache
def _shipped(base: str) -> PrivacyProfile:
    return load_profile(base)


def _settings(profile: PrivacyProfile) -> dict[str, Any]:
    """The profile's settings, one per key, ``[dp]`` keys included by their own names (a
    profile without ``[dp]``: its required keys absent, the others at their defaults)."""
    out = {k: v for k, v in profile.to_dict().items() if k not in PROFILE_LABELS and k != "dp"}
    dp = profile.dp.model_dump(mode="json") if profile.dp is not None else {
        k: None if f.is_required() else f.get_default(call_default_factory=True)
        for k, f in DPConfig.model_fields.items()}
    out.update(dp)
    return out


def differences(profile: PrivacyProfile, base: str) -> list[tuple[str, Any, Any]]:
    """``(key, profile's value, shipped profile base's value)`` of every setting that
    differs."""
    mine, theirs = _settings(profile), _settings(_shipped(base))
    return [(k, mine.get(k), theirs.get(k)) for k in mine | theirs
            if mine.get(k) != theirs.get(k)]


def derived_name(profile: PrivacyProfile, base: str) -> str:
    """The shipped profile ``base`` changed into ``profile`` named after the base and the
    changes, e.g. ``secure-dp (epsilon = 2.0)``; ``base`` itself when nothing differs."""
    diffs = differences(profile, base)
    if not diffs:
        return base
    return f"{base} ({', '.join(f'{k} = {shown_value(v)}' for k, v, _ in diffs)})"


def checked_name(name: str, profile: PrivacyProfile, said: str, fix: str) -> str:
    """``name`` for the settings of ``profile``: a name of its own as it is, a name claiming
    a shipped profile only if it is the name :func:`derived_name` gives these settings (then
    written as that function writes it).

    Raises
    ------
    ProfileError
        ``said``, what differs, and ``fix`` (what to do), for a claimed name of other settings.
    """
    base = claimed_base(name)
    if base is None:
        return name
    derived = derived_name(profile, base)
    if _normal(name) == _normal(derived):
        return derived
    if _normal(name) == base:
        shown = "; ".join(f"{k} = {shown_value(mine)} ({base!r}: {shown_value(theirs)})"
                          for k, mine, theirs in differences(profile, base))
        raise ProfileError(f"{said}, a shipped profile's name, but its settings differ from "
                           f"that profile's: {shown}. The sites and `fedforest status` show a "
                           f"job's profile by its name: {fix}")
    raise ProfileError(f"{said}, in the form of the name of profile {base!r} with changes, but "
                       f"these settings are named {derived!r}. The sites and `fedforest "
                       f"status` show a job's profile by its name, so a name that starts with "
                       f"a shipped profile's name and a space or \"(\" is reserved for that "
                       f"profile and the changes it lists: {fix}")
