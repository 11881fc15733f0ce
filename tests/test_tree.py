"""Tests for fedforest_secure._tree: node kinds and the tree arrays of the model file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedforest_secure._tree import NodeKind, Tree, TreeBuilder
from fedforest_secure.model import ForestModel

# a model file as written by the format's first release: kinds as the integers 0-3
_FILE = json.dumps({
    "format": "fedforest-secure/model/v1", "task": "regression", "n_features": 2,
    "n_classes": 0, "n_clients": 2, "meta": {},
    "trees": [{"kind": [1, 2, 3, 0, 0, 0, 0], "feature": [0, 1, -1, -1, -1, -1, -1],
               "threshold": [0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
               "left": [1, 3, 5, -1, -1, -1, -1], "right": [2, 4, 6, -1, -1, -1, -1],
               "value": [[0.0], [0.0], [0.0], [1.0], [2.0], [3.0], [4.0]],
               "n": [8.0, 4.0, 4.0, 2.0, 2.0, 2.0, 2.0], "sets": {"1": [1], "2": [0]}}],
}, sort_keys=True, allow_nan=False)


def test_node_kind_codes_are_the_file_format_codes() -> None:
    assert [int(k) for k in (NodeKind.LEAF, NodeKind.NUMERIC, NodeKind.CATEGORICAL,
                             NodeKind.CLIENT)] == [0, 1, 2, 3]
    assert [k.label for k in NodeKind] == ["leaf", "numeric", "categorical", "client"]


def test_model_file_with_integer_kinds_loads_predicts_and_writes_back_identically() -> None:
    model = ForestModel.from_json(_FILE)
    tree = model.trees[0]
    assert [NodeKind(int(k)) for k in tree.kind[:3]] == [
        NodeKind.NUMERIC, NodeKind.CATEGORICAL, NodeKind.CLIENT]
    assert model.uses_client and tree.depth == 2
    X = np.array([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    # x0 <= 0.5 -> level of x1 in {1} goes left; else client in {0} goes left
    np.testing.assert_array_equal(model.predict(X, client=np.array([0, 0, 0, 1])),
                                  [1.0, 2.0, 3.0, 4.0])
    # written back in the current format, otherwise identical
    assert model.to_json() == _FILE.replace("fedforest-secure/model/v1",
                                            "fedforest-secure/model/v2")


def test_unknown_node_kind_in_a_model_file_is_refused() -> None:
    bad = json.loads(_FILE)
    bad["trees"][0]["kind"][3] = 7
    with pytest.raises(ValueError, match="unknown node kind"):
        ForestModel.from_json(json.dumps(bad))


def test_tree_builder_grows_leaves_and_freezes_a_tree() -> None:
    tb = TreeBuilder(n_out=2)
    root = tb.add()
    tb.kind[root], tb.feature[root], tb.threshold[root] = NodeKind.NUMERIC, 0, 1.5
    tb.left[root], tb.right[root] = tb.add(), tb.add()
    tb.value[2] = np.array([0.25, 0.75])
    tree = tb.build()
    assert isinstance(tree, Tree)
    np.testing.assert_array_equal(tree.kind, [1, 0, 0])
    assert tree.kind.dtype == np.int64 and tree.value.shape == (3, 2)
    np.testing.assert_array_equal(tree.apply(np.array([[1.0], [2.0]]), None), [1, 2])
    assert json.loads(json.dumps(tree.to_dict()))["kind"] == [1, 0, 0]


def test_missing_values_follow_each_split_and_old_files_use_the_larger_child() -> None:
    tree = Tree(kind=np.array([1, 2, 0, 0, 0]), feature=np.array([0, 1, -1, -1, -1]),
                threshold=np.array([np.inf, 0.0, 0, 0, 0]), left=np.array([1, 3, -1, -1, -1]),
                right=np.array([2, 4, -1, -1, -1]), value=np.zeros((5, 1)),
                n=np.array([10.0, 7, 3, 2, 5]), sets={1: [0]},
                missing_left=np.array([False, True, False, False, False]))
    X = np.array([[1.0, 0.0], [np.nan, 0.0], [5.0, np.nan], [5.0, 1.0]])
    # +inf: every present value left, a missing one right; a missing level goes left at 1
    np.testing.assert_array_equal(tree.apply(X, None), [3, 2, 3, 4])
    back = Tree.from_dict(json.loads(json.dumps(tree.to_dict(), allow_nan=False)))
    np.testing.assert_array_equal(back.apply(X, None), [3, 2, 3, 4])
    assert back.threshold[0] == np.inf
    old = tree.to_dict()
    del old["missing_left"]  # a file written before missing values: the larger child
    legacy = Tree.from_dict(old)
    assert legacy.missing_left is None and "missing_left" not in legacy.to_dict()
    np.testing.assert_array_equal(legacy.missing_goes_left()[:2], [True, False])
    np.testing.assert_array_equal(legacy.apply(X, None), [3, 3, 4, 4])


@pytest.mark.parametrize(("side", "child"), [("left", 0), ("right", 2), ("left", -2)])
def test_a_leaf_with_a_child_is_refused_at_load(side: str, child: int) -> None:
    """A leaf's children are -1: the walks of feature_importances_, estimators_ and
    to_sklearn follow a leaf's child (one pointing back to the root went round forever)."""
    doc = json.loads(_FILE)
    doc["trees"][0][side][3] = child
    with pytest.raises(ValueError, match=rf"^tree 0, node 3: a leaf's {side} child is "
                                         rf"{child}, not -1 \(a leaf has no children\)$"):
        ForestModel.from_json(json.dumps(doc))


def test_a_node_with_two_parents_is_refused_at_load() -> None:
    """A chain of splits whose two children are the same next node is no tree: a walk from
    the root visits that node twice, and each node below it twice as often again (a 25-node
    file took 4 s and 1.2 GB in feature_importances_, a 40-node one ran out of memory)."""
    n = 9
    doc = json.loads(_FILE)
    chain = list(range(1, n)) + [-1]
    doc["trees"][0] = {
        "kind": [1] * (n - 1) + [0], "feature": [0] * (n - 1) + [-1],
        "threshold": [0.5] * (n - 1) + [0.0], "left": chain, "right": chain,
        "value": [[float(i)] for i in range(n)], "n": [8.0] * n, "sets": {}}
    with pytest.raises(ValueError, match=r"^tree 0, node 1: the child of two splits \(a node "
                                         r"has one parent\)$"):
        ForestModel.from_json(json.dumps(doc))
