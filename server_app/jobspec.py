"""The operator's job file (``fedforest server create-job --job job.toml``) and its JobConfig.

Example::

    id = "readmission-2024"
    clients = ["hospital-a", "hospital-b", "hospital-c"]   # order fixes each client's index
    profile = "secure"            # a profile shipped with the package, or a path to a TOML file
    schema = "schema.toml"        # the schema every client validates its table against
    round_deadline = 120.0        # seconds a client has to answer one round
    min_clients = 2               # optional; default: the profile's threshold x len(clients)

    [forest]                      # hyper-parameters, scikit-learn meanings
    n_estimators = 50
    max_depth = 8
    random_state = 0

    [data]                        # optional: facts normally read from the schema
    task = "classification"
    n_features = 30
    n_classes = 2
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedforest_secure.config import MAX_BINS, MAX_ESTIMATORS, JobConfig, resolve_max_features
from fedforest_secure.config_errors import allowed_keys, explain
from fedforest_secure.privacy import available_profiles
from fedforest_secure.privacy.pinning import schema_facts
from fedforest_secure.protocol.api import NAME_PATTERN
from fedforest_secure.schema import Schema

from .evaljob import EvaluationParams, embed_models, evaluation_of, set_models
from .jobprofile import job_profile
from .settings import ConfigError

__all__ = ["MAX_RANDOM_STATE", "ForestParams", "JobSpec", "build_config", "load_job_spec",
           "parse_schema", "resolve_profile", "schema_sha256", "stored_schema_text"]

#: the largest ``random_state``, as of ``--seed`` (scikit-learn's forests take one below 2**32)
MAX_RANDOM_STATE = 2**32 - 1


class ForestParams(BaseModel):
    """The ``[forest]`` table: the forest's hyper-parameters (scikit-learn meanings)."""

    # strict: TOML's true is no number, "no" no boolean and "16" no integer
    model_config = ConfigDict(extra="forbid", strict=True)

    n_estimators: int = Field(default=50, ge=1, le=MAX_ESTIMATORS, description=(
        "number of trees T"))
    max_depth: int = Field(default=8, ge=1, le=60, description=(
        "maximum depth M of every tree (the root is depth 0)"))
    min_samples_leaf: int = Field(default=5, ge=1, description=(
        "a split must leave at least this many (bootstrap) rows on each side"))
    min_samples_split: int = Field(default=2, ge=2, description=(
        "a node with fewer rows is not split"))
    min_impurity_decrease: float = Field(default=0.0, ge=0.0, description=(
        "a split must decrease the weighted impurity by at least this much"))
    max_features: int | float | str | None = Field(default=1 / 3, description=(
        'features drawn per node: an int, a fraction in (0, 1], "sqrt", "log2"; absent: 1/3 '
        "of the features"))
    bootstrap: bool = Field(default=True, description=(
        "each site resamples its own rows per tree (client-stratified bootstrap); false: "
        "every tree sees every row"))
    n_bins: int = Field(default=32, ge=2, le=MAX_BINS, description=(
        "sketch size B: candidate thresholds per feature and node (method = \"random\": "
        "fixed-width bins of the marginal counts the thresholds are drawn from)"))
    method: str = Field(default="quantiles", description=(
        'how split candidates are found: "quantiles" (the paper), "avgimp", "exact" (open '
        'profile only), "histogram", "random" (random features, thresholds drawn from the '
        'pooled marginal counts; for DP)'))
    top_l: int | None = Field(default=None, description=(
        'shortlist of L candidate features per node (with method = "avgimp")'))
    split_on_client: bool = Field(default=False, description=(
        "allow splits on the site indicator H (the profile's h_splits decides how)"))
    criterion: str | None = Field(default=None, description=(
        'impurity: "gini" or "entropy" for classification, "mse" for regression; absent: '
        "gini / mse"))
    random_state: int = Field(default=0, ge=0, le=MAX_RANDOM_STATE, description=(
        "seed of the coordinator's feature sampling and the sites' bootstrap"))


    @field_validator("max_features", mode="before")
    @classmethod
    def _features(cls, v: object) -> object:
        """One message for a value of no allowed type (not one per member of the union)."""
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float | str)):
            shown = str(v).lower() if isinstance(v, bool) else repr(v)
            raise ValueError(f'an int, a fraction in (0, 1], "sqrt" or "log2", not {shown}')
        return v


