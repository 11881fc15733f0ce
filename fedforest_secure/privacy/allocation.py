"""How a DP job spends its budget: the forest's shape and the noise of every release.

Two things live here, both pure functions of public information (the job's configuration and
its profile), so that every client computes its own noise and the server cannot lower it:

* :func:`dp_forest_settings`, the allocation rule: trees, depth, candidate bins ``B`` and
  features per node as a documented function of (epsilon, rows, features, classes);
* :func:`job_noise`, the noise plan: each planned release (one noisy histogram round per
  splitting level; under DP nothing else is released) gets a share of the job's zCDP budget,
  and one calibration (:func:`calibrate`) solves for the client noise scales such that the
  composition of *all* the job's releases is exactly (epsilon, delta)-DP
  (:mod:`.accountant`: Rényi curves add up, one conversion). The sensitivities are those of
  :mod:`.sensitivity` in ring units, the sums of ``y`` and ``y**2`` with one more unit per
  cell a record touches for each site's rounding to the fixed-point grid.

The calibration (planned releases and their Rényi cost, the client noise scales that spend
the budget exactly, and the plan's type :class:`JobNoise`) is :mod:`._calibration`; its names
are importable from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..errors import BudgetError
from ._calibration import (
    JobNoise,
    PlannedBlock,
    PlannedRelease,
    calibrate,
    check_sampling,
    release_cost,
)
from .dp import honest_noise_adders, min_survivors, rho_for, single_vector_bound
from .sensitivity import StatKind, abstention_factor, histogram_sensitivity

if TYPE_CHECKING:
    from ..config import JobConfig

__all__ = ["CLASS_PRIOR_NOISE_MULT", "CLASS_TOTALS_MAX_EPSILON", "CLASS_TOTALS_NOISE_MULT",
           "CLASS_TOTALS_SHARE", "LEAF_CLASS_BALANCED", "LEAF_SHRINK", "LEAF_VOTE_BALANCED",
           "LEAF_VOTE_COUNTS_ABOVE", "LEAF_WEIGHT_BELOW", "LEAF_WEIGHT_NOISE", "MARGINAL_FLOOR",
           "MARGINAL_SHARE", "DPForestSettings", "JobNoise", "PlannedBlock", "PlannedRelease",
           "calibrate", "class_totals_scale", "dp_forest_settings", "job_noise",
           "leaf_vote_weight", "leaf_votes_are_counts", "level_signal_to_noise",
           "random_split_depth", "release_cost"]


def _dp_value(dp: Mapping[str, Any], key: str, default: Any) -> Any:
    v = dp.get(key)
    return default if v is None else v


def job_noise(config: JobConfig, units: Mapping[str, float]) -> JobNoise:
    """The noise plan of a DP job (module docstring), cached per configuration.

    Parameters
    ----------
    config : JobConfig
        With a ``[dp]`` profile section.
    units : mapping
        Integer (ring) units per unit of each statistic kind (``"count"``, ``"sum"``,
        ``"sumsq"``): 1 for counts, ``2**frac_bits / scale`` for the others.

    Raises
    ------
    BudgetError
        No budget, or a client noise scale the sampler cannot draw (a small epsilon with a
        large ``frac_bits``; :func:`~._calibration.check_sampling`).
    """
    key = (config.to_json(), tuple(sorted((k, float(v)) for k, v in units.items())))
    return _job_noise(*key)


@lru_cache(maxsize=16)
def _job_noise(config_json: str, units: tuple[tuple[str, float], ...]) -> JobNoise:
    from ..config import JobConfig

    config = JobConfig.from_json(config_json)
    unit = dict(units)
    plan = _planned(config, unit)
    frac = int(config.profile.get("frac_bits", 24))

    def sigmas_at(bits: int) -> dict[str, float]:  # real sums' units scale with 2**frac_bits
        return _named_sigmas(_planned(config, {k: v if k == "count" else v * 2.0**(bits - frac)
                                               for k, v in unit.items()}))

    check_sampling(_named_sigmas(plan), sigmas_at, frac, ("epsilon", plan.epsilon))
    return plan


def _named_sigmas(plan: JobNoise) -> dict[str, float]:
    return {f"{r.label} ({b.name})": s for r, sig in zip(plan.releases, plan.sigmas, strict=True)
            for b, s in zip(r.blocks, sig, strict=True)}


def _planned(config: JobConfig, unit: Mapping[str, float]) -> JobNoise:
    """The noise plan of :func:`job_noise`, not checked against the sampler."""
    dp = config.dp
    if not dp:
        raise BudgetError("the job has no [dp] section: no budget")
    eps, delta = float(dp["epsilon"]), float(dp["delta"])
    trees = 1 if config.sampling == "disjoint" else config.n_estimators
    mult = 1 if config.sampling in ("disjoint", "all") else int(
        _dp_value(dp, "max_multiplicity", 4))
    rows = abstention_factor(config.profile)  # abstention moves m rows per record
    mult *= rows
    tol = float(_dp_value(dp, "dropout_tolerance",
                          max(0.0, 1.0 - float(config.profile.get("threshold", 1.0)))))
    k_min = min_survivors(config.n_clients, min(tol, 0.999))
    # the releases' noise holds for the honest survivors: K_min less the colluders
    thr, nb = float(config.profile.get("threshold", 1.0)), config.profile.get("neighbours")
    honest = honest_noise_adders(config.n_clients, k_min, _dp_value(dp, "colluders", 0),
                                 threshold=thr, neighbours=nb)
    bound = single_vector_bound(config.n_clients, thr, nb)
    m = config.max_features
    width = max([config.n_bins] + [lv for lv in config.levels]) + 1
    kinds: list[tuple[str, StatKind, int]]
    if config.task == "classification":
        kinds = [("count", "class_count", config.n_classes)]
    else:
        kinds = [("count", "count", 1), ("sum", "sum", 1), ("sumsq", "sum_sq", 1)]
    depth = config.max_depth
    if config.method == "random":
        return _random_split_noise(config, unit, eps, delta, trees, mult, k_min, honest, bound)
    level_w = [1.0 / depth] * depth
    releases = []
    for level in range(depth):
        nodes = trees * 2**level
        blocks: list[PlannedBlock] = []
        for name, stat, cols in kinds:
            sens = histogram_sensitivity(
                stat, n_features=m, n_trees=trees, max_multiplicity=mult,
                target_bounds=(-config.target_bound, config.target_bound)
            ).scaled(float(unit[name]))
            if name != "count":  # each site's sums are rounded: one unit per bin its rows touch
                sens = sens.rounded(trees * m * rows)
            blocks.append(PlannedBlock(name, sens, nodes * m * width * cols,
                                       level_w[level] / len(kinds)))
        releases.append(PlannedRelease(f"level {level} histograms", honest, tuple(blocks)))
    sig = calibrate(releases, eps, delta)
    return JobNoise(tuple(releases), tuple(range(depth)), sig, k_min, eps, delta, bound)


#: Budget shares of a regression's leaf release under random splits: the leaf means need the
#: counts and the sums of y; the sums of squares travel in the same block but are not used.
_RANDOM_REGRESSION_SHARES = {"count": 0.49, "sum": 0.49, "sumsq": 0.02}
#: Random splits: share of the zCDP budget spent on the features' marginal counts (level 0);
#: the leaves' totals get the rest.
MARGINAL_SHARE = 0.1
#: Random splits: rows added to every bin of the (noisy) marginal counts after clipping at 0,
#: before the CDF is formed (post-processing; half a row did better than one standard deviation
#: of the noise on the validation sets of docs/privacy.md §2.6).
MARGINAL_FLOOR = 0.5
#: Random-split classification: pseudo-rows of a node's parent's class proportions added to its
#: (noisy, clipped) class counts, per standard deviation of the summed noise on one count of the
#: leaves' release (post-processing). 0: off, nodes below ``min_samples_leaf`` take their
#: ancestor's value instead; docs/privacy.md §2.6 has the measurements of 0.1 to 2.
LEAF_SHRINK = 0.0
#: Random-split classification: the forest votes with the leaves' noisy class counts summed
#: over the trees (instead of averaging each tree's class proportions) when the standard
#: deviation of the noise on one summed class count of the leaves' release is at least this
#: many times the mean rows per leaf (:func:`leaf_votes_are_counts`). ``inf`` (as shipped):
#: always proportions; 0: always counts. 4 gained at epsilon <= 2 on the validation sets but
#: lost on breast cancer in the comparison (docs/privacy.md §2.6), so it is off.
LEAF_VOTE_COUNTS_ABOVE = math.inf
#: Summed-count leaf votes: each class's summed counts over that class's noisy total (a vote
#: with uniform class priors) instead of over all rows. Off (docs/privacy.md §2.6).
LEAF_VOTE_BALANCED = False
#: Random-split DP classification (on as shipped): node values are class proportions under
#: uniform class priors, as far as the leaves' release shows the classes' frequencies
#: (:func:`~fedforest_secure._random_splits.class_weights`: post-processing, no budget). An
#: imbalanced set is otherwise predicted as its majority class once the noise flattens the
#: leaves (docs/privacy.md §2.6, "Class priors").
LEAF_CLASS_BALANCED = True
#: With :data:`LEAF_CLASS_BALANCED`: the class frequencies' noise is taken as this many times
#: the leaves' count noise when deciding how far to trust them (1: positive-part James-Stein;
#: 2 was chosen on the validation sets).
CLASS_PRIOR_NOISE_MULT = 2.0
#: Random-split DP classification at large epsilon: a leaf's vote is its class proportions
#: times ``n / (n + LEAF_WEIGHT_NOISE * sigma)``, ``n`` its noisy row count and ``sigma`` the
#: standard deviation of the noise on one summed class count of the leaves' release, so a leaf
#: whose counts are mostly noise moves the forest's vote less than one whose rows dominate the
#: noise (:func:`leaf_vote_weight`; post-processing). 0 (as shipped): every leaf one vote; 1
#: gained at epsilon = 4 on the validation sets but not at epsilon = 8, nor on the comparison
#: (docs/privacy.md §2.6, "Leaf weights").
LEAF_WEIGHT_NOISE = 0.0
#: The leaf weights apply where ``sigma`` is at most this many times the mean rows per leaf
#: (the large-epsilon regime, :func:`leaf_vote_weight`); elsewhere every leaf has one vote.
LEAF_WEIGHT_BELOW = 4.0
#: Random-split DP classification: the width of its soft routing at prediction, a share of the
#: rows in the released marginal CDF (:mod:`~fedforest_secure._soft_routing`; post-processing):
#: a row within this share of the rows of a split's threshold is shared between both
#: children, so each tree averages the noisy leaves around it. Chosen on the validation sets
#: of docs/privacy.md §2.6 ("Soft routing"); 0 turns it off.
SOFT_ROUTING_WIDTH = 0.08


#: Random-split DP classification at epsilon <= :data:`CLASS_TOTALS_MAX_EPSILON`: about this
#: share of the zCDP budget goes to the classes' row totals, released with the marginal counts
#: (:func:`class_totals_scale`); the class priors then come from them instead of the leaves'
#: summed counts, which at small epsilon cannot show the classes' frequencies.
CLASS_TOTALS_SHARE = 0.05
#: Largest epsilon whose random-split classification plan releases the classes' row totals.
CLASS_TOTALS_MAX_EPSILON = 2.0
#: With the class totals released (on as shipped): the forest votes with the leaves' noisy
#: class counts summed over the trees, each class's counts times its class weight, instead of
#: averaging its trees' leaf proportions (a linear vote: the noise, not clipped, does not
#: favour the classes with the larger weights; docs/privacy.md §2.6, "Class totals at small
#: epsilon").
CLASS_TOTALS_COUNT_VOTES = True
#: The class totals' noise :func:`~fedforest_secure._random_splits.class_weights` assumes, in
#: standard deviations of their actual noise (1: positive-part James-Stein).
CLASS_TOTALS_NOISE_MULT = 1.0


def class_totals_scale(config: JobConfig) -> int:
    """How many times its classes' row totals a client adds to the level-0 release of a DP
    random-split classification job (0: the plan releases no class totals).

    The level-0 release is one noisy vector with one noise scale: the features' marginal counts
    (one count per feature for a record, L2 sensitivity ``sqrt(d)``) followed by ``a`` times the
    client's row count per class (one class for a record: ``a`` more in L2), so that the
    decoded totals, divided by ``a``, carry ``1 / a`` of the counts' noise: the release is
    ``(d + a**2) / d`` times the marginal counts' zCDP cost, and the class totals take the share
    ``MARGINAL_SHARE * a**2 / d`` of the budget. ``a`` is the smallest integer of at least
    ``sqrt(d * CLASS_TOTALS_SHARE / MARGINAL_SHARE)``, so that the class totals get at least
    :data:`CLASS_TOTALS_SHARE` (at most ``4/3`` of :data:`MARGINAL_SHARE`, with 3 features).
    Planned (``a >= 1``) only under
    differential privacy, for classification with random splits and an epsilon of at most
    :data:`CLASS_TOTALS_MAX_EPSILON` (a pure function of the job's public configuration: every
    client computes it from its own profile)."""
    dp = config.dp
    if (not dp or config.task != "classification" or config.method != "random"
            or CLASS_TOTALS_SHARE <= 0 or float(dp["epsilon"]) > CLASS_TOTALS_MAX_EPSILON):
        return 0
    a = math.sqrt(config.n_features * CLASS_TOTALS_SHARE / MARGINAL_SHARE)
    return max(1, int(math.ceil(a - 1e-9)))


def leaf_votes_are_counts(count_std: float, n_rows: float, depth: int) -> bool:
    """Whether a random-split classifier votes with summed noisy class counts
    (docs/privacy.md §2.6): ``count_std >= LEAF_VOTE_COUNTS_ABOVE * n_rows / 2**depth``.

    Parameters
    ----------
    count_std : standard deviation of the noise on one summed class count of the leaves'
        release (:meth:`JobNoise.sum_count_std`)
    n_rows : the federation's rows (the coordinator uses the released leaf totals' mean row
        count per tree: post-processing)
    depth : the trees' depth (a tree has ``2**depth`` leaves)

    Summed counts weight a tree's leaf by its (noisy) size, so a leaf whose counts are mostly
    noise moves the vote little; averaged proportions give every leaf one full vote, which is
    better when the noise is small against a leaf's rows.
    """
    rows_per_leaf = _rows_per_leaf(count_std, n_rows, depth)
    return rows_per_leaf is not None and bool(count_std >= LEAF_VOTE_COUNTS_ABOVE * rows_per_leaf)


def _rows_per_leaf(count_std: float, n_rows: float, depth: int) -> float | None:
    """``n_rows / 2**depth`` (``n_rows`` at least 1), or None where ``count_std`` is not a
    finite, non-negative noise standard deviation."""
    if not (math.isfinite(count_std) and count_std >= 0):
        return None
    return max(float(n_rows), 1.0) / 2.0 ** depth


def leaf_vote_weight(count_std: float, n_rows: float, depth: int) -> float:
    """The pseudo-rows ``lam`` of a random-split classifier's leaf weights ``n / (n + lam)``
    (docs/privacy.md §2.6, "Leaf weights"): ``LEAF_WEIGHT_NOISE * count_std`` where
    ``count_std <= LEAF_WEIGHT_BELOW * n_rows / 2**depth``, else 0 (every leaf one vote).

    The parameters are those of :func:`leaf_votes_are_counts`. A leaf's class proportions
    estimate its rows' classes with an error that grows as its rows ``n`` shrink against the
    noise; weighting its vote by ``n / (n + lam)`` moves the forest's average towards the
    leaves that hold more rows than noise. Where the noise is many times the rows per leaf
    (small epsilon) nearly every leaf is mostly noise and the weights are not applied.
    """
    rows_per_leaf = _rows_per_leaf(count_std, n_rows, depth)
    if rows_per_leaf is None or LEAF_WEIGHT_NOISE <= 0 \
            or count_std > LEAF_WEIGHT_BELOW * rows_per_leaf:
        return 0.0
    return float(LEAF_WEIGHT_NOISE * count_std)


def _random_split_noise(config: JobConfig, unit: Mapping[str, float], eps: float,
                        delta: float, trees: int, mult: int, k_min: int,
                        honest: int, bound: int) -> JobNoise:
    """Random splits: two releases. Level 0: every feature's row counts in ``n_bins``
    fixed-width bins of its public range, over one tree's rows (a record counts once per
    feature: a histogram with ``F = d`` and ``T = 1``), share :data:`MARGINAL_SHARE`; with
    :func:`class_totals_scale` ``a >= 1`` also ``a`` times the classes' row totals, the share
    then ``MARGINAL_SHARE * (1 + a**2 / d)``.
    Level ``max_depth``: the leaves' node totals (a record sits in one leaf per tree: a
    histogram with ``F = 1`` over ``T`` trees), the rest. Counts are integers; a regression's
    sums of ``y`` and ``y**2`` get one more unit per leaf the record reaches, for each site's
    rounding to the grid (:meth:`~.sensitivity.Sensitivity.rounded`). Both releases' noise
    holds for ``honest`` sites (``K_min`` less the colluders); ``k_min`` is the survivors,
    ``bound`` the plan's :attr:`~JobNoise.vector_bound`."""
    leaves = trees * 2**config.max_depth
    leaf_share = 1.0 - MARGINAL_SHARE
    kinds: list[tuple[str, StatKind, int, float]]
    if config.task == "classification":
        kinds = [("count", "class_count", config.n_classes, leaf_share)]
    else:
        kinds = [("count", "count", 1, leaf_share * _RANDOM_REGRESSION_SHARES["count"]),
                 ("sum", "sum", 1, leaf_share * _RANDOM_REGRESSION_SHARES["sum"]),
                 ("sumsq", "sum_sq", 1, leaf_share * _RANDOM_REGRESSION_SHARES["sumsq"])]
    marg = histogram_sensitivity("count", n_features=config.n_features, n_trees=1,
                                 max_multiplicity=mult)
    dims, marg_share = config.n_features * config.n_bins, MARGINAL_SHARE
    a = class_totals_scale(config)
    if a:  # the classes' row totals, a times over, in the same vector (one noise scale)
        classes = histogram_sensitivity("class_count", n_features=1, n_trees=1,
                                        max_multiplicity=mult).scaled(float(a))
        marg = marg.combine(classes)
        dims += config.n_classes
        marg_share = MARGINAL_SHARE * (1.0 + a * a / config.n_features)
        leaf_share = 1.0 - marg_share
        kinds = [("count", "class_count", config.n_classes, leaf_share)]
    marginals = PlannedRelease("marginal counts" + (" and class totals" if a else ""), honest,
                               (PlannedBlock("count", marg.scaled(float(unit["count"])), dims,
                                             marg_share),))
    blocks = []
    for name, stat, cols, share in kinds:
        sens = histogram_sensitivity(stat, n_features=1, n_trees=trees, max_multiplicity=mult,
                                     target_bounds=(-config.target_bound, config.target_bound)
                                     ).scaled(float(unit[name]))
        if name != "count":  # each site's sums are rounded: one unit in the record's leaf
            sens = sens.rounded(trees)
        blocks.append(PlannedBlock(name, sens, leaves * cols, share))
    release = PlannedRelease("leaf totals", honest, tuple(blocks))
    sig = calibrate([marginals, release], eps, delta)
    return JobNoise((marginals, release), (0, config.max_depth), sig, k_min, eps, delta, bound)


