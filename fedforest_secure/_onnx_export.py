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

Numeric splits only: a forest with categorical or client (H) splits is refused, and so is
a numeric split on a feature the model's schema calls categorical (a DP job's random splits
cut its level codes, which the ONNX model would compare with the site's own values).

A forest with soft routing (:mod:`~fedforest_secure._soft_routing`: DP random-split
classifiers) has no ``TreeEnsemble`` form; standard operators compute it instead. Every
feature's released CDF is evaluated on ``X`` (``Floor`` and ``Gather``: the model's
piecewise-linear interpolation), every split's share of a row to the left is clipped as the
model clips it (a missing value goes where ``missing_left`` says), a node's probability is its
parent's times its edge's share, level by level, and one ``MatMul`` sums the leaves'
probabilities times their values. Its memory grows with the rows times the forest's nodes
(about ``28 * n * nodes`` bytes in onnxruntime: 64 trees of depth 5, 4,032 nodes, on 10,000
rows raised its peak memory by about 1.1 GB), so a large input is best predicted in batches.

``onnx`` is an optional dependency (``pip install onnx``); it is imported when a model is
written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._sklearn_api import check_exportable
from ._soft_routing import SoftRouting
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
                   vote: str = "proportions", routing: SoftRouting | None = None,
                   categorical: Mapping[int, str] | None = None) -> ModelProto:
    """The ONNX model of the forest ``trees`` (module docstring); ``routing``: its soft
    routing (:attr:`~fedforest_secure.model.ForestModel.routing`), if it has one;
    ``categorical``: the features the model's schema calls categorical (index: name).

    Raises
    ------
    ImportError
        The ``onnx`` package is not installed.
    ValueError
        No trees, or a tree splits on a categorical level set, on the client indicator H or
        on a feature of ``categorical``
        (:func:`~fedforest_secure._sklearn_api.check_exportable`).
    """
    try:
        import onnx
        from onnx import TensorProto, helper
    except ImportError:
        raise ImportError("to_onnx needs the onnx package: pip install onnx") from None
    if not trees:
        raise ValueError("to_onnx needs a forest with at least one tree")
    check_exportable(trees, categorical, "to_onnx")
    regression = task == "regression"
    labels = np.asarray([] if classes is None else classes)
    n_targets = 1 if regression else labels.size
    if n_targets < 1:
        raise ValueError("a classification forest needs its classes")
    double = TensorProto.DOUBLE
    inits = [helper.make_tensor("n_trees", double, [], [float(len(trees))])]
    if routing is not None:
        nodes = _soft_sums(trees, routing, n_targets, inits)
    else:
        nodes = [_tree_ensemble(trees, n_targets)]
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


