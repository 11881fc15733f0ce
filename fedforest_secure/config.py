"""The configuration of one training job, shared by the coordinator and every worker.

A :class:`JobConfig` is fixed when the job is created and never changes; the server stores it,
sends it to each joining client, and logs it in the audit log. Everything here is public within
the federation (hyper-parameters, schema-level facts, the privacy profile).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["MAX_BINS", "MAX_ESTIMATORS", "METHODS", "JobConfig", "resolve_max_features"]

#: the largest sketch size B a new job or fit may ask (``n_bins``): a worker's grids and
#: sketches grow with B per node and feature
MAX_BINS = 4096
#: the most trees a job may have (``n_estimators``): a site holds a (tree, row) pair for
#: every tree and row it draws, so a site refuses a job of more
MAX_ESTIMATORS = 10_000


def _json_scalar(value: Any) -> Any:
    """A numpy scalar (a setting taken from ``np.arange(...)``) as the JSON value it holds."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a job configuration holds {type(value).__name__!r}, which JSON cannot "
                    "hold")

#: the names ``method`` takes, one per candidate method of
#: :data:`~fedforest_secure._candidates.CANDIDATE_METHODS` (in its order)
METHODS = ("quantiles", "avgimp", "exact", "histogram", "random")

#: the most leaves (trees x 2^max_depth) a DP forest of random splits may have: it grows every
#: tree to its full depth, and 8 trees of depth 14 (131,072 leaves) took 1.8 GB in process
MAX_RANDOM_SPLIT_LEAVES = 1 << 18


def resolve_max_features(max_features: Any, n_features: int) -> int:
    """Number of features sampled per node, with scikit-learn's meanings.

    ``None`` -> all; ``"sqrt"`` / ``"log2"``; a float in (0, 1] -> that fraction (at least 1);
    an int -> that many.
    """
    if max_features is None:
        return n_features
    if isinstance(max_features, str):
        if max_features == "sqrt":
            return max(1, int(math.sqrt(n_features)))
        if max_features == "log2":
            return max(1, int(math.log2(n_features)))
        raise ValueError(f"max_features must be None, 'sqrt', 'log2', an int or a float; "
                         f"got {max_features!r}")
    if isinstance(max_features, bool):
        raise ValueError("max_features must not be a bool")
    if isinstance(max_features, numbers.Integral):
        count = int(max_features)
        if not 1 <= count <= n_features:
            raise ValueError(f"max_features={count} must be in [1, {n_features}]")
        return count
    if isinstance(max_features, numbers.Real):
        max_features = float(max_features)
        if not 0.0 < max_features <= 1.0:
            raise ValueError(f"max_features={max_features} must be in (0, 1]")
        return max(1, int(max_features * n_features))
    raise ValueError(f"unsupported max_features {max_features!r}")


