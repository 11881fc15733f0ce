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
