"""What a client holds to on its own: the job configuration checked against its own knowledge.

The server sends each joining client the job's :class:`~fedforest_secure.config.JobConfig`. Its
privacy-relevant facts decide how much noise the client adds and what it reveals: the DP budget,
the number of clients (so ``K_min``, the survivors the noise is calibrated for), the target and
feature bounds (the sensitivity), the threshold. A client checks them against what it knows
without the server, before anything leaves the site:

* its pinned profile (``fedforest client --profile``): every privacy setting equal;
* its own schema file: the facts a schema fixes (:func:`schema_facts`), bounds included;
* its pinned number of clients (``--clients``), the job's membership as agreed out of band.

:func:`check_job_config` refuses (:class:`~fedforest_secure.errors.RefusedRequest`, code
``"job_config"``) with every disagreement named. Whatever the server says, the worker clips
each target to the bound the noise is calibrated for (:func:`clip_targets`), so a record never
moves a sum by more than the calibration assumes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FedForestError, RefusedRequest

if TYPE_CHECKING:
    from ..config import JobConfig
    from ..schema import Schema

__all__ = ["check_job_config", "clip_targets", "schema_facts"]

#: Profile fields that are labels for humans, not privacy settings.
PROFILE_LABELS = frozenset({"name", "description"})


def schema_facts(schema: Schema) -> dict[str, Any]:
    """The :class:`~fedforest_secure.config.JobConfig` fields a schema fixes (task, features,
    levels, public bounds, classes, the target's centre and half-width), as a job built from
    that schema holds them."""
    bounds: list[tuple[float, float]] | None = []
    for (lo, hi), kind, levels in zip(schema.bounds_array.tolist(), schema.feature_kinds,
                                      schema.n_levels, strict=True):
        if kind == "categorical":
            bounds.append((0.0, float(max(levels - 1, 1))))  # type: ignore[union-attr]
        elif math.isnan(lo) or math.isnan(hi):
            bounds = None
            break
        else:
            bounds.append((float(lo), float(hi)))  # type: ignore[union-attr]
    target_bound, target_offset = 1.0, 0.0
    if not schema.is_classification and schema.target.bounds is not None:
        # centred on the bounds' middle: sums of y and y^2 then carry the spread, not an
        # offset that the fixed-point scale (and floating point) would swamp it with
        lo, hi = (float(b) for b in schema.target.bounds)
        target_offset = lo / 2.0 + hi / 2.0  # (no overflow for bounds near the float range)
        target_bound = max(hi - target_offset, target_offset - lo)
    return {
        "task": "classification" if schema.is_classification else "regression",
        "n_features": schema.n_features,
        "feature_kinds": tuple(schema.feature_kinds),
        "n_levels": tuple(schema.n_levels),
        "feature_bounds": tuple(bounds) if bounds is not None else None,
        "n_classes": schema.n_classes,
        "target_bound": max(target_bound, 1e-12),
        "target_offset": target_offset,
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
        except (TypeError, ValueError):
            return False
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _profile_dict(profile: Any) -> dict[str, Any]:
    from .profile import PrivacyProfile

    if isinstance(profile, PrivacyProfile):
        return profile.to_dict()
    return PrivacyProfile.from_dict(profile).to_dict()


def check_job_config(config: JobConfig, *, profile: Any = None, schema: Schema | None = None,
                     n_clients: int | None = None) -> None:
    """Refuse a job configuration that disagrees with what this client knows on its own.

    Parameters
    ----------
    config : JobConfig
        The configuration the server sent.
    profile : PrivacyProfile or mapping, optional
        The client's pinned profile: every privacy setting must be equal (labels aside).
    schema : Schema, optional
        The client's own schema file: every fact it fixes (:func:`schema_facts`) must be equal.
    n_clients : int, optional
        The number of clients the client knows the job has.

    Raises
    ------
    RefusedRequest
        ``code="job_config"``, naming every field that differs.
    """
    diffs: list[str] = []
    if profile is not None:
        want = _profile_dict(profile)
        try:
            got = _profile_dict(config.profile)
        except FedForestError as exc:
            raise RefusedRequest(f"the job's privacy profile is not a valid profile ({exc}); "
                                 f"this site pinned {want.get('name', '?')!r}: refusing to take "
                                 "part", code="job_config") from None
        diffs += [f"profile.{k}: job {got.get(k)!r}, this site {want.get(k)!r}"
                  for k in sorted(set(want) | set(got))
                  if k not in PROFILE_LABELS and not _same(got.get(k), want.get(k))]
    if schema is not None:
        effective = {"feature_kinds": config.kinds, "n_levels": config.levels}
        for key, mine in schema_facts(schema).items():
            theirs = effective.get(key, getattr(config, key))
            if not _same(theirs, mine):
                diffs.append(f"{key}: job {theirs!r}, this site's schema {mine!r}")
    if n_clients is not None and config.n_clients != n_clients:
        diffs.append(f"n_clients: job {config.n_clients}, this site {n_clients}")
    if diffs:
        raise RefusedRequest(
            f"the configuration of job {config.job_id!r} disagrees with this site's own "
            f"({'; '.join(diffs)}): refusing to take part: this site did not join the "
            "job (it only asked what the job is)", code="job_config")


def clip_targets(config: JobConfig, y: np.ndarray) -> np.ndarray:
    """``y`` clipped to ``[-target_bound, target_bound]`` when the job's DP noise is calibrated
    for that bound (regression under ``[dp]``); otherwise ``y`` itself.

    Clipping is what makes the calibration hold whatever the data: each record's target enters
    the sums (and its square the sums of squares) with at most the bound the noise assumes.
    """
    if config.dp is None or config.task != "regression":
        return y
    bound = float(config.target_bound)
    if not (math.isfinite(bound) and bound > 0):
        from ..errors import BudgetError

        raise BudgetError(f"differential privacy needs a finite positive target bound, got "
                          f"{config.target_bound!r}")
    clipped: np.ndarray = np.clip(y, -bound, bound)
    return clipped
