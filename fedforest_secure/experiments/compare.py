"""Utility with and without privacy: FedForest profiles against central baselines.

:func:`run_comparison` trains, on the same train/test split and the same client partition per
seed, every method of the comparison and scores it on the held-out rows:

========================  ==================================================================
``fedforest-open``        FedForest, ``open`` profile (the paper's protocol in the clear)
``fedforest-secure``      FedForest, ``secure`` profile (secure aggregation, pooled CDF sketch)
``fedforest-secure-dp``   FedForest, ``load_profile("secure-dp", epsilon=eps)`` at each finite
                          epsilon, hyper-parameters left unset so the DP defaults apply
``diffprivlib-rf``        diffprivlib's centrally trained DP ``RandomForestClassifier`` at each
                          finite epsilon (classification only: diffprivlib 0.6 has no DP
                          random-forest regressor)
``diffprivlib-linreg``    diffprivlib's central DP ``LinearRegression`` (regression only; the
                          only DP regressor diffprivlib ships)
``dp-ebm``                InterpretML's DP-EBM (Nori et al. 2021; ``DPExplainableBoosting*`` of
                          the optional ``interpret-core``), central DP at each finite epsilon,
                          delta = 1e-6, binary classification and regression only; left out
                          with a note in ``settings["notes"]`` when it cannot run
``centralized-rf``        scikit-learn random forest on the pooled training rows (no privacy)
``local``                 local learning: one forest per client, each test row predicted by
                          its owner's forest
========================  ==================================================================

Protocol per seed ``s``: a 70/30 split (stratified for classification) with ``random_state=s``;
the training rows are spread over ``K`` clients by :func:`~.partitions.dirichlet_partition` on the
training features (covariate shift; concentration ``alpha``). Held-out rows get an owner for
local learning: their nearest training row's client (standardised features), i.e. a held-out
sample of the client mixture. A table with its own client column keeps it instead; a site
whose rows all fall in a seed's held-out 30% has them moved to that seed's training rows (with
a note in ``settings["notes"]``), so every method trains on every site.
The metric is balanced accuracy (classification; or accuracy, ``metric="accuracy"``) or R^2
(regression): :data:`METRICS`. Nothing is tuned on the
test rows. The module has no network code and draws nothing: the ``fedforest compare`` command
renders the result (``fedforest_cli.compare_view``).
"""

from __future__ import annotations

import csv
import io
import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..estimators import FedForestClassifier, FedForestRegressor
from ..files import write_atomic
from ..privacy import load_profile
from ._compare_data import _Split, _split, load_csv_table
from .baselines import CentralizedRF, LocalLearning
from .loaders import load_dataset

__all__ = [
    "DP_METHODS",
    "METHOD_LABELS",
    "METRICS",
    "ComparisonResult",
    "csv_text",
    "load_csv_table",
    "parse_epsilons",
    "read_csv",
    "run_comparison",
    "to_csv",
]

INF = math.inf

#: Human-readable names, in table order.
METHOD_LABELS: dict[str, str] = {
    "fedforest-open": "FedForest open",
    "fedforest-secure": "FedForest secure",
    "fedforest-secure-dp": "FedForest secure-dp",
    "diffprivlib-rf": "diffprivlib RF (central DP)",
    "diffprivlib-linreg": "diffprivlib LinearRegression (central DP)",
    "dp-ebm": "DP-EBM (interpret, central DP)",
    "centralized-rf": "Centralized RF (sklearn)",
    "local": "Local learning",
}
#: Methods trained once per finite epsilon; the others once per seed (shown under epsilon = inf).
DP_METHODS = ("fedforest-secure-dp", "diffprivlib-rf", "diffprivlib-linreg", "dp-ebm")


