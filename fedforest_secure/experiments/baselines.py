"""Non-federated and one-shot baselines the paper compares FedForest with.

``LocalLearning``
    Every client trains its own scikit-learn random forest on its own rows, with the same
    hyper-parameters as the federated forest, and nothing is shared. In the paper, local
    learning is evaluated on a held-out sample of the client mixture; each test row is
    predicted by the model of the client it belongs to. So ``predict(X, client=h)`` sends
    row ``i`` to the forest of client ``h[i]``. Without ``client`` there is no owner to pick,
    and the prediction is the unweighted average of all the clients' forests (the same as
    :class:`LocalEnsemble`). A client id that was not seen in ``fit`` is an error.
``LocalEnsemble``
    One-shot local ensembling (Hauschild et al., 2022). The clients' local forests are merged
    into one forest, so every row, whoever owns it, gets the average of the clients'
    predictions (regression) or of their class probabilities (classification).
    ``weights="uniform"`` (the default) is the merged forest of Hauschild et al.: every client
    brings the same number of trees. ``weights="size"`` weights client ``k`` by ``n_k``.
``CentralizedRF``
    The reference: a scikit-learn random forest trained on the pooled rows. It is
    "Centralized (X)" in the paper and, with ``use_client=True``, "Centralized (X,H)". For the
    latter the client id becomes one extra numeric column, Fisher-encoded once at the root as
    the paper describes: client ``k`` is replaced by the mean of ``y`` over its training rows
    (for classification, one column per class holding that class's share of the client's
    rows; for two classes only the positive class is kept). Rows of a client that was not seen
    in ``fit`` get the pooled mean. ``bootstrap="client"`` draws a client-stratified bootstrap
    (each client resamples its own ``n_k`` rows, as FedForest does) instead of sklearn's pooled
    bootstrap. It fits one ``DecisionTree`` per draw, with the resample counts as sample
    weights, which is what sklearn's forest does internally.

All three follow scikit-learn conventions: keyword-only constructor parameters, ``fit(X, y,
client=h)``, ``predict``, ``predict_proba`` (classification) and ``score`` (R^2 or accuracy).
``task`` is ``"regression"`` or ``"classification"``. ``LocalLearningRegressor`` and its siblings
are the same classes with ``task`` fixed. ``max_features=None`` means the paper's default,
``1/3`` of the features for regression and ``"sqrt"`` for classification (scikit-learn meanings).
To use every feature, pass ``max_features=1.0``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
from sklearn.metrics import accuracy_score, r2_score
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

from ..config import resolve_max_features

__all__ = [
    "CentralizedRF",
    "LocalEnsemble",
    "LocalEnsembleClassifier",
    "LocalEnsembleRegressor",
    "LocalLearning",
    "LocalLearningClassifier",
    "LocalLearningRegressor",
]

_TASKS = ("regression", "classification")


def _check_task(task: str) -> str:
    if task not in _TASKS:
        raise ValueError(f"task must be one of {_TASKS}, got {task!r}")
    return task


def _default_max_features(task: str, max_features: Any) -> Any:
    if max_features is not None:
        return max_features
    return 1 / 3 if task == "regression" else "sqrt"


def _check_Xy(X: Any, y: Any | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-dimensional, got shape {X.shape}")
    if y is None:
        return X, None
    y = np.asarray(y)
    if y.shape != (X.shape[0],):
        raise ValueError(f"y must have shape ({X.shape[0]},), got {y.shape}")
    return X, y


def _check_client(client: Any, n: int) -> np.ndarray:
    h = np.asarray(client)
    if h.shape != (n,):
        raise ValueError(f"client must have shape ({n},), got {h.shape}")
    return h


def _forest(task: str, params: dict[str, Any], seed: int | None) -> Any:
    cls = RandomForestRegressor if task == "regression" else RandomForestClassifier
    return cls(random_state=seed, **params)


class _Base(BaseEstimator):  # type: ignore[misc]
    """Shared parameters, validation and scoring."""

    def __init__(self, *, task: str = "regression", n_estimators: int = 50,
                 max_depth: int | None = 8,
                 min_samples_leaf: int = 5, max_features: Any = None, bootstrap: Any = True,
                 random_state: int | None = 0, n_jobs: int | None = None) -> None:
        self.task = task
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.max_features = max_features
        self.bootstrap = bootstrap
        self.random_state = random_state
        self.n_jobs = n_jobs

    def _rf_params(self) -> dict[str, Any]:
        return {"n_estimators": self.n_estimators, "max_depth": self.max_depth,
                "min_samples_leaf": self.min_samples_leaf,
                "max_features": _default_max_features(self.task, self.max_features),
                "bootstrap": self.bootstrap, "n_jobs": self.n_jobs}

    def _check_fitted(self) -> None:
        if not hasattr(self, "n_features_in_"):
            raise AttributeError(f"this {type(self).__name__} is not fitted yet; call fit first")

    def _encode_y(self, y: np.ndarray) -> np.ndarray:
        if self.task == "regression":
            y = y.astype(np.float64)
            if not np.all(np.isfinite(y)):
                raise ValueError("y has non-finite values")
            return y
        self.classes_ = np.unique(y)
        if self.classes_.size < 2:
            raise ValueError("classification needs at least two classes in y")
        return np.searchsorted(self.classes_, y)

    def _values(self, X: np.ndarray, client: Any) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict_proba(self, X: Any, client: Any = None) -> np.ndarray:
        """Class probabilities, shape (n, n_classes), columns ordered as ``classes_``."""
        if _check_task(self.task) != "classification":
            raise AttributeError("predict_proba is only available for task='classification'")
        return self._values(X, client)

    def predict(self, X: Any, client: Any = None) -> np.ndarray:
        """Predicted values (regression) or classes (classification), shape (n,)."""
        v = self._values(X, client)
        if self.task == "regression":
            return v[:, 0]
        return np.asarray(self.classes_[np.argmax(v, axis=1)])

    def score(self, X: Any, y: Any, client: Any = None, sample_weight: Any = None) -> float:
        """R^2 for regression, accuracy for classification."""
        pred = self.predict(X, client=client)
        if self.task == "regression":
            return float(r2_score(y, pred, sample_weight=sample_weight))
        return float(accuracy_score(y, pred, sample_weight=sample_weight))


class _LocalForests(_Base):
    """One scikit-learn forest per client."""

    def __init__(self, *, task: str = "regression", n_estimators: int = 50,
                 max_depth: int | None = 8,
                 min_samples_leaf: int = 5, max_features: Any = None, bootstrap: Any = True,
                 random_state: int | None = 0, n_jobs: int | None = None) -> None:
        super().__init__(task=task, n_estimators=n_estimators, max_depth=max_depth,
                         min_samples_leaf=min_samples_leaf, max_features=max_features,
                         bootstrap=bootstrap, random_state=random_state, n_jobs=n_jobs)

    def fit(self, X: Any, y: Any, client: Any = None) -> _LocalForests:
        """Train one forest per client on that client's rows.

        Parameters
        ----------
        X : array of shape (n, d)
        y : array of shape (n,)
        client : array of shape (n,), the client of each row (None: a single client)
        """
        _check_task(self.task)
        X, y = _check_Xy(X, y)
        assert y is not None
        h = np.zeros(X.shape[0], dtype=np.int64) if client is None else \
            _check_client(client, X.shape[0])
        y_enc = self._encode_y(y)
        self.clients_ = np.unique(h)
        seeds = np.random.SeedSequence(self.random_state).generate_state(len(self.clients_))
        self.estimators_: list[Any] = []
        self.client_sizes_ = np.zeros(len(self.clients_), dtype=np.int64)
        for k, c in enumerate(self.clients_):
            rows = h == c
            est = _forest(self.task, self._rf_params(), int(seeds[k]))
            est.fit(X[rows], y_enc[rows])
            self.estimators_.append(est)
            self.client_sizes_[k] = int(rows.sum())
        self.n_features_in_ = X.shape[1]
        self.n_clients_ = len(self.clients_)
        return self

    def _client_values(self, k: int, X: np.ndarray) -> np.ndarray:
        """Predictions of client k's forest, (n, 1) or (n, n_classes) in global class order."""
        est = self.estimators_[k]
        if self.task == "regression":
            return np.asarray(est.predict(X), dtype=np.float64)[:, None]
        out = np.zeros((X.shape[0], len(self.classes_)))
        # the local forest only knows the classes its client has; its classes_ are codes
        out[:, np.asarray(est.classes_, dtype=np.int64)] = est.predict_proba(X)
        return out

    def _average(self, X: np.ndarray, weights: np.ndarray) -> np.ndarray:
        total = np.zeros((X.shape[0], 1 if self.task == "regression" else len(self.classes_)))
        for k in range(self.n_clients_):
            total += weights[k] * self._client_values(k, X)
        return total / float(weights.sum())

    def _prepare(self, X: Any) -> np.ndarray:
        self._check_fitted()
        X2, _ = _check_Xy(X)
        if X2.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X2.shape[1]} features, the model expects "
                             f"{self.n_features_in_}")
        return X2


