"""Data preparation for ``fedforest simulate``: one CSV, token and certificate per site."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SimData", "SimulateOptions", "SiteData", "check_dataset_name", "load_table",
           "prepare_sites", "write_site_files"]


@dataclass
class SimulateOptions:
    """What ``fedforest simulate`` runs: the data, the federation, the forest."""

    dataset: str = "breast_cancer"
    clients: int = 4
    alpha: float = 0.5
    profile: str = "secure"
    out: Path = Path("fedforest-run")
    trees: int = 20
    depth: int = 6
    bins: int = 16
    seed: int = 0
    max_rows: int | None = None
    round_deadline: float = 60.0
    extra_forest: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Refuse options that cannot make a simulation (before anything is written).

        Raises
        ------
        ValueError
            Naming the option and what it takes.
        """
        check_dataset_name(self.dataset)
        for flag, value, low in (("--clients", self.clients, 1), ("--trees", self.trees, 1),
                                 ("--depth", self.depth, 1), ("--bins", self.bins, 2),
                                 ("--max-rows", self.max_rows, 1)):
            if value is not None and value < low:
                raise ValueError(f"{flag} must be at least {low}, got {value}")
        for flag, number in (("--alpha", self.alpha), ("--round-deadline",
                                                       self.round_deadline)):
            if not (math.isfinite(number) and number > 0):
                raise ValueError(f"{flag} must be a positive number, got {number}")


@dataclass
class SiteData:
    name: str
    csv: Path
    schema: Path
    token: str
    X: np.ndarray
    y: np.ndarray


@dataclass
class SimData:
    job_id: str
    task: str
    sites: list[SiteData]
    X_test: np.ndarray
    y_test: np.ndarray
    job_toml: Path
    #: each site's share of the held-out rows (``X_test`` pooled), and its CSV
    held_out: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    held_out_csvs: list[Path] = field(default_factory=list)


def synthetic_table(n: int, d: int = 20, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic regression table of ``n`` rows (for transport benchmarks at any size)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).round(4)
    y = X[:, 0] + 2.0 * np.sin(X[:, 1]) + X[:, 2] * X[:, 3] + rng.normal(scale=0.5, size=n)
    return X, y


#: the fewest rows of a ``synthetic-<rows>`` table
MIN_SYNTHETIC_ROWS = 10


def _synthetic_rows(name: str) -> int | None:
    """``n`` for ``synthetic-<n>``, else None."""
    head, _, rows = name.partition("-")
    return int(rows) if head == "synthetic" and rows.isdigit() else None


def check_dataset_name(name: str) -> None:
    """Raise ValueError unless :func:`load_table` knows ``name`` (nothing is read)."""
    rows = _synthetic_rows(name)
    if rows is not None:
        if rows < MIN_SYNTHETIC_ROWS:
            raise ValueError(f"synthetic-<rows> needs at least {MIN_SYNTHETIC_ROWS} rows, got "
                             f"{name!r}")
        return
    from fedforest_secure.experiments.loaders import canonical_name

    try:
        canonical_name(name)
    except ValueError as exc:
        raise ValueError(f"{exc}, or synthetic-<rows>") from None


def load_table(name: str) -> tuple[np.ndarray, np.ndarray, str, list[str]]:
    """``(X, y, task, feature_names)`` of a dataset of :mod:`fedforest_secure.experiments`.

    ``synthetic-<n>`` is a synthetic regression table of ``n`` rows and 20 features.
    """
    rows = _synthetic_rows(name)
    if rows is not None:
        X, y = synthetic_table(rows)
        return X, y, "regression", [f"x{j}" for j in range(X.shape[1])]
    from fedforest_secure.experiments.loaders import load_dataset

    ds = load_dataset(name)
    return ds.X, ds.y, ds.task, [f"x{j}" for j in range(ds.X.shape[1])]


def _partition(y: np.ndarray, task: str, k: int, alpha: float, seed: int) -> np.ndarray:
    from fedforest_secure.experiments.partitions import dirichlet_partition

    target = y.astype(np.int64) if task == "classification" else y.astype(np.float64)
    return np.asarray(dirichlet_partition(target, k, alpha, seed, min_size=10))