class DataFacts(BaseModel):
    """The ``[data]`` table: schema-level facts, for a job created without a schema file."""

    model_config = ConfigDict(extra="forbid", strict=True)

    task: str = Field(description='"classification" or "regression"')
    n_features: int = Field(ge=1, description="number of features d")
    n_classes: int = Field(default=0, description="number of classes (0 for regression)")
    target_bound: float = Field(default=0.0, description=(
        "public bound on |y - target_offset| of a regression target (fixed-point scale of "
        "its sums)"))
    target_offset: float = Field(default=0.0, description=(
        "a regression target's public centre: the sites subtract it before taking sums and "
        "the model adds it back (a schema's target bounds give their middle)"))
    feature_kinds: list[str] = Field(default_factory=list, description=(
        '"continuous" or "categorical" per feature; absent: all continuous'))
    n_levels: list[int] = Field(default_factory=list, description=(
        "number of levels per feature (0 for a continuous one)"))
    feature_bounds: list[tuple[float, float]] | None = Field(default=None, description=(
        "public [lo, hi] per feature; needed by the secure profiles' pooled sketch; a site's "
        "value outside them is an error, never clipped"))

    @field_validator("feature_bounds", mode="before")
    @classmethod
    def _pairs(cls, v: object) -> object:
        """A TOML array ``[lo, hi]`` is the pair (strict validation takes only tuples)."""
        if isinstance(v, list):
            return [tuple(b) if isinstance(b, list) else b for b in v]
        return v


class JobSpec(BaseModel):
    """``job.toml``: one training job, as the operator creates it."""

    # populate_by_name: the stored spec (JobRow.spec_json) carries the fields' own names; a
    # job file using them is refused by load_job_spec. The server reads a stored spec's
    # schema text only (stored_schema_text): these limits and strict types are create-job's
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    id: str = Field(pattern=NAME_PATTERN, description=(
        "the job's name: letters, digits, '_', '.', '-' (at most 64)"))
    clients: list[str] = Field(min_length=1, max_length=1000, description=(
        "the sites taking part, as registered with `fedforest server add-client`; the order "
        "fixes each site's index"))
    profile: str = Field(default="secure", description=(
        '"open", "secure", "secure-dp" or the path of a profile TOML file (relative to '
        "job.toml, whatever its name)"))
    profile_overrides: dict[str, Any] = Field(
        default_factory=dict, validation_alias=AliasChoices("privacy", "profile_overrides"),
        description=("the `[privacy]` table: overrides of the profile's fields (see below), "
                     "e.g. epsilon = 2.0"))
    schema_text: str | None = Field(
        default=None, json_schema_extra={"file_key": "schema"},
        description="path of the schema file every site shares (relative to job.toml); the "
                    "job stores its text")
    round_deadline: float = Field(default=300.0, gt=0, le=7 * 24 * 3600, description=(
        "seconds a site has for each step of a round before it is dropped"))
    min_clients: int | None = Field(default=None, ge=1, description=(
        "training stops below this many active sites; absent: the profile's threshold "
        "times the number of sites"))
    forest: ForestParams = Field(default_factory=ForestParams, description=(
        "the `[forest]` table"))
    data: DataFacts | None = Field(default=None, description=(
        "the `[data]` table, only for a job without a schema file (refused beside `schema`)"))
    public_rows: int | None = Field(default=None, ge=1, description=(
        "a public count (or lower bound) of the federation's rows, for the DP allocation "
        "rule; absent: 100 rows per site"))
    kind: Literal["train", "evaluate"] = Field(default="train", description=(
        '"train" (a forest) or "evaluate" (score the models of `[evaluation]` on every '
        "site's held-out rows; sites run `fedforest client --eval-data`)"))
    evaluation: EvaluationParams | None = Field(default=None, description=(
        'the `[evaluation]` table, only with kind = "evaluate"'))

    @field_validator("clients")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("client names must be unique")
        return v

    def schema_sha256(self) -> str | None:
        return schema_sha256(self.schema_text)


def schema_sha256(schema_text: str | None) -> str | None:
    """The SHA-256 of a job's schema text, as the sites hash their copy."""
    return None if schema_text is None else hashlib.sha256(schema_text.encode()).hexdigest()


