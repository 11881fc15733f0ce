"""Tests for fedforest_secure._node_weights: a tree's counts and impurities as scikit-learn's
trees hold them."""

from __future__ import annotations

import numpy as np

from fedforest_secure._node_weights import exported_impurity, tree_counts

#: root 0 -> (1, 2); 1 -> (3, 4); 2, 3, 4 leaves
LEFT = np.array([1, 3, -1, -1, -1])
RIGHT = np.array([2, 4, -1, -1, -1])


def _decreases(w: np.ndarray, imp: np.ndarray) -> np.ndarray:
    inner = np.flatnonzero(LEFT >= 0)
    out: np.ndarray = w[inner] * imp[inner] - w[LEFT[inner]] * imp[LEFT[inner]] \
        - w[RIGHT[inner]] * imp[RIGHT[inner]]
    return out


def test_a_trees_exact_counts_are_kept() -> None:
    n = np.array([10.0, 6.0, 4.0, 1.0, 5.0])
    weighted, whole = tree_counts(n, LEFT, RIGHT)
    np.testing.assert_array_equal(weighted, n)
    np.testing.assert_array_equal(whole, [10, 6, 4, 1, 5])
    assert whole.dtype == np.intp


def test_noisy_or_partial_counts_become_a_trees_counts() -> None:
    """A DP leaf of -3.4 rows and an abstention leaf of 0 count one row; an inner node
    counts the sum of its leaves (not its own noisy 9 or partial 12)."""
    for n, want, want_whole in (
            (np.array([9.0, 2.6, 6.4, -3.4, 6.0]), [13.4, 7.0, 6.4, 1.0, 6.0], [13, 7, 6, 1, 6]),
            (np.array([12.0, 6.0, 4.0, 0.0, 5.0]), [10.0, 6.0, 4.0, 1.0, 5.0],
             [10, 6, 4, 1, 5])):
        weighted, whole = tree_counts(n, LEFT, RIGHT)
        np.testing.assert_allclose(weighted, want, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(whole, want_whole)


def test_impurities_give_scikit_learn_the_clipped_decreases() -> None:
    """Node 1's children are less pure than it (a noisy decrease of 6 x 0.1 - 1 x 0.5 - 5 x
    0.3 = -1.4): scikit-learn would add -1.4 to the feature. The tree goes out with
    impurities from its leaves (0) up: node 1's decrease is 0, the root's its own
    (10 x 0.5 - 6 x 0.1 - 4 x 0.2 = 3.6)."""
    w = np.array([10.0, 6.0, 4.0, 1.0, 5.0])
    imp = np.array([0.5, 0.1, 0.2, 0.5, 0.3])
    out = exported_impurity(w, imp, LEFT, RIGHT)
    np.testing.assert_allclose(_decreases(w, out), [3.6, 0.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(out, [0.36, 0.0, 0.0, 0.0, 0.0], rtol=0, atol=1e-15)
    exact = np.array([0.5, 0.4, 0.2, 0.5, 0.3])  # no decrease below zero: kept as it is
    np.testing.assert_array_equal(exported_impurity(w, exact, LEFT, RIGHT), exact)


def test_a_subtree_whose_splits_decrease_nothing_adds_exactly_nothing() -> None:
    """Every split's noisy decrease below zero, impurities of 10^5: the estimators count
    no decrease (the tree's importances are all zero), and so must scikit-learn, to the
    last bit (a rounding residue of 10^-11 would be normalised into an importance of 1)."""
    w = np.array([1202.75, 785.75, 417.0, 487.0, 298.75])
    imp = np.array([0.0, 95.446, 1.0e5, 364.244, 1.0e5 / 3])
    out = exported_impurity(w, imp, LEFT, RIGHT)
    assert (_decreases(w, imp) < 0).all()
    np.testing.assert_array_equal(_decreases(w, out), [0.0, 0.0])


def test_the_counts_of_a_tree_whose_child_points_back_are_refused_not_walked_forever() -> None:
    """Node 2 is given as a split whose left child is the root: a walk from the root would
    never end; the walk stops at as many levels as the tree has nodes."""
    import signal

    import pytest

    def _stuck(*_: object) -> None:
        raise AssertionError("tree_counts did not return within 20 s")

    old = signal.signal(signal.SIGALRM, _stuck)
    signal.alarm(20)
    try:
        with pytest.raises(ValueError, match="^the children of the nodes do not form a tree "
                                             r"\(a walk from the root goes round\)$"):
            tree_counts(np.array([9.0, 2.6, 6.4, -3.4, 6.0]), np.array([1, 3, 0, -1, -1]),
                        np.array([2, 4, 1, -1, -1]))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