class LocalLearning(_LocalForests):
    """Local learning: each client keeps its own forest; a row is predicted by its client's one.

    ``predict(X, client=h)`` uses the forest of client ``h[i]`` for row ``i``; without
    ``client`` it averages all clients' forests (uniformly). See the module docstring.
    """

    def _values(self, X: Any, client: Any) -> np.ndarray:
        X = self._prepare(X)
        if client is None:
            return self._average(X, np.ones(self.n_clients_))
        h = _check_client(client, X.shape[0])
        idx = np.searchsorted(self.clients_, h)
        idx = np.clip(idx, 0, self.n_clients_ - 1)
        unknown = self.clients_[idx] != h
        if unknown.any():
            raise ValueError(f"unknown client {h[unknown].tolist()[0]!r}; known clients are "
                             f"{self.clients_.tolist()}")
        width = 1 if self.task == "regression" else len(self.classes_)
        out = np.zeros((X.shape[0], width))
        for k in np.unique(idx):
            rows = idx == k
            out[rows] = self._client_values(int(k), X[rows])
        return out


class LocalEnsemble(_LocalForests):
    """One-shot local ensembling (Hauschild et al., 2022): average of the clients' forests.

    Parameters
    ----------
    weights : {"uniform", "size"}, default "uniform"
        ``"uniform"``: every client's forest counts the same (the merged forest of Hauschild
        et al.); ``"size"``: client ``k`` is weighted by its number of training rows.
    Other parameters as in :class:`LocalLearning`. ``client`` is accepted by ``predict`` for
    API symmetry and ignored.
    """

    def __init__(self, *, task: str = "regression", n_estimators: int = 50,
                 max_depth: int | None = 8,
                 min_samples_leaf: int = 5, max_features: Any = None, bootstrap: Any = True,
                 weights: str = "uniform", random_state: int | None = 0,
                 n_jobs: int | None = None) -> None:
        super().__init__(task=task, n_estimators=n_estimators, max_depth=max_depth,
                         min_samples_leaf=min_samples_leaf, max_features=max_features,
                         bootstrap=bootstrap, random_state=random_state, n_jobs=n_jobs)
        self.weights = weights

    def fit(self, X: Any, y: Any, client: Any = None) -> LocalEnsemble:
        if self.weights not in ("uniform", "size"):
            raise ValueError(f"weights must be 'uniform' or 'size', got {self.weights!r}")
        super().fit(X, y, client=client)
        return self

    def _values(self, X: Any, client: Any) -> np.ndarray:
        X = self._prepare(X)
        w = np.ones(self.n_clients_) if self.weights == "uniform" else \
            self.client_sizes_.astype(np.float64)
        return self._average(X, w)


