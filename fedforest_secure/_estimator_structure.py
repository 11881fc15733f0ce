"""The fitted forest as scikit-learn's forests show theirs (``estimators_``,
``feature_importances_``, ``apply``, ``decision_path``), and the forest exported as a
scikit-learn forest or as an ONNX model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np

from ._estimator_rows import _EstimatorRows
from ._sklearn_api import FederatedTree, forest_importances, to_sklearn_forest
from .files import write_atomic
from .model import ForestModel

#: the instance attribute holding ``(model_, y_offset_, trees, importances or None)``
_CACHE = "_structure_cache"


class _EstimatorStructure(_EstimatorRows):
    """The estimators' fitted trees, importances and exports."""

    @property
    def estimators_(self) -> list[FederatedTree]:
        """The trees, one :class:`~fedforest_secure._sklearn_api.FederatedTree` each, with
        their arrays under scikit-learn's ``tree_`` names. Built once per fitted forest: every
        read returns the same list until a fit or a load gives the estimator another
        ``model_``."""
        return self._structure()[0]

    @property
    def feature_importances_(self) -> np.ndarray:
        """Mean decrease in impurity per feature, shape (n_features,), summing to 1: computed
        from the node statistics the coordinator aggregated to grow the trees (nothing more
        is disclosed); splits on the client indicator count for no feature. Under DP those
        statistics are noisy (with minimum-leaf abstention partial): the node counts are
        taken as a tree's (``estimators_[i].tree_``: each leaf at least one row, each inner
        node the sum of its children), and a split whose decrease comes out below zero counts
        as no decrease. Each read returns a new array (computed once per fitted forest)."""
        trees, importances = self._structure()
        if importances is None:
            importances = forest_importances(trees, self._fitted_model().n_features)
            self.__dict__[_CACHE] = (*self.__dict__[_CACHE][:3], importances)
        return importances.copy()

    def _structure(self) -> tuple[list[FederatedTree], np.ndarray | None]:
        """The fitted forest's trees (and its importances, once computed), built from
        ``model_`` on the first read and kept while ``model_`` and ``y_offset_`` stay."""
        model = self._fitted_model()
        offset = float(getattr(self, "y_offset_", 0.0))
        cached = self.__dict__.get(_CACHE)
        if cached is not None and cached[0] is model and cached[1] == offset:
            return cached[2], cached[3]

        def prepare(X: Any, client: Any) -> tuple[np.ndarray, np.ndarray | None]:
            Xc = self._validate_X_predict(X)  # as the forest's apply: names, width, levels
            return Xc, self._predict_codes(client, Xc.shape[0], "apply")

        trees = [FederatedTree(t, model.n_features, offset, prepare) for t in model.trees]
        self.__dict__[_CACHE] = (model, offset, trees, None)
        return trees, None

    def __getstate__(self) -> dict[str, Any]:
        """The estimator's state for pickle and deepcopy, without the built trees (they are
        built again from ``model_``)."""
        state = dict(cast("dict[str, Any]", super().__getstate__()))  # BaseEstimator's
        state.pop(_CACHE, None)
        return state

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
        what this estimator predicts except for a row whose value has the float32 number of a
        threshold and lies on its other side: scikit-learn reads X as float32 and cannot tell
        such values apart. The thresholds go out as float32 numbers that keep a table's
        values where this forest sends them (a threshold that is a data value, as the open
        profile's are, and the value just above a secure sketch's cut); values finer than
        float32 beside a threshold (whole numbers past 2^24 a few apart, full float64
        fractions), and a float32-stored value just above a histogram's or DP grid's cut,
        can go the other way. :meth:`to_onnx` predicts exactly, in float64. The
        trees' node counts are a tree's (under DP and with minimum-leaf abstention each leaf
        counts at least one row, each inner node the sum of its children), so SHAP's
        ``TreeExplainer`` takes them and the export's ``feature_importances_`` are this
        estimator's.

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
        if path is not None:  # whole or not at all: a failed write keeps the file there was
            write_atomic(path, onx.SerializeToString())
        return onx
