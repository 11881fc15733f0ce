"""How much the 10-seed mean of ``secure-dp`` in ``fedforest compare`` moves from run to run.

The DP noise is fresh in every fit, so one run of the comparison is one draw of each cell's
10-seed mean. This script repeats the ``secure-dp`` fits of ``run_comparison`` (same splits,
seeds 0 .. seeds - 1) ``--repeats`` times per value of ``allocation.LEAF_SHRINK`` and of
``allocation.LEAF_VOTE_COUNTS_ABOVE`` (``inf``: leaf votes always averaged proportions) and of
``allocation.LEAF_CLASS_BALANCED`` (``--balanced``: 1 node values under uniform class priors,
0 under the training rows' class frequencies) and of ``allocation.CLASS_TOTALS_SHARE``
(``--class-totals``: the share of the class totals released at epsilon <= 2, 0 for none) and
of ``allocation.CLASS_TOTALS_COUNT_VOTES`` (``--totals-votes``: 1 summed weighted counts, 0
averaged proportions, with the class totals) and of ``allocation.SOFT_ROUTING_WIDTH``
(``--routing``: the soft routing's width at prediction, 0 for hard splits) and prints
each run's means and, per epsilon, their mean and standard deviation over the runs
(docs/privacy.md §3, "Repeats"). It measures; nothing is chosen with it.

Usage::

    nice -n 10 python benchmarks/dp_repeats.py --dataset breast_cancer --repeats 5
    nice -n 10 python benchmarks/dp_repeats.py --dataset wine --shrink 0 --vote-above 4,inf
    nice -n 10 python benchmarks/dp_repeats.py --dataset breast_cancer --shrink 0 --balanced 0,1
    nice -n 10 python benchmarks/dp_repeats.py --dataset wine --shrink 0 --class-totals 0.05,0
"""

from __future__ import annotations

import argparse

import numpy as np

from fedforest_secure.experiments.compare import parse_epsilons, run_comparison
from fedforest_secure.privacy import allocation


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--epsilons", default="0.5,1,8")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shrink", default="0,0.5", help="values of allocation.LEAF_SHRINK")
    ap.add_argument("--vote-above", default=str(allocation.LEAF_VOTE_COUNTS_ABOVE),
                    help="values of allocation.LEAF_VOTE_COUNTS_ABOVE (inf: proportions)")
    ap.add_argument("--balanced", default=str(int(allocation.LEAF_CLASS_BALANCED)),
                    help="values of allocation.LEAF_CLASS_BALANCED (0 or 1)")
    ap.add_argument("--class-totals", default=str(allocation.CLASS_TOTALS_SHARE),
                    help="values of allocation.CLASS_TOTALS_SHARE (0: no class totals)")
    ap.add_argument("--totals-votes", default=str(int(allocation.CLASS_TOTALS_COUNT_VOTES)),
                    help="values of allocation.CLASS_TOTALS_COUNT_VOTES (0 or 1)")
    ap.add_argument("--routing", default=str(allocation.SOFT_ROUTING_WIDTH),
                    help="values of allocation.SOFT_ROUTING_WIDTH (0: hard splits)")
    args = ap.parse_args(argv)
    eps = [e for e in parse_epsilons(args.epsilons) if np.isfinite(e)]
    saved = (allocation.LEAF_SHRINK, allocation.LEAF_VOTE_COUNTS_ABOVE,
             allocation.LEAF_CLASS_BALANCED, allocation.CLASS_TOTALS_SHARE,
             allocation.CLASS_TOTALS_COUNT_VOTES, allocation.SOFT_ROUTING_WIDTH)
    rules = [(float(c), float(v), bool(int(b)), float(t), bool(int(tv)), float(w))
             for c in args.shrink.split(",") if c
             for v in args.vote_above.split(",") if v
             for b in args.balanced.split(",") if b
             for t in args.class_totals.split(",") if t
             for tv in args.totals_votes.split(",") if tv
             for w in args.routing.split(",") if w]
    try:
        for c, above, bal, share, tvotes, width in rules:
            (allocation.LEAF_SHRINK, allocation.LEAF_VOTE_COUNTS_ABOVE,
             allocation.LEAF_CLASS_BALANCED, allocation.CLASS_TOTALS_SHARE,
             allocation.CLASS_TOTALS_COUNT_VOTES, allocation.SOFT_ROUTING_WIDTH) = (
                c, above, bal, share, tvotes, width)
            allocation._job_noise.cache_clear()  # noise plans made under other constants
            name = (f"c={c:g} votes>={above:g} balanced={int(bal)} class_totals={share:g} "
                    f"totals_votes={int(tvotes)} routing={width:g}")
            runs = []
            for r in range(args.repeats):
                res = run_comparison(args.dataset, epsilons=eps, seeds=args.seeds,
                                     methods=["fedforest-secure-dp"])
                means = []
                for e in eps:
                    st = res.stats("fedforest-secure-dp", e)
                    means.append(float("nan") if st is None else st[0])
                runs.append(means)
                print(f"{args.dataset} {name} run {r}: "
                      + " ".join(f"{m:.3f}" for m in means), flush=True)
            a = np.array(runs)
            print(f"{args.dataset} {name} over {args.repeats} runs: mean "
                  + " ".join(f"{m:.3f}" for m in a.mean(axis=0)) + ", std "
                  + " ".join(f"{s:.3f}" for s in a.std(axis=0, ddof=1)), flush=True)
    finally:
        (allocation.LEAF_SHRINK, allocation.LEAF_VOTE_COUNTS_ABOVE,
         allocation.LEAF_CLASS_BALANCED, allocation.CLASS_TOTALS_SHARE,
         allocation.CLASS_TOTALS_COUNT_VOTES, allocation.SOFT_ROUTING_WIDTH) = saved
        allocation._job_noise.cache_clear()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