class CentralizedRF(_Base):
    """scikit-learn random forest on the pooled rows, optionally with a Fisher-encoded client id.

    Parameters
    ----------
    use_client : bool, default False
        ``True``: "Centralized (X,H)". The client id is appended as Fisher-encoded column(s):
        the client's mean of ``y`` on the training rows (for classification, its class shares).
        ``fit``, ``predict`` and ``score`` then need ``client``.
    bootstrap : bool or "client", default True
        ``True``: sklearn's pooled bootstrap; ``"client"``: client-stratified bootstrap (each
        client resamples its own rows); ``False``: no bootstrap.
    max_features : as in sklearn; None means 1/3 (regression) or "sqrt" (classification) of the
        ``d`` columns of ``X``. With ``use_client`` the count is resolved on ``d`` and the H
        column(s) add to it. sklearn cannot exempt H from feature sampling, so unlike FedForest
        H is not always a candidate.
    """

    def __init__(self, *, task: str = "regression", n_estimators: int = 50,
                 max_depth: int | None = 8,
                 min_samples_leaf: int = 5, max_features: Any = None, bootstrap: Any = True,
                 use_client: bool = False, random_state: int | None = 0,
                 n_jobs: int | None = None) -> None:
        super().__init__(task=task, n_estimators=n_estimators, max_depth=max_depth,
                         min_samples_leaf=min_samples_leaf, max_features=max_features,
                         bootstrap=bootstrap, random_state=random_state, n_jobs=n_jobs)
        self.use_client = use_client

    # ---------------------------------------------------------------- Fisher encoding of H
    def _fisher_fit(self, y_enc: np.ndarray, h: np.ndarray) -> None:
        self.clients_ = np.unique(h)
        if self.task == "regression":
            target = y_enc[:, None].astype(np.float64)
        else:
            onehot = np.eye(len(self.classes_))[y_enc]
            target = onehot[:, 1:] if len(self.classes_) == 2 else onehot
        self.client_codes_ = np.stack([target[h == c].mean(axis=0) for c in self.clients_])
        self.client_default_ = target.mean(axis=0)

    def _fisher_transform(self, X: np.ndarray, client: Any) -> np.ndarray:
        if not self.use_client:
            return X
        if client is None:
            raise ValueError("use_client=True: pass client= to fit, predict and score")
        h = _check_client(client, X.shape[0])
        idx = np.clip(np.searchsorted(self.clients_, h), 0, len(self.clients_) - 1)
        known = self.clients_[idx] == h
        codes = np.where(known[:, None], self.client_codes_[idx], self.client_default_[None, :])
        return np.hstack([X, codes])

    def _resolved_max_features(self, d: int) -> Any:
        mf = _default_max_features(self.task, self.max_features)
        if not self.use_client:
            return mf
        return resolve_max_features(mf, d) + self.client_codes_.shape[1]

    # ---------------------------------------------------------------- fit / predict
    def fit(self, X: Any, y: Any, client: Any = None) -> CentralizedRF:
        """Train on the pooled rows. ``client`` is needed for ``use_client`` or
        ``bootstrap="client"`` and ignored otherwise."""
        _check_task(self.task)
        X, y = _check_Xy(X, y)
        assert y is not None
        y_enc = self._encode_y(y)
        d = X.shape[1]
        if client is not None:
            h = _check_client(client, X.shape[0])
        elif self.use_client or self.bootstrap == "client":
            raise ValueError("use_client=True or bootstrap='client' needs client=")
        else:
            h = np.zeros(X.shape[0], dtype=np.int64)
        if self.use_client:
            self._fisher_fit(y_enc, h)
        Xa = self._fisher_transform(X, h if self.use_client else None)
        mf = self._resolved_max_features(d)
        if self.bootstrap == "client":
            self.estimators_ = self._fit_stratified(Xa, y_enc, h, mf)
            self.forest_ = None
        elif isinstance(self.bootstrap, bool | np.bool_):
            params = self._rf_params()
            params["max_features"] = mf
            self.forest_ = _forest(self.task, params, self.random_state)
            self.forest_.fit(Xa, y_enc)
            self.estimators_ = list(self.forest_.estimators_)
        else:
            raise ValueError(f"bootstrap must be True, False or 'client', got {self.bootstrap!r}")
        self.n_features_in_ = d
        return self

    def _fit_stratified(self, X: np.ndarray, y: np.ndarray, h: np.ndarray, mf: Any) -> list[Any]:
        rng = np.random.default_rng(self.random_state)
        groups = [np.flatnonzero(h == c) for c in np.unique(h)]
        cls = DecisionTreeRegressor if self.task == "regression" else DecisionTreeClassifier
        trees = []
        for _ in range(self.n_estimators):
            w = np.zeros(X.shape[0])
            for rows in groups:
                w += np.bincount(rng.choice(rows, size=rows.size, replace=True),
                                 minlength=X.shape[0])
            tree = cls(max_depth=self.max_depth, min_samples_leaf=self.min_samples_leaf,
                       max_features=mf, random_state=int(rng.integers(2**31 - 1)))
            keep = w > 0
            tree.fit(X[keep], y[keep], sample_weight=w[keep])
            trees.append(tree)
        return trees

    def _values(self, X: Any, client: Any) -> np.ndarray:
        self._check_fitted()
        X, _ = _check_Xy(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, the model expects "
                             f"{self.n_features_in_}")
        Xa = self._fisher_transform(X, client)
        if self.forest_ is not None:
            if self.task == "regression":
                return np.asarray(self.forest_.predict(Xa), dtype=np.float64)[:, None]
            return np.asarray(self.forest_.predict_proba(Xa))
        width = 1 if self.task == "regression" else len(self.classes_)
        out = np.zeros((X.shape[0], width))
        for tree in self.estimators_:
            if self.task == "regression":
                out[:, 0] += tree.predict(Xa)
            else:
                out[:, np.asarray(tree.classes_, dtype=np.int64)] += tree.predict_proba(Xa)
        return out / len(self.estimators_)