@dataclass(frozen=True)
class JobConfig:
    """Everything both sides of a job must agree on."""

    job_id: str
    task: str  # "regression" | "classification"
    n_features: int
    n_clients: int
    feature_kinds: tuple[str, ...] = ()  # "continuous" | "categorical", per feature
    n_levels: tuple[int, ...] = ()  # levels per categorical feature, 0 for continuous
    #: per feature, whether rows may miss it (NaN; the schema's ``missing = "allowed"``);
    #: empty: no feature may. Such features' histograms carry one more bin, the missing rows'
    missing_allowed: tuple[bool, ...] = ()
    feature_bounds: tuple[tuple[float, float], ...] | None = None  # public bounds, if known
    n_classes: int = 0
    #: regression: max |y - target_offset| (public), for the fixed-point scale of sums
    target_bound: float = 0.0
    #: regression: the middle of the target's public bounds; the sites subtract it from every
    #: target before taking sums (which then carry the spread, not the offset) and the model
    #: adds it back to its predictions
    target_offset: float = 0.0
    n_estimators: int = 50
    #: 0: no limit (trees grow until no node can split; the estimators' max_depth=None); a DP
    #: job needs a limit (its budget is split over the levels)
    max_depth: int = 8
    min_samples_leaf: int = 5
    min_samples_split: int = 2
    min_impurity_decrease: float = 0.0
    max_features: int = 1
    bootstrap: bool = True
    #: "" (from ``bootstrap``: "bootstrap" or "all") or "disjoint": every row in exactly one
    #: tree (parallel composition under differential privacy)
    row_sampling: str = ""
    n_bins: int = 32
    method: str = "quantiles"
    top_l: int | None = None
    split_on_client: bool = False
    criterion: str = "mse"  # "mse" | "gini" | "entropy"
    random_state: int = 0
    profile: dict[str, Any] = field(default_factory=dict)
    #: an evaluation job's :class:`~fedforest_secure.evaluation.spec.EvalSpec` as a JSON mapping
    #: (the models it scores, its bins); None for a training job
    evaluation: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.profile, Mapping):
            raise ValueError("profile must be a mapping of the profile's sections, not a "
                             f"{type(self.profile).__name__}")
        if self.task not in ("regression", "classification"):
            raise ValueError(f"task must be 'regression' or 'classification', not {self.task!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, not {self.method!r}")
        if self.task == "classification" and self.n_classes < 2:
            raise ValueError("classification needs n_classes >= 2")
        if self.task == "regression" and self.criterion != "mse":
            raise ValueError("regression supports criterion='mse' only")
        if not math.isfinite(self.target_offset) or (self.target_offset != 0.0
                                                    and self.task != "regression"):
            raise ValueError(f"target_offset must be finite, and 0 unless the task is "
                             f"regression; got {self.target_offset!r}")
        if self.task == "classification" and self.criterion not in ("gini", "entropy"):
            raise ValueError("classification criterion must be 'gini' or 'entropy'")
        for name in ("n_features", "n_clients", "n_estimators", "min_samples_leaf"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        if int(self.max_depth) < 0:
            raise ValueError("max_depth must be >= 1, or 0 for no limit")
        if self.max_depth == 0 and self.dp is not None:
            raise ValueError("a DP job needs a depth limit (max_depth >= 1): its budget is "
                             "split over the levels")
        if self.max_depth == 0 and self.method == "random":
            raise ValueError("method='random' needs a finite max_depth (>= 1; no limit was "
                             "given): random splits split every node down to max_depth, so "
                             "without a limit the trees grow until memory runs out")
        if (self.dp is not None and self.method == "random"
                and self.n_estimators * 2**self.max_depth > MAX_RANDOM_SPLIT_LEAVES):
            raise ValueError(
                f"DP random splits grow every tree to its full depth: {self.n_estimators} "
                f"trees of 2^{self.max_depth} leaves is more than "
                f"{MAX_RANDOM_SPLIT_LEAVES:,} leaves: lower max_depth or n_estimators (a leaf's "
                "noisy count needs rows; unset, the allocation rule picks the depth from them)")
        if self.min_samples_split < 2:
            raise ValueError("min_samples_split must be >= 2")
        if self.n_bins < 2:  # (MAX_BINS caps new jobs and fits; a saved file may hold more)
            raise ValueError("n_bins must be >= 2")
        if not 1 <= self.max_features <= self.n_features:
            raise ValueError("max_features must be resolved to an int in [1, n_features]")
        if self.top_l is not None and not 1 <= self.top_l <= self.n_features:
            raise ValueError("top_l must be None or in [1, n_features]")
        if self.row_sampling not in ("", "bootstrap", "all", "disjoint"):
            raise ValueError("row_sampling must be '', 'bootstrap', 'all' or 'disjoint'")
        if self.max_depth > 60:
            raise ValueError("max_depth must be <= 60")
        if self.feature_kinds and len(self.feature_kinds) != self.n_features:
            raise ValueError("feature_kinds must have one entry per feature")
        if self.n_levels and len(self.n_levels) != self.n_features:
            raise ValueError("n_levels must have one entry per feature")
        if self.missing_allowed and len(self.missing_allowed) != self.n_features:
            raise ValueError("missing_allowed must have one entry per feature")

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.feature_kinds or ("continuous",) * self.n_features

    @property
    def levels(self) -> tuple[int, ...]:
        return self.n_levels or (0,) * self.n_features

    @property
    def sampling(self) -> str:
        """How each client draws the rows of each tree: bootstrap, all, or disjoint."""
        return self.row_sampling or ("bootstrap" if self.bootstrap else "all")

    @property
    def dp(self) -> dict[str, Any] | None:
        """The profile's ``[dp]`` section, or None."""
        dp = self.profile.get("dp")
        return dict(dp) if dp else None

    @property
    def has_missing(self) -> bool:
        """Whether some feature may be missing: then every histogram has a last bin for the
        rows whose feature is missing, and every split a direction for them."""
        return any(self.missing_allowed)

    @property
    def may_miss(self) -> tuple[bool, ...]:
        """Per feature, whether it may be missing."""
        return self.missing_allowed or (False,) * self.n_features

    @property
    def n_stats(self) -> int:
        """Width S of a sufficient-statistics vector: (n, sum y, sum y^2) or class counts."""
        return 3 if self.task == "regression" else self.n_classes

    def to_json(self) -> str:
        obj = asdict(self)
        if obj["evaluation"] is None:
            del obj["evaluation"]  # a training job's configuration has no evaluation key
        if not any(obj["missing_allowed"]):
            del obj["missing_allowed"]  # nor one without missing values a missing key
        if obj["target_offset"] == 0.0:
            del obj["target_offset"]  # nor one whose target needs no centring an offset key
        return json.dumps(obj, sort_keys=True, default=_json_scalar)

    @classmethod
    def from_json(cls, text: str) -> JobConfig:
        obj = json.loads(text)
        for key in ("feature_kinds", "n_levels", "missing_allowed"):
            obj[key] = tuple(obj.get(key, ()))
        if obj.get("feature_bounds") is not None:
            obj["feature_bounds"] = tuple(tuple(b) for b in obj["feature_bounds"])
        return cls(**obj)