# ----------------------------------------------------------------------------- the rule
#: Smallest ratio of the rows in a histogram cell at the deepest level to the noise on a count
#: (classification; regression needs more, its sums carry the target bound): below it a level
#: splits on noise. Chosen on iris (seeds 100-105, central simulation of the engine's DP path).
_MIN_SIGNAL_TO_NOISE = {"classification": 0.6, "regression": 2.0}
_MAX_DP_DEPTH = 3
_DP_BINS = 4
#: The clients' noise holds for K_min = 3 of 4: the sum's variance is 4/3 of the central one.
_DISTRIBUTED_FACTOR = 4.0 / 3.0


#: Random splits: trees, and rows per leaf that set the depth (classification, regression).
_RANDOM_TREES = 64
#: Random-split classification at epsilon >= :data:`MANY_TREES_EPSILON`: twice the trees. With
#: soft routing at prediction, 128 trees gained at epsilon = 8 on the validation sets (three
#: seed streams) and lost at epsilon = 2 and 4 (docs/privacy.md §2.6, "Soft routing").
_RANDOM_TREES_MANY = 128
MANY_TREES_EPSILON = 8.0
_RANDOM_ROWS_PER_LEAF = {"classification": 4.0, "regression": 8.0}
_RANDOM_DEPTH = (3, 8)
#: Random splits: fixed-width bins of the marginal counts the thresholds are drawn from.
_MARGINAL_BINS = 32
#: Random-split regression: rows per leaf per standard deviation of the averaged count noise.
_REGRESSION_LEAF_NOISE = 16.0


