"""A site's pinned privacy profile (``--profile``) against the profile its job states: the check
before the site joins, and the job's profile as the site then runs it (every setting the
server left out at its default)."""

from __future__ import annotations

from typing import Any

from fedforest_secure.errors import FedForestError
from fedforest_secure.privacy import PrivacyProfile, load_profile

__all__ = ["ProfileRefused", "check_job_profile", "job_profile_settings", "pinned_profile"]


class ProfileRefused(FedForestError):
    """The job's privacy profile is not the one this site pinned: the client takes no part."""


#: Profile fields that are labels for humans, not privacy settings.
_PROFILE_LABELS = frozenset({"name", "description"})


def pinned_profile(name_or_path: str) -> dict[str, Any]:
    """The profile a site pins with ``--profile`` (shipped name or TOML path), as a dict."""
    return load_profile(name_or_path).to_dict()


def check_job_profile(pinned: dict[str, Any], job_profile: Any) -> None:
    """Refuse (:class:`ProfileRefused`) a job whose profile differs from the pinned one.

    Every privacy setting must be equal (secure aggregation, fixed point, threshold, sketch,
    abstention, H-splits, the whole ``dp`` section with its budget, ``min_clients``, ...); only
    the labels ``name`` and ``description`` may differ. A server cannot hand the site a weaker
    profile (``open``, ``secure_aggregation = false``, a larger or missing DP budget), nor a
    different one that it claims is equivalent.
    """
    want = pinned.get("name", "?")
    job = job_profile_settings(job_profile, pinned=want)
    diffs = sorted(k for k in set(pinned) | set(job)
                   if k not in _PROFILE_LABELS and pinned.get(k) != job.get(k))
    if diffs:
        shown = "; ".join(f"{k}: job {job.get(k)!r}, pinned {pinned.get(k)!r}" for k in diffs)
        raise ProfileRefused(
            f"the job's privacy profile {job.get('name', '?')!r} is not the profile this site "
            f"pinned ({want!r}): {shown}. Refusing to take part: this site did not join the job "
            "(it only asked what the job is)")


def job_profile_settings(job_profile: Any, *, pinned: str | None = None) -> dict[str, Any]:
    """The job's privacy profile as this site runs the job with it: every setting the server
    left out at :class:`PrivacyProfile`'s default (``threshold`` 1.0, ``h_splits = "off"``,
    ...), the same reading as the pin check's. The client replaces the job configuration's
    profile with it once, when it accepts the job, so every reader (the worker, the
    secure-aggregation session, the encoding of uploads) sees one set of defaults, not each its
    own. A profile that is not a valid one is refused (:class:`ProfileRefused`), pinned or not.
    """
    try:
        return PrivacyProfile.from_dict(job_profile).to_dict()
    except FedForestError as exc:
        why = "refusing to take part" if pinned is None else \
            f"this site pinned {pinned!r}: refusing to take part"
        raise ProfileRefused(f"the job's privacy profile is not a valid profile ({exc}); "
                             f"{why}") from None
