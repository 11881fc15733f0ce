"""scikit-learn style estimators: ``FedForestRegressor`` and ``FedForestClassifier``.

``fit(X, y, client=h)`` splits the rows by the client indicator ``h`` into in-process clients
that run the real protocol (workers, coordinator, aggregation under the chosen privacy
profile); the rows are never pooled. The public feature bounds the secure sketch needs are
inferred from the data here (the in-process facade plays every part); a real deployment takes
them from the schema. ``n_jobs`` threads run the clients' work of each round concurrently (numpy
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
  ``min_samples_leaf=5`` (the federated default: no leaf summarises fewer than 5 rows) or at
  pure nodes. Under a DP profile the budget is split over the levels, so a depth is needed:
  ``None`` takes the allocation rule's
  (:func:`~fedforest_secure.privacy.allocation.dp_forest_settings`). Without DP,
  ``method="random"`` (every node split down to the depth) refuses ``None``.
* ``n_estimators``, ``n_bins``, ``bootstrap`` left at None: the paper's 50 trees, B = 32
  candidate bins and the client-stratified bootstrap, or under a DP profile the allocation
  rule's trees, bins and row sampling (and its method when ``method`` is left at
  "quantiles").
* ``max_features``: scikit-learn's values (an int, a fraction, "sqrt", "log2", None for all);
  default "sqrt" (classifier) and the paper's 1/3 (regressor).
* ``sample_weight``: non-negative integer frequency weights (a row of weight 3 counts as three
  rows; under DP only 0 and 1).
* ``X`` may hold missing values (NaN): every split learns where they go (see
  :mod:`fedforest_secure._tree`).
* A DataFrame's bool columns are 0 and 1 in ``fit`` and ``predict`` alike (scikit-learn's
  reading); ``fit`` refuses date, time and duration columns (datetime64 ones, and Python or
  numpy date objects in an object column; as scikit-learn's forests do) and repeated column
  names, naming the column.
* A regression target is centred on the middle of its range; one whose centred values reach
  past ``sqrt(float64 max) / (2 n)`` (n rows, frequency weights counted: the trees' sums of
  y^2 would overflow) is refused at ``fit``, naming it, with the advice to rescale it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Mapping
from numbers import Integral, Real
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, RealNotInt, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_sample_weight, check_array, validate_data

from ._cells import no_value
from ._estimator_inputs import (
    TARGET_BOUND_FLOOR,
    as_schema_error,
    name_text_cell,
    nan_bounds,
    refuse_dates,
    refuse_duplicate_names,
    refuse_huge_target,
    refuse_text_weights,
    refuse_tiny_target,
    refuse_weightless_sites,
)
from ._sklearn_api import FederatedTree, forest_importances, to_sklearn_forest
from .config import METHODS, JobConfig, resolve_max_features
from .errors import NotFittedError, SchemaError
from .federation import run_in_process
from .files import write_atomic
from .model import ForestModel, _column_names

__all__ = ["FedForestClassifier", "FedForestRegressor"]

_OLD_FORMAT = "fedforest-secure/estimator/v1"  # files written before the one model format


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


def _check_label_kinds(labels: list[Any]) -> None:
    """Refuse client labels that mix text and numbers: ``1`` and ``"1"`` would otherwise
    become one site (numpy makes both text) or fail to sort."""
    text = [lab for lab in labels if isinstance(lab, str)]
    if text and len(text) < len(labels):
        other = next((lab for lab in labels if not isinstance(lab, str)
                      and not no_value(lab)), None)
        if other is None:  # text and missing labels: the missing ones are named later
            return
        raise SchemaError(f"client mixes text and numbers (e.g. {text[0]!r} and {other!r}): "
                          "give every row's institution the same kind of label")


#: what fit sets: dropped when a fit starts, so a failed fit leaves the estimator unfitted
_FITTED = ("model_", "config_", "profile_", "y_offset_", "clients_", "n_clients_",
           "n_outputs_", "classes_", "n_classes_", "n_features_in_", "feature_names_in_")


class _FedForestBase(BaseEstimator):  # type: ignore[misc]
    _task: ClassVar[str] = "regression"

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
        "n_bins": [Interval(Integral, 2, None, closed="left"), None],
        "method": [StrOptions(set(METHODS))],
        "top_l": [Interval(Integral, 1, None, closed="left"), None],
        "split_on_client": ["boolean"],
        "profile": _profile_types(),
        "random_state": ["random_state"],
        "n_jobs": [Integral, None],
    }

    def __init__(self, *, n_estimators: int | None = None, max_depth: int | None = None,
                 min_samples_leaf: int = 5, min_samples_split: int = 2,
                 min_impurity_decrease: float = 0.0, max_features: Any = 1 / 3,
                 bootstrap: bool | None = None, n_bins: int | None = None,
                 method: str = "quantiles", top_l: int | None = None,
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
        """Trees, depth (0: no limit), bins, row sampling and method, with the parameters
        left at None filled in (module docstring)."""
        out: dict[str, Any] = {"n_estimators": self.n_estimators, "max_depth": self.max_depth,
               "n_bins": self.n_bins,
               "sampling": None if self.bootstrap is None else
               ("bootstrap" if self.bootstrap else "all"),
               # under DP the quantile sketch (the default method) is never used: the rule
               # picks the method; any other method the user names is kept
               "method": None if dp and self.method == "quantiles" else self.method}
        if dp and out["method"] is None and self.split_on_client:
            out["method"] = "histogram"  # H-splits are scored by the greedy levels
        if dp:
            defaults = _dp_rule_for(out["method"], float(dp["epsilon"]), self._task, n_rows, d,
                                    n_classes, float(dp["delta"]))
        else:
            defaults = {"n_estimators": 50, "max_depth": 0, "n_bins": 32,
                        "sampling": "bootstrap", "method": self.method}
        for key in out:
            if out[key] is None:
                out[key] = defaults[key]
        return out

    def _seed(self) -> int:
        if isinstance(self.random_state, Integral):
            return int(self.random_state)
        return int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))

    def _client_codes(self, client: Any, n: int, fitting: bool) -> np.ndarray:
        if client is None:
            if fitting:
                self.clients_ = np.array([0])
            return np.zeros(n, dtype=np.int64)
        given = client
        client = np.asarray(client)
        if client.dtype.kind in "OU":
            _check_label_kinds(client.tolist() if client.dtype.kind == "O" or
                               isinstance(given, np.ndarray) else list(given))
        if client.shape != (n,):
            raise SchemaError(f"client must have shape ({n},), got {client.shape}")
        if client.dtype.kind == "f":
            holes = np.flatnonzero(np.isnan(client))
        elif client.dtype.kind == "O":
            holes = np.flatnonzero([no_value(c) for c in client.tolist()])
        else:
            holes = np.zeros(0, dtype=np.int64)
        if holes.size:
            shown = ", ".join(str(r) for r in holes[:10]) + (", ..." if holes.size > 10 else "")
            raise SchemaError(f"client has no value at {holes.size} "
                              f"row{'s' if holes.size > 1 else ''} ({shown}): every row "
                              "needs the institution it comes from")
        if fitting:
            self.clients_ = np.unique(client)
        # a forest that never splits on the site predicts rows of any site, a new one too
        strict = fitting or self.model_.uses_client
        if not fitting and client.dtype.kind in "iu" and self.clients_.dtype.kind in "OU" \
                and not any(str(c).strip().lstrip("+-").isdigit()
                            for c in self.clients_.tolist()):
            # sites named by words: an integer is an index. Names that read as numbers
            # ("1", "2") are matched as names only: an index would pick another site
            return self._site_indices(client, strict)
        # clients_ is in index order: sorted after fit, the job's order for a job's model
        index = {c: i for i, c in enumerate(self.clients_.tolist())}
        codes = np.empty(n, dtype=np.int64)
        for r, c in enumerate(client.tolist()):
            k = index.get(c)
            if k is None:
                if strict:
                    raise SchemaError(f"unknown client {c!r}; the forest knows "
                                      f"{self.clients_.tolist()}")
                k = -1
            codes[r] = k
        return codes

    def _site_indices(self, client: np.ndarray, strict: bool) -> np.ndarray:
        """Integers where the sites have word names (a job's model): their indices in
        ``clients_``, as :meth:`ForestModel.predict` takes them; -1 for an index beyond them,
        refused if ``strict``. Not called where a name reads as a number."""
        codes = client.astype(np.int64)
        bad = (codes < 0) | (codes >= len(self.clients_))
        if bad.any():
            if strict:
                names = ", ".join(repr(c) for c in self.clients_.tolist())
                raise SchemaError(f"unknown client {int(codes[bad][0])}; the forest knows "
                                  f"sites 0 to {len(self.clients_) - 1} ({names}), by index "
                                  "or name")
            codes[bad] = -1
        return codes

    def _encode_y(self, y: np.ndarray) -> tuple[np.ndarray, float]:
        return y.astype(np.float64), 1.0

    # ------------------------------------------------------------------ fit / predict
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
        on_round : optional callback receiving each round's :class:`RoundRecord`

        Returns
        -------
        self
        """
        self._validate_params()
        # a fit that fails leaves the estimator unfitted, never the old forest answering under
        # the new fit's classes, columns or sites
        for attr in _FITTED:
            self.__dict__.pop(attr, None)
        refuse_dates(X)
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
            check_classification_targets(y)
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
            # centre y on the middle of its range: sums of y and y^2 then carry the spread, not
            # an offset (y = 10^6 + noise lost its splits to rounding, and in the fixed-point
            # ring to its scale), and under DP the noise on sums of y is halved
            self.y_offset_ = float((y_enc[kept].min() + y_enc[kept].max()) / 2.0)
            y_enc = y_enc - self.y_offset_
            target_bound = float(np.max(np.abs(y_enc[kept])))
            rows = float(weights[kept].sum()) if weights is not None else float(n)
            refuse_huge_target(y_name, target_bound, self.y_offset_, rows)
            prof = _profile_dict(self.profile)
            refuse_tiny_target(y_name, target_bound, self.y_offset_,
                               int(prof.get("frac_bits", 24)) if prof.get("fixed_point")
                               else None)
        mf = self.max_features
        if isinstance(mf, Integral) and not isinstance(mf, bool) and mf > d:
            raise SchemaError(f"max_features={mf} is more than the {d} features of X")
        self.profile_ = _profile_dict(self.profile)
        # a feature missing in some training row may be missing (the estimator plays the
        # schema's part: missing = "allowed" where the data have holes)
        missing = tuple(bool(v) for v in np.isnan(X[kept]).any(axis=0))
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
            n_bins=shape["n_bins"], method=shape["method"], top_l=self.top_l,
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

    def _check_fitted(self) -> ForestModel:
        if not hasattr(self, "model_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")
        model: ForestModel = self.model_
        return model

    def _validate_X_predict(self, X: Any) -> np.ndarray:
        """``X`` checked against the fit. A table with named columns is matched to
        ``feature_names_in_`` by name (any order; a missing or unknown column is refused) and,
        for a federated job's model, categorical columns are read as levels
        (:meth:`ForestModel.prepare`); an array is taken by position."""
        model = self._check_fitted()
        refuse_dates(X)
        if model.schema is not None or (_column_names(X) is not None
                                        and model.feature_names is not None):
            Xp = model.prepare(X)
            out: np.ndarray = as_schema_error(check_array, Xp, dtype=np.float64,
                                               ensure_all_finite="allow-nan")
            return out
        out = as_schema_error(validate_data, self, X, reset=False, dtype=np.float64,
                               ensure_all_finite="allow-nan")
        return out

    def _predict_codes(self, client: Any, n: int, method: str) -> np.ndarray | None:
        """The sites' codes of ``n`` rows to predict (None without ``client``); a forest that
        splits on the site indicator H needs them."""
        if client is None:
            if self.model_.uses_client:
                raise ValueError("this forest splits on the client indicator H: pass client= "
                                 f"to {method}")
            return None
        return self._client_codes(client, n, False)

    def _values(self, X: Any, client: Any, method: str = "predict") -> np.ndarray:
        model = self._check_fitted()
        X = self._validate_X_predict(X)
        return model.values_of(X, self._predict_codes(client, X.shape[0], method))

    # ------------------------------------------------------------------ fitted structure
    @property
    def estimators_(self) -> list[FederatedTree]:
        """The trees, one :class:`~fedforest_secure._sklearn_api.FederatedTree` each, with
        their arrays under scikit-learn's ``tree_`` names."""
        model = self._fitted_model()
        offset = float(getattr(self, "y_offset_", 0.0))

        def prepare(X: Any, client: Any) -> tuple[np.ndarray, np.ndarray | None]:
            Xc = self._validate_X_predict(X)  # as the forest's apply: names, width, levels
            return Xc, self._predict_codes(client, Xc.shape[0], "apply")

        return [FederatedTree(t, model.n_features, offset, prepare) for t in model.trees]

    @property
    def feature_importances_(self) -> np.ndarray:
        """Mean decrease in impurity per feature, shape (n_features,), summing to 1: computed
        from the node statistics the coordinator aggregated to grow the trees (nothing more
        is disclosed); splits on the client indicator count for no feature. Under DP those
        statistics are noisy: a split whose noisy decrease comes out below zero counts as no
        decrease."""
        model = self._fitted_model()
        return forest_importances(self.estimators_, model.n_features)

    def _fitted_model(self) -> ForestModel:
        if not hasattr(self, "model_"):
            raise AttributeError(f"this {type(self).__name__} is not fitted yet")
        model: ForestModel = self.model_
        return model

    def apply(self, X: Any, *, client: Any = None) -> np.ndarray:
        """Leaf index of every row in every tree, shape (n, n_estimators)."""
        model = self._check_fitted()
        X = self._validate_X_predict(X)
        codes = self._predict_codes(client, X.shape[0], "apply")
        return np.stack([t.apply(X, codes) for t in model.trees], axis=1) \
            if model.trees else np.zeros((X.shape[0], 0), dtype=np.int64)

    def decision_path(self, X: Any, *, client: Any = None) -> tuple[Any, np.ndarray]:
        """The nodes every row passes through, as scikit-learn's forests return them.

        Returns
        -------
        indicator : sparse matrix of shape (n, total nodes), 1 where a row passes a node
            (the trees' nodes side by side)
        n_nodes_ptr : array of shape (n_estimators + 1,), tree ``i``'s columns are
            ``[n_nodes_ptr[i], n_nodes_ptr[i + 1])``
        """
        from scipy.sparse import csr_matrix

        model = self._check_fitted()
        X = self._validate_X_predict(X)
        codes = self._predict_codes(client, X.shape[0], "decision_path")
        ptr = np.concatenate([[0], np.cumsum([t.n_nodes for t in model.trees])])
        rows, cols = [], []
        for i, t in enumerate(model.trees):
            r, c = t.decision_path(X, codes)
            rows.append(r)
            cols.append(c + ptr[i])
        r_all = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        c_all = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
        indicator = csr_matrix((np.ones(r_all.size, dtype=np.int64), (r_all, c_all)),
                               shape=(X.shape[0], int(ptr[-1])))
        return indicator, ptr

    def to_sklearn(self, *, hard_splits: bool = False) -> Any:
        """A fitted scikit-learn ``RandomForestRegressor`` / ``RandomForestClassifier`` with
        this forest's trees (:func:`~fedforest_secure._sklearn_api.to_sklearn_forest`), so
        SHAP, skops, skl2onnx and ``permutation_importance`` work on it unchanged. It predicts
        what this estimator predicts except for a row with a value within float32 rounding of
        a threshold, on its other side: scikit-learn reads X as float32 (the thresholds go out
        as float32 numbers). With the open profile's thresholds (data values) that is rare;
        the secure sketch puts some thresholds just below a repeated value, whose rows then go
        left in scikit-learn. :meth:`to_onnx` predicts exactly, in float64.

        A forest with soft routing (``model_.routing``: a DP random-split classifier shares a
        row near a threshold between both children, docs/privacy.md §2.6) has no scikit-learn
        form: ``hard_splits=True`` exports its trees with hard splits, which predict
        differently from this estimator. A DP classifier's noisy leaf counts go out as their
        proportions (clipped at 0): scikit-learn averages those, close to this forest's vote
        on the summed counts.

        Raises
        ------
        ValueError
            The forest splits on the client indicator H or on a feature its schema calls
            categorical (a DP job's random splits cut its level codes), or it routes rows
            softly and ``hard_splits`` is False.
        """
        model = self._check_fitted()
        if model.routing is not None and not hard_splits:
            raise ValueError("this forest shares a row near a threshold between both "
                             "children (soft routing, docs/privacy.md §2.6), which "
                             "scikit-learn's trees cannot: use to_onnx(), or "
                             "to_sklearn(hard_splits=True) for its trees with hard splits "
                             "(different predictions)")
        return to_sklearn_forest(model.trees, model.task, model.n_features,
                                 classes=getattr(self, "classes_", None),
                                 y_offset=float(getattr(self, "y_offset_", 0.0)),
                                 feature_names=getattr(self, "feature_names_in_", None),
                                 vote=model.vote, categorical=model.categorical_features())

    def to_onnx(self, path: str | Path | None = None) -> Any:
        """This forest as an ONNX model computed in double precision
        (:func:`~fedforest_secure._onnx_export.forest_to_onnx`): input ``X`` (n, n_features)
        float64; outputs ``variable`` (n, 1) for a regressor, ``label`` (n,) and
        ``probabilities`` (n, n_classes) for a classifier. onnxruntime predicts with it what
        this estimator predicts on float64 inputs, missing values (NaN) included. Written to
        ``path`` when given.

        Returns
        -------
        onnx.ModelProto

        Raises
        ------
        ImportError
            The ``onnx`` package is not installed.
        ValueError
            The forest splits on a categorical feature (a feature its schema calls
            categorical, at its level codes too) or on the client indicator H.
        """
        from ._onnx_export import forest_to_onnx

        model = self._check_fitted()
        onx = forest_to_onnx(model.trees, model.task, model.n_features,
                             classes=getattr(self, "classes_", None),
                             y_offset=float(getattr(self, "y_offset_", 0.0)),
                             vote=model.vote, routing=model.routing,
                             categorical=model.categorical_features())
        if path is not None:
            Path(path).write_bytes(onx.SerializeToString())
        return onx

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write the fitted estimator as a model file (:mod:`fedforest_secure.model`): the
        forest with its labels and feature names, plus the parameters, privacy profile and job
        configuration. An estimator read from a federated job's model file, which records no
        parameters or profile, writes that file as it was (claiming none)."""
        model = self._check_fitted()
        if not hasattr(self, "profile_"):  # loaded from a file without an estimator section
            write_atomic(path, getattr(self, "_file_model", model).to_json())
            return
        params = self.get_params()
        params["profile"] = getattr(self, "profile_", params["profile"])
        config = getattr(self, "config_", None)
        if not isinstance(params["random_state"], Integral | None) and config is not None:
            params["random_state"] = config.random_state
        section = {"class": type(self).__name__, "params": params,
                   "config": None if config is None else json.loads(config.to_json())}
        write_atomic(path, dataclasses.replace(model, estimator=section).to_json())

    @classmethod
    def load(cls, path: str | Path) -> Any:
        """Read a model file: one this estimator saved, or a federated job's model (the
        server's, ``fedforest model download``'s, a client's ``--out``).

        Raises
        ------
        ValueError
            Not a model file, a file whose parts do not fit together (the message names the
            field and the tree, :meth:`ForestModel.from_dict`), or a forest of the other task
            (a regression forest is read by :class:`FedForestRegressor`, a classification
            forest by :class:`FedForestClassifier`).
        """
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path}: not a model file ({exc})") from None
        try:
            if isinstance(doc, dict) and doc.get("format") == _OLD_FORMAT:
                return cls._load_old(doc)
            model = ForestModel.from_dict(doc)
        except KeyError as exc:
            raise ValueError(f"{path}: not a model file: no {exc.args[0]!r} field") from None
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        if model.task != cls._task:  # ForestModel refuses a task other than these two
            other = {"regression": "FedForestRegressor",
                     "classification": "FedForestClassifier"}[model.task]
            raise ValueError(f"{path} holds a {model.task} forest: read it with {other}.load")
        section = model.estimator or {}
        if section and (not isinstance(section, dict) or section.get("class") != cls.__name__):
            saved_by = section.get("class") if isinstance(section, dict) else None
            raise ValueError(f"{path} was saved by {saved_by}, not {cls.__name__}")
        est = cls._from_params(section["params"], path) if section else cls()
        est.model_ = dataclasses.replace(model, estimator=None)
        if not section:  # a job's model: classes in the schema's order
            sorted_model = _classes_sorted(est.model_)
            if sorted_model is not est.model_:
                est._file_model = est.model_  # what save writes back
                est.model_ = sorted_model
        if section.get("config") is not None:
            try:
                est.config_ = JobConfig.from_json(json.dumps(section["config"]))
            except (TypeError, ValueError, AttributeError) as exc:
                raise ValueError(f"{path}: estimator.config is not a job configuration: "
                                 f"{exc}") from None
        if section:
            est.profile_ = section["params"].get("profile", est.profile)
        est._set_fitted_attributes()
        return est

    @classmethod
    def _from_params(cls, params: Any, path: str | Path) -> Any:
        """The estimator of a model file's ``estimator.params``; a ValueError naming the file
        for a parameter this estimator does not have."""
        if not isinstance(params, dict):
            raise ValueError(f"{path}: estimator.params must be a mapping of parameters, got "
                             f"{params!r}")
        known = cls().get_params()
        unknown = sorted(str(k) for k in params if k not in known)
        if unknown:
            raise ValueError(f"{path}: estimator.params: unknown parameter "
                             f"{', '.join(map(repr, unknown))} of {cls.__name__} (its "
                             f"parameters are {', '.join(sorted(known))})")
        return cls(**params)

    def _set_fitted_attributes(self) -> None:
        model = self.model_
        self.n_features_in_ = model.n_features
        if model.feature_names is not None:
            self.feature_names_in_ = np.array(model.feature_names, dtype=object)
        self.clients_ = np.array(model.clients if model.clients is not None
                                 else list(range(max(model.n_clients, 1))))
        self.n_clients_ = len(self.clients_)
        if model.task == "classification":
            self.classes_ = np.array(model.classes if model.classes is not None
                                     else list(range(model.n_classes)))
            self.n_classes_ = int(self.classes_.size)
        self.n_outputs_ = 1
        self.y_offset_ = model.y_offset

    @classmethod
    def _load_old(cls, doc: dict[str, Any]) -> Any:
        if doc.get("class") != cls.__name__:
            raise ValueError(f"not a saved {cls.__name__} (saved by {doc.get('class')})")
        params = dict(doc["params"])
        if params.get("max_features") == "auto":  # files written before scikit-learn 1.4 names
            params.pop("max_features")
        est = cls(**params)
        model = ForestModel.from_dict(doc["model"])
        est.model_ = dataclasses.replace(
            model, clients=doc["clients"], classes=doc.get("classes"),
            feature_names=doc.get("feature_names"), y_offset=float(doc.get("y_offset", 0.0)))
        est.config_ = JobConfig.from_json(json.dumps(doc["config"]))
        est.profile_ = doc["params"]["profile"]
        est._set_fitted_attributes()
        return est


def _classes_sorted(model: ForestModel) -> ForestModel:
    """``model`` with its classes in sorted order, the trees' class columns to match (as
    scikit-learn's classifiers keep ``classes_``, and its metrics read probability columns);
    ``model`` itself if they are sorted already or cannot be compared."""
    if model.task != "classification" or not model.classes:
        return model
    try:
        order = sorted(range(len(model.classes)), key=lambda i: model.classes[i])  # type: ignore[index]
    except TypeError:  # labels of mixed kinds: kept as they are
        return model
    if order == list(range(len(order))):
        return model
    trees = [dataclasses.replace(t, value=t.value[:, order]) for t in model.trees]
    return dataclasses.replace(model, trees=trees, classes=[model.classes[i] for i in order])


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

    _parameter_constraints: ClassVar[dict[str, list[Any]]] = {
        **_FedForestBase._parameter_constraints,
        "criterion": [StrOptions({"gini", "entropy"})],
    }

    def __init__(self, *, n_estimators: int | None = None, max_depth: int | None = None,
                 min_samples_leaf: int = 5, min_samples_split: int = 2,
                 min_impurity_decrease: float = 0.0, max_features: Any = "sqrt",
                 bootstrap: bool | None = None, n_bins: int | None = None,
                 method: str = "quantiles", top_l: int | None = None,
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
        return np.searchsorted(self.classes_, y).astype(np.int64), 1.0

    def predict_proba(self, X: Any, *, client: Any = None) -> np.ndarray:
        """Class probabilities, shape (n, n_classes), columns ordered as ``classes_``."""
        return self._values(X, client, "predict_proba")

    def predict(self, X: Any, *, client: Any = None) -> np.ndarray:
        """Predicted classes, shape (n,)."""
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

        schema = Schema.from_dict(self.model_.schema)
        codes = schema.encode_target(y)  # indices into the schema's classes
        labels = np.asarray(schema.target.classes, dtype=object)[codes]
        return float(accuracy_score(labels.astype(str),
                                    np.asarray(self.predict(X, client=client)).astype(str),
                                    sample_weight=sample_weight))