def stored_schema_text(spec_json: str) -> str | None:
    """The schema text of a stored job's spec (``JobRow.spec_json``), read as it is.

    The stored spec is not validated again: create-job validated it, with the limits of the
    version that created it, and a later version's limits (or strict types) are the job
    file's, never a reason to refuse a job the database already holds."""
    text = json.loads(spec_json).get("schema_text")
    return text if isinstance(text, str) else None


def load_job_spec(path: Path, *, models: Sequence[Path] | None = None,
                  names: Sequence[str] | None = None) -> JobSpec:
    """Read ``job.toml``; embeds the schema file (and a profile file) it names. ``models``
    (and ``names``): an evaluation job scoring these model files (``fedforest evaluate``)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark allowed
    except FileNotFoundError as exc:
        raise ConfigError(f"job file not found: {path}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"invalid job file {path}: {exc}") from exc
    except OSError as exc:  # a directory, a file this process may not read
        raise ConfigError(f"cannot read the job file {path}: {exc.strerror or exc}") from exc
    base = path.resolve().parent
    _refuse_inner_keys(raw, path)
    schema = raw.pop("schema", None)
    if schema is not None:
        if not isinstance(schema, str):
            raise ConfigError(f"invalid job file {path}: schema = {schema!r}: write the path of "
                              'the schema file as a string, e.g. schema = "schema.toml"')
        if "data" in raw:
            raise ConfigError(
                f"invalid job file {path}: [data] is only for a job without a schema file, and "
                f"this one names schema = {schema!r}: the sites check the job against the "
                "schema's facts, so a [data] table replacing them gets the job refused by every "
                "site. Remove the [data] table (or the schema)")
        schema_path = Path(schema) if Path(schema).is_absolute() else base / schema
        try:
            # without a byte-order mark, as the sites hash their copy (client_app.data)
            raw["schema_text"] = schema_path.read_text(encoding="utf-8-sig")
        except FileNotFoundError as exc:
            raise ConfigError(f"schema file not found: {schema_path}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"invalid schema file {schema_path}: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"cannot read the schema file {schema_path}: "
                              f"{exc.strerror or exc}") from exc
        parse_schema(raw["schema_text"], schema_path)  # errors name the file
    prof = raw.get("profile")
    if isinstance(prof, str) and prof not in available_profiles():
        # a profile file, whatever its name: relative to job.toml, as the schema
        ppath = Path(prof) if Path(prof).is_absolute() else base / prof
        if not ppath.exists():
            raise ConfigError(f"invalid job file {path}: profile = {prof!r} is neither a shipped "
                              f"profile ({', '.join(available_profiles())}) nor a file: no "
                              f"{ppath} (a profile file's path is relative to job.toml)")
        raw["profile"] = str(ppath.resolve())
    if models is not None:
        set_models(raw, models, names)
    embed_models(raw, base)
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"invalid job file {path}: {explain(exc, JobSpec, raw)}") from None


def _refuse_inner_keys(raw: dict[str, Any], path: Path) -> None:
    """Refuse the names the stored spec gives ``[privacy]`` and the schema's text: a job file
    writes ``[privacy]`` and ``schema``."""
    for key in ("profile_overrides", "schema_text"):
        if key in raw:
            raise ConfigError(f"invalid job file {path}: {key}: unknown key; allowed: "
                              f"{', '.join(allowed_keys(JobSpec))}")


def resolve_profile(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The profile (shipped name or TOML path) with the job file's ``[privacy]`` overrides
    (:func:`~server_app.jobprofile.job_profile`), as the JSON mapping :class:`JobConfig`
    carries."""
    try:
        prof = job_profile(name, overrides or {})
    except ConfigError:
        raise  # it names the [privacy] keys
    except (ValueError, OSError) as exc:
        raise ConfigError(f"profile {name!r}: {exc}") from exc
    return dict(json.loads(json.dumps(prof.to_dict(), default=str)))


