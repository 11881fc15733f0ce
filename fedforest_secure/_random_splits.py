"""Random splits with data-adaptive thresholds, and node values from the leaves' totals
(``method="random"``).

Every node splits on one feature drawn at random (the first of its sampled features). Its
threshold is drawn inside the node's public box (the schema bounds intersected with its
ancestors' splits) from the pooled marginal distribution of that feature: one round at the first
level counts the rows of the federation in ``n_bins`` fixed-width bins of every feature's public
range (:func:`marginal_cdf` turns the counts, noisy under differential privacy, into a
piecewise-linear CDF), and a threshold is the inverse CDF of a uniform draw between the CDF at the
box's two ends (:func:`random_splits`). Thresholds therefore follow the data's quantiles (a skewed
feature is cut where its rows are), while the structure depends on the seed, the public bounds
and that one release only; under differential privacy the budget goes to two releases, the
marginal counts (for classification at small epsilon with the classes' row totals) and the
leaves' node totals at the last level (:func:`~fedforest_secure.privacy.allocation.job_noise`).

Node values are post-processing of those totals (:func:`values_from_leaves`): an internal node's
statistics are the sums of its leaves', and a node whose count (for classification: of its class
counts clipped at 0) is below a threshold (too small to trust, or too noisy) takes the value of
its nearest ancestor that is not, the root falling back to uniform class proportions
(classification) or 0 (regression; the estimator centres y). With ``shrink > 0`` (off as
shipped, :meth:`~fedforest_secure._release.ReleasePolicy.leaf_shrinkage`) a classification
node's proportions are instead shrunk towards its parent's: ``shrink`` pseudo-rows of the
parent's proportions are added to its class counts clipped at 0, so a node whose counts are
mostly noise keeps mostly its parent's value and a large node its own. Under differential
privacy the classes' counts are first weighted towards uniform class priors
(:func:`class_weights`, as far as the released class totals, or the leaves' summed counts,
show the classes' frequencies).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from . import _impurity, _splits

__all__ = ["cdf_edges", "class_weights", "marginal_cdf", "random_splits", "values_from_leaves"]


class _Builder(Protocol):
    left: list[int]
    right: list[int]
    value: list[np.ndarray]
    n: list[float]
    impurity: list[float]


def marginal_cdf(counts: np.ndarray, floor: float) -> np.ndarray:
    """Piecewise-linear CDF per feature at the edges of its fixed-width bins.

    Parameters
    ----------
    counts : (d, nb) pooled row counts per feature and bin (noisy under DP)
    floor : added to every bin after clipping the counts at 0 (post-processing): it keeps the
        CDF strictly increasing and, set to the noise's scale, pulls a bin whose count is
        mostly noise towards the uniform share

    Returns
    -------
    (d, nb + 1) the CDF at the bins' edges, from 0 to 1
    """
    c = np.maximum(np.asarray(counts, dtype=np.float64), 0.0) + max(float(floor), 1e-9)
    cum = np.concatenate([np.zeros((c.shape[0], 1)), np.cumsum(c, axis=1)], axis=1)
    out: np.ndarray = cum / cum[:, -1:]
    return out


def cdf_edges(bounds: np.ndarray, nb: int) -> np.ndarray:
    """(d, nb + 1) the edges of ``nb`` fixed-width bins of every feature's ``bounds`` (d, 2):
    where :func:`marginal_cdf` gives the CDF."""
    lo, hi = bounds[:, :1], bounds[:, 1:2]
    out: np.ndarray = lo + (hi - lo) * (np.arange(nb + 1) / nb)[None, :]
    return out


def _interp_rows(x: np.ndarray, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """``np.interp(x[i], xp[i], fp[i])`` for every row i (``xp`` ascending per row)."""
    k = xp.shape[1]
    idx = np.empty(x.size, dtype=np.int64)
    for i in range(x.size):  # one searchsorted per node; levels hold few nodes per feature
        idx[i] = np.searchsorted(xp[i], x[i], side="right")
    idx = np.clip(idx, 1, k - 1)
    rows = np.arange(x.size)
    x0, x1 = xp[rows, idx - 1], xp[rows, idx]
    f0, f1 = fp[rows, idx - 1], fp[rows, idx]
    frac = np.where(x1 > x0, (x - x0) / np.where(x1 > x0, x1 - x0, 1.0), 0.0)
    out: np.ndarray = f0 + np.clip(frac, 0.0, 1.0) * (f1 - f0)
    return out


def random_splits(rng: np.random.Generator, feats: np.ndarray, box_lo: np.ndarray,
                  box_hi: np.ndarray, cdf: np.ndarray | None = None,
                  bounds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Feature and threshold per node: one of the node's sampled features, uniformly, and a
    threshold in its box on that feature (the middle when the box is a point).

    A random subset (``m < d``) comes in random order (:func:`~._planner.sample_features`): its
    first feature is uniform over it. All ``d`` features come in order: one is drawn per node.

    Parameters
    ----------
    feats : (n_nodes, m) sampled features
    box_lo, box_hi : (n_nodes, d) the nodes' boxes
    cdf, bounds : (d, nb + 1) the features' marginal CDF at the edges of ``nb`` fixed-width
        bins of ``bounds`` (d, 2) (:func:`marginal_cdf`): the threshold is the inverse CDF of
        a uniform draw between the CDF at the box's ends. Without them the threshold is
        uniform in the box.

    Returns
    -------
    feature (n_nodes,), threshold (n_nodes,)
    """
    n_nodes, m = feats.shape
    rows = np.arange(n_nodes)
    if m == box_lo.shape[1]:  # all features, in order: draw one per node
        feature = feats[rows, rng.integers(m, size=n_nodes)].astype(np.int64)
    else:  # a random subset in random order: its first (a subset's draws stay as they were)
        feature = feats[:, 0].astype(np.int64)
    lo, hi = box_lo[rows, feature], box_hi[rows, feature]
    u = rng.random(n_nodes)
    if cdf is None or bounds is None:
        threshold = np.where(hi > lo, lo + u * (hi - lo), lo)
        return feature, threshold
    edges = cdf_edges(np.asarray(bounds, dtype=np.float64), cdf.shape[1] - 1)[feature]
    fp = cdf[feature]
    f_lo = _interp_rows(lo, edges, fp)
    f_hi = _interp_rows(hi, edges, fp)
    t = _interp_rows(f_lo + u * (f_hi - f_lo), fp, edges)
    threshold = np.where(hi > lo, np.clip(t, lo, hi), lo)
    return feature, threshold


