"""Privacy profiles: which protections a training job combines, and what it discloses.

A profile is a TOML file validated by :class:`PrivacyProfile`. Three ship with the package
(``open``, ``secure``, ``secure-dp``); :func:`load_profile` reads one of them or any TOML file and
applies keyword overrides::

    load_profile("secure-dp", epsilon=2.0)              # named "secure-dp (epsilon = 2.0)"
    load_profile("secure", secure_aggregation=False)

A shipped profile's name means its settings (:mod:`.names`): a profile changed by overrides
is named after the shipped profile and the changes, and a ``name=`` claiming a shipped
profile's name for other settings is refused. A file is read as it is, whatever its name (a
site's pin file is compared setting by setting; ``fedforest server create-job`` checks a job's
profile file's name).

Rules enforced here (each violation is a :class:`~fedforest_secure.errors.ProfileError`):

* ``secure_aggregation = true`` needs ``fixed_point = true`` (masks live in the fixed-point ring),
  ``rows_per_sketch_point >= 2``, ``min_clients >= 3`` (the sum of two clients tells each one the
  other's vector) and ``threshold > 0.5`` (a strict majority of the job's clients unmasks).
* ``[dp]`` needs ``secure_aggregation = true``: noise is *distributed* (each client adds a share
  so that only the sum carries the calibrated scale), so in the clear every client's vector would
  carry only a fraction of it. It also refuses anything disclosed in plaintext (``sketch =
  "quantiles"``, ``h_splits = "clear"``), which would void the guarantee.
* ``h_splits = "noisy"`` needs ``[dp]`` (the noise scale comes from it); a job that splits on
  the client also needs ``dp.h_epsilon``, the budget of the noisy per-client node summaries
  (:mod:`.hsplits`; the coordinator fails closed without it).
* ``dp.dropout_tolerance`` must cover the dropouts the unmasking threshold accepts
  (``dropout_tolerance >= 1 - threshold``); when omitted it defaults to ``1 - threshold``.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tomli_w
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ..config_errors import allowed_keys, submodel_at
from ..errors import ProfileError

__all__ = ["DPConfig", "PrivacyProfile", "available_profiles", "load_profile",
           "with_profile_defaults"]

_PROFILE_DIR = "profiles"


class DPConfig(BaseModel):
    """The ``[dp]`` section: differential privacy of everything the server learns.

    Attributes
    ----------
    epsilon : float
        Total privacy budget for one training job, finite and > 0.
    delta : float
        Total delta in (0, 1) (the Gaussian mechanism needs delta > 0).
    mechanism : {"gaussian_discrete"}
        Distributed discrete Gaussian noise on fixed-point integers.
    dropout_tolerance : float or None
        Fraction of a round's clients that may drop while the sum still carries the full noise
        scale; each client adds variance ``sigma**2 / K_min`` with
        ``K_min = ceil(K * (1 - dropout_tolerance))``. None means ``1 - threshold``.
    max_multiplicity : int
        Cap on a record's bootstrap multiplicity ``m_max`` (workers clip to it); it scales every
        sensitivity.
    h_epsilon : float or None
        Budget of the noisy per-client node summaries of ``h_splits = "noisy"``, spent *in
        addition to* ``epsilon`` (which the aggregated sums use): such a job is
        ``(total_epsilon, delta)``-DP with ``total_epsilon < epsilon + h_epsilon`` (the
        accountant composes both in Renyi DP; docs/privacy.md, "H-splits"). Required for noisy
        H-splits (a job without it fails closed); ignored otherwise.
    colluders : int
        Sites that may collude with the server, against which ``epsilon`` still holds
        (>= 0, default 0). The noise is distributed: a colluding site knows (or never adds)
        its own share, and the server may drop honest sites down to ``K_min``, so the honest
        sites' sum carries only ``K_min - colluders`` sites' noise. Each site's noise is
        calibrated for that many honest noise-adders. A job refuses ``colluders >= K_min``
        and ``colluders >= min(2t - n, t - 1)`` (that many colluders can get the server one
        site's vector, which carries that site's noise alone), and any colluders with
        ``neighbours`` (SecAgg+). More colluders: more noise per site (docs/privacy.md,
        "Colluding sites").
    class_priors : {"uniform", "rows"}
        A random-split classifier's node values: ``"uniform"`` weights the leaves' noisy class
        counts towards uniform class priors as far as the release shows the classes'
        frequencies (``predict`` then aims at balanced accuracy and ``predict_proba`` estimates
        probabilities under equal class priors; docs/privacy.md §2.6); ``"rows"`` keeps the
        training rows' class frequencies (calibrated probabilities, plain accuracy).
        Post-processing either way: the same releases and budget.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    epsilon: float
    delta: float
    mechanism: Literal["gaussian_discrete"] = "gaussian_discrete"
    dropout_tolerance: float | None = None
    max_multiplicity: int = 4
    h_epsilon: float | None = None
    colluders: int = 0
    class_priors: Literal["uniform", "rows"] = "uniform"

    @model_validator(mode="after")
    def _validate(self) -> DPConfig:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be finite and > 0, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1) for Gaussian noise, got {self.delta}")
        tol = self.dropout_tolerance
        if tol is not None and not 0 <= tol < 1:
            raise ValueError(f"dropout_tolerance must be in [0, 1), got {tol}")
        if self.max_multiplicity < 1:
            raise ValueError(f"max_multiplicity must be >= 1, got {self.max_multiplicity}")
        h = self.h_epsilon
        if h is not None and not (math.isfinite(h) and h > 0):
            raise ValueError(f"h_epsilon must be finite and > 0, got {h}")
        if self.colluders < 0:
            raise ValueError(f"colluders must be >= 0 (the sites that may collude with the "
                             f"server), got {self.colluders}")
        return self