class LocalLearningRegressor(LocalLearning):
    """:class:`LocalLearning` with ``task="regression"``."""

    def __init__(self, *, n_estimators: int = 50, max_depth: int | None = 8,
                 min_samples_leaf: int = 5, max_features: Any = None, bootstrap: Any = True,
                 random_state: int | None = 0, n_jobs: int | None = None) -> None:
        super().__init__(task="regression", n_estimators=n_estimators, max_depth=max_depth,
                         min_samples_leaf=min_samples_leaf, max_features=max_features,
                         bootstrap=bootstrap, random_state=random_state,
                         n_jobs=n_jobs)


class LocalLearningClassifier(LocalLearning):
    """:class:`LocalLearning` with ``task="classification"``."""

    def __init__(self, *, n_estimators: int = 50, max_depth: int | None = 8,
                 min_samples_leaf: int = 5, max_features: Any = None, bootstrap: Any = True,
                 random_state: int | None = 0, n_jobs: int | None = None) -> None:
        super().__init__(task="classification", n_estimators=n_estimators, max_depth=max_depth,
                         min_samples_leaf=min_samples_leaf, max_features=max_features,
                         bootstrap=bootstrap, random_state=random_state,
                         n_jobs=n_jobs)


class LocalEnsembleRegressor(LocalEnsemble):
    """:class:`LocalEnsemble` with ``task="regression"``."""

    def __init__(self, *, n_estimators: int = 50, max_depth: int | None = 8,
                 min_samples_leaf: int = 5, max_features: Any = None, bootstrap: Any = True,
                 weights: str = "uniform",
                 random_state: int | None = 0, n_jobs: int | None = None) -> None:
        super().__init__(task="regression", n_estimators=n_estimators, max_depth=max_depth,
                         min_samples_leaf=min_samples_leaf, max_features=max_features,
                         bootstrap=bootstrap, weights=weights, random_state=random_state,
                         n_jobs=n_jobs)


class LocalEnsembleClassifier(LocalEnsemble):
    """:class:`LocalEnsemble` with ``task="classification"``."""

    def __init__(self, *, n_estimators: int = 50, max_depth: int | None = 8,
                 min_samples_leaf: int = 5, max_features: Any = None, bootstrap: Any = True,
                 weights: str = "uniform",
                 random_state: int | None = 0, n_jobs: int | None = None) -> None:
        super().__init__(task="classification", n_estimators=n_estimators, max_depth=max_depth,
                         min_samples_leaf=min_samples_leaf, max_features=max_features,
                         bootstrap=bootstrap, weights=weights, random_state=random_state,
                         n_jobs=n_jobs)