#: Largest weight :func:`class_weights` gives a class (its frequency at least 1 / (4 C)).
_MAX_CLASS_WEIGHT = 4.0
#: :func:`class_weights` trusts the classes' frequencies only where the rows' noisy total is
#: at least this many standard deviations of its noise.
_MIN_TOTAL_TO_NOISE = 3.0


def class_weights(leaf_totals: np.ndarray, n_trees: int, count_noise: float,
                  totals: np.ndarray | None = None, totals_noise: float | None = None
                  ) -> np.ndarray:
    """Weights ``(1 / C) / q_c`` that turn class counts into counts under uniform class
    priors, with ``q`` the classes' frequencies estimated from the leaves' (noisy) class
    counts and shrunk towards uniform as far as their noise requires (positive-part
    James-Stein).

    ``p_c = N_c / N`` with ``N_c`` class c's leaf counts summed over all leaves and divided by
    the trees (every tree holds every row), ``N = sum(N_c)``; with ``count_noise`` the standard
    deviation of the noise on one leaf class count, the noise on ``N_c`` has standard deviation
    ``s = count_noise * sqrt(L) / T`` over ``L`` leaves, so ``||p - u||**2`` has about
    ``v = (C - 1) s**2 / N**2`` of noise even when the classes are balanced (``u = 1 / C``).
    ``q = u + f (p - u)`` with ``f = max(0, 1 - v / ||p - u||**2)``, and ``f = 0`` where ``N``
    is below :data:`_MIN_TOTAL_TO_NOISE` standard deviations of its own noise (``s sqrt(C)``):
    uniform weights when the release cannot tell the classes' frequencies from uniform, the
    inverse frequencies when it clearly can. No weight exceeds :data:`_MAX_CLASS_WEIGHT`.

    With ``totals`` (the classes' noisy row totals of a release of their own) and
    ``totals_noise`` (the noise assumed on one of them), ``N_c`` are those totals and ``s`` is
    ``totals_noise`` instead; the leaves' counts are not used.
    """
    leaves = np.asarray(leaf_totals, dtype=np.float64)
    C = leaves.shape[1]
    u = 1.0 / C
    if totals is not None and totals_noise is not None:
        per_class = np.asarray(totals, dtype=np.float64).reshape(C)
        s = float(totals_noise)
    else:
        trees = max(int(n_trees), 1)
        per_class = leaves.sum(axis=0) / trees
        s = float(count_noise) * np.sqrt(leaves.shape[0]) / trees
    n = float(per_class.sum())
    if n <= 0 or n < _MIN_TOTAL_TO_NOISE * s * np.sqrt(C):
        return np.ones(C)
    p = per_class / n
    dev = float(((p - u) ** 2).sum())
    f = max(0.0, 1.0 - (C - 1) * s**2 / n**2 / dev) if dev > 0 else 0.0
    q = np.maximum(u + f * (p - u), u / _MAX_CLASS_WEIGHT)
    out: np.ndarray = u / q
    return out