def schema_dict(X: np.ndarray, y: np.ndarray, task: str, names: list[str]) -> dict[str, Any]:
    """A schema whose public bounds cover the whole table (in a simulation, the pooled range)."""
    feats = []
    for j, name in enumerate(names):
        lo, hi = float(X[:, j].min()), float(X[:, j].max())
        feats.append({"name": name, "kind": "continuous",
                      "bounds": [lo, hi if hi > lo else lo + 1.0]})
    if task == "classification":
        target: dict[str, Any] = {"name": "y", "kind": "classification",
                                  "classes": [str(c) for c in range(int(y.max()) + 1)]}
    else:
        lo, hi = float(y.min()), float(y.max())
        target = {"name": "y", "kind": "regression", "bounds": [lo, hi if hi > lo else lo + 1]}
    return {"features": feats, "target": target}


def write_schema(path: Path, schema: dict[str, Any]) -> None:
    import tomli_w

    path.write_text(tomli_w.dumps(schema))


def write_csv(path: Path, X: np.ndarray, y: np.ndarray, names: list[str], task: str) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*names, "y"])
        for row, t in zip(X.tolist(), y.tolist(), strict=True):
            w.writerow([repr(float(v)) for v in row]
                       + [str(int(t)) if task == "classification" else repr(float(t))])


def write_job_toml(path: Path, job_id: str, names: list[str], profile: str, deadline: float,
                   forest: dict[str, Any], min_clients: int | None = None) -> None:
    import tomli_w

    doc: dict[str, Any] = {"id": job_id, "clients": names, "profile": profile,
                           "schema": "schema.toml", "round_deadline": deadline,
                           "forest": forest}
    if min_clients is not None:
        doc["min_clients"] = min_clients
    path.write_text(tomli_w.dumps(doc))


def write_site_files(out: Path, names: list[str], parts: list[tuple[np.ndarray, np.ndarray]],
                     feat_names: list[str], task: str, schema: dict[str, Any]) -> list[Path]:
    write_schema(out / "schema.toml", schema)
    paths = []
    for name, (X, y) in zip(names, parts, strict=True):
        (out / "sites").mkdir(exist_ok=True)
        p = out / "sites" / f"{name}.csv"
        write_csv(p, X, y, feat_names, task)
        paths.append(p)
    return paths


def prepare_sites(opts: SimulateOptions, out: Path, names: list[str], server_toml: Path,
                  table: tuple[np.ndarray, np.ndarray, str, list[str]] | None = None
                  ) -> SimData:
    """Write schema, CSVs, job.toml; register the clients and create the job on the server DB
    (``table``: :func:`load_table`'s result, read here if not given)."""
    from server_app.admin import ServerAdmin
    from server_app.jobspec import load_job_spec
    from server_app.settings import load_settings

    X, y, task, feat = table if table is not None else load_table(opts.dataset)
    rng = np.random.default_rng(opts.seed)
    idx = rng.permutation(X.shape[0])
    if opts.max_rows is not None:
        idx = idx[: opts.max_rows]
    n_test = max(1, len(idx) // 5)
    test, train = idx[:n_test], idx[n_test:]
    part = _partition(y[train], task, opts.clients, opts.alpha, opts.seed)
    parts = [(X[train][part == k], y[train][part == k]) for k in range(opts.clients)]
    schema = schema_dict(X, y, task, feat)
    csvs = write_site_files(out, names, parts, feat, task, schema)
    # the held-out rows are spread over the sites too: each keeps its share (never pooled by
    # the federation; the simulation pools them only for the centralized reference)
    where = np.random.default_rng(opts.seed + 1).integers(0, opts.clients, size=len(test))
    held_out = [(X[test][where == k], y[test][where == k]) for k in range(opts.clients)]
    held_csvs = []
    for name, (Xk, yk) in zip(names, held_out, strict=True):
        held_csvs.append(out / "sites" / f"{name}.test.csv")
        write_csv(held_csvs[-1], Xk, yk, feat, task)
    forest = {"n_estimators": opts.trees, "max_depth": opts.depth, "n_bins": opts.bins,
              "random_state": opts.seed, "min_samples_leaf": 5, **opts.extra_forest}
    job_id = f"sim-{opts.dataset.replace('_', '-')}"
    job_toml = out / "job.toml"
    write_job_toml(job_toml, job_id, names, opts.profile, opts.round_deadline, forest)
    with ServerAdmin.from_settings(load_settings(server_toml)) as admin:
        tokens = [admin.add_client(n) for n in names]
        admin.create_job(load_job_spec(job_toml))
    sites = [SiteData(n, p, out / "schema.toml", t, Xk, yk)
             for n, p, t, (Xk, yk) in zip(names, csvs, tokens, parts, strict=True)]
    return SimData(job_id, task, sites, X[test], y[test], job_toml, held_out, held_csvs)