@dataclass(frozen=True)
class DPForestSettings:
    """Forest hyper-parameters chosen by :func:`dp_forest_settings`."""

    n_estimators: int
    max_depth: int
    n_bins: int
    max_features: int
    sampling: str = "all"
    method: str = "random"

    def as_params(self) -> dict[str, Any]:
        return {"n_estimators": self.n_estimators, "max_depth": self.max_depth,
                "n_bins": self.n_bins, "max_features": self.max_features,
                "sampling": self.sampling, "method": self.method}


def level_signal_to_noise(epsilon: float, delta: float, n_rows: int, n_classes: int,
                          task: str, n_estimators: int, max_features: int, depth: int,
                          n_bins: int = _DP_BINS) -> float:
    """Rows per histogram cell at level ``depth - 1`` over the noise on one count of a job of
    that shape (every row in every tree, equal zCDP shares per level and statistic kind)."""
    rho = rho_for(epsilon, delta)
    kinds = 1 if task == "classification" else 3
    cells = 2 ** (depth - 1) * n_bins * (n_classes if task == "classification" else 1)
    sigma = math.sqrt(_DISTRIBUTED_FACTOR * n_estimators * max_features * depth * kinds
                      / (2.0 * rho))
    return float(n_rows / cells / sigma)


def random_split_depth(n_rows: int, task: str, epsilon: float | None = None,
                       delta: float = 1e-6) -> int:
    """Depth of the random-split trees, clipped to [3, 8]: ``round(log2(n / r))`` with ``r = 4``
    rows per leaf for classification and 8 for regression (leaf means need more).

    Regression with a budget (``epsilon``): also at most ``round(log2(n / (c * s)))``, where
    ``s = sqrt(4/3 / (2 rho_n))`` is the standard deviation of the count noise on a leaf
    averaged over the trees (``rho_n``: the zCDP share of the leaves' counts, :data:`MARGINAL_SHARE`
    and :data:`_RANDOM_REGRESSION_SHARES`) and ``c = 16``: a leaf's mean divides a noisy sum
    (the target bound times the count noise) by its count, so small budgets need fewer, larger
    leaves. The depth never decreases as epsilon grows."""
    d = math.floor(math.log2(max(n_rows, 1) / _RANDOM_ROWS_PER_LEAF[task]) + 0.5)
    if task == "regression" and epsilon is not None:
        rho_n = rho_for(epsilon, delta) * (1.0 - MARGINAL_SHARE) * _RANDOM_REGRESSION_SHARES[
            "count"]
        s = math.sqrt(_DISTRIBUTED_FACTOR / (2.0 * rho_n))
        d = min(d, math.floor(math.log2(max(n_rows, 1) / (_REGRESSION_LEAF_NOISE * s)) + 0.5))
    return int(min(max(d, _RANDOM_DEPTH[0]), _RANDOM_DEPTH[1]))