class PrivacyProfile(BaseModel):
    """A validated privacy profile (immutable).

    Attributes
    ----------
    name : str
        The profile's label (what a site pins with ``--profile``).
    secure_aggregation : bool
        Pairwise masking; False means plain sums with identical results.
    threshold : float
        Fraction of the job's clients needed to unmask, in (0, 1]: ``t = ceil(threshold x
        n_clients)`` for every round, so dropouts do not lower it.
    sketch : {"quantiles", "secure_cdf"}
        The paper's per-client quantile sketches (disclosed) or a pooled CDF sketch whose counts
        are aggregated like any other statistic.
    rows_per_sketch_point : int
        Adaptive B: a sketch point summarises at least this many rows (>= 1; 1 is the paper's
        ``B < n`` rule; secure profiles need >= 2). With r >= 2 a per-client sketch counts
        the client's distinct rows (a bootstrap repeat or frequency weight once).
    abstain_below : int
        A client with fewer distinct rows than this at a node contributes nothing for it or
        its subtree (0: never). Bootstrap repeats of a row count once.
    h_splits : {"off", "noisy", "clear"}
        Splits on the client indicator H: not at all, on DP-noised per-client summaries, or on
        plaintext per-client summaries.
    dp : DPConfig or None
        Differential privacy; None means no noise.
    fixed_point : bool
        Encode summable vectors in the fixed-point ring. A profile with
        ``secure_aggregation = false`` and the same ``fixed_point``/``frac_bits`` grows the same
        forest, split for split.
    frac_bits : int
        Fractional bits of the fixed-point encoding of real-valued sums (0..40; a job of K
        sites refuses more than their sums hold, 34 - floor(log2 K): 33 for 2-3 sites, 32 for
        4-7, 31 for 8-15, 30 for 16-31). Under ``[dp]`` the sums' noise grows with
        ``2**frac_bits``: a small epsilon with a large ``frac_bits`` whose noise the sampler
        cannot draw is refused before any round, naming the largest ``frac_bits`` it can.
    min_clients : int
        Sums over fewer clients are refused (default 3 with secure aggregation, else 1).
    neighbours : int or None
        Secure aggregation's graph: None shares masks between every pair of a round's clients
        (the complete graph); an int ``k >= 2`` is the SecAgg+ sparse graph, each client sharing
        with ``~k`` neighbours drawn from the round's public seed, so a client's cost grows with
        ``k`` rather than with the number of clients (choose ``k`` of order ``log2 K``; see
        docs/privacy.md). Needs ``secure_aggregation = true``.
    site_metrics : bool
        An evaluation job may ask this site for its own evaluation statistics in the clear
        (per-site metrics); false: the site sends them only inside the secure sum. Not with
        ``[dp]`` (the statistics would carry no noise).
    description : str
        Free text for humans.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    secure_aggregation: bool
    threshold: float = 1.0
    sketch: Literal["quantiles", "secure_cdf"]
    rows_per_sketch_point: int = 1
    abstain_below: int = 0
    h_splits: Literal["off", "noisy", "clear"] = "off"
    dp: DPConfig | None = None
    fixed_point: bool = False
    frac_bits: int = 24
    min_clients: int = 1
    neighbours: int | None = None
    site_metrics: bool = False
    description: str = ""

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "min_clients" not in data:
            data = dict(data)
            data["min_clients"] = _default_min_clients(data)
        return data

    @model_validator(mode="after")
    def _validate(self) -> PrivacyProfile:
        if not self.name.strip():
            raise ValueError("name must not be empty")
        if not (math.isfinite(self.threshold) and 0 < self.threshold <= 1):
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.rows_per_sketch_point < 1:
            raise ValueError(
                f"rows_per_sketch_point must be >= 1, got {self.rows_per_sketch_point}"
            )
        if self.abstain_below < 0:
            raise ValueError(f"abstain_below must be >= 0, got {self.abstain_below}")
        if not 0 <= self.frac_bits <= 40:
            raise ValueError(f"frac_bits must be in [0, 40], got {self.frac_bits}")
        if self.min_clients < 1:
            raise ValueError(f"min_clients must be >= 1, got {self.min_clients}")
        if self.secure_aggregation:
            if not self.fixed_point:
                raise ValueError("secure_aggregation = true needs fixed_point = true")
            if self.rows_per_sketch_point < 2:
                raise ValueError(
                    "secure_aggregation = true needs rows_per_sketch_point >= 2 "
                    "(a sketch point must not pin a single row)"
                )
            if self.min_clients < 3:  # the sum of two tells each one the other's vector
                raise ValueError("secure_aggregation = true needs min_clients >= 3")
            if self.threshold <= 0.5:
                raise ValueError(f"secure_aggregation = true needs threshold > 0.5 (a strict "
                                 f"majority of the job's clients unmasks), got "
                                 f"{self.threshold}")
        if self.neighbours is not None:
            if not self.secure_aggregation:
                raise ValueError("neighbours (the SecAgg+ graph) needs secure_aggregation = true")
            if self.neighbours < 2:
                raise ValueError(f"neighbours must be >= 2, got {self.neighbours}")
        if self.h_splits == "noisy" and self.dp is None:
            raise ValueError('h_splits = "noisy" needs a [dp] section for the noise scale')
        if self.dp is not None:
            if not self.secure_aggregation:
                raise ValueError(
                    "dp needs secure_aggregation = true: the noise is split across clients so "
                    "only the sum carries the calibrated scale"
                )
            if self.sketch == "quantiles":
                raise ValueError('dp is incompatible with sketch = "quantiles" (plaintext)')
            if self.h_splits == "clear":
                raise ValueError('dp is incompatible with h_splits = "clear" (plaintext)')
            if self.site_metrics:
                raise ValueError("dp is incompatible with site_metrics = true (plaintext "
                                 "per-site evaluation statistics)")
            tol = self.dp.dropout_tolerance
            if tol is not None and tol < 1 - self.threshold - 1e-12:
                raise ValueError(
                    f"dp.dropout_tolerance ({tol}) must be >= 1 - threshold "
                    f"({1 - self.threshold:.6g}): rounds the threshold accepts would carry less "
                    "noise than calibrated"
                )
        return self

    # ------------------------------------------------------------------ derived
    @property
    def dropout_tolerance(self) -> float:
        """The DP dropout tolerance in effect (``1 - threshold`` unless set; 0 without dp)."""
        if self.dp is None:
            return 0.0
        if self.dp.dropout_tolerance is not None:
            return self.dp.dropout_tolerance
        return max(0.0, 1.0 - self.threshold)

    @property
    def disclosures(self) -> list[str]:
        """Everything this profile lets the server learn beyond (noised) sums over clients."""
        out: list[str] = []
        if not self.secure_aggregation:
            out.append("per-client statistic vectors (no secure aggregation)")
        if self.sketch == "quantiles":
            out.append("per-client quantile sketches")
        if self.h_splits == "clear":
            out.append("per-client node summaries")
        elif self.h_splits == "noisy":
            out.append("noisy per-client node summaries")
        if self.site_metrics:
            out.append("per-client evaluation statistics (evaluation jobs that ask)")
        return out

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        """All fields as a JSON-ready mapping (for model files); ``neighbours`` only when set,
        ``dp.class_priors`` only when not ``"uniform"`` and ``dp.colluders`` only when not 0,
        so the mapping of a profile that keeps those defaults holds none of these keys."""
        out = self.model_dump(mode="json")
        if out.get("neighbours") is None:
            out.pop("neighbours", None)
        dp = out.get("dp")
        if isinstance(dp, dict) and dp.get("class_priors") == "uniform":
            dp.pop("class_priors")
        if isinstance(dp, dict) and dp.get("colluders") == 0:
            dp.pop("colluders")
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyProfile:
        """Validate a mapping; every failure is a :class:`ProfileError`."""
        if not isinstance(data, Mapping):
            raise ProfileError(f"a profile must be a mapping, got {type(data).__name__}")
        try:
            return cls.model_validate(_python_values(data))
        except ValidationError as exc:
            raise ProfileError(_format_error(exc, data)) from None

    def to_toml(self) -> str:
        """TOML text that :func:`load_profile` reads back to an equal profile."""
        return tomli_w.dumps(self.model_dump(mode="json", exclude_none=True))


def _python_values(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with each numpy scalar (``np.int64(2)``, ``np.float32(0.5)``, ``np.True_``) as
    the Python value it holds, in the ``dp`` section too: the strict checks take it as they
    take that value (an integer setting takes ``np.int64(2)``, not ``np.True_`` nor
    ``np.float64(2.0)``, as it takes 2, not True nor 2.0). Arrays are left as they are."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, np.generic):
            value = value.item()
        elif isinstance(value, Mapping):
            value = _python_values(value)
        out[key] = value
    return out


def _default_min_clients(data: Mapping[str, Any]) -> int:
    """``min_clients`` of a profile that leaves it out: 3 with secure aggregation, else 1."""
    return 3 if data.get("secure_aggregation") is True else 1


def with_profile_defaults(profile: Mapping[str, Any]) -> dict[str, Any]:
    """``profile`` with every setting it leaves out at :class:`PrivacyProfile`'s default.

    A job's profile travels as a mapping (``JobConfig.profile``). Whoever reads a setting from
    it reads it through this function (or through :meth:`PrivacyProfile.from_dict`), so a
    left-out setting means what it means to a site's pin check: ``threshold`` 1.0 (t = n),
    ``h_splits = "off"``, ``rows_per_sketch_point`` 1, ``abstain_below`` 0, ``min_clients`` 3
    with secure aggregation (else 1), and so on; a server cannot weaken a setting by leaving it
    out. Nothing is validated (:meth:`PrivacyProfile.from_dict` does that): settings without a
    default (``name``, ``secure_aggregation``, ``sketch``) stay left out.
    """
    out = dict(profile)
    if "min_clients" not in out:
        out["min_clients"] = _default_min_clients(out)
    for key, info in PrivacyProfile.model_fields.items():
        if key not in out and not info.is_required():
            out[key] = info.get_default(call_default_factory=True)
    return out


def _format_error(exc: ValidationError, data: Mapping[str, Any]) -> str:
    name = data.get("name") if isinstance(data, Mapping) else None
    parts = []
    for err in exc.errors():
        loc = ".".join(str(k) for k in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            owner = submodel_at(PrivacyProfile, err["loc"][:-1])
            msg = "unknown field"
            if owner is not None:
                msg += f" (allowed: {', '.join(allowed_keys(owner))})"
        parts.append(f"{loc}: {msg}" if loc else msg)
    label = f" {name!r}" if isinstance(name, str) else ""
    return f"invalid privacy profile{label}: " + "; ".join(parts)


def available_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    root = resources.files(__package__).joinpath(_PROFILE_DIR)
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def _read_toml(source: str | Path) -> dict[str, Any]:
    if isinstance(source, str) and source in available_profiles():
        res = resources.files(__package__).joinpath(_PROFILE_DIR).joinpath(f"{source}.toml")
        text = res.read_text(encoding="utf-8")
        where = f"shipped profile {source!r}"
    else:
        path = Path(source)
        if not (path.suffix == ".toml" or path.exists() or isinstance(source, Path)):
            raise ProfileError(
                f"unknown profile {str(source)!r}: not one of {available_profiles()} "
                "and not a path to a .toml file"
            )
        try:
            text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (Notepad) is no text
        except (OSError, UnicodeDecodeError) as exc:
            raise ProfileError(f"cannot read profile file {path}: {exc}") from None
        where = str(path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"cannot parse {where}: {exc}") from None


def load_profile(name_or_path: str | Path | PrivacyProfile, **overrides: Any) -> PrivacyProfile:
    """Load a shipped profile, a TOML file, or copy a profile, applying keyword overrides.

    Parameters
    ----------
    name_or_path : str, Path or PrivacyProfile
        ``"open"``, ``"secure"``, ``"secure-dp"``, a path to a TOML file, or a profile.
    **overrides
        Top-level fields (``secure_aggregation=False``, ``dp=None``, ``dp={...}``) or fields of
        the ``[dp]`` section (``epsilon=2.0``, ``delta=1e-7``); the latter need a profile with
        a ``[dp]`` section (or a ``dp=`` override). ``dp={...}`` overrides the keys it gives
        and keeps the profile's other ``[dp]`` keys, as a job file's ``[privacy.dp]`` table
        does; on a profile without ``[dp]`` it gives the section whole. With overrides, a
        profile named like a shipped one is named after it and its changes
        (``secure-dp (epsilon = 2.0)``), and ``name=`` may not claim a shipped profile's name
        for other settings (:mod:`~fedforest_secure.privacy.names`).

    Raises
    ------
    ProfileError
        Unknown name or keyword, unreadable file, a profile that does not validate, or a
        ``name=`` claiming a shipped profile's name for other settings.
    """
    if isinstance(name_or_path, PrivacyProfile):
        data = name_or_path.model_dump()
    elif isinstance(name_or_path, str | Path):
        data = _read_toml(name_or_path)
    else:
        raise ProfileError(
            f"expected a profile name, path or PrivacyProfile, got {type(name_or_path).__name__}"
        )
    if not overrides:
        return PrivacyProfile.from_dict(data)
    top = set(PrivacyProfile.model_fields)
    dp_fields = set(DPConfig.model_fields)
    dp_over = {k: v for k, v in overrides.items() if k in dp_fields and k not in top}
    unknown = sorted(set(overrides) - top - dp_fields)
    if unknown:
        raise ProfileError(
            f"unknown profile override(s) {unknown}; valid: {sorted(top | dp_fields)}"
        )
    source = data.get("name")
    given_dp = overrides.get("dp")
    twice = sorted(set(dp_over) & set(given_dp)) if isinstance(given_dp, Mapping) else []
    if twice:  # neither silently wins
        raise ProfileError(f"{twice[0]} is given twice, as {twice[0]}= and in dp=: give it once")
    for k, v in overrides.items():
        if k == "dp" and isinstance(v, Mapping) and isinstance(data.get("dp"), Mapping | DPConfig):
            # dp={...} overrides the keys it gives, as a job file's [privacy.dp] table does
            dp = data["dp"]
            data["dp"] = {**(dp.model_dump() if isinstance(dp, DPConfig) else dp), **v}
        elif k in top:
            data[k] = v
    if dp_over:
        dp = data.get("dp")
        if isinstance(dp, DPConfig):
            dp = dp.model_dump()
        if not isinstance(dp, Mapping):
            raise ProfileError(
                f"cannot override {sorted(dp_over)}: profile {data.get('name')!r} has no [dp] "
                "section (pass dp={...} or start from 'secure-dp')"
            )
        data["dp"] = {**dp, **dp_over}
    return _named(PrivacyProfile.from_dict(data), source, "name" in overrides)


def _named(profile: PrivacyProfile, source: Any, given: bool) -> PrivacyProfile:
    """``profile`` (read with overrides) under the name it may bear
    (:mod:`~fedforest_secure.privacy.names`): a profile named like a shipped one takes the
    shipped name and its changes (``secure-dp (epsilon = 2.0)``); a ``name=`` claiming a shipped
    profile's name for other settings is refused."""
    from .names import checked_name, claimed_base, derived_name

    def auto(name: str) -> str:
        base = claimed_base(name)
        return name if base is None else derived_name(profile, base)

    if not given:
        name = auto(profile.name)
    else:
        otherwise = auto(source) if isinstance(source, str) and source.strip() else None
        name = checked_name(profile.name, profile, f"name={profile.name!r}",
                            'pass a name of its own (name="...")' + (
                                "" if otherwise is None else
                                f", or leave name= out (the profile is then named "
                                f"{otherwise!r})"))
    return profile if name == profile.name else profile.model_copy(update={"name": name})
