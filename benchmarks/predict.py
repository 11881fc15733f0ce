"""Prediction time of a soft-routed forest against the same forest's hard splits.

A DP random-split classifier (``secure-dp``, epsilon 8: 128 trees of depth 8 with soft routing,
the shipped setting) is fitted once on 4,000 rows of six skewed features over four clients.
Then, for each size, the forest's probabilities (``ForestModel.values_of``, what
``predict_proba`` returns) with its soft routing and with the same trees' hard splits (the
model without its routing) are timed alternately, in this one
process (CPU seconds, ``time.process_time``), and the table gives the soft / hard ratio:

    python benchmarks/predict.py                           # n = 300, 10k, 100k, 3 repetitions
    python benchmarks/predict.py --sizes 1000 --repeat 5
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import at_least  # noqa: E402
from speed import _load, _state  # noqa: E402

import fedforest_secure  # noqa: E402
from fedforest_secure import FedForestClassifier, load_profile  # noqa: E402
from fedforest_secure.model import ForestModel  # noqa: E402


def _rows(n: int, seed: int) -> np.ndarray:
    return np.exp(0.8 * np.random.default_rng(seed).normal(size=(n, 6)))


def _forest(epsilon: float) -> ForestModel:
    X = _rows(4000, 0)
    y = (np.log(X[:, 0]) + np.log(X[:, 1]) > 0).astype(int) + (np.log(X[:, 2]) > 1)
    est = FedForestClassifier(profile=load_profile("secure-dp", epsilon=epsilon),
                              random_state=0).fit(X, y, client=np.arange(4000) % 4)
    model: ForestModel = est.model_
    return model


def _seconds(model: ForestModel, X: np.ndarray) -> float:
    t0 = time.process_time()
    model.values_of(X)
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[300, 10_000, 100_000])
    ap.add_argument("--repeat", type=at_least(1), default=3)
    ap.add_argument("--epsilon", type=float, default=8.0)
    args = ap.parse_args(argv)
    soft = _forest(args.epsilon)
    if soft.routing is None:
        raise SystemExit("the fitted forest has no soft routing")
    hard = dataclasses.replace(soft, routing=None)
    depth = max(t.depth for t in soft.trees)
    print(f"{len(soft.trees)} trees (depth <= {depth}), width {soft.routing.width}, "
          f"epsilon {args.epsilon}; median of {args.repeat}; "
          f"fedforest_secure {_state(str(Path(fedforest_secure.__file__).parent))}; "
          f"load {_load()}")
    print("| rows | soft routing CPU s | hard splits CPU s | soft / hard |")
    print("|--:|--:|--:|--:|")
    for n in args.sizes:
        X = _rows(n, 11)
        X[np.random.default_rng(2).random(X.shape) < 0.05] = np.nan  # some missing values
        s, h = [], []
        for _ in range(args.repeat):
            s.append(_seconds(soft, X))
            h.append(_seconds(hard, X))
        ms, mh = statistics.median(s), statistics.median(h)
        print(f"| {n:,} | {ms:.3f} | {mh:.3f} | {ms / mh:.1f} |", flush=True)
    print(f"load at the end {_load()}")


if __name__ == "__main__":
    main()