def parse_epsilons(text: str | Iterable[Any]) -> list[float]:
    """``"0.5,1,inf"`` (or an iterable) -> sorted unique floats; ``inf`` means "no DP"."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: set[float] = set()
    for item in items:
        s = str(item).strip().lower()
        if not s:
            continue
        try:
            v = INF if s in ("inf", "infinity", "∞", "none") else float(s)
        except ValueError:
            raise ValueError(f"epsilon must be a number > 0 or inf, got {item!r}") from None
        if math.isnan(v) or v <= 0:
            raise ValueError(f"epsilon must be > 0 or inf, got {item!r}")
        out.add(v)
    if not out:
        raise ValueError("no epsilon given")
    return sorted(out)


def _eps_label(eps: float) -> str:
    return "inf" if math.isinf(eps) else f"{eps:g}"


@dataclass
class ComparisonResult:
    """Scores of every (method, epsilon) over the seeds.

    ``scores[method][eps]`` lists one score per seed (``eps = inf`` for the methods without
    DP). ``seconds[method]`` is the total training+prediction time of the method.
    """

    dataset: str
    task: str
    metric: str
    epsilons: list[float]
    seeds: list[int]
    n_clients: int
    alpha: float
    scores: dict[str, dict[float, list[float]]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def methods(self) -> list[str]:
        order = list(METHOD_LABELS)
        return sorted(self.scores, key=lambda m: order.index(m) if m in order else len(order))

    @property
    def columns(self) -> list[float]:
        """Finite epsilons of the run, then inf (the column of the methods without DP)."""
        return [e for e in self.epsilons if math.isfinite(e)] + [INF]

    def add(self, method: str, eps: float, score: float, seconds: float) -> None:
        self.scores.setdefault(method, {}).setdefault(eps, []).append(float(score))
        self.seconds[method] = self.seconds.get(method, 0.0) + seconds

    def stats(self, method: str, eps: float) -> tuple[float, float, int] | None:
        """(mean, std, n) of a cell, or None if the method was not run there (std: ddof=0)."""
        vals = self.scores.get(method, {}).get(eps)
        if not vals:
            return None
        a = np.asarray(vals, dtype=np.float64)
        return float(a.mean()), float(a.std()), int(a.size)

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per (method, epsilon): the CSV rows."""
        out = []
        for m in self.methods:
            for eps in self.columns:
                st = self.stats(m, eps)
                if st is None:
                    continue
                out.append({"dataset": self.dataset, "task": self.task, "metric": self.metric,
                            "method": m, "label": METHOD_LABELS.get(m, m),
                            "epsilon": _eps_label(eps), "mean": st[0], "std": st[1],
                            "n_seeds": st[2],
                            "scores": ";".join(f"{v:.6f}" for v in self.scores[m][eps])})
        return out


# ------------------------------------------------------------------------------ methods
#: the metrics a comparison can score, per task (the first is the default)
METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("balanced_accuracy", "accuracy"),
    "regression": ("r2",),
}


def _score(metric: str, y: np.ndarray, pred: np.ndarray) -> float:
    from sklearn.metrics import accuracy_score, balanced_accuracy_score, r2_score

    if metric == "balanced_accuracy":
        return float(balanced_accuracy_score(y, pred))
    if metric == "accuracy":
        return float(accuracy_score(y, pred))
    return float(r2_score(y, pred))


def _fedforest(task: str, profile: Any, params: dict[str, Any], seed: int) -> Any:
    cls = FedForestClassifier if task == "classification" else FedForestRegressor
    return cls(profile=profile, random_state=seed, **params)


def _fit_predict(model: Any, s: _Split, with_client: bool = True) -> np.ndarray:
    if with_client:
        model.fit(s.Xtr, s.ytr, client=s.htr)
        return np.asarray(model.predict(s.Xte, client=s.hte))
    model.fit(s.Xtr, s.ytr)
    return np.asarray(model.predict(s.Xte))