def values_from_leaves(trees: Sequence[Any], leaf_tree: np.ndarray, leaf_node: np.ndarray,
                       leaf_totals: np.ndarray, task: str, min_count: float,
                       bound: float | None = None, criterion: str = "gini",
                       shrink: float = 0.0, count_votes: bool = False,
                       balanced: bool = False, class_prior_noise: float | None = None,
                       class_totals: np.ndarray | None = None,
                       class_totals_noise: float | None = None,
                       leaf_weight: float = 0.0) -> None:
    """Set every node's value, count and impurity in ``trees`` from the leaves' (noisy)
    totals (``criterion``: the impurity's, for classification).

    Parameters
    ----------
    trees : tree builders (nodes added parent first: a child's id exceeds its parent's)
    leaf_tree, leaf_node : (L,) the leaves' tree index and node id
    leaf_totals : (L, S) their statistics (class counts, or n, sum y, sum y**2)
    min_count : a node whose count is below this takes its nearest trusted ancestor's value
        (regression, and classification without ``shrink``)
    bound : regression values are clipped to ``[-bound, bound]`` (the public target bound)
    shrink : classification, ``> 0``: a node's value is ``(c + shrink * p) / (sum(c) + shrink)``
        with ``c`` its class counts clipped at 0 and ``p`` its parent's value (the root's:
        uniform proportions), instead of the ``min_count`` rule
    count_votes : classification: every leaf's value is its noisy class counts (unclipped)
        divided by the mean rows per leaf (the sum of all leaves' counts over their number,
        at least 1), so the forest's average of its trees' leaf values is
        the leaves' summed counts up to that constant (a forest whose ``vote`` is
        ``"counts"`` normalises it, :meth:`~fedforest_secure.model.ForestModel.values_of`);
        internal nodes keep their proportions
    balanced : with ``count_votes``, each class's counts are divided by that class's mean rows
        per leaf instead (every class's summed counts over its own noisy total, at least 1)
    class_prior_noise : classification without ``count_votes``, not None: node values are
        class proportions under uniform class priors, as far as the release shows the classes'
        frequencies (:func:`class_weights`; the value is the standard deviation of the noise
        on one leaf class count, 0 for exact totals): every class's counts are multiplied by
        its weight before anything else (post-processing of the same totals)
    class_totals, class_totals_noise : with ``class_prior_noise``, the classes' noisy row
        totals of a release of their own and the noise assumed on one of them: the class
        frequencies come from them instead of the leaves (:func:`class_weights`)
    leaf_weight : classification without ``count_votes``, ``> 0``: every leaf's value (its
        class proportions, or its ancestor's where it fell back) is multiplied by
        ``n / (n + leaf_weight)``, ``n`` its class counts clipped at 0 and summed, so the
        forest's average weights each leaf by how far its rows exceed the noise (a forest
        whose ``vote`` is ``"counts"`` normalises that average per row); internal nodes keep
        their proportions
    """
    if not (np.isfinite(shrink) and shrink >= 0):
        raise ValueError(f"shrink must be finite and >= 0, got {shrink}")
    if not (np.isfinite(leaf_weight) and leaf_weight >= 0):
        raise ValueError(f"leaf_weight must be finite and >= 0, got {leaf_weight}")
    S = leaf_totals.shape[1]
    n_out = 1 if task == "regression" else S
    prior = np.zeros(n_out) if task == "regression" else np.full(n_out, 1.0 / n_out)
    count_votes = count_votes and task == "classification"
    if class_prior_noise is not None and task == "classification" and (
            not count_votes or class_totals is not None):
        leaf_totals = leaf_totals * class_weights(leaf_totals, len(trees), class_prior_noise,
                                                  class_totals, class_totals_noise)[None, :]
    weighted = task == "classification" and not count_votes and leaf_weight > 0
    rows_per_leaf: float | np.ndarray = 1.0
    if count_votes:
        n_leaves = max(leaf_totals.shape[0], 1)
        rows_per_leaf = (np.maximum(leaf_totals.sum(axis=0) / n_leaves, 1.0) if balanced
                         else max(float(leaf_totals.sum()) / n_leaves, 1.0))
    for t, tb in enumerate(trees):
        b: _Builder = tb
        size = len(b.left)
        stats = np.zeros((size, S))
        mine = leaf_tree == t
        stats[leaf_node[mine]] = leaf_totals[mine]
        parent = np.full(size, -1, dtype=np.int64)
        for node in range(size - 1, -1, -1):  # children after parents: sum bottom-up
            left, right = b.left[node], b.right[node]
            if left >= 0:
                stats[node] = stats[left] + stats[right]
                parent[left] = parent[right] = node
        vals = _impurity.node_values(stats, task)
        if task == "classification":  # noisy class counts clipped at 0, then normalised
            n = np.maximum(stats, 0.0).sum(axis=1)
        else:
            n = _impurity.counts_of(stats, task)
        if task == "regression" and bound is not None:
            vals = np.clip(vals, -bound, bound)
        clean = _splits.clean_noisy_groups(stats, task, bound)
        imp = _impurity.impurity(clean, task, "mse" if task == "regression" else criterion)
        shrunk = task == "classification" and shrink > 0
        for node in range(size):  # parents first: top-down fallback
            if shrunk:
                base = prior if parent[node] < 0 else b.value[parent[node]]
                counts = np.maximum(stats[node], 0.0)
                value = (counts + shrink * base) / (counts.sum() + shrink)
            elif n[node] >= min_count and np.isfinite(vals[node]).all():
                value = vals[node]
            else:
                value = prior if parent[node] < 0 else b.value[parent[node]]
            if count_votes and b.left[node] < 0:
                value = stats[node] / rows_per_leaf
            elif weighted and b.left[node] < 0:
                value = value * (n[node] / (n[node] + leaf_weight))
            b.value[node] = np.asarray(value, dtype=np.float64).reshape(n_out)
            b.n[node] = float(n[node])
            b.impurity[node] = float(imp[node])

