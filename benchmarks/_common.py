"""Shared pieces of the paper benchmarks: the paper's hyper-parameters, the method zoo, metrics,
client-stratified hold-outs and plain-text (Markdown) tables."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.metrics import accuracy_score, balanced_accuracy_score, mean_squared_error, r2_score

from fedforest_secure import FedForestClassifier, FedForestRegressor
from fedforest_secure.experiments.baselines import CentralizedRF, LocalEnsemble, LocalLearning

# The paper's setting (Section 5, "Experimental setting"): T = 50 trees, depth 8, min leaf 5,
# B = 32 candidates per feature, L = 3 for AvgImp/Top-L, max_features d/3 (regression) and
# sqrt(d) (classification), client-stratified bootstrap (FedForest's bootstrap=True).
PAPER_HP: dict[str, Any] = {"n_estimators": 50, "max_depth": 8, "min_samples_leaf": 5,
                            "n_bins": 32, "top_l": 3}

# Method names used in every table.
CENT_X = "Centralized RF (X)"
CENT_XH = "Centralized RF (X,H)"
QUANT_X = "FedForest Quantiles (X)"
QUANT_XH = "FedForest Quantiles (X,H)"
AVG_X = "FedForest AvgImp/Top-3 (X)"
AVG_XH = "FedForest AvgImp/Top-3 (X,H)"
HIST = "Fed Histogram (Kalloori)"
ENS = "Local Ensemble (Hauschild)"
LOCAL = "Local Learning"
# FedForest under the ``secure`` privacy profile: secure aggregation of every statistic, the
# pooled ``secure_cdf`` sketch, sums over >= 3 clients, no H-splits.
SECURE_X = "FedForest secure (X)"

ALL_METHODS = (CENT_X, CENT_XH, QUANT_X, QUANT_XH, AVG_X, AVG_XH, HIST, ENS, LOCAL, SECURE_X)
# Short names for ``--methods``.
METHOD_KEYS = {"cent_x": CENT_X, "cent_xh": CENT_XH, "quant_x": QUANT_X, "quant_xh": QUANT_XH,
               "avg_x": AVG_X, "avg_xh": AVG_XH, "hist": HIST, "ens": ENS, "local": LOCAL,
               "secure_x": SECURE_X}


def max_features_for(task: str) -> Any:
    return 1 / 3 if task == "regression" else "sqrt"


def make_method(name: str, task: str, seed: int, n_estimators: int | None = None,
                max_features: Any = None) -> Any:
    """A fresh, unfitted model for method ``name`` with the paper's hyper-parameters.

    Every model has ``fit(X, y, client=h)`` and ``predict(X, client=h)``; FedForest runs the
    in-process protocol with the ``open`` profile, except :data:`SECURE_X` (the ``secure``
    profile, same hyper-parameters). ``max_features=None``: the paper's d/3 or sqrt(d).
    """
    T = n_estimators or PAPER_HP["n_estimators"]
    mf = max_features_for(task) if max_features is None else max_features
    tree = {"n_estimators": T, "max_depth": PAPER_HP["max_depth"],
            "min_samples_leaf": PAPER_HP["min_samples_leaf"], "max_features": mf,
            "random_state": seed}
    if name in (CENT_X, CENT_XH):
        return CentralizedRF(task=task, use_client=name == CENT_XH, **tree)
    if name == ENS:
        return LocalEnsemble(task=task, **tree)
    if name == LOCAL:
        return LocalLearning(task=task, **tree)
    Fed = FedForestRegressor if task == "regression" else FedForestClassifier
    fed = dict(tree, n_bins=PAPER_HP["n_bins"], bootstrap=True, profile="open")
    if name in (QUANT_X, QUANT_XH):
        return Fed(method="quantiles", split_on_client=name == QUANT_XH, **fed)
    if name in (AVG_X, AVG_XH):
        return Fed(method="avgimp", top_l=PAPER_HP["top_l"], split_on_client=name == AVG_XH,
                   **fed)
    if name == HIST:
        return Fed(method="histogram", **fed)
    if name == SECURE_X:
        # the profile sets the sketch (secure_cdf), abstention and the minimum of 3 clients
        return Fed(method="quantiles", **dict(fed, profile="secure"))
    raise ValueError(f"unknown method {name!r}")


# ------------------------------------------------------------------------------- metrics
def mse(y: np.ndarray, p: np.ndarray) -> float:
    return float(mean_squared_error(y, p))


def r2(y: np.ndarray, p: np.ndarray) -> float:
    return float(r2_score(y, p))


def bacc(y: np.ndarray, p: np.ndarray) -> float:
    return float(balanced_accuracy_score(y, p))


def acc(y: np.ndarray, p: np.ndarray) -> float:
    return float(accuracy_score(y, p))


@dataclass
class Run:
    """One fit + predict: the predictions and the fit time."""

    pred: np.ndarray
    fit_s: float


def fit_predict(model: Any, X: np.ndarray, y: np.ndarray, h: np.ndarray, X_test: np.ndarray,
                h_test: np.ndarray) -> Run:
    t0 = time.perf_counter()
    model.fit(X, y, client=h)
    fit_s = time.perf_counter() - t0
    return Run(np.asarray(model.predict(X_test, client=h_test)), fit_s)


# ------------------------------------------------------------------------------- splits
def client_holdout(client: np.ndarray, test_size: float,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Hold out ``round(test_size * n_k)`` rows of every client (at least one row stays in
    training), so the test rows are a sample of the client mixture with known clients."""
    tr, te = [], []
    for c in np.unique(client):
        rows = rng.permutation(np.flatnonzero(client == c))
        n_test = min(int(round(test_size * rows.size)), rows.size - 1)
        te.append(rows[:n_test])
        tr.append(rows[n_test:])
    return np.sort(np.concatenate(tr)), np.sort(np.concatenate(te))


# ------------------------------------------------------------------------------- stats
def mean_std(values: Sequence[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return math.nan, math.nan
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def _digits(std: float) -> int:
    if not np.isfinite(std) or std <= 0:
        return 3
    return int(min(4, max(2, 1 - math.floor(math.log10(std)))))


def fmt(values: Sequence[float] | None, digits: int | None = None) -> str:
    """``mean ± std`` (sample std over reps); two significant digits of the std."""
    if values is None or len(values) == 0:
        return "-"
    m, s = mean_std(values)
    dg = digits if digits is not None else _digits(s)
    if len(values) == 1:
        return f"{m:.{dg}f}"
    return f"{m:.{dg}f} ± {s:.{dg}f}"


def table(title: str, header: Sequence[str], rows: Iterable[Sequence[str]],
          notes: Sequence[str] = ()) -> str:
    """A Markdown pipe table with aligned columns, preceded by ``### title``."""
    rows = [list(map(str, r)) for r in rows]
    header = list(header)
    width = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    left = [True] + [False] * (len(header) - 1)

    def line(cells: Sequence[str]) -> str:
        out = [c.ljust(w) if lf else c.rjust(w)
               for c, w, lf in zip(cells, width, left, strict=True)]
        return "| " + " | ".join(out) + " |"

    sep = "|" + "|".join((":" if lf else "") + "-" * (w + 1 - lf) + ("" if lf else ":")
                         for w, lf in zip(width, left, strict=True)) + "|"
    text = [f"### {title}", "", line(header), sep] + [line(r) for r in rows]
    if notes:
        text.append("")
        text += [f"- {n}" for n in notes]
    return "\n".join(text) + "\n"


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


Timer = Callable[[], float]