def dp_forest_settings(epsilon: float, n_rows: int, n_features: int, n_classes: int,
                       task: str, delta: float = 1e-6, *, method: str = "random"
                       ) -> DPForestSettings:
    """The allocation rule (docs/privacy.md §2.6): forest shape of a DP job.

    ``method="random"`` (the default of DP jobs): every node splits on a random feature at a
    threshold drawn in its public box from that feature's noisy marginal distribution
    (:mod:`fedforest_secure._random_splits`): two releases, the marginal counts on
    ``n_bins = 32`` fixed-width bins (:data:`MARGINAL_SHARE` of the budget; for classification
    at epsilon <= :data:`CLASS_TOTALS_MAX_EPSILON` with the classes' row totals, about
    :data:`CLASS_TOTALS_SHARE` more, :func:`class_totals_scale`) and the leaves' node totals
    (the rest); every row in every tree (``sampling="all"``), ``T = 64`` trees (classification
    at epsilon >= :data:`MANY_TREES_EPSILON`: 128) of depth :func:`random_split_depth` (a
    function of the rows only; for regression also of the noise). More budget never gives
    fewer trees or a shallower forest, and the noise of both releases only shrinks as epsilon
    grows (with 128 trees a tree's leaves carry sqrt(2) times the noise of 64, and the
    forest's average the same).

    A greedy method (``"histogram"``, ``"quantiles"``: noisy histograms of fixed-width
    candidate bins at every level, budget split equally over the levels in zCDP) uses the
    earlier rule: ``B = 4``; ``m = max(1, d // 10)`` features per node for classification,
    ``min(2, d)`` for regression; ``T = 4`` trees below epsilon = 2, else 8 unless 4 trees
    reach a deeper forest (classification), 8 (regression); the depth is the deepest ``D <= 3``
    (for that ``T``) whose deepest level keeps at least
    ``_MIN_SIGNAL_TO_NOISE`` rows per histogram cell per unit of count noise
    (:func:`level_signal_to_noise`), at least 1; more budget never makes it shallower.

    Parameters
    ----------
    epsilon, delta : the job's budget
    n_rows : rows of the federation (a public count, or a public lower bound of it)
    n_features, n_classes : from the schema (``n_classes`` is ignored for regression)
    task : ``"classification"`` or ``"regression"``
    method : ``"random"`` or a greedy method
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise BudgetError(f"epsilon must be finite and > 0, got {epsilon}")
    if n_rows < 1 or n_features < 1:
        raise BudgetError(f"n_rows and n_features must be >= 1, got {n_rows}, {n_features}")
    if task not in ("classification", "regression"):
        raise BudgetError(f"unknown task {task!r}")
    if method == "random":
        trees = _RANDOM_TREES_MANY if task == "classification" and \
            epsilon >= MANY_TREES_EPSILON else _RANDOM_TREES
        return DPForestSettings(trees, random_split_depth(n_rows, task, epsilon, delta),
                                _MARGINAL_BINS, 1, method="random")
    if task == "classification":
        choices = (4,) if epsilon < 2.0 else (8, 4)
        m = max(1, n_features // 10)
        classes = max(n_classes, 2)
    else:
        choices, m, classes = (8,), min(2, n_features), 1

    def depth_for(trees: int) -> int:
        depth = 1
        for d in range(2, _MAX_DP_DEPTH + 1):
            if level_signal_to_noise(epsilon, delta, n_rows, classes, task, trees, m,
                                     d) >= _MIN_SIGNAL_TO_NOISE[task]:
                depth = d
        return depth

    # 8 trees split the budget twice as finely as 4: where that costs depth, 4 trees keep it
    # (the depth for a given number of trees only grows with epsilon, so the deeper of the
    # two never shrinks as epsilon grows)
    trees = max(choices, key=lambda t: (depth_for(t), t))
    return DPForestSettings(trees, depth_for(trees), _DP_BINS, m, method=method)
