"""scikit-learn style estimators: ``FedForestRegressor`` and ``FedForestClassifier``.

``fit(X, y, client=h)`` splits the rows by the client indicator ``h`` into in-process clients
that run the real protocol (workers, coordinator, aggregation under the chosen privacy
profile); the rows are never pooled. The public feature bounds the secure sketch needs are
inferred from the data here (the in-process facade plays every part), with a warning where one
far value makes a feature's bounds too wide for the sketch to resolve its other values
(:func:`~fedforest_secure._estimator_inputs.warn_unresolved`); a real deployment takes them
from the schema. ``n_jobs`` threads run the clients' work of each round concurrently (numpy
releases the GIL in the heavy steps); the replies are added in client order, so the forest is the
same for every ``n_jobs``.

``save`` writes, and ``load`` reads, the one model file format of :mod:`fedforest_secure.model`:
``FedForestClassifier.load`` also reads the model a federated job produced (what the server
stores, what ``fedforest model download`` and the client's ``--out`` write), with its class
labels, feature names and schema, so ``predict_proba`` works on a site's table as is. Fitted on
a DataFrame (or loaded from a job's model), ``predict`` takes a table's columns by name.
Where the sites have word names (``clients_``: a job's model, or text labels at fit),
``client=`` takes their names or their indices in ``clients_``, as :meth:`ForestModel.predict`
does. Where some name reads as a number (``"1"``, ``"2"``) an integer is refused rather than
taken as an index (which would name another site); :meth:`ForestModel.predict`, which knows
no names, always takes integers as indices.

The estimators follow scikit-learn's conventions (``_parameter_constraints``, ``validate_data``,
``check_estimator`` passes with the default parameters) and scikit-learn's meanings of the
shared parameters, with these federated defaults:

* ``max_depth=None``: no depth limit, as in scikit-learn; the trees stop growing at
  ``min_samples_leaf=5`` (the federated default) or at pure nodes. Under a DP profile the
  budget is split over the levels, so a depth is needed: ``None`` takes the allocation rule's
  (:func:`~fedforest_secure.privacy.allocation.dp_forest_settings`). Without DP,
  ``method="random"`` (every node split down to the depth) refuses ``None``.
* ``n_estimators``, ``n_bins``, ``bootstrap``, ``method`` left at None: the paper's 50
  trees, B = 32 candidate bins, the client-stratified bootstrap and the quantile sketch
  (``"quantiles"``), or under a DP profile the allocation rule's trees, bins, row sampling
  and method; a method the user names is kept under DP too, as a job file's is.
* ``min_samples_leaf`` and ``min_samples_split`` count rows with their bootstrap repeats and
  frequency weights, not distinct rows as scikit-learn's forests do: a leaf of count 5 may
  hold fewer distinct records, down to one record the bootstrap drew 5 times (the leaf's value
  is then that record's target). The profile's ``abstain_below`` counts a client's distinct
  rows (docs/privacy.md, section 2.2).
* ``max_features``: scikit-learn's values (an int, a fraction, "sqrt", "log2", None for all);
  default "sqrt" (classifier) and the paper's 1/3 (regressor). Under a DP profile the default
  takes the allocation rule's value, as a job file without ``max_features`` does (random
  splits: 1; greedy methods: ``max(1, d // 10)`` for classification, ``min(2, d)`` for
  regression, the count the rule chose the depth for); any other value is kept (the
  default's own value given explicitly counts as the default: pass an int to choose). Each node
  draws exactly that many features; where every drawn feature is constant on the node's rows,
  the node becomes a leaf (scikit-learn draws further features). On binary or one-hot
  features, which are constant below a split on them, this stops many branches early: give
  such data a larger ``max_features``.
* ``sample_weight``: non-negative integer frequency weights (a row of weight 3 counts as three
  rows; under DP only 0 and 1).
* ``X`` may hold missing values (NaN): every split learns where they go (see
  :mod:`fedforest_secure._tree`).
* A DataFrame's bool columns are 0 and 1 in ``fit`` and ``predict`` alike (scikit-learn's
  reading); ``fit`` refuses date, time and duration columns (datetime64 ones, and Python or
  numpy date objects in an object column; as scikit-learn's forests do) and repeated column
  names, naming the column.
* A regression target is centred before the trees take their sums of y and y^2. Under the
  open profile the centre is its median (a row counted its weight times), so a few far values
  do not hide the bulk's spread in rounding. Under a fixed-point (secure) or DP profile it is
  the middle of its range: the half-width about the centre is the fixed-point ring's scale
  and the DP noise's bound, both smallest about the middle (so also under the open profile
  where the median would put a row past what the sums of squares hold). A target reaching
  past ``sqrt(float64 max) / (2 n)`` from the middle of its range (n rows, frequency weights
  counted: the trees' sums of y^2 would overflow) is refused at ``fit``, naming it, with the
  advice to rescale it.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
import warnings
from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, RealNotInt, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight, validate_data

from ._estimator_files import _EstimatorFiles
from ._estimator_inputs import (
    TARGET_BOUND_FLOOR,
    as_schema_error,
    name_text_cell,
    nan_bounds,
    refuse_complex,
    refuse_dates,
    refuse_duplicate_names,
    refuse_huge_target,
    refuse_text_weights,
    refuse_tiny_target,
    refuse_weightless_sites,
    refuse_wide_int_labels,
    target_centre,
    warn_unresolved,
    warn_unresolved_target,
)
from ._estimator_structure import _EstimatorStructure
from .config import MAX_BINS, METHODS, JobConfig, resolve_max_features
from .errors import SchemaError
from .federation import run_in_process

__all__ = ["FedForestClassifier", "FedForestRegressor"]


def _dp_rule_for(method: str | None, epsilon: float, task: str, n_rows: int, n_features: int,
                 n_classes: int, delta: float) -> dict[str, Any]:
    """The allocation rule's forest shape for a DP job (docs/privacy.md)."""
    from .privacy.allocation import dp_forest_settings

    return dp_forest_settings(epsilon, n_rows, n_features, n_classes, task, delta=delta,
                              method=method or "random").as_params()


