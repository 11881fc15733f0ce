"""CPU seconds of one in-process FedForest fit, by part of the engine.

``time.process_time`` around each part (no profiler, so the parts cost what they cost in a
plain fit), after one unmeasured warm-up fit on 1,000 other rows. The data, forest and clients
are those of ``benchmarks/speed.py`` (synthetic regression, d = 20, K = 10, T = 50, depth 8,
min leaf 5, d/3 features). Prints a Markdown table, one column per size:

    python benchmarks/speed_parts.py                       # n = 10k, open profile
    python benchmarks/speed_parts.py --sizes 10000 100000 --profile secure

Compare two versions of the code side by side by running this script alternately with each
version first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed import _data  # noqa: E402

from fedforest_secure import (  # noqa: E402
    FedForestRegressor,
    _candidates,
    _level_stats,
    coordinator,
    worker,
)


def _timed(totals: dict[str, float], owner: Any, name: str, key: str) -> None:
    """Replace ``owner.name`` by a wrapper adding its CPU seconds to ``totals[key]``."""
    inner: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(inner)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0.0) + time.process_time() - t0

    setattr(owner, name, timed)


def _instrument() -> dict[str, float]:
    totals: dict[str, float] = {}
    coord, work = coordinator.Coordinator, worker.Worker
    _timed(totals, coord, "next_task", "coord")
    _timed(totals, coord, "submit", "coord")
    _timed(totals, _candidates, "pooled_sketch_candidates", "pooled")
    _timed(totals, coordinator, "grow", "grow")  # imported there by name
    _timed(totals, work, "_sketch", "sketch")
    _timed(totals, work, "_sort_level", "order")
    _timed(totals, _level_stats.LevelStatistics, "quantile_points", "points")
    _timed(totals, work, "_histogram", "hist")
    _timed(totals, work, "__init__", "build")
    return totals


def _fit(n: int, profile: str, seed: int = 0) -> None:
    X, y, h = _data(n, 20, 10, seed=seed)
    FedForestRegressor(n_estimators=50, max_depth=8, min_samples_leaf=5, max_features=1 / 3,
                       profile=profile, random_state=0).fit(X, y, client=h)


def parts(n: int, profile: str, totals: dict[str, float]) -> list[tuple[str, float]]:
    """One measured fit at ``n`` rows: ``(part, CPU seconds)`` rows summing to the fit."""
    totals.clear()
    t0 = time.process_time()
    _fit(n, profile)
    whole = time.process_time() - t0
    g = totals.get
    rest = whole - g("coord", 0.0) - g("sketch", 0.0) - g("hist", 0.0) - g("build", 0.0)
    return [
        ("whole fit", whole),
        ("coordinator: pooled sketch candidates", g("pooled", 0.0)),
        (f"coordinator: the rest (growing the trees {g('grow', 0.0):.2f})",
         g("coord", 0.0) - g("pooled", 0.0)),
        ("workers, sketch rounds: level order (build and sort)", g("order", 0.0)),
        ("workers, sketch rounds: quantile points", g("points", 0.0)),
        ("workers, sketch rounds: routing, node totals, the rest",
         g("sketch", 0.0) - g("order", 0.0) - g("points", 0.0)),
        ("workers, histogram rounds", g("hist", 0.0)),
        ("building the workers (codes, bootstrap)", g("build", 0.0)),
        ("summing the replies and the rest", rest),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000])
    ap.add_argument("--profile", default="open", choices=["open", "secure"])
    args = ap.parse_args()
    if any(n < 100 for n in args.sizes):
        ap.error("--sizes: each size must be at least 100 rows")
    totals = _instrument()
    _fit(1000, args.profile, seed=1)  # warm-up: imports and first-call set-up left out
    columns = [parts(n, args.profile, totals) for n in args.sizes]
    print("| part | " + " | ".join(f"n = {n:,}" for n in args.sizes) + " |")
    print("|---|" + "--:|" * len(args.sizes))
    for i, (name, _) in enumerate(columns[0]):
        print(f"| {name} | " + " | ".join(f"{col[i][1]:.2f}" for col in columns) + " |")


if __name__ == "__main__":
    main()
