"""Validation of the DP allocation rule on data sets and seeds disjoint from the comparison.

The rule (``privacy.allocation.dp_forest_settings``) and the ``secure-dp`` profile are chosen
here, never on the comparison's data sets (breast cancer, wine, diabetes) or seeds (0-9):
``FedForest*`` with ``load_profile("secure-dp", epsilon=eps, **overrides)`` on the same kind
of split as ``fedforest compare`` (``run_comparison``: 70/30, stratified, the training rows over
4 clients by a Dirichlet(1.0) partition of k-means groups), seeds from 100, balanced accuracy
(R² for the regressions). Each variant is a profile override and a forest shape as a function
of (epsilon, rows, features, classes, task); the table has one row per data set and variant,
one column per epsilon, each cell the mean over the seeds. docs/privacy.md §2.6 quotes it.

Usage::

    nice -n 10 python benchmarks/dp_validation.py                  # every set and variant
    nice -n 10 python benchmarks/dp_validation.py --sets iris,skewed180 --variants rule,abstain5 \\
        --seeds 6 --epsilons 0.5,8
    nice -n 10 python benchmarks/dp_validation.py --flamby --epsilons 1,2,4,8 --seeds 5
    nice -n 10 python benchmarks/dp_validation.py --paired --variants rule,leafw1 --epsilons 4,8

``--paired`` compares post-processing variants on the same releases: the clients' noise is
drawn from one seeded stream per (data set, epsilon), so every variant's fits see the same
noise (rounded normal draws of the same scale instead of the discrete Gaussian: a measuring
aid, never what a job runs). Without it the noise is fresh in every fit and a 16-seed mean
moves by a few hundredths from run to run.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedforest_secure.experiments.compare import parse_epsilons, run_comparison
from fedforest_secure.experiments.loaders import load_dataset
from fedforest_secure.privacy.allocation import dp_forest_settings

Data = tuple[np.ndarray, np.ndarray, None, str]


# ------------------------------------------------------------------------------ data sets
def _skewed(n: int, d: int, classes: int, weights: list[float] | None = None) -> Data:
    """``make_classification`` (a third of the features informative, a fifth redundant, one
    cluster per class; ``weights``: class proportions) through x -> exp(0.8 x): skewed
    features."""
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=n, n_features=d, n_informative=max(2, d // 3),
                               n_redundant=d // 5, n_classes=classes, n_clusters_per_class=1,
                               weights=weights, random_state=7)
    return np.exp(0.8 * X), y, None, "classification"


def _iris() -> Data:
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    return X, y, None, "classification"


def _digits(labels: tuple[int, ...], rows: int | None) -> Data:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    keep = np.isin(y, labels)
    X, y = X[keep], y[keep]
    if rows is not None:
        pick = np.random.default_rng(0).permutation(y.size)[:rows]
        X, y = X[pick], y[pick]
    return X.astype(np.float64), y, None, "classification"


def _shared(name: str, rows: int | None = None) -> Data:
    ds = load_dataset(name)
    X, y = np.asarray(ds.X, dtype=np.float64), np.asarray(ds.y)
    if rows is not None and y.size > rows:
        pick = np.random.default_rng(0).permutation(y.size)[:rows]
        X, y = X[pick], y[pick]
    return X, y, None, str(ds.task)


def _banknote_imbalanced() -> Data:
    """450 rows of banknote, 320 of class 0 and 130 of class 1 (71/29)."""
    X, y, _, task = _shared("banknote")
    rng = np.random.default_rng(1)
    pick = np.concatenate([rng.permutation(np.flatnonzero(y == 0))[:320],
                           rng.permutation(np.flatnonzero(y == 1))[:130]])
    return X[pick], y[pick], None, task


SETS: dict[str, Callable[[], Data]] = {
    "iris": _iris,
    "skewed180": lambda: _skewed(180, 13, 3),
    "skewed500": lambda: _skewed(500, 30, 2),
    "skewed500imb": lambda: _skewed(500, 30, 2, [0.65]),  # 65/35: imbalanced, binary
    "skewed400imb": lambda: _skewed(400, 20, 2, [0.7]),  # 70/30
    "banknoteimb": _banknote_imbalanced,  # 71/29
    "skewed180mild": lambda: _skewed(180, 13, 3, [0.42, 0.33]),  # 42/33/25: mildly imbalanced
    "digits1-4-7": lambda: _digits((1, 4, 7), 180),
    "digits3-8": lambda: _digits((3, 8), None),
    "banknote": lambda: _shared("banknote", 600),
    "spectf": lambda: _shared("spectf"),
    "bodyfat": lambda: _shared("bodyfat"),
    "space_ga": lambda: _shared("space_ga", 600),
}


# ------------------------------------------------------------------------------ variants
@dataclass(frozen=True)
class Variant:
    """A profile override and a forest shape (None: the rule's, via the estimators)."""

    profile: dict[str, Any]
    shape: Callable[[float, int, int, int, str], dict[str, Any]] | None = None
    #: constants of ``privacy.allocation`` set for the variant's fits
    constants: tuple[tuple[str, Any], ...] = ()


def _rule(**change: Any) -> Callable[[float, int, int, int, str], dict[str, Any]]:
    def shape(eps: float, n: int, d: int, k: int, task: str) -> dict[str, Any]:
        params = dp_forest_settings(eps, n, d, k, task).as_params()
        params.update(change)
        return params
    return shape


def _noise_depth(c: float) -> Callable[[float, int, int, int, str], dict[str, Any]]:
    """Classification depth also capped by the noise on a leaf's counts (as regression):
    D <= round(log2(n / (c s))), s the count noise of a leaf averaged over the trees."""
    from fedforest_secure.privacy.allocation import MARGINAL_SHARE
    from fedforest_secure.privacy.dp import rho_for

    def shape(eps: float, n: int, d: int, k: int, task: str) -> dict[str, Any]:
        params = dp_forest_settings(eps, n, d, k, task).as_params()
        if task == "classification":
            s = math.sqrt((4.0 / 3.0) / (2.0 * rho_for(eps, 1e-6) * (1 - MARGINAL_SHARE)))
            cap = math.floor(math.log2(max(n, 1) / (c * s)) + 0.5)
            params["max_depth"] = int(min(params["max_depth"], max(cap, 3)))
        return params
    return shape


VARIANTS: dict[str, Variant] = {
    "rule": Variant({}),  # the shipped profile and rule
    "abstain5": Variant({"abstain_below": 5}),  # with its noise paid (docs/privacy.md §2.2)
    "greedy": Variant({}, lambda e, n, d, k, t: dp_forest_settings(
        e, n, d, k, t, method="histogram").as_params() | {"method": "histogram"}),
    "noisedepth4": Variant({}, _noise_depth(4.0)),
    "trees16": Variant({}, _rule(n_estimators=16)),
    "trees32": Variant({}, _rule(n_estimators=32)),
    "trees128": Variant({}, _rule(n_estimators=128)),
    # leaf values shrunk towards the parent's by c noise standard deviations of pseudo-rows
    "shrink0.1": Variant({}, constants=(("LEAF_SHRINK", 0.1),)),
    "shrink0.5": Variant({}, constants=(("LEAF_SHRINK", 0.5),)),
    "shrink1": Variant({}, constants=(("LEAF_SHRINK", 1.0),)),
    "shrink2": Variant({}, constants=(("LEAF_SHRINK", 2.0),)),
    # leaf votes: always averaged proportions (as shipped), always summed noisy counts, and
    # summed counts where the leaf noise is at least 4 times the rows per leaf
    "props": Variant({}, constants=(("LEAF_VOTE_COUNTS_ABOVE", math.inf),)),
    "counts": Variant({}, constants=(("LEAF_VOTE_COUNTS_ABOVE", 0.0),)),
    "votes4": Variant({}, constants=(("LEAF_VOTE_COUNTS_ABOVE", 4.0),)),
    # the same with each class's counts over its own total (uniform class priors)
    "votes4bal": Variant({}, constants=(("LEAF_VOTE_COUNTS_ABOVE", 4.0),
                                        ("LEAF_VOTE_BALANCED", True))),
    # node values as class proportions under uniform class priors, as far as the leaves'
    # release shows the class frequencies (their noise taken as 1 or 2 times the count noise)
    "propsbal": Variant({}, constants=(("LEAF_CLASS_BALANCED", True),)),
    "propsbal2": Variant({}, constants=(("LEAF_CLASS_BALANCED", True),
                                        ("CLASS_PRIOR_NOISE_MULT", 2.0))),
    "propsbal+shrink0.5": Variant({}, constants=(("LEAF_CLASS_BALANCED", True),
                                                 ("LEAF_SHRINK", 0.5))),
    # DP classification at epsilon <= 2: the class priors from the classes' row totals
    # released with the marginal counts (about 5% of the budget, as shipped), without them
    # (the leaves' summed counts), with 10%, and with twice their noise assumed
    "noclasstotals": Variant({}, constants=(("CLASS_TOTALS_SHARE", 0.0),)),
    "classtotals0.1": Variant({}, constants=(("CLASS_TOTALS_SHARE", 0.1),)),
    "classtotalsk2": Variant({}, constants=(("CLASS_TOTALS_NOISE_MULT", 2.0),)),
    # with the class totals: averaged leaf proportions as the vote (instead of the summed
    # noisy class counts, weighted, as shipped)
    "totalsprops": Variant({}, constants=(("CLASS_TOTALS_COUNT_VOTES", False),)),
    # leaf votes weighted by n / (n + c sigma) where sigma <= 4 rows per leaf (off as
    # shipped: c = 0), and with c = 1 at every epsilon
    "leafw0.5": Variant({}, constants=(("LEAF_WEIGHT_NOISE", 0.5),)),
    "leafw1": Variant({}, constants=(("LEAF_WEIGHT_NOISE", 1.0),)),
    "leafw2": Variant({}, constants=(("LEAF_WEIGHT_NOISE", 2.0),)),
    "leafwall": Variant({}, constants=(("LEAF_WEIGHT_NOISE", 1.0),
                                       ("LEAF_WEIGHT_BELOW", math.inf))),
    # random-split DP classifiers route rows softly at prediction within a width of the rows
    # (0.08 as shipped): hard splits, and narrower or wider routing
    "hardsplits": Variant({}, constants=(("SOFT_ROUTING_WIDTH", 0.0),)),
    "route0.05": Variant({}, constants=(("SOFT_ROUTING_WIDTH", 0.05),)),
    "route0.12": Variant({}, constants=(("SOFT_ROUTING_WIDTH", 0.12),)),
    "share0.05": Variant({}, constants=(("MARGINAL_SHARE", 0.05),)),
    "share0.2": Variant({}, constants=(("MARGINAL_SHARE", 0.2),)),
    "depth+1": Variant({}, lambda e, n, d, k, t: _rule()(e, n, d, k, t) | {
        "max_depth": _rule()(e, n, d, k, t)["max_depth"] + 1}),
    "depth-1": Variant({}, lambda e, n, d, k, t: _rule()(e, n, d, k, t) | {
        "max_depth": _rule()(e, n, d, k, t)["max_depth"] - 1}),
}


class PairedNoise:
    """``--paired``: the clients' DP noise from one seeded stream, restarted per cell."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def restart(self, key: str) -> None:
        self.rng = np.random.default_rng(zlib.crc32(key.encode()))

    def sample(self, sigma: float, size: int, rng: Any = None) -> np.ndarray:
        out: np.ndarray = np.round(self.rng.normal(0.0, float(sigma), size)).astype(np.int64)
        return out

    def install(self) -> None:
        import fedforest_secure.privacy as privacy

        privacy.sample_discrete_gaussian = self.sample


def evaluate(data: Data, variant: Variant, eps: float, seeds: list[int],
             paired: PairedNoise | None = None, key: str = "") -> float:
    """Mean score of ``secure-dp`` with the variant over ``seeds`` at ``eps`` (``paired``:
    the noise stream restarted from ``key`` and ``eps``)."""
    if paired is not None:
        paired.restart(f"{key}-{eps}")
    X, y, _, task = data
    params: dict[str, Any] = {}
    if variant.shape is not None:
        n_train = int(round(0.7 * y.size))
        k = int(np.unique(y).size) if task == "classification" else 0
        shape = variant.shape(eps, n_train, X.shape[1], k, task)
        params = {key: shape[key] for key in ("n_estimators", "max_depth", "n_bins", "method")
                  if key in shape}
    from fedforest_secure.privacy import allocation

    saved = {name: getattr(allocation, name) for name, _ in variant.constants}
    try:
        for name, value in variant.constants:
            setattr(allocation, name, value)
        allocation._job_noise.cache_clear()  # noise plans made under other constants
        res = run_comparison(data=data, epsilons=(eps,), seeds=seeds,
                             methods=["fedforest-secure-dp"], dp_params=params,
                             dp_profile=variant.profile)
    finally:
        for name, value in saved.items():
            setattr(allocation, name, value)
        allocation._job_noise.cache_clear()
    st = res.stats("fedforest-secure-dp", eps)
    return math.nan if st is None else st[0]


def flamby_heart(epsilons: list[float], fits: int) -> None:
    """docs/privacy.md §4: ``secure-dp`` on FLamby's Fed-Heart-Disease (the four hospitals as
    the clients, FLamby's split), pooled test accuracy and per hospital, ``random_state``
    0 .. fits - 1 (the DP noise is fresh in every fit)."""
    from sklearn.metrics import accuracy_score

    from fedforest_secure import FedForestClassifier
    from fedforest_secure.experiments.loaders import load_fed_heart_disease
    from fedforest_secure.privacy import load_profile

    tt = load_fed_heart_disease()
    tr, te = tt.train, tt.test
    if tr.client is None or te.client is None:
        raise ValueError("the heart data must name each row's hospital")
    print("| profile | accuracy | per hospital |")
    print("|---|---|---|")
    for eps in epsilons:
        pooled, per = [], []
        for s in range(fits):
            model = FedForestClassifier(profile=load_profile("secure-dp", epsilon=eps),
                                        random_state=s).fit(tr.X, tr.y, client=tr.client)
            pred = model.predict(te.X)
            pooled.append(accuracy_score(te.y, pred))
            per.append([accuracy_score(te.y[te.client == k], pred[te.client == k])
                        for k in np.unique(te.client)])
        hosp = " ".join(f"{v:.3f}" for v in np.mean(per, axis=0))
        print(f"| secure-dp ε = {eps:g} | {np.mean(pooled):.3f} ± {np.std(pooled):.3f} | "
              f"{hosp} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--epsilons", default="0.5,1,2,4,8")
    ap.add_argument("--seeds", type=int, default=6, help="seeds first .. first + n - 1")
    ap.add_argument("--first-seed", type=int, default=100,
                    help="first seed (>= 100: the comparison uses 0-9)")
    ap.add_argument("--paired", action="store_true",
                    help="the same seeded noise stream for every variant (module docstring)")
    ap.add_argument("--flamby", action="store_true",
                    help="instead: secure-dp on FLamby's heart data (docs/privacy.md §4)")
    args = ap.parse_args(argv)
    if args.flamby:
        flamby_heart([e for e in parse_epsilons(args.epsilons) if math.isfinite(e)],
                     args.seeds)
        return 0
    sets = [s for s in args.sets.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    for name in sets + variants:
        if name not in SETS and name not in VARIANTS:
            ap.error(f"unknown set or variant {name!r}")
    eps_list = [e for e in parse_epsilons(args.epsilons) if math.isfinite(e)]
    if args.first_seed < 100:
        ap.error("--first-seed must be >= 100 (the comparison's seeds are 0-9)")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    paired = PairedNoise() if args.paired else None
    if paired is not None:
        paired.install()
    print(f"# seeds {seeds[0]}-{seeds[-1]}, mean balanced accuracy (R² for regression)")
    print("| data | variant | " + " | ".join(f"ε={e:g}" for e in eps_list) + " |")
    print("|---|---|" + "---|" * len(eps_list))
    t0 = time.perf_counter()
    for s in sets:
        data = SETS[s]()
        for v in variants:
            cells = [evaluate(data, VARIANTS[v], e, seeds, paired, s) for e in eps_list]
            print(f"| {s} | {v} | " + " | ".join(f"{c:.3f}" for c in cells) + " |",
                  flush=True)
    print(f"# {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