def _profile_dict(profile: Any) -> dict[str, Any]:
    from .privacy import PrivacyProfile, load_profile

    if isinstance(profile, Mapping):  # a profile stored in a saved model
        prof = PrivacyProfile.from_dict(dict(profile))
    else:
        prof = profile if isinstance(profile, PrivacyProfile) else load_profile(profile)
    return prof.to_dict()


def _profile_types() -> list[Any]:
    from .privacy import PrivacyProfile

    return [str, os.PathLike, Mapping, PrivacyProfile]


#: what fit sets: dropped when a fit starts and when it fails, so a failed fit leaves the
#: estimator unfitted (scikit-learn's ``check_is_fitted`` says so too)
_FITTED = ("model_", "config_", "profile_", "y_offset_", "clients_", "n_clients_",
           "n_outputs_", "classes_", "n_classes_", "n_features_in_", "feature_names_in_",
           "_file_model", "_structure_cache")


class _FedForestBase(_EstimatorStructure, _EstimatorFiles, BaseEstimator):  # type: ignore[misc]
    """What the two estimators share: their parameters and ``fit``. The bases add the reading
    of ``client=`` and ``X`` (``_estimator_rows``), the fitted trees and exports
    (``_estimator_structure``), and ``save`` / ``load`` (``_estimator_files``)."""

    _task: ClassVar[str] = "regression"
    #: ``max_features``'s default: under a DP profile it takes the allocation rule's value
    _DEFAULT_MAX_FEATURES: ClassVar[Any] = 1 / 3

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        "n_estimators": [Interval(Integral, 1, None, closed="left"), None],
        "max_depth": [Interval(Integral, 1, 60, closed="both"), None],
        "min_samples_leaf": [Interval(Integral, 1, None, closed="left")],
        "min_samples_split": [Interval(Integral, 2, None, closed="left")],
        "min_impurity_decrease": [Interval(Real, 0.0, None, closed="left")],
        "max_features": [Interval(Integral, 1, None, closed="left"),
                         Interval(RealNotInt, 0.0, 1.0, closed="right"),
                         StrOptions({"sqrt", "log2"}), None],
        "bootstrap": ["boolean", None],
        "n_bins": [Interval(Integral, 2, MAX_BINS, closed="both"), None],
        "method": [StrOptions(set(METHODS)), None],
        "top_l": [Interval(Integral, 1, None, closed="left"), None],
        "split_on_client": ["boolean"],
        "profile": _profile_types(),
        "random_state": ["random_state"],
        "n_jobs": [Integral, None],
    }

    def __init__(self, *, n_estimators: int | None = None, max_depth: int | None = None,
                 min_samples_leaf: int = 5, min_samples_split: int = 2,
                 min_impurity_decrease: float = 0.0,
                 max_features: Any = _DEFAULT_MAX_FEATURES,
                 bootstrap: bool | None = None, n_bins: int | None = None,
                 method: str | None = None, top_l: int | None = None,
                 split_on_client: bool = False, profile: Any = "open",
                 random_state: Any = 0, n_jobs: int | None = None) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.min_samples_split = min_samples_split
        self.min_impurity_decrease = min_impurity_decrease
        self.max_features = max_features
        self.bootstrap = bootstrap
        self.n_bins = n_bins
        self.method = method
        self.top_l = top_l
        self.split_on_client = split_on_client
        self.profile = profile
        self.random_state = random_state
        self.n_jobs = n_jobs

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        tags.input_tags.sparse = False
        return tags

    # ------------------------------------------------------------------ helpers
    def _criterion(self) -> str:
        return "mse"

    def _forest_shape(self, d: int, dp: dict[str, Any] | None, n_rows: int,
                      n_classes: int) -> dict[str, Any]:
        """Trees, depth (0: no limit), bins, row sampling, method and features per node, with
        the parameters left at None filled in, and under DP ``max_features`` left at its
        default too (module docstring)."""
        out: dict[str, Any] = {"n_estimators": self.n_estimators, "max_depth": self.max_depth,
               "n_bins": self.n_bins,
               "sampling": None if self.bootstrap is None else
               ("bootstrap" if self.bootstrap else "all"),
               # left at None: the quantile sketch, or under DP the rule's method
               "method": self.method}
        if dp and out["method"] is None and self.split_on_client:
            out["method"] = "histogram"  # H-splits are scored by the greedy levels
        if dp:
            defaults = _dp_rule_for(out["method"], float(dp["epsilon"]), self._task, n_rows, d,
                                    n_classes, float(dp["delta"]))
        else:
            defaults = {"n_estimators": 50, "max_depth": 0, "n_bins": 32,
                        "sampling": "bootstrap", "method": "quantiles"}
        for key in out:
            if out[key] is None:
                out[key] = defaults[key]
        # the rule's features per node, as a job file that leaves max_features out gets them
        unset = self.max_features == self._DEFAULT_MAX_FEATURES
        out["max_features"] = defaults["max_features"] if dp and unset else self.max_features
        return out

    def _seed(self) -> int:
        if isinstance(self.random_state, Integral):
            return int(self.random_state)
        return int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))

    def _encode_y(self, y: np.ndarray) -> tuple[np.ndarray, float]:
        return y.astype(np.float64), 1.0

    # ------------------------------------------------------------------ fit
    def fit(self, X: Any, y: Any, sample_weight: Any = None, *, client: Any = None,
            on_round: Any = None) -> Any:
        """Train over in-process clients.

        Parameters
        ----------
        X : array-like of shape (n, d); NaN marks a missing value. A DataFrame's column
            names become ``feature_names_in_``.
        y : array-like of shape (n,)
        sample_weight : array-like of shape (n,), non-negative integer frequency weights, or
            None
        client : array-like of shape (n,), the institution of each row (None: one client)
            (its distinct values, sorted, give the sites their indices, and each index seeds
            that site's bootstrap: the same sites under names that sort in another order grow
            another forest)
        on_round : optional callback receiving each round's :class:`RoundRecord`

        Returns
        -------
        self
        """
        self._validate_params()
        # a fit that fails leaves the estimator unfitted, never the old forest answering under
        # the new fit's classes, columns or sites, nor the attributes set on the way
        self._drop_fitted()
        try:
            return self._fit(X, y, sample_weight, client, on_round)
        except BaseException:
            self._drop_fitted()
            raise

    def _drop_fitted(self) -> None:
        for attr in _FITTED:
            self.__dict__.pop(attr, None)

    def _fit(self, X: Any, y: Any, sample_weight: Any, client: Any, on_round: Any) -> Any:
        """The body of :meth:`fit`, on an estimator without fitted attributes."""
        refuse_dates(X)
        refuse_complex(X)
        refuse_duplicate_names(X)
        y_name = getattr(y, "name", None)  # a Series' name, for the messages about y
        try:
            X, y = as_schema_error(validate_data, self, X, y, dtype=np.float64,
                                    ensure_all_finite="allow-nan",
                                    y_numeric=self._task == "regression", multi_output=False)
        except SchemaError:
            name_text_cell(X)  # a text cell of a table: its column and row, as predict says
            raise
        if self._task == "classification":
            try:
                check_classification_targets(y)
            except TypeError:  # labels that cannot be sorted together: numbers and text
                kinds = sorted({type(v).__name__ for v in y.tolist()})
                raise SchemaError(f"y mixes class labels of kinds that cannot be ordered "
                                  f"({', '.join(kinds)}); give every label the same kind, "
                                  "e.g. y.astype(str)") from None
        n, d = X.shape
        weights = None
        if sample_weight is not None:
            refuse_text_weights(sample_weight)
            weights = _check_sample_weight(sample_weight, X, dtype=np.float64)
            if (weights != np.round(weights)).any() or (weights < 0).any():
                raise SchemaError("sample_weight must hold non-negative integers (frequency "
                                  "weights: a row of weight 3 counts as three rows)")
            if not (weights > 0).any():
                raise SchemaError("sample_weight is zero for every row")
        h = self._client_codes(client, n, fitting=True)
        y_enc, _ = self._encode_y(y)
        kept = weights > 0 if weights is not None else np.ones(n, dtype=bool)
        refuse_weightless_sites(self.clients_, h, kept)
        target_bound = float(np.max(np.abs(y_enc[kept]))) if self._task == "regression" \
            else 1.0
        K = len(self.clients_)
        lo, hi = nan_bounds(X[kept])
        dp = _profile_dict(self.profile).get("dp")
        n_classes = len(getattr(self, "classes_", []))
        shape = self._forest_shape(d, dp, int(kept.sum()), n_classes)
        self.y_offset_ = 0.0
        if self._task == "regression":
            # centre y: sums of y and y^2 then carry the spread, not an offset (y = 10^6 +
            # noise lost its splits to rounding, and in the fixed-point ring to its scale);
            # the limits are checked about the middle of the range (halves first: no overflow
            # for targets near the float maximum), the centre itself is target_centre's
            middle = float(y_enc[kept].min() / 2.0 + y_enc[kept].max() / 2.0)
            rows = float(weights[kept].sum()) if weights is not None else float(n)
            prof = _profile_dict(self.profile)
            frac_bits = int(prof.get("frac_bits", 24)) if prof.get("fixed_point") else None
            refuse_huge_target(y_name, float(np.max(np.abs(y_enc[kept] - middle))), middle,
                               rows)
            refuse_tiny_target(y_name, float(np.max(np.abs(y_enc[kept] - middle))), middle,
                               frac_bits)
            self.y_offset_ = target_centre(y_enc[kept], None if weights is None
                                           else weights[kept], middle, rows,
                                           not prof.get("fixed_point") and not prof.get("dp"))
            target_bound = float(np.max(np.abs(y_enc[kept] - self.y_offset_)))
            warn_unresolved_target(y_name, y_enc[kept], self.y_offset_, target_bound, frac_bits)
            y_enc = y_enc - self.y_offset_
        mf = shape["max_features"]
        if isinstance(mf, Integral) and not isinstance(mf, bool) and mf > d:
            raise SchemaError(f"max_features={mf} is more than the {d} features of X")
        self.profile_ = _profile_dict(self.profile)
        if (self.profile_.get("sketch") == "secure_cdf" and not self.profile_.get("dp")
                and shape["method"] in ("quantiles", "avgimp")):  # the secure sketch's grids
            warn_unresolved(X[kept], lo, hi, getattr(self, "feature_names_in_", None))
        # a feature missing in some training row may be missing (the estimator plays the
        # schema's part: missing = "allowed" where the data have holes)
        missing = tuple(bool(v) for v in np.isnan(X[kept]).any(axis=0))
        top_l = self.top_l
        if top_l is not None and shape["method"] != "avgimp":
            warnings.warn(f"top_l={top_l} is ignored with method={shape['method']!r}: top_l "
                          "applies to method='avgimp' only; every drawn feature is evaluated",
                          UserWarning, stacklevel=3)
            top_l = None
        config = JobConfig(
            job_id=f"local-{uuid.uuid4().hex[:12]}", task=self._task, n_features=d,
            n_clients=K, n_classes=n_classes, missing_allowed=missing,
            feature_bounds=tuple((float(a), float(b)) for a, b in zip(lo, hi, strict=True)),
            target_bound=max(target_bound, TARGET_BOUND_FLOOR), n_estimators=shape["n_estimators"],
            max_depth=shape["max_depth"], min_samples_leaf=self.min_samples_leaf,
            min_samples_split=self.min_samples_split,
            min_impurity_decrease=self.min_impurity_decrease,
            max_features=resolve_max_features(mf, d),
            bootstrap=shape["sampling"] == "bootstrap", row_sampling=shape["sampling"],
            n_bins=shape["n_bins"], method=shape["method"], top_l=top_l,
            split_on_client=self.split_on_client, criterion=self._criterion(),
            random_state=self._seed(), profile=self.profile_)
        # each client's share of the rows is made when its worker is built, and dropped after
        shares = ((X[h == k], y_enc[h == k]) if weights is None else
                  (X[h == k], y_enc[h == k], weights[h == k]) for k in range(K))
        self.config_ = config
        model = run_in_process(config, shares, on_round=on_round, n_jobs=self.n_jobs)
        classes = getattr(self, "classes_", None)
        names = getattr(self, "feature_names_in_", None)  # set by validate_data
        self.model_ = dataclasses.replace(
            model, feature_names=None if names is None else [str(c) for c in names],
            clients=self.clients_.tolist(), y_offset=self.y_offset_,
            classes=None if classes is None else classes.tolist())
        self.n_clients_ = K
        self.n_outputs_ = 1
        return self


