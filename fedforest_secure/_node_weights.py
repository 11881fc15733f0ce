"""Node counts and impurities as scikit-learn's trees hold them, from a model's node statistics.

scikit-learn's trees, and what reads them (``feature_importances_``, SHAP's path-dependent
``TreeExplainer``, which weighs each child by its share ``w_child / w_node`` of the node), hold
counts of at least one row per leaf, with each inner node's count the sum of its children's.
A model's counts are that where every node's statistics are exact. Under DP they are noisy
(a leaf can hold -24 rows), and with minimum-leaf abstention a node counts only the clients
that did not abstain from it (a leaf can hold 0 rows, and children fewer rows than their
parent). :func:`tree_counts` then gives each leaf its count clipped at one row and each inner
node the sum of its leaves'.

A split's decrease in impurity, ``w_node imp_node - w_left imp_left - w_right imp_right``, can
come out below zero from such statistics; the estimators count it as zero, scikit-learn
(which never meets one) adds it. :func:`exported_impurity` gives such a tree impurities
whose decreases, in scikit-learn's arithmetic, are the estimators' clipped ones.
"""

from __future__ import annotations

import numpy as np

__all__ = ["exported_impurity", "tree_counts"]

#: the least count of a leaf: one row, as a scikit-learn leaf holds at least
MIN_LEAF_COUNT = 1.0


def _levels(left: np.ndarray, right: np.ndarray) -> list[np.ndarray]:
    """Node ids level by level from the root (``left``/``right``: -1 at a leaf).

    Raises
    ------
    ValueError
        Children that lead a walk from the root round (a tree has fewer levels than nodes).
    """
    levels: list[np.ndarray] = []
    frontier = np.zeros(1 if left.size else 0, dtype=np.intp)
    while frontier.size:
        if len(levels) >= left.size:
            raise ValueError("the children of the nodes do not form a tree (a walk from the "
                             "root goes round)")
        levels.append(frontier)
        inner = frontier[left[frontier] >= 0]
        frontier = np.concatenate([left[inner], right[inner]]).astype(np.intp)
    return levels


def tree_counts(n: np.ndarray, left: np.ndarray, right: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Weighted (float64) and whole (intp) counts per node (module docstring): the model's
    counts ``n`` where they are a tree's (every leaf at least one row, every inner node the
    sum of its children), else each leaf's clipped at one row and each inner node the sum of
    its leaves'."""
    n = np.asarray(n, dtype=np.float64)
    leaf = left < 0
    inner = np.flatnonzero(~leaf)
    if (n[leaf] >= MIN_LEAF_COUNT).all() and \
            (n[inner] == n[left[inner]] + n[right[inner]]).all():
        return n.copy(), np.rint(n).astype(np.intp)
    weighted = np.where(leaf, np.maximum(n, MIN_LEAF_COUNT), 0.0)
    whole = np.where(leaf, np.rint(weighted), 0).astype(np.intp)
    for nodes in reversed(_levels(left, right)):
        up = nodes[left[nodes] >= 0]
        weighted[up] = weighted[left[up]] + weighted[right[up]]
        whole[up] = whole[left[up]] + whole[right[up]]
    return weighted, whole


def _decrease(w: np.ndarray, imp: np.ndarray, node: np.ndarray, left: np.ndarray,
              right: np.ndarray) -> np.ndarray:
    """Each node's weighted impurity decrease, in the order scikit-learn adds it."""
    out: np.ndarray = (w[node] * imp[node] - w[left[node]] * imp[left[node]]) \
        - w[right[node]] * imp[right[node]]
    return out


def exported_impurity(w: np.ndarray, impurity: np.ndarray, left: np.ndarray,
                      right: np.ndarray) -> np.ndarray:
    """Impurities for scikit-learn (module docstring): each split's decrease there, with
    the counts ``w``, is the decrease of ``impurity`` clipped at zero (as the estimators
    count it). Where no decrease is negative, ``impurity`` itself; else impurities measured
    from the leaves up: each leaf's 0, each inner node's the clipped decreases of the splits
    below it (its own included) per row of the node, so a subtree whose splits decrease
    nothing has 0 throughout and adds exactly nothing."""
    imp = np.asarray(impurity, dtype=np.float64)
    inner = np.flatnonzero(left >= 0)
    if (_decrease(w, imp, inner, left, right) >= 0).all():
        return imp.copy()
    out = np.zeros_like(imp)
    for nodes in reversed(_levels(left, right)):
        up = nodes[left[nodes] >= 0]
        if not up.size:
            continue
        lo, ro = left[up], right[up]
        kept = np.maximum(_decrease(w, imp, up, left, right), 0.0)
        out[up] = (kept + w[lo] * out[lo] + w[ro] * out[ro]) / w[up]
        for _ in range(8):  # rounding: no decrease below zero where the clipped one is zero
            dec = _decrease(w, out, up, left, right)
            low = dec < 0
            if not low.any():
                break
            out[up[low]] = np.nextafter(out[up[low]] - dec[low] / w[up[low]], np.inf)
    return out