def parse_schema(schema_text: str, source: Path | None = None) -> Schema:
    """The schema of a schema file's text (TOML or JSON); errors name ``source``."""
    try:
        raw = json.loads(schema_text) if schema_text.lstrip().startswith("{") else \
            tomllib.loads(schema_text)
    except ValueError as exc:  # tomllib.TOMLDecodeError too
        where = "the schema" if source is None else f"schema file {source}"
        raise ConfigError(f"cannot parse {where}: {exc}") from exc
    try:
        return Schema.from_dict(raw, source=source)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _schema_facts(schema: Schema) -> dict[str, Any]:
    """JobConfig fields read from a schema, via fedforest_secure.schema."""
    facts = schema_facts(schema)
    # missing = "allowed" columns: the rows missing them fill one more histogram bin
    facts["missing_allowed"] = (tuple(schema.missing_allowed) if any(schema.missing_allowed)
                                else ())
    return facts


_RULE_FIELDS = ("n_estimators", "max_depth", "n_bins", "max_features", "bootstrap", "method")


def _dp_forest(spec: JobSpec, facts: dict[str, Any], dp: dict[str, Any]) -> dict[str, Any]:
    """The allocation rule's values for the forest fields the job file does not set
    (:func:`fedforest_secure.privacy.allocation.dp_forest_settings`)."""
    from fedforest_secure.privacy.allocation import dp_forest_settings

    given = spec.forest.model_fields_set
    method = spec.forest.method if "method" in given else (
        "histogram" if spec.forest.split_on_client else "random")
    rows = spec.public_rows or 100 * len(spec.clients)
    rule = dp_forest_settings(float(dp["epsilon"]), rows, int(facts["n_features"]),
                              int(facts.get("n_classes") or 0), str(facts["task"]),
                              delta=float(dp["delta"]), method=method).as_params()
    rule["bootstrap"] = rule.pop("sampling") == "bootstrap"
    return {k: rule[k] for k in _RULE_FIELDS if k not in given}


def build_config(spec: JobSpec) -> JobConfig:
    """The job's :class:`JobConfig` from the spec (schema facts + forest + profile)."""
    schema = parse_schema(spec.schema_text) if spec.schema_text is not None else None
    if spec.data is not None:
        facts: dict[str, Any] = spec.data.model_dump()
        facts["feature_kinds"] = tuple(facts["feature_kinds"])
        facts["n_levels"] = tuple(facts["n_levels"])
        if facts["feature_bounds"] is not None:
            facts["feature_bounds"] = tuple(tuple(b) for b in facts["feature_bounds"])
    elif schema is not None:
        facts = _schema_facts(schema)
    else:
        raise ConfigError("a job needs a schema file or a [data] table")
    forest = spec.forest.model_dump()
    profile = resolve_profile(spec.profile, spec.profile_overrides)
    dp = profile.get("dp")
    if dp and spec.kind == "train":  # forest settings the job file leaves out: DP rule
        forest.update(_dp_forest(spec, facts, dp))
    if forest["top_l"] is not None and forest["method"] != "avgimp":
        # avgimp with top_l discloses each site's top-L features: only a profile in the clear
        fix = ('remove top_l, or set method = "avgimp"'
               if profile.get("secure_aggregation") is False else
               "remove top_l (with method = \"avgimp\" it discloses each site's top-L "
               "features in the clear, which a profile with secure aggregation never does)")
        raise ConfigError(f"job {spec.id!r}: [forest] top_l = {forest['top_l']} applies to "
                          f"method = \"avgimp\" only, and the job's method is "
                          f"{forest['method']!r}: {fix}")
    try:
        forest["max_features"] = resolve_max_features(forest["max_features"],
                                                      int(facts["n_features"]))
        if forest["criterion"] is None:
            forest["criterion"] = "mse" if facts["task"] == "regression" else "gini"
        facts["evaluation"] = evaluation_of(spec.kind, spec.evaluation, schema, facts)
        return JobConfig(job_id=spec.id, n_clients=len(spec.clients), profile=profile,
                         **facts, **forest)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"job {spec.id!r}: {exc}") from exc


def default_min_clients(spec: JobSpec, profile: dict[str, Any]) -> int:
    """t: the profile's threshold fraction of the job's clients (at least 1, and at least the
    profile's own ``min_clients``)."""
    if spec.min_clients is not None:
        if spec.min_clients > len(spec.clients):
            raise ConfigError("min_clients exceeds the number of clients")
        return spec.min_clients
    frac = float(profile.get("threshold", 0.0) or 0.0)
    floor = min(int(profile.get("min_clients", 1) or 1), len(spec.clients))
    return max(1, floor, math.ceil(frac * len(spec.clients) - 1e-9))
