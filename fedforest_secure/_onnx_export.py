"""The trained forest as an ONNX model computed in double precision.

The graph is one ``ai.onnx.ml`` opset-5 ``TreeEnsemble`` node (``X`` and its output are
``tensor(double)``, thresholds and leaf values double tensors) followed by the same arithmetic
as :meth:`~fedforest_secure.model.ForestModel.values_of`: the trees' leaf values summed
(aggregate SUM), divided by the number of trees, and for regression ``y_offset`` added. A
split sends ``x <= threshold`` to its left child (BRANCH_LEQ, compared in double, as the
federated forest compares) and a missing value (NaN) where the tree's ``missing_left`` says
(``nodes_missing_value_tracks_true``). So an ONNX runtime that implements opset 5 in double
(onnxruntime 1.32 is tested) reaches the estimator's leaves on any float64 input, NaN included,
and predicts its values up to the rounding of the sum (the runtime may add the trees in
another order: a few units in the last place).

An opset-5 leaf feeds one target, so a classifier's tree is written once per class (leaf
weight: the class's proportion at that leaf); a tree whose root is a leaf is written as one
split whose both branches reach that leaf.

Outputs: regression ``variable`` (n, 1); classification ``probabilities`` (n, n_classes),
columns ordered as ``classes_`` (a forest whose ``vote`` is ``"counts"``: the mean clipped at
0 and normalised per row, uniform where nothing is left, as ``values_of``), and ``label``
(n,), the class label of the first largest probability (as ``predict``; where two classes
tie up to the rounding of the sum, as summed counts can, either may come first).

Numeric splits only: a forest with categorical or client (H) splits is refused.

``onnx`` is an optional dependency (``pip install onnx``); it is imported when a model is
written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._tree import NodeKind, Tree

if TYPE_CHECKING:
    from onnx import ModelProto

__all__ = ["forest_to_onnx"]

#: opsets written: ai.onnx.ml 5 has the TreeEnsemble operator with double tensors
_ML_OPSET = 5
_ONNX_OPSET = 21
_IR_VERSION = 10
#: TreeEnsemble's codes
_BRANCH_LEQ = 0
_AGGREGATE_SUM = 1  # opset 5: AVERAGE 0, SUM 1, MIN 2, MAX 3
_POST_TRANSFORM_NONE = 0


class _Ensemble:
    """The TreeEnsemble attributes under construction (interior nodes and leaves apart)."""

    def __init__(self) -> None:
        self.roots: list[int] = []
        self.features: list[int] = []
        self.splits: list[float] = []
        self.missing_true: list[int] = []
        self.true_ids: list[int] = []
        self.true_leaf: list[int] = []
        self.false_ids: list[int] = []
        self.false_leaf: list[int] = []
        self.leaf_targets: list[int] = []
        self.leaf_weights: list[float] = []

    def add_tree(self, tree: Tree, weights: np.ndarray, target: int) -> None:
        """Append ``tree`` with leaf weights ``weights[node]`` feeding ``target``."""
        leaf = tree.kind == NodeKind.LEAF
        inner_ids = np.flatnonzero(~leaf)
        leaf_ids = np.flatnonzero(leaf)
        node_at = {int(nd): len(self.features) + i for i, nd in enumerate(inner_ids)}
        leaf_at = {int(nd): len(self.leaf_weights) + i for i, nd in enumerate(leaf_ids)}
        for nd in leaf_ids:
            self.leaf_targets.append(target)
            self.leaf_weights.append(float(weights[nd]))
        if not inner_ids.size:  # a lone leaf: one split, both branches reach it
            self.roots.append(len(self.features))
            self._add_node(0, 0.0, 0, (leaf_at[0], 1), (leaf_at[0], 1))
            return
        self.roots.append(node_at[0])
        missing_left = tree.missing_goes_left()
        for nd in inner_ids:
            kids = []
            for child in (int(tree.left[nd]), int(tree.right[nd])):
                kids.append((leaf_at[child], 1) if leaf[child] else (node_at[child], 0))
            self._add_node(int(tree.feature[nd]), float(tree.threshold[nd]),
                           int(bool(missing_left[nd])), kids[0], kids[1])

    def _add_node(self, feature: int, split: float, missing_true: int,
                  true: tuple[int, int], false: tuple[int, int]) -> None:
        self.features.append(feature)
        self.splits.append(split)
        self.missing_true.append(missing_true)
        self.true_ids.append(true[0])
        self.true_leaf.append(true[1])
        self.false_ids.append(false[0])
        self.false_leaf.append(false[1])


def forest_to_onnx(trees: Sequence[Tree], task: str, n_features: int,
                   classes: np.ndarray | None = None, y_offset: float = 0.0,
                   vote: str = "proportions") -> ModelProto:
    """The ONNX model of the forest ``trees`` (module docstring).

    Raises
    ------
    ImportError
        The ``onnx`` package is not installed.
    ValueError
        No trees, or a tree splits on a categorical level set or on the client indicator H.
    """
    try:
        import onnx
        from onnx import TensorProto, helper
    except ImportError:
        raise ImportError("to_onnx needs the onnx package: pip install onnx") from None
    if not trees:
        raise ValueError("to_onnx needs a forest with at least one tree")
    for t in trees:
        if ((t.kind != NodeKind.LEAF) & (t.kind != NodeKind.NUMERIC)).any():
            raise ValueError("this forest has categorical or client (H) splits; to_onnx "
                             "writes numeric splits only")
    regression = task == "regression"
    labels = np.asarray([] if classes is None else classes)
    n_targets = 1 if regression else labels.size
    if n_targets < 1:
        raise ValueError("a classification forest needs its classes")
    ens = _Ensemble()
    for t in trees:
        for c in range(n_targets):
            ens.add_tree(t, t.value[:, c], c)

    def tensor(name: str, dtype: int, values: Sequence[Any]) -> Any:
        return helper.make_tensor(name, dtype, [len(values)], list(values))

    forest = helper.make_node(
        "TreeEnsemble", ["X"], ["sums"], domain="ai.onnx.ml",
        tree_roots=ens.roots, nodes_featureids=ens.features,
        nodes_modes=tensor("nodes_modes", TensorProto.UINT8, [_BRANCH_LEQ] * len(ens.splits)),
        nodes_splits=tensor("nodes_splits", TensorProto.DOUBLE, ens.splits),
        nodes_missing_value_tracks_true=ens.missing_true,
        nodes_truenodeids=ens.true_ids, nodes_trueleafs=ens.true_leaf,
        nodes_falsenodeids=ens.false_ids, nodes_falseleafs=ens.false_leaf,
        leaf_targetids=ens.leaf_targets,
        leaf_weights=tensor("leaf_weights", TensorProto.DOUBLE, ens.leaf_weights),
        n_targets=n_targets, aggregate_function=_AGGREGATE_SUM,
        post_transform=_POST_TRANSFORM_NONE)
    n_trees = helper.make_tensor("n_trees", TensorProto.DOUBLE, [], [float(len(trees))])
    nodes = [forest]
    inits = [n_trees]
    double = TensorProto.DOUBLE
    if regression:
        offset = helper.make_tensor("y_offset", double, [], [float(y_offset)])
        inits.append(offset)
        nodes += [helper.make_node("Div", ["sums", "n_trees"], ["mean"]),
                  helper.make_node("Add", ["mean", "y_offset"], ["variable"])]
        outputs = [helper.make_tensor_value_info("variable", double, [None, 1])]
    else:
        label_type, label_values = _label_tensor_values(labels)
        inits.append(helper.make_tensor("classes", label_type, [n_targets], label_values))
        if vote == "counts":  # the mean clipped at 0, normalised per row (uniform if 0)
            inits += [helper.make_tensor("zero", double, [], [0.0]),
                      helper.make_tensor("one", double, [], [1.0]),
                      helper.make_tensor("uniform", double, [], [1.0 / n_targets]),
                      helper.make_tensor("axis1", TensorProto.INT64, [1], [1])]
            nodes += [helper.make_node("Div", ["sums", "n_trees"], ["mean"]),
                      helper.make_node("Max", ["mean", "zero"], ["clipped"]),
                      helper.make_node("ReduceSum", ["clipped", "axis1"], ["total"],
                                       keepdims=1),
                      helper.make_node("Greater", ["total", "zero"], ["some"]),
                      helper.make_node("Where", ["some", "total", "one"], ["divisor"]),
                      helper.make_node("Div", ["clipped", "divisor"], ["shares"]),
                      helper.make_node("Where", ["some", "shares", "uniform"],
                                       ["probabilities"])]
        else:
            nodes.append(helper.make_node("Div", ["sums", "n_trees"], ["probabilities"]))
        nodes += [helper.make_node("ArgMax", ["probabilities"], ["best"], axis=1,
                                   keepdims=0),
                  helper.make_node("Gather", ["classes", "best"], ["label"], axis=0)]
        outputs = [helper.make_tensor_value_info("label", label_type, [None]),
                   helper.make_tensor_value_info("probabilities", double, [None, n_targets])]
    graph = helper.make_graph(
        nodes, "fedforest", [helper.make_tensor_value_info("X", double, [None, n_features])],
        outputs, initializer=inits)
    model = helper.make_model(
        graph, producer_name="fedforest-secure", ir_version=_IR_VERSION,
        opset_imports=[helper.make_opsetid("", _ONNX_OPSET),
                       helper.make_opsetid("ai.onnx.ml", _ML_OPSET)])
    onnx.checker.check_model(model)
    return model


def _label_tensor_values(labels: np.ndarray) -> tuple[int, list[Any]]:
    """The ONNX element type and values of the class labels: int64 for integer or boolean
    labels, double for real ones, string otherwise."""
    from onnx import TensorProto

    if labels.dtype.kind in "iub":
        return TensorProto.INT64, [int(v) for v in labels]
    if labels.dtype.kind == "f":
        return TensorProto.DOUBLE, [float(v) for v in labels]
    return TensorProto.STRING, [str(v).encode() for v in labels]