def _tree_ensemble(trees: Sequence[Tree], n_targets: int) -> Any:
    """The ``TreeEnsemble`` node from ``X`` to ``sums`` (n, n_targets): the trees' leaf
    values summed, a classifier's tree once per class."""
    from onnx import TensorProto, helper

    ens = _Ensemble()
    for t in trees:
        for c in range(n_targets):
            ens.add_tree(t, t.value[:, c], c)

    def tensor(name: str, dtype: int, values: Sequence[Any]) -> Any:
        return helper.make_tensor(name, dtype, [len(values)], list(values))

    return helper.make_node(
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


def _soft_sums(trees: Sequence[Tree], routing: SoftRouting, n_targets: int,
               inits: list[Any]) -> list[Any]:
    """The nodes from ``X`` to ``sums`` (n, n_targets) of a soft-routed forest (module
    docstring); their constants are appended to ``inits``."""
    from onnx import TensorProto, helper, numpy_helper

    def const(name: str, value: Any) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(kind: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(kind, inputs, [output], **attrs))
        return output

    nodes: list[Any] = []
    d = routing.n_features
    nb = routing.cdf.shape[1] - 1
    lo, hi = routing.bounds[:, 0], routing.bounds[:, 1]
    flat = routing.cdf.reshape(-1)
    degenerate = ~(hi > lo)
    scale = np.where(degenerate, 0.0, nb / np.where(degenerate, 1.0, hi - lo))
    # Z = F(X): the CDF's bin k and the fraction of it below x, a missing value read as lo
    nan = op("IsNaN", ["X"], "x_nan")
    xc = op("Where", [nan, const("r_lo", lo), "X"], "x_filled")
    u = op("Mul", [op("Sub", [xc, "r_lo"], "x_shift"), const("r_scale", scale)], "u_raw")
    u = op("Clip", [u, const("r_zero", np.float64(0.0)), const("r_nb", np.float64(nb))], "u")
    k = op("Min", [op("Floor", [u], "k_floor"), const("r_last", np.float64(nb - 1))], "k")
    idx = op("Add", [op("Cast", [k], "k_int", to=TensorProto.INT64),
                     const("r_offset", np.arange(d, dtype=np.int64) * (nb + 1))], "cdf_idx")
    c0 = op("Gather", [const("r_cdf", flat), idx], "cdf_lo", axis=0)
    c1 = op("Gather", ["r_cdf", op("Add", [idx, const("r_one_i", np.int64(1))], "cdf_idx1")],
            "cdf_hi", axis=0)
    inside = op("Add", [c0, op("Mul", [op("Sub", [u, k], "frac"),
                                       op("Sub", [c1, c0], "cdf_step")], "cdf_rise")],
                "z_inside")
    at_or_above = op("Cast", [op("GreaterOrEqual", [xc, "r_lo"], "x_ge_lo")], "z_step",
                     to=TensorProto.DOUBLE)
    z = op("Where", [const("r_degenerate", degenerate), at_or_above, inside], "z")
    # every split node of every tree, in one flat order: its share of a row to the left
    feats: list[int] = []
    tpos: list[float] = []
    nan_left: list[float] = []
    inner_at: list[dict[int, int]] = []
    for t in trees:
        pos = routing.threshold_positions(t)
        goes_left = t.missing_goes_left()
        at: dict[int, int] = {}
        for inner in np.flatnonzero(t.kind != NodeKind.LEAF).tolist():
            at[inner] = len(feats)
            feats.append(int(t.feature[inner]))
            tpos.append(float(pos[inner]))
            nan_left.append(1.0 if goes_left[inner] else 0.0)
        inner_at.append(at)
    m = len(feats)
    leaves: list[tuple[int, int]] = []  # (tree, leaf node) in the order of the leaf columns
    level_cols: list[str] = []
    if m:
        f_idx = const("s_feature", np.array(feats, dtype=np.int64))
        zn = op("Gather", [z, f_idx], "s_z", axis=1)
        share = op("Add", [const("r_half", np.float64(0.5)),
                           op("Mul", [op("Sub", [const("s_pos", np.array(tpos)), zn], "s_gap"),
                                      const("r_inv", np.float64(0.5 / routing.width))],
                              "s_slope")], "s_raw")
        share = op("Clip", [share, "r_zero", const("r_one", np.float64(1.0))], "s_clipped")
        share = op("Where", [op("Gather", [nan, f_idx], "s_nan", axis=1),
                             const("s_nan_left", np.array(nan_left)), share], "s_left")
        right = op("Sub", ["r_one", share], "s_right")
        edges = op("Concat", [share, right], "s_edges", axis=1)  # left: j, right: m + j
    # level by level: a node's probability is its parent's times its edge's share
    ones = op("Add", [op("Mul", [op("Gather", [z, const("p_col0", np.zeros(len(trees),
                                                                         dtype=np.int64))],
                                    "p_z0", axis=1), "r_zero"], "p_zero"), "r_one"], "p_0")
    frontier = [(ti, 0) for ti in range(len(trees))]  # the columns of the current level
    current = ones
    level = 0
    while frontier:
        leaf_cols = [i for i, (ti, nd) in enumerate(frontier)
                     if trees[ti].kind[nd] == NodeKind.LEAF or trees[ti].n_nodes == 0]
        if leaf_cols:
            leaves += [frontier[i] for i in leaf_cols]
            level_cols.append(op("Gather", [current, const(f"l{level}_cols", np.array(
                leaf_cols, dtype=np.int64))], f"l{level}_p", axis=1))
        parents: list[int] = []
        edge_cols: list[int] = []
        nxt: list[tuple[int, int]] = []
        for i, (ti, nd) in enumerate(frontier):
            t = trees[ti]
            if t.n_nodes == 0 or t.kind[nd] == NodeKind.LEAF:
                continue
            j = inner_at[ti][nd]
            for child, edge in ((int(t.left[nd]), j), (int(t.right[nd]), m + j)):
                parents.append(i)
                edge_cols.append(edge)
                nxt.append((ti, child))
        if not nxt:
            break
        level += 1
        up = op("Gather", [current, const(f"n{level}_parent", np.array(parents,
                                                                       dtype=np.int64))],
                f"n{level}_up", axis=1)
        via = op("Gather", [edges, const(f"n{level}_edge", np.array(edge_cols,
                                                                    dtype=np.int64))],
                 f"n{level}_via", axis=1)
        current = op("Mul", [up, via], f"p_{level}")
        frontier = nxt
    probs = level_cols[0] if len(level_cols) == 1 else op("Concat", level_cols, "leaf_p",
                                                          axis=1)
    values = np.array([trees[ti].value[nd] if trees[ti].n_nodes else np.zeros(n_targets)
                       for ti, nd in leaves], dtype=np.float64).reshape(len(leaves), n_targets)
    op("MatMul", [probs, const("leaf_values", values)], "sums")
    return nodes


def _label_tensor_values(labels: np.ndarray) -> tuple[int, list[Any]]:
    """The ONNX element type and values of the class labels: int64 for integer or boolean
    labels (a ValueError for unsigned ones beyond int64), double for real ones, string
    otherwise."""
    from onnx import TensorProto

    if labels.dtype.kind in "iub":
        if labels.dtype.kind == "u" and labels.max() > np.iinfo(np.int64).max:
            raise ValueError(f"class label {int(labels.max())} does not fit ONNX's int64 "
                             "labels; map the classes to smaller integers or to text")
        return TensorProto.INT64, [int(v) for v in labels]
    if labels.dtype.kind == "f":
        return TensorProto.DOUBLE, [float(v) for v in labels]
    return TensorProto.STRING, [str(v).encode() for v in labels]