class FedForestRegressor(RegressorMixin, _FedForestBase):  # type: ignore[misc]
    """Federated random forest regressor (FedForest, Khellaf et al.).

    Parameters are keyword-only; see the module docstring for the federated defaults.
    """

    _task = "regression"

    def predict(self, X: Any, *, client: Any = None) -> np.ndarray:
        """Predicted values, shape (n,). ``client`` is needed only if the forest splits on H."""
        out: np.ndarray = self._values(X, client)[:, 0] + getattr(self, "y_offset_", 0.0)
        return out

    def score(self, X: Any, y: Any, sample_weight: Any = None, *, client: Any = None) -> float:
        """R^2 of ``predict(X, client=client)`` against ``y``."""
        from sklearn.metrics import r2_score

        return float(r2_score(y, self.predict(X, client=client), sample_weight=sample_weight))


class FedForestClassifier(ClassifierMixin, _FedForestBase):  # type: ignore[misc]
    """Federated random forest classifier (FedForest, Khellaf et al.).

    Parameters are keyword-only; see the module docstring for the federated defaults.
    ``criterion`` is "gini" or "entropy".
    """

    _task = "classification"
    _DEFAULT_MAX_FEATURES = "sqrt"

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **_FedForestBase._parameter_constraints,
        "criterion": [StrOptions({"gini", "entropy"})],
    }

    def __init__(self, *, n_estimators: int | None = None, max_depth: int | None = None,
                 min_samples_leaf: int = 5, min_samples_split: int = 2,
                 min_impurity_decrease: float = 0.0,
                 max_features: Any = _DEFAULT_MAX_FEATURES,
                 bootstrap: bool | None = None, n_bins: int | None = None,
                 method: str | None = None, top_l: int | None = None,
                 split_on_client: bool = False, profile: Any = "open",
                 criterion: str = "gini", random_state: Any = 0,
                 n_jobs: int | None = None) -> None:
        super().__init__(n_estimators=n_estimators, max_depth=max_depth,
                         min_samples_leaf=min_samples_leaf, min_samples_split=min_samples_split,
                         min_impurity_decrease=min_impurity_decrease, max_features=max_features,
                         bootstrap=bootstrap, n_bins=n_bins, method=method, top_l=top_l,
                         split_on_client=split_on_client, profile=profile,
                         random_state=random_state, n_jobs=n_jobs)
        self.criterion = criterion

    def _criterion(self) -> str:
        return str(self.criterion)

    def _encode_y(self, y: np.ndarray) -> tuple[np.ndarray, float]:
        self.classes_ = np.unique(y)
        self.n_classes_ = int(self.classes_.size)
        if self.classes_.size < 2:
            raise SchemaError(f"y has one class ({self.classes_[0]!r}); a classifier needs "
                              "at least two classes")
        refuse_wide_int_labels(self.classes_)
        return np.searchsorted(self.classes_, y).astype(np.int64), 1.0

    def predict_proba(self, X: Any, *, client: Any = None) -> np.ndarray:
        """Class probabilities, shape (n, n_classes), columns ordered as ``classes_``."""
        return self._values(X, client, "predict_proba")

    def predict(self, X: Any, *, client: Any = None) -> np.ndarray:
        """Predicted classes, shape (n,). An exactly tied row goes to the class first in
        ``classes_`` (sorted), as in the ONNX and scikit-learn exports; a job's
        ``ForestModel.predict`` and a federated evaluation give it to the schema's first class
        instead, so on such rows ``score`` may differ from the evaluation's accuracy."""
        self._check_fitted()
        labels: np.ndarray = self.classes_[np.argmax(self._values(X, client), axis=1)]
        return labels

    def score(self, X: Any, y: Any, sample_weight: Any = None, *, client: Any = None) -> float:
        """Accuracy of ``predict(X, client=client)`` against ``y``.

        A job's model (with its schema) reads ``y`` as the sites' clients read the target
        column: ``1``, ``1.0`` and ``"1"`` are the class ``"1"``, an unknown class is an error.
        """
        from sklearn.metrics import accuracy_score

        self._check_fitted()
        if self.model_.schema is None:
            return float(accuracy_score(y, self.predict(X, client=client),
                                        sample_weight=sample_weight))
        from .schema import Schema

        schema = Schema.from_dict(self.model_.schema, stored=True)
        codes = schema.encode_target(y)  # indices into the schema's classes
        labels = np.asarray(schema.target.classes, dtype=object)[codes]
        return float(accuracy_score(labels.astype(str),
                                    np.asarray(self.predict(X, client=client)).astype(str),
                                    sample_weight=sample_weight))
