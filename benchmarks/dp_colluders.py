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
    python benchmarks/dp_colluders.py --colluders 2 --sites 5,10,30   # 3 sites allow 1

Every number of sites must allow ``--colluders``; one that does not is a usage error, before
any output, naming the given numbers that do and the fewest sites that do.
"""

from __future__ import annotations

import argparse

from fedforest_secure import secure_sum
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError
from fedforest_secure.privacy import PrivacyProfile, load_profile
from fedforest_secure.privacy.allocation import job_noise
from fedforest_secure.secagg._rounds import job_threshold


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--colluders", type=int, default=0, help="the profile's dp.colluders")
    ap.add_argument("--sites", default="3,5,10,30", help="numbers of sites, comma-separated "
                    "(each must allow --colluders: c below min(2t - n, t - 1))")
    args = ap.parse_args(argv)
    try:
        sites = [int(s) for s in args.sites.split(",")]
    except ValueError:
        ap.error(f"--sites: comma-separated whole numbers, got {args.sites!r}")
    if any(n < 3 for n in sites):
        ap.error(f"--sites: secure-dp needs at least 3 sites, got {args.sites!r}")
    try:
        prof = load_profile("secure-dp", epsilon=args.epsilon, colluders=args.colluders)
        rows = []
        for n in sites:
            try:
                rows += _rows(prof, n)
            except FedForestError as exc:  # too few sites for the colluders: before any output
                ap.error(f"--sites: {exc}. {_sites_hint(prof, args.colluders, sites)}")
    except FedForestError as exc:
        ap.error(str(exc))
    print(f"secure-dp, epsilon = {args.epsilon:g}, dp.colluders = {args.colluders}")
    print("| sites n | t | K_min | colluders c | epsilon against c colluders |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


def _largest_coalition(prof: PrivacyProfile, n: int) -> tuple[int, int]:
    """``(t, c)``: the threshold of ``n`` sites and the largest coalition a sum keeps a
    vector from (below ``min(2t - n, t - 1)``)."""
    t = job_threshold(prof.threshold, n)
    return t, min(2 * t - n, t - 1) - 1


def _sites_hint(prof: PrivacyProfile, colluders: int, sites: list[int]) -> str:
    """What to pass instead: the given numbers of sites that allow ``colluders``, and the
    fewest sites that do (the bound is not monotone in n: 9 sites allow 4, 10 allow 3)."""
    fit = [n for n in sites if _largest_coalition(prof, n)[1] >= colluders]
    fewest = next((n for n in range(3, 4 * colluders + 10)
                   if _largest_coalition(prof, n)[1] >= colluders), None)
    hint = f"Pass --sites with numbers of sites that allow {colluders} colluders"
    if fit:
        hint += f": of yours, --sites {','.join(map(str, fit))}"
    return hint + (f" (the fewest that allow {colluders}: {fewest})" if fewest else "")


def _rows(prof: PrivacyProfile, n: int) -> list[str]:
    cfg = JobConfig(job_id="j", task="classification", n_features=4, n_classes=2,
                    n_clients=n, feature_bounds=tuple((-1.0, 1.0) for _ in range(4)),
                    n_estimators=64, max_depth=6, min_samples_leaf=1, max_features=1,
                    n_bins=32, method="random", row_sampling="all", criterion="gini",
                    profile=prof.to_dict())
    plan = job_noise(cfg, secure_sum.noise_units(cfg))
    t, most = _largest_coalition(prof, n)
    return [f"| {n} | {t} | {plan.k_min} | {c} | {plan.epsilon_against(c):.2f} |"
            for c in sorted({c for c in (1, 2, 3, most) if 1 <= c <= most})]


if __name__ == "__main__":
    main()