def _quiet(fn: Callable[[], np.ndarray]) -> np.ndarray:
    """Run diffprivlib code with its warnings silenced (locally: the test suite errors on them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def _diffprivlib_rf(s: _Split, eps: float, params: dict[str, Any], seed: int) -> np.ndarray:
    from diffprivlib.models import RandomForestClassifier

    bounds = (s.Xtr.min(axis=0), s.Xtr.max(axis=0))  # from the training data
    model = RandomForestClassifier(
        n_estimators=int(params.get("n_estimators", 50)), epsilon=eps, bounds=bounds,
        classes=np.unique(s.ytr), max_depth=int(params.get("max_depth", 8)),
        random_state=seed, n_jobs=1)
    return _quiet(lambda: _fit_predict(model, s, with_client=False))


def _diffprivlib_linreg(s: _Split, eps: float, seed: int) -> np.ndarray:
    from diffprivlib.models import LinearRegression

    model = LinearRegression(epsilon=eps, bounds_X=(s.Xtr.min(axis=0), s.Xtr.max(axis=0)),
                             bounds_y=(float(s.ytr.min()), float(s.ytr.max())),
                             random_state=seed)
    return _quiet(lambda: _fit_predict(model, s, with_client=False))


def _dp_ebm(s: _Split, eps: float, task: str, seed: int) -> np.ndarray:
    from interpret.privacy import DPExplainableBoostingClassifier, DPExplainableBoostingRegressor

    bounds = {j: (float(a), float(b)) for j, (a, b) in
              enumerate(zip(s.Xtr.min(axis=0), s.Xtr.max(axis=0), strict=True))}
    kw: dict[str, Any] = {"epsilon": eps, "delta": 1e-6, "privacy_bounds": bounds,
                          "feature_types": ["continuous"] * s.Xtr.shape[1],
                          "random_state": seed, "n_jobs": 1}
    model: Any
    if task == "classification":
        model = DPExplainableBoostingClassifier(**kw)
    else:
        model = DPExplainableBoostingRegressor(privacy_target_min=float(s.ytr.min()),
                                               privacy_target_max=float(s.ytr.max()), **kw)
    return _quiet(lambda: _fit_predict(model, s, with_client=False))


def dp_ebm_unavailable(task: str, n_classes: int) -> str | None:
    """Why DP-EBM cannot run here (None if it can)."""
    if task == "classification" and n_classes != 2:
        return f"DP-EBM supports binary classification only ({n_classes} classes)"
    try:
        import interpret.privacy  # noqa: F401
    except ImportError:
        return ("DP-EBM left out: interpret-core is not installed "
                "(pip install 'fedforest-secure[dp]')")
    return None


def _default_methods(task: str, n_classes: int) -> tuple[list[str], list[str]]:
    dp_base = "diffprivlib-rf" if task == "classification" else "diffprivlib-linreg"
    out = ["fedforest-open", "fedforest-secure", "fedforest-secure-dp", dp_base]
    why = dp_ebm_unavailable(task, n_classes)
    if why is None:
        out.append("dp-ebm")
    return out + ["centralized-rf", "local"], [] if why is None else [why]


def run_comparison(
    dataset: str | None = None,
    *,
    epsilons: Sequence[float] | str = (0.5, 1, 2, 4, 8, INF),
    seeds: int | Sequence[int] = 5,
    n_clients: int = 4,
    alpha: float = 1.0,
    methods: Sequence[str] | None = None,
    fed_params: dict[str, Any] | None = None,
    dp_params: dict[str, Any] | None = None,
    dp_profile: dict[str, Any] | None = None,
    baseline_params: dict[str, Any] | None = None,
    data: tuple[np.ndarray, np.ndarray, np.ndarray | None, str] | None = None,
    name: str | None = None,
    metric: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> ComparisonResult:
    """Train and score every method on the same splits (module docstring).

    Parameters
    ----------
    dataset : name for :func:`~.loaders.load_dataset` (or pass ``data``)
    epsilons : finite values are the DP budgets; ``inf`` is always the no-DP column
    seeds : a count (seeds ``0..n-1``) or explicit seeds
    n_clients, alpha : Dirichlet partition of the training rows (ignored with a client column)
    methods : subset of :data:`METHOD_LABELS` (default: all that apply to the task)
    fed_params : FedForest hyper-parameters for the open and secure profiles (default: the
        estimators' defaults, 50 trees of depth 8, B = 32)
    dp_params : FedForest hyper-parameters under secure-dp (default: none, so the DP defaults
        of the estimators apply)
    dp_profile : overrides of the ``secure-dp`` profile (``load_profile("secure-dp",
        epsilon=eps, **dp_profile)``; default: none)
    baseline_params : ``n_estimators`` / ``max_depth`` of the central and local forests and of
        diffprivlib's (default 50 and 8)
    data : ``(X, y, client or None, task)`` instead of a named dataset; ``client`` labels
        each row's site (names or numbers, numbered ``0..K-1`` in sorted order)
    metric : one of ``METRICS[task]`` (default: balanced accuracy or R^2)
    progress : called with a short message after every fit
    """
    if data is None:
        if dataset is None:
            raise ValueError("give a dataset name or data=(X, y, client, task)")
        ds = load_dataset(dataset)
        X, y, client, task = ds.X, ds.y, ds.client, str(ds.task)
        name = name or dataset
    else:
        X, y, client, task = data
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y)
        name = name or dataset or "table"
    sites: list[Any] = []  # the sites' names (client labels), by code
    if client is not None:
        labels, client = np.unique(np.asarray(client), return_inverse=True)
        sites = labels.tolist()
    eps_list = parse_epsilons(epsilons if not isinstance(epsilons, str) else epsilons)
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list:
        raise ValueError("at least one seed is needed")
    if client is None and (not isinstance(n_clients, int) or n_clients < 1):
        raise ValueError(f"n_clients must be an integer >= 1, got {n_clients!r}")
    metric = metric or METRICS[task][0]
    if metric not in METRICS[task]:
        raise ValueError(f"metric {metric!r} does not score a {task} task; choose from "
                         f"{list(METRICS[task])}")
    n_classes = int(np.unique(y).size) if task == "classification" else 0
    notes: list[str] = []
    if methods is not None:
        chosen = list(methods)
        why = dp_ebm_unavailable(task, n_classes) if "dp-ebm" in chosen else None
        if why is not None:
            raise ValueError(why)
    else:
        chosen, notes = _default_methods(task, n_classes)
    unknown = [m for m in chosen if m not in METHOD_LABELS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(METHOD_LABELS)}")
    if task == "regression" and "diffprivlib-rf" in chosen:
        raise ValueError("diffprivlib has no DP random-forest regressor; use diffprivlib-linreg")
    if task == "classification" and "diffprivlib-linreg" in chosen:
        raise ValueError("diffprivlib-linreg is a regression baseline")
    fed = dict(fed_params or {})
    dpp = dict(dp_params or {})
    base = {"n_estimators": 50, "max_depth": 8, **(baseline_params or {})}
    finite = [e for e in eps_list if math.isfinite(e)]
    res = ComparisonResult(
        dataset=name, task=task,
        metric=metric, epsilons=eps_list, seeds=seed_list,
        n_clients=n_clients if client is None else len(sites), alpha=alpha,
        settings={"fed_params": fed, "dp_params": dpp, "baseline_params": base,
                  "n_rows": int(X.shape[0]), "n_features": int(X.shape[1]),
                  "client_column": client is not None, "methods": chosen, "notes": notes})

    def note(msg: str) -> None:
        if progress is not None:
            progress(msg)

    def fit_one(m: str, eps: float, s: _Split, seed: int) -> np.ndarray:
        if m == "fedforest-open":
            return _fit_predict(_fedforest(task, "open", fed, seed), s)
        if m == "fedforest-secure":
            return _fit_predict(_fedforest(task, "secure", fed, seed), s)
        if m == "fedforest-secure-dp":
            prof = load_profile("secure-dp", epsilon=float(eps), **(dp_profile or {}))
            return _fit_predict(_fedforest(task, prof, dpp, seed), s)
        if m == "diffprivlib-rf":
            return _diffprivlib_rf(s, eps, base, seed)
        if m == "diffprivlib-linreg":
            return _diffprivlib_linreg(s, eps, seed)
        if m == "dp-ebm":
            return _dp_ebm(s, eps, task, seed)
        cls = CentralizedRF if m == "centralized-rf" else LocalLearning
        return _fit_predict(cls(task=task, n_estimators=base["n_estimators"],
                                max_depth=base["max_depth"], random_state=seed), s)

    moved: dict[int, list[int]] = {}  # site code -> the seeds whose held-out rows held it all
    for seed in seed_list:
        split = _split(X, y, client, task, seed, n_clients, alpha)
        for code in split.moved.tolist():
            moved.setdefault(code, []).append(seed)
        for m in chosen:
            for eps in (finite if m in DP_METHODS else [INF]):
                t0 = time.perf_counter()
                score = _score(metric, split.yte, fit_one(m, eps, split, seed))
                res.add(m, eps, score, time.perf_counter() - t0)
                note(f"seed {seed} {m} eps={_eps_label(eps)}: {score:.4f}")
    notes += [_moved_note(sites[code], seeds) for code, seeds in sorted(moved.items())]
    return res


def _moved_note(site: Any, seeds: list[int]) -> str:
    """The note of a site whose rows all fell in the held-out part of ``seeds``."""
    many = len(seeds) > 1
    which = "those seeds score" if many else "that seed scores"
    return (f"site {site!r} had no training row in the 70/30 split of seed"
            f"{'s' if many else ''} {', '.join(map(str, seeds))}: its held-out rows were "
            f"moved to the training rows there, so {which} no row of it")


# ------------------------------------------------------------------------------ outputs
def to_csv(res: ComparisonResult, path: str | Path) -> Path:
    """One row per (method, epsilon): mean, std, number of seeds and the per-seed scores;
    written whole or not at all (:func:`~fedforest_secure.files.write_atomic`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, csv_text(res))
    return path


def csv_text(res: ComparisonResult) -> str:
    """The text :func:`to_csv` writes."""
    fields = ["dataset", "task", "metric", "method", "label", "epsilon", "mean", "std",
              "n_seeds", "scores"]
    fh = io.StringIO(newline="")
    w = csv.DictWriter(fh, fieldnames=fields)
    w.writeheader()
    for row in res.rows():
        w.writerow({**row, "mean": f"{row['mean']:.6f}", "std": f"{row['std']:.6f}"})
    return fh.getvalue()


def read_csv(path: str | Path, *, n_clients: int = 0, alpha: float = math.nan
             ) -> ComparisonResult:
    """Rebuild a :class:`ComparisonResult` from :func:`to_csv` output (per-seed scores kept;
    seeds are renumbered 0..n-1 and timings are not stored)."""
    with Path(path).open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ValueError(f"{path}: no rows")
    eps = sorted({INF if r["epsilon"] == "inf" else float(r["epsilon"]) for r in rows})
    res = ComparisonResult(dataset=rows[0]["dataset"], task=rows[0]["task"],
                           metric=rows[0]["metric"], epsilons=eps,
                           seeds=list(range(max(int(r["n_seeds"]) for r in rows))),
                           n_clients=n_clients, alpha=alpha)
    for r in rows:
        e = INF if r["epsilon"] == "inf" else float(r["epsilon"])
        for v in r["scores"].split(";"):
            res.add(r["method"], e, float(v), 0.0)
    return res
