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
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

from .config import METHODS, JobConfig, resolve_max_features
from .errors import NotFittedError, SchemaError
from .federation import run_in_process
from .model import ForestModel, _column_names

__all__ = ["FedForestClassifier", "FedForestRegressor"]

_OLD_FORMAT = "fedforest-secure/estimator/v1"  # files written before the one model format

def _dp_defaults(epsilon: float, task: str, n_rows: int, n_features: int, n_classes: int,
                 delta: float) -> dict[str, Any]:
    """Hyper-parameters under a DP profile when the user leaves them unset: the allocation rule
    :func:`~fedforest_secure.privacy.allocation.dp_forest_settings` (docs/privacy.md)."""
    from .privacy.allocation import dp_forest_settings

    return dp_forest_settings(epsilon, n_rows, n_features, n_classes, task,
                              delta=delta).as_params()


def _dp_rule_for(method: str | None, epsilon: float, task: str, n_rows: int, n_features: int,
                 n_classes: int, delta: float) -> dict[str, Any]:
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


class _FedForestBase(BaseEstimator):  # type: ignore[misc]
    _task = "regression"

    def __init__(self, *, n_estimators: int | None = None, max_depth: int | None = None,
                 min_samples_leaf: int = 5, min_samples_split: int = 2,
                 min_impurity_decrease: float = 0.0, max_features: Any = "auto",
                 bootstrap: bool | None = None, n_bins: int | None = None,
                 method: str = "quantiles", top_l: int | None = None,
                 split_on_client: bool = False, profile: Any = "open",
                 random_state: int | None = 0, n_jobs: int | None = None) -> None:
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

    # ------------------------------------------------------------------ helpers
    def _criterion(self) -> str:
        return "mse"

    def _resolved(self, d: int, dp: dict[str, Any] | None, n_rows: int = 1,
                  n_classes: int = 0) -> dict[str, Any]:
        """Hyper-parameters with ``None`` / ``"auto"`` replaced by defaults.

        Without DP: the paper's (50 trees, depth 8, B = 32, d/3 features for regression and
        sqrt(d) for classification, client-stratified bootstrap). Under a DP profile every
        release costs budget, so the defaults favour few, shallow trees that all see every row,
        with coarse bins and few features per node (:func:`_dp_defaults`, docs/privacy.md).
        """
        auto_mf = (1 / 3 if self._task == "regression" else "sqrt")
        out = {"n_estimators": self.n_estimators, "max_depth": self.max_depth,
               "n_bins": self.n_bins, "max_features": self.max_features,
               "sampling": None if self.bootstrap is None else
               ("bootstrap" if self.bootstrap else "all"),
               # under DP the quantile sketch (the default method) is never used: the rule
               # picks the method; any other method the user names is kept
               "method": None if dp and self.method == "quantiles" else self.method}
        if dp and out["method"] is None and self.split_on_client:
            out["method"] = "histogram"  # H-splits are scored by the greedy levels
        defaults = (_dp_rule_for(out["method"], float(dp["epsilon"]), self._task, n_rows, d,
                                 n_classes, float(dp["delta"])) if dp else
                    {"n_estimators": 50, "max_depth": 8, "n_bins": 32, "max_features": auto_mf,
                     "sampling": "bootstrap", "method": self.method})
        for key, val in defaults.items():
            if key == "max_features":  # None keeps scikit-learn's meaning: all features
                if isinstance(out[key], str) and out[key] == "auto":
                    out[key] = val
            elif out[key] is None:
                out[key] = val
        if isinstance(out["max_features"], int) and not isinstance(out["max_features"], bool):
            out["max_features"] = min(out["max_features"], d)
        return out

    def _check_X(self, X: Any) -> np.ndarray:
        arr = np.asarray(X, dtype=np.float64)
        if arr.ndim != 2:
            raise SchemaError(f"X must be 2-dimensional, got shape {arr.shape}")
        if not np.isfinite(arr).all():
            r, c = np.argwhere(~np.isfinite(arr))[0]
            raise SchemaError(f"X has a non-finite value at row {r}, column {c}")
        return arr

    def _encode_y(self, y: Any) -> tuple[np.ndarray, float]:
        y = np.asarray(y, dtype=np.float64)
        if not np.isfinite(y).all():
            raise SchemaError("y has non-finite values")
        return y, float(np.max(np.abs(y))) if y.size else 1.0

    def _client_codes(self, client: Any, n: int, fitting: bool) -> np.ndarray:
        if client is None:
            if fitting:
                self.clients_ = np.array([0])
            return np.zeros(n, dtype=np.int64)
        client = np.asarray(client)
        if client.shape != (n,):
            raise SchemaError(f"client must have shape ({n},), got {client.shape}")
        if fitting:
            self.clients_ = np.unique(client)
        # clients_ is in index order: sorted after fit, the job's order for a job's model
        index = {c: i for i, c in enumerate(self.clients_.tolist())}
        codes = np.empty(n, dtype=np.int64)
        for r, c in enumerate(client.tolist()):
            k = index.get(c)
            if k is None:
                raise SchemaError(f"unknown client {c!r}; the forest knows "
                                  f"{self.clients_.tolist()}")
            codes[r] = k
        return codes

    # ------------------------------------------------------------------ fit / predict
    def fit(self, X: Any, y: Any, client: Any = None,
            on_round: Any = None) -> _FedForestBase:
        """Train over in-process clients.

        Parameters
        ----------
        X : array of shape (n, d)
        y : array of shape (n,)
        client : array of shape (n,), the institution of each row (None: one client)
        on_round : optional callback receiving each round's :class:`RoundRecord`
        """
        names = _column_names(X)
        X = self._check_X(X)
        y = np.asarray(y)
        if y.shape != (X.shape[0],):
            raise SchemaError(f"y must have shape ({X.shape[0]},), got {y.shape}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        h = self._client_codes(client, X.shape[0], fitting=True)
        y_enc, target_bound = self._encode_y(y)
        K = len(self.clients_)
        d = X.shape[1]
        lo, hi = X.min(axis=0), X.max(axis=0)
        hi = np.where(hi > lo, hi, lo + 1.0)
        dp = _profile_dict(self.profile).get("dp")
        hp = self._resolved(d, dp, X.shape[0], len(getattr(self, "classes_", [])))
        self.y_offset_ = 0.0
        if dp and self._task == "regression" and y_enc.size:
            # centre y on the middle of its bounds: halves the noise on sums of y under DP
            self.y_offset_ = float((y_enc.min() + y_enc.max()) / 2.0)
            y_enc = y_enc - self.y_offset_
            target_bound = float(np.max(np.abs(y_enc)))
        seed = int(self.random_state) if self.random_state is not None else \
            int(np.random.SeedSequence().generate_state(1)[0])
        self.profile_ = _profile_dict(self.profile)
        config = JobConfig(
            job_id=f"local-{uuid.uuid4().hex[:12]}", task=self._task, n_features=d,
            n_clients=K, n_classes=len(getattr(self, "classes_", [])),
            feature_bounds=tuple((float(a), float(b)) for a, b in zip(lo, hi, strict=True)),
            target_bound=max(target_bound, 1e-12), n_estimators=hp["n_estimators"],
            max_depth=hp["max_depth"], min_samples_leaf=self.min_samples_leaf,
            min_samples_split=self.min_samples_split,
            min_impurity_decrease=self.min_impurity_decrease,
            max_features=resolve_max_features(hp["max_features"], d),
            bootstrap=hp["sampling"] == "bootstrap", row_sampling=hp["sampling"],
            n_bins=hp["n_bins"], method=hp["method"], top_l=self.top_l,
            split_on_client=self.split_on_client, criterion=self._criterion(),
            random_state=seed, profile=self.profile_)
        # each client's share of the rows is made when its worker is built, and dropped after
        shares = ((X[h == k], y_enc[h == k]) for k in range(K))
        self.config_ = config
        model = run_in_process(config, shares, on_round=on_round, n_jobs=self.n_jobs)
        classes = getattr(self, "classes_", None)
        self.model_ = dataclasses.replace(
            model, feature_names=names, clients=self.clients_.tolist(), y_offset=self.y_offset_,
            classes=None if classes is None else classes.tolist())
        self.n_features_in_ = d
        if names is not None:
            self.feature_names_in_ = np.array(names, dtype=object)
        self.n_clients_ = K
        return self

    def _check_fitted(self) -> ForestModel:
        if not hasattr(self, "model_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")
        return self.model_

    def _values(self, X: Any, client: Any) -> np.ndarray:
        model = self._check_fitted()
        if _column_names(X) is None and model.schema is None:
            X = self._check_X(X)
            if X.shape[1] != self.n_features_in_:
                raise SchemaError(f"X has {X.shape[1]} features, the forest expects "
                                  f"{self.n_features_in_}")
        X = self._check_X(model.prepare(X))  # columns by name, levels by label
        codes = None if client is None else self._client_codes(client, X.shape[0], False)
        return model.values_of(X, codes)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        """Write the fitted estimator as a model file (:mod:`fedforest_secure.model`): the
        forest with its labels and feature names, plus the parameters, privacy profile and job
        configuration."""
        model = self._check_fitted()
        params = self.get_params()
        params["profile"] = getattr(self, "profile_", params["profile"])
        config = getattr(self, "config_", None)
        section = {"class": type(self).__name__, "params": params,
                   "config": None if config is None else json.loads(config.to_json())}
        Path(path).write_text(dataclasses.replace(model, estimator=section).to_json())

    @classmethod
    def load(cls, path: str | Path) -> Any:
        """Read a model file: one this estimator saved, or a federated job's model (the
        server's, ``fedforest model download``'s, a client's ``--out``).

        Raises
        ------
        ValueError
            Not a model file, or a forest of the other task (a regression forest is read by
            :class:`FedForestRegressor`, a classification forest by
            :class:`FedForestClassifier`).
        """
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a model file ({exc})") from None
        if isinstance(doc, dict) and doc.get("format") == _OLD_FORMAT:
            return cls._load_old(doc, path)
        try:
            model = ForestModel.from_dict(doc)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        if model.task != cls._task:
            other = "FedForestRegressor" if model.task == "regression" else "FedForestClassifier"
            raise ValueError(f"{path} holds a {model.task} forest: read it with {other}.load")
        section = model.estimator or {}
        if section and section.get("class") != cls.__name__:
            raise ValueError(f"{path} was saved by {section.get('class')}, not {cls.__name__}")
        est = cls(**section["params"]) if section else cls()
        est.model_ = dataclasses.replace(model, estimator=None)
        if section.get("config") is not None:
            est.config_ = JobConfig.from_json(json.dumps(section["config"]))
        if section:
            est.profile_ = section["params"]["profile"]
        est._set_fitted_attributes()
        return est

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
        self.y_offset_ = model.y_offset

    @classmethod
    def _load_old(cls, doc: dict[str, Any], path: str | Path) -> Any:
        if doc.get("class") != cls.__name__:
            raise ValueError(f"{path} is not a saved {cls.__name__}")
        est = cls(**doc["params"])
        model = ForestModel.from_dict(doc["model"])
        est.model_ = dataclasses.replace(
            model, clients=doc["clients"], classes=doc.get("classes"),
            y_offset=float(doc.get("y_offset", 0.0)))
        est.config_ = JobConfig.from_json(json.dumps(doc["config"]))
        est.profile_ = doc["params"]["profile"]
        est._set_fitted_attributes()
        return est


class FedForestRegressor(RegressorMixin, _FedForestBase):  # type: ignore[misc]
    """Federated random forest regressor (FedForest, Khellaf et al.)."""

    _task = "regression"

    def predict(self, X: Any, client: Any = None) -> np.ndarray:
        """Predicted values, shape (n,). ``client`` is needed only if the forest splits on H."""
        return self._values(X, client)[:, 0] + getattr(self, "y_offset_", 0.0)

    def score(self, X: Any, y: Any, client: Any = None, sample_weight: Any = None) -> float:
        from sklearn.metrics import r2_score

        return float(r2_score(y, self.predict(X, client), sample_weight=sample_weight))


class FedForestClassifier(ClassifierMixin, _FedForestBase):  # type: ignore[misc]
    """Federated random forest classifier (FedForest, Khellaf et al.)."""

    _task = "classification"

    def __init__(self, *, n_estimators: int | None = None, max_depth: int | None = None,
                 min_samples_leaf: int = 5, min_samples_split: int = 2,
                 min_impurity_decrease: float = 0.0, max_features: Any = "auto",
                 bootstrap: bool | None = None, n_bins: int | None = None,
                 method: str = "quantiles", top_l: int | None = None,
                 split_on_client: bool = False, profile: Any = "open",
                 criterion: str = "gini", random_state: int | None = 0,
                 n_jobs: int | None = None) -> None:
        super().__init__(n_estimators=n_estimators, max_depth=max_depth,
                         min_samples_leaf=min_samples_leaf, min_samples_split=min_samples_split,
                         min_impurity_decrease=min_impurity_decrease, max_features=max_features,
                         bootstrap=bootstrap, n_bins=n_bins, method=method, top_l=top_l,
                         split_on_client=split_on_client, profile=profile,
                         random_state=random_state, n_jobs=n_jobs)
        self.criterion = criterion

    def _criterion(self) -> str:
        if self.criterion not in ("gini", "entropy"):
            raise ValueError(f"criterion must be 'gini' or 'entropy', got {self.criterion!r}")
        return self.criterion

    def _encode_y(self, y: Any) -> tuple[np.ndarray, float]:
        y = np.asarray(y)
        self.classes_ = np.unique(y)
        if self.classes_.size < 2:
            raise SchemaError("classification needs at least two classes in y")
        return np.searchsorted(self.classes_, y).astype(np.int64), 1.0

    def predict_proba(self, X: Any, client: Any = None) -> np.ndarray:
        """Class probabilities, shape (n, n_classes), columns ordered as ``classes_``."""
        return self._values(X, client)

    def predict(self, X: Any, client: Any = None) -> np.ndarray:
        """Predicted classes, shape (n,)."""
        self._check_fitted()
        labels: np.ndarray = self.classes_[np.argmax(self.predict_proba(X, client), axis=1)]
        return labels

    def score(self, X: Any, y: Any, client: Any = None, sample_weight: Any = None) -> float:
        from sklearn.metrics import accuracy_score

        return float(accuracy_score(y, self.predict(X, client), sample_weight=sample_weight))
