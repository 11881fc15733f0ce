"""The trained forest seen through scikit-learn's names: per-tree ``tree_`` arrays, the mean
decrease in impurity, and the export to a fitted scikit-learn random forest.

Everything here reads the trees the coordinator built from aggregated statistics (values,
weighted counts, impurities, splits): nothing is disclosed beyond what the model already holds.

scikit-learn's trees have numeric splits only, so a forest with categorical or client
(H) splits has ``tree_`` arrays (with ``kind`` telling the splits apart) but no export;
nor has a forest that splits numerically on a feature its schema calls categorical (at the
level codes: :func:`check_exportable`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._node_weights import exported_impurity, tree_counts
from ._tree import NodeKind, Tree
from .errors import SchemaError

__all__ = ["FederatedTree", "TreeArrays", "check_exportable", "forest_importances",
           "to_sklearn_forest"]

#: scikit-learn's markers: a leaf's children and a leaf's feature
_TREE_LEAF = -1
_TREE_UNDEFINED = -2


@dataclass(frozen=True)
class TreeArrays:
    """One tree's arrays under scikit-learn's ``tree_`` names (read-only view).

    ``feature`` is -2 at leaves (as scikit-learn) and -1 at client (H) splits; ``kind`` holds
    the :class:`~fedforest_secure._tree.NodeKind` codes; ``threshold`` is +inf where a split
    separates the present values from the missing ones; ``missing_go_to_left`` says where a
    missing value goes (scikit-learn's name). ``value`` has shape (node_count, 1, n_outputs)
    for regression and (node_count, 1, n_classes) for classification (class proportions).
    ``weighted_n_node_samples`` and ``n_node_samples`` (rounded) are the nodes' weighted
    training rows where the model's counts are a tree's; under DP (noisy counts, some below
    zero) and with minimum-leaf abstention (a node counts the clients that did not abstain)
    each leaf counts at least one row and each inner node the sum of its children
    (:func:`~fedforest_secure._node_weights.tree_counts`).
    """

    node_count: int
    max_depth: int
    children_left: np.ndarray
    children_right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    value: np.ndarray
    impurity: np.ndarray
    n_node_samples: np.ndarray
    weighted_n_node_samples: np.ndarray
    missing_go_to_left: np.ndarray
    kind: np.ndarray

    @property
    def n_leaves(self) -> int:
        return int((self.children_left == _TREE_LEAF).sum())

    def compute_feature_importances(self, n_features: int, normalize: bool = True
                                    ) -> np.ndarray:
        """Mean decrease in impurity per feature (scikit-learn's definition): every numeric or
        categorical split adds ``w_node imp_node - w_left imp_left - w_right imp_right`` to
        its feature, divided by the root's weight; client splits count for no feature. Under
        DP the impurities are noisy (and with abstention partial), so a decrease can come out
        below zero: it counts as zero."""
        out = np.zeros(n_features)
        left, right = self.children_left, self.children_right
        inner = np.flatnonzero((left != _TREE_LEAF) & (self.feature >= 0))
        w, imp = self.weighted_n_node_samples, self.impurity
        dec = w[inner] * imp[inner] - w[left[inner]] * imp[left[inner]] \
            - w[right[inner]] * imp[right[inner]]
        np.add.at(out, self.feature[inner], np.maximum(dec, 0.0))
        if self.node_count and w[0] > 0:
            out /= w[0]
        if normalize:
            total = out.sum()
            if total > 0:
                out /= total
        return out


def tree_arrays(tree: Tree, y_offset: float = 0.0) -> TreeArrays:
    """The scikit-learn view of ``tree`` (regression values shifted by ``y_offset``)."""
    leaf = tree.kind == NodeKind.LEAF
    feature = np.where(leaf, _TREE_UNDEFINED,
                       np.where(tree.kind == NodeKind.CLIENT, -1, tree.feature))
    threshold = np.where(leaf, float(_TREE_UNDEFINED), tree.threshold)
    value = tree.value + y_offset if tree.value.shape[1] == 1 else tree.value
    impurity = tree.impurity if tree.impurity is not None else np.zeros(tree.n_nodes)
    # children by node kind: a leaf has none, whatever its entries hold
    left = np.where(leaf, _TREE_LEAF, tree.left).astype(np.intp)
    right = np.where(leaf, _TREE_LEAF, tree.right).astype(np.intp)
    weighted, whole = tree_counts(tree.n, left, right)
    return TreeArrays(
        node_count=tree.n_nodes, max_depth=tree.depth,
        children_left=left, children_right=right,
        feature=feature.astype(np.intp), threshold=threshold.astype(np.float64),
        value=value[:, None, :].astype(np.float64), impurity=impurity.astype(np.float64),
        n_node_samples=whole, weighted_n_node_samples=weighted,
        missing_go_to_left=np.where(leaf, False, tree.missing_goes_left()).astype(np.uint8),
        kind=tree.kind.copy())


#: Checks a tree's input: ``(X, client)`` to the float64 rows and the sites' codes.
PrepareInput = Callable[[Any, Any], tuple[np.ndarray, "np.ndarray | None"]]


class FederatedTree:
    """One tree of a fitted FedForest estimator (an item of ``estimators_``).

    ``prepare`` checks the input of :meth:`apply` (the estimator's: a table's columns by name,
    an array's width, a site's name), by default only the array's width.

    Attributes
    ----------
    tree_ : TreeArrays
        The tree's arrays under scikit-learn's names.
    n_features_in_ : int
    """

    def __init__(self, tree: Tree, n_features: int, y_offset: float = 0.0,
                 prepare: PrepareInput | None = None) -> None:
        self._tree = tree
        self.tree_ = tree_arrays(tree, y_offset)
        self.n_features_in_ = n_features
        self._prepare = prepare if prepare is not None else self._check_width

    def _check_width(self, X: Any, client: Any) -> tuple[np.ndarray, np.ndarray | None]:
        Xf = np.asarray(X, dtype=np.float64)
        if Xf.ndim != 2 or Xf.shape[1] != self.n_features_in_:
            got = f"{Xf.shape[1]} features" if Xf.ndim == 2 else f"shape {Xf.shape}"
            raise SchemaError(f"X has {got}, but this tree is expecting "
                              f"{self.n_features_in_} features as input")
        return Xf, None if client is None else np.asarray(client)

    def apply(self, X: Any, client: Any = None) -> np.ndarray:
        """Leaf index of every row, shape (n,): ``X`` checked as the forest's ``apply`` checks
        it."""
        Xf, codes = self._prepare(X, client)
        return self._tree.apply(Xf, codes)

    def get_depth(self) -> int:
        return self.tree_.max_depth

    def get_n_leaves(self) -> int:
        return self.tree_.n_leaves

    @property
    def feature_importances_(self) -> np.ndarray:
        """Normalised mean decrease in impurity of this tree, shape (n_features,)."""
        return self.tree_.compute_feature_importances(self.n_features_in_)

    def __repr__(self) -> str:
        return f"FederatedTree(node_count={self.tree_.node_count}, depth={self.get_depth()})"


def forest_importances(trees: Sequence[FederatedTree], n_features: int) -> np.ndarray:
    """The forest's mean decrease in impurity: the trees' normalised importances averaged
    over the trees that split, normalised to sum to 1 (all zeros if no tree splits)."""
    per_tree = [t.feature_importances_ for t in trees if t.tree_.node_count > 1]
    if not per_tree:
        return np.zeros(n_features)
    mean = np.mean(per_tree, axis=0)
    total = mean.sum()
    out: np.ndarray = mean / total if total > 0 else mean
    return out


#: a threshold written with at most this many significant digits is taken for a data value
#: (a number a table holds, as the open profile's thresholds are): a cut the trees compute
#: (a midpoint, a sketch's grid edge) is that short about once in 10^4 times
_TABLE_DIGITS = 12


def _float32_thresholds(t: np.ndarray) -> np.ndarray:
    """Thresholds for scikit-learn's ``float32(x) <= threshold``, as float32 numbers.

    scikit-learn reads a value ``x`` as ``float32(x)``, the forest compares ``x <= t`` in
    float64. Let ``a = float32(t)``. Every ``x`` with ``float32(x) != a`` goes the same way
    in both whether the threshold goes out as ``a`` or as the float32 number below ``a``.
    The values with ``float32(x) == a`` all go one way in scikit-learn, while the forest
    sends those ``<= t`` left and the others right: unless ``t`` is the largest of them,
    two such values on either side of ``t`` cannot both go as the forest sends them. So
    ``a`` goes out when ``a <= t`` (``t`` and ``a`` go left; the values of ``a`` above ``t``
    go left too), and when ``a > t`` the side where a table's values lie is kept:

    * ``t`` written with at most :data:`_TABLE_DIGITS` significant digits (-99327204, 0.35):
      a data value, which goes left: ``a`` (the values of ``a`` above ``t``, ``a`` among
      them, go left too).
    * ``t`` halfway between ``a`` and the float32 number below (a midpoint of float32
      data): that number below, so every float32 value goes as in the forest; only ``t``
      itself goes right.
    * ``a`` a short decimal (120, 0.5: its float32 digits read back as it): ``t`` is a cut
      just below a value a table holds (the secure sketch's 119.99999644677146 below 120),
      which goes right: the float32 number below (the values of ``a`` up to ``t`` go right
      too).
    * otherwise ``a``: ``t``, a data value at full float64 precision, goes left. A float32
      value just above a cut that is none of these (a histogram's or a DP grid's edge beside
      a float32-stored table's value) then goes left too.
    """
    t = np.asarray(t, dtype=np.float64)
    with np.errstate(over="ignore"):  # beyond float32's range: +-inf, as scikit-learn's X
        near = t.astype(np.float32)
    result = near.astype(np.float64)
    below = np.nextafter(near, np.float32(-np.inf)).astype(np.float64)
    for i in np.flatnonzero(result > t):
        ti = float(t[i])
        if float(f"{ti:.{_TABLE_DIGITS}g}") == ti:
            continue
        if (below[i] + result[i]) / 2.0 == ti or float(str(near[i])) == result[i]:
            result[i] = below[i]
    return result


def _proportions(counts: np.ndarray) -> np.ndarray:
    """Per node, noisy class counts as proportions: clipped at 0, divided by their sum;
    uniform where nothing is left."""
    clipped = np.clip(counts, 0.0, None)
    total = clipped.sum(axis=-1, keepdims=True)
    uniform = np.full_like(clipped, 1.0 / max(clipped.shape[-1], 1))
    out: np.ndarray = np.where(total > 0, clipped / np.where(total > 0, total, 1.0), uniform)
    return out


def check_exportable(trees: Sequence[Tree], categorical: Mapping[int, str] | None,
                     export: str) -> None:
    """Refuse (ValueError) a forest that ``export`` (``"to_onnx"``, ``"to_sklearn"``) cannot
    write: a split on a categorical level set or on the client indicator H, or a numeric split
    on a feature of ``categorical`` (index: name, the features the model's schema calls
    categorical): it cuts the feature's level codes (a DP job's random splits), which an
    exported model would compare with the site's own values."""
    for t in trees:
        if ((t.kind != NodeKind.LEAF) & (t.kind != NodeKind.NUMERIC)).any():
            raise ValueError(f"this forest has categorical or client (H) splits; {export} "
                             "writes numeric splits only")
    for j, name in sorted((categorical or {}).items()):
        if any(((t.kind == NodeKind.NUMERIC) & (t.feature == j)).any() for t in trees):
            raise ValueError(
                f"this forest splits on the categorical feature {name!r} (at its level "
                f"codes, which are not the values a site's table holds); {export} writes "
                "splits on continuous features only: predict with the model itself")


def to_sklearn_forest(trees: Sequence[Tree], task: str, n_features: int,
                      classes: np.ndarray | None = None, y_offset: float = 0.0,
                      feature_names: np.ndarray | None = None,
                      vote: str = "proportions",
                      categorical: Mapping[int, str] | None = None) -> Any:
    """A fitted scikit-learn ``RandomForestRegressor`` / ``RandomForestClassifier`` whose
    trees are ``trees``: the same splits (missing-value directions included), leaf values,
    impurities and weighted counts, so it predicts what the federated forest predicts.

    scikit-learn compares ``float32(x) <= threshold``; the federated forest compares
    ``x <= threshold`` in float64. Each threshold is exported as a float32 number
    (:func:`_float32_thresholds`), so a value goes the same way in both unless its float32
    number is the threshold's own: of the values that share it, those on one side of the
    threshold can go the other way (scikit-learn cannot tell them apart). The side kept is
    the one a table's values lie on: the threshold itself where it is a data value (the open
    profile's), the value just above it where it is a cut below one (the secure sketch's).

    The counts are the trees' (:class:`TreeArrays`: under DP or abstention, each leaf's at
    least one row and each inner node's the sum of its children's). A tree in which a
    split's noisy decrease in impurity comes out below zero goes out with impurities
    measured from its leaves (each leaf 0) whose decreases are the estimators' clipped ones
    (:func:`~fedforest_secure._node_weights.exported_impurity`): scikit-learn's
    ``feature_importances_`` are the estimators', and SHAP's ``TreeExplainer`` reads node
    weights of a tree.

    A classifier whose leaves hold (noisy) class counts (``vote="counts"``, a DP profile)
    is exported with each node's counts, clipped at 0, as proportions (uniform where none is
    left): scikit-learn averages per-tree probabilities, so its labels can differ from the
    forest's vote on the summed counts where that vote is close.

    Raises
    ------
    ValueError
        A tree splits on a categorical level set or on the client indicator H (scikit-learn
        trees have numeric splits only), or on a feature of ``categorical``
        (:func:`check_exportable`).
    """
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor
    from sklearn.tree._tree import Tree as SkTree

    check_exportable(trees, categorical, "to_sklearn")
    regression = task == "regression"
    n_out = 1 if regression else len(classes if classes is not None else [])
    est_cls = DecisionTreeRegressor if regression else DecisionTreeClassifier
    forest = (RandomForestRegressor if regression else RandomForestClassifier)(
        n_estimators=len(trees))
    node_dtype = _node_dtype()
    estimators = []
    for i, t in enumerate(trees):
        arrays = tree_arrays(t, y_offset if regression else 0.0)
        n_classes = np.array([1 if regression else n_out], dtype=np.intp)
        sk = SkTree(n_features, n_classes, 1)
        nodes = np.zeros(arrays.node_count, dtype=node_dtype)
        nodes["left_child"] = arrays.children_left
        nodes["right_child"] = arrays.children_right
        nodes["feature"] = arrays.feature
        nodes["threshold"] = _float32_thresholds(arrays.threshold)
        nodes["impurity"] = exported_impurity(arrays.weighted_n_node_samples, arrays.impurity,
                                              arrays.children_left, arrays.children_right)
        nodes["n_node_samples"] = arrays.n_node_samples
        nodes["weighted_n_node_samples"] = arrays.weighted_n_node_samples
        nodes["missing_go_to_left"] = arrays.missing_go_to_left
        values = np.asarray(arrays.value, dtype=np.float64)
        if not regression and vote == "counts":
            values = _proportions(values)
        sk.__setstate__({"max_depth": arrays.max_depth, "node_count": arrays.node_count,
                         "nodes": nodes, "values": np.ascontiguousarray(values)})
        est = est_cls(random_state=i)
        est.tree_ = sk
        est.n_features_in_ = n_features
        est.n_outputs_ = 1
        est.max_features_ = n_features
        if not regression:
            est.classes_ = np.asarray(classes)
            est.n_classes_ = n_out
        estimators.append(est)
    forest.estimators_ = estimators
    forest.estimator_ = est_cls()
    forest.n_features_in_ = n_features
    forest.n_outputs_ = 1
    if feature_names is not None:
        forest.feature_names_in_ = np.asarray(feature_names, dtype=object)
        for est in estimators:
            est.feature_names_in_ = forest.feature_names_in_
    if not regression:
        forest.classes_ = np.asarray(classes)
        forest.n_classes_ = n_out
    return forest


def _node_dtype() -> np.dtype[Any]:
    """scikit-learn's tree node record type (read off an empty tree of the installed
    version)."""
    from sklearn.tree._tree import Tree as SkTree

    probe = SkTree(1, np.array([1], dtype=np.intp), 1)
    dtype: np.dtype[Any] = probe.__getstate__()["nodes"].dtype
    return dtype
