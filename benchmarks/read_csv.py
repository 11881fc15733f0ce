"""CPU seconds of reading a site's CSV table through its schema (``Schema.read_csv``).

A synthetic table of n rows, d continuous features with public bounds and a regression target
(numbers written with ``repr``), read ``--repeat`` times; prints the best CPU time per size as a
Markdown table:

    python benchmarks/read_csv.py                       # n = 10k, 100k; d = 20
    python benchmarks/read_csv.py --sizes 1000000 --repeat 1

Compare two versions of the code side by side by running this script alternately with each
version first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from _cli import at_least

from fedforest_secure.schema import Schema


def _table(path: Path, n: int, d: int) -> Schema:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d))
    y = X[:, 0] + rng.normal(size=n)
    names = [f"x{j}" for j in range(d)]
    with path.open("w") as fh:
        fh.write(",".join([*names, "y"]) + "\n")
        for row, target in zip(X.tolist(), y.tolist(), strict=True):
            fh.write(",".join(map(repr, [*row, target])) + "\n")
    return Schema.from_dict({
        "target": {"name": "y", "kind": "regression", "bounds": [-20.0, 20.0]},
        "features": [{"name": c, "kind": "continuous", "bounds": [-10.0, 10.0]}
                     for c in names]})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--features", type=int, default=20)
    ap.add_argument("--repeat", type=at_least(1), default=3)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            path = Path(tmp) / f"site-{n}.csv"
            schema = _table(path, n, args.features)
            best = np.inf
            for _ in range(args.repeat):
                t0 = time.process_time()
                X, _, _ = schema.read_csv(path)
                best = min(best, time.process_time() - t0)
            assert X.shape == (n, args.features)
            rows.append((n, best, path.stat().st_size / 2**20))
    print(f"| rows | d | CSV MiB | read_csv CPU s (best of {args.repeat}) |")
    print("|---:|---:|---:|---:|")
    for n, sec, mib in rows:
        print(f"| {n:,} | {args.features} | {mib:.1f} | {sec:.3f} |")


if __name__ == "__main__":
    main()
