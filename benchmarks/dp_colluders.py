"""What epsilon a ``secure-dp`` job's noise holds against the server and ``c`` colluding sites.

The noise is distributed: each site adds a share calibrated so that ``K_min - colluders`` sites'
noise together spends the job's (epsilon, delta) (``dp.colluders``, default 0). A colluding site
knows (or never adds) its own share and the server may drop honest sites down to ``K_min``, so
against ``c`` colluders a released sum carries the noise of ``K_min - c`` sites. For each number
of sites and ``c`` = 1, 2, 3 and the largest ``c`` below ``min(2t - n, t - 1)`` (past it the
coalition may unmask one site's vector, which carries that site's share alone) this prints the
plan's epsilon against ``c`` colluders
(:meth:`~fedforest_secure.privacy.allocation.JobNoise.epsilon_against`, the project's own
accountant), for a random-split classification job of the ``secure-dp`` profile
(docs/privacy.md, "Colluding sites"; README.md and threat_model.md quote its output).

Usage::

    python benchmarks/dp_colluders.py                       # epsilon = 1, dp.colluders = 0
    python benchmarks/dp_colluders.py --epsilon 4 --colluders 1
"""

from __future__ import annotations

import argparse

from fedforest_secure import secure_sum
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError
from fedforest_secure.privacy import load_profile
from fedforest_secure.privacy.allocation import job_noise
from fedforest_secure.secagg._rounds import job_threshold


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--colluders", type=int, default=0, help="the profile's dp.colluders")
    ap.add_argument("--sites", default="3,5,10,30", help="numbers of sites, comma-separated")
    args = ap.parse_args(argv)
    try:
        sites = [int(s) for s in args.sites.split(",")]
    except ValueError:
        ap.error(f"--sites: comma-separated whole numbers, got {args.sites!r}")
    if any(n < 3 for n in sites):
        ap.error(f"--sites: secure-dp needs at least 3 sites, got {args.sites!r}")
    try:
        _table(args.epsilon, args.colluders, sites)
    except FedForestError as exc:
        ap.error(str(exc))


def _table(epsilon: float, colluders: int, sites: list[int]) -> None:
    print(f"secure-dp, epsilon = {epsilon:g}, dp.colluders = {colluders}")
    print("| sites n | t | K_min | colluders c | epsilon against c colluders |")
    print("|---|---|---|---|---|")
    for n in sites:
        prof = load_profile("secure-dp", epsilon=epsilon, colluders=colluders)
        cfg = JobConfig(job_id="j", task="classification", n_features=4, n_classes=2,
                        n_clients=n, feature_bounds=tuple((-1.0, 1.0) for _ in range(4)),
                        n_estimators=64, max_depth=6, min_samples_leaf=1, max_features=1,
                        n_bins=32, method="random", row_sampling="all", criterion="gini",
                        profile=prof.to_dict())
        plan = job_noise(cfg, secure_sum.noise_units(cfg))
        t = job_threshold(prof.threshold, n)
        most = min(2 * t - n, t - 1) - 1  # the largest coalition a sum keeps a vector from
        for c in sorted({c for c in (1, 2, 3, most) if 1 <= c <= most}):
            eps = plan.epsilon_against(c)
            print(f"| {n} | {t} | {plan.k_min} | {c} | {eps:.2f} |")


if __name__ == "__main__":
    main()
