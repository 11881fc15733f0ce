"""Data preparation for ``fedforest simulate``: one CSV, token and certificate per site."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._common import MAX_SEED

if TYPE_CHECKING:
    from pydantic import BaseModel

    from fedforest_secure.privacy import PrivacyProfile

__all__ = ["MIN_SITE_ROWS", "SimData", "SimulateOptions", "SiteData", "check_dataset_name",
           "check_job_before_writing", "job_document", "load_table", "prepare_sites",
           "split_sizes", "write_site_files"]

#: the fewest training rows of a site (the Dirichlet partition tops up smaller ones)
MIN_SITE_ROWS = 10


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

    @property
    def job_id(self) -> str:
        """The training job's id (its evaluation job adds ``-eval``)."""
        return f"sim-{self.dataset.replace('_', '-')}"

    def profile_ref(self) -> str:
        """``--profile`` as job.toml and the clients name it: a shipped profile's name as
        given, a file's path resolved against the current directory (job.toml lies in --out,
        and a relative path in it would be read from there)."""
        from fedforest_secure.privacy import available_profiles

        if self.profile in available_profiles():
            return self.profile
        return str(Path(self.profile).resolve())

    def privacy_profile(self) -> PrivacyProfile:
        """The profile ``--profile`` names, loaded.

        Raises
        ------
        ValueError
            Naming ``--profile`` and why it cannot be loaded.
        """
        from fedforest_secure.privacy import load_profile

        try:
            return load_profile(self.profile)  # a relative path: from the current directory
        except (ValueError, OSError) as exc:
            raise ValueError(f"--profile {self.profile}: {exc}") from None

    def check(self) -> None:
        """Refuse options that cannot make a simulation (before anything is written): the
        ranges job.toml allows, and a profile that can be loaded and accepts --clients sites.

        Raises
        ------
        ValueError
            Naming the option and what it takes.
        """
        from server_app.jobcheck import MIN_SECURE_SITES
        from server_app.jobspec import ForestParams, JobSpec

        check_dataset_name(self.dataset)
        ranges = (("--clients", self.clients, 1, _job_limits(JobSpec, "clients")[1]),
                  ("--trees", self.trees, *_job_limits(ForestParams, "n_estimators")),
                  ("--depth", self.depth, *_job_limits(ForestParams, "max_depth")),
                  ("--bins", self.bins, *_job_limits(ForestParams, "n_bins")),
                  ("--max-rows", self.max_rows, 1, None))
        for flag, value, low, high in ranges:
            if value is None:
                continue
            if low is not None and value < low:
                raise ValueError(f"{flag} must be at least {low:g}, got {value}")
            if high is not None and value > high:
                raise ValueError(f"{flag} must be at most {high:g}, got {value}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"--seed must be an integer from 0 to {MAX_SEED}, got {self.seed}")
        for flag, number in (("--alpha", self.alpha), ("--round-deadline",
                                                       self.round_deadline)):
            if not (math.isfinite(number) and number > 0):
                raise ValueError(f"{flag} must be a positive number, got {number}")
        longest = _job_limits(JobSpec, "round_deadline")[1]
        if longest is not None and self.round_deadline > longest:
            raise ValueError(f"--round-deadline must be at most {longest:g} seconds, got "
                             f"{self.round_deadline:g}")
        profile = self.privacy_profile()
        if profile.secure_aggregation and self.clients < MIN_SECURE_SITES:
            raise ValueError(f"--clients {self.clients}: profile {profile.name!r} uses secure "
                             f"aggregation, which needs at least {MIN_SECURE_SITES} sites (the "
                             "sum of two sites tells each one the other's vector); use "
                             f"--clients {MIN_SECURE_SITES} or more, or --profile open")
        if self.clients < profile.min_clients:
            raise ValueError(f"--clients {self.clients}: profile {profile.name!r} refuses sums "
                             f"over fewer than {profile.min_clients} sites (its min_clients); "
                             f"use --clients {profile.min_clients} or more")

    def check_rows(self, n_rows: int) -> None:
        """Refuse more sites than a table of ``n_rows`` rows gives :data:`MIN_SITE_ROWS`
        training rows each (after ``--max-rows`` and the held-out fifth).

        Raises
        ------
        ValueError
            Naming ``--clients`` and the most sites the table allows.
        """
        n_train, _ = split_sizes(n_rows, self.max_rows)
        if n_train >= self.clients * MIN_SITE_ROWS:
            return
        cut = self.max_rows is not None and self.max_rows < n_rows
        most = n_train // MIN_SITE_ROWS
        advice = [f"at most --clients {most}"] if 1 <= most < self.clients else []
        if cut:
            advice.append("a larger --max-rows")
        raise ValueError(
            f"--clients {self.clients}: {self.dataset}'s {n_train} training rows"
            + (f" (--max-rows {self.max_rows})" if cut else "")
            + f" cannot give {self.clients} site{'s' if self.clients > 1 else ''} at least "
            f"{MIN_SITE_ROWS} rows each"
            + (f"; use {' or '.join(advice)}" if advice else ""))


def _job_limits(model: type[BaseModel], name: str) -> tuple[float | None, float | None]:
    """(lowest, highest) value (a list's length) of a field of job.toml, from its model."""
    low: float | None = None
    high: float | None = None
    for rule in model.model_fields[name].metadata:
        low = getattr(rule, "ge", low)
        high = getattr(rule, "le", getattr(rule, "max_length", high))
    return low, high


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
    return np.asarray(dirichlet_partition(target, k, alpha, seed, min_size=MIN_SITE_ROWS))


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


def _job_doc(job_id: str, names: list[str], profile: str, deadline: float,
             forest: dict[str, Any], min_clients: int | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"id": job_id, "clients": names, "profile": profile,
                           "schema": "schema.toml", "round_deadline": deadline,
                           "forest": forest}
    if min_clients is not None:
        doc["min_clients"] = min_clients
    return doc


def write_job_toml(path: Path, job_id: str, names: list[str], profile: str, deadline: float,
                   forest: dict[str, Any], min_clients: int | None = None) -> None:
    import tomli_w

    path.write_text(tomli_w.dumps(_job_doc(job_id, names, profile, deadline, forest,
                                           min_clients)))


def job_document(opts: SimulateOptions, job_id: str, names: list[str]) -> dict[str, Any]:
    """The simulation's job.toml (its schema file beside it), as a mapping."""
    forest = {"n_estimators": opts.trees, "max_depth": opts.depth, "n_bins": opts.bins,
              "random_state": opts.seed, "min_samples_leaf": 5, **opts.extra_forest}
    return _job_doc(job_id, names, opts.profile_ref(), opts.round_deadline, forest)


def check_job_before_writing(opts: SimulateOptions, names: list[str],
                             table: tuple[np.ndarray, np.ndarray, str, list[str]]) -> None:
    """Refuse what the server would refuse at create-job
    (:func:`~server_app.jobcheck.check_job`) before anything is written: the job of
    :func:`prepare_sites`, its schema in memory.

    Raises
    ------
    ValueError
        The server's reason (:class:`~server_app.settings.ConfigError`).
    """
    import tomli_w

    from server_app.jobcheck import check_job
    from server_app.jobspec import JobSpec

    X, y, task, feat = table
    doc = job_document(opts, opts.job_id, names)
    del doc["schema"]
    doc["schema_text"] = tomli_w.dumps(schema_dict(X, y, task, feat))
    check_job(JobSpec.model_validate(doc))


def split_sizes(n_rows: int, max_rows: int | None) -> tuple[int, int]:
    """(training, held-out) rows of a table of ``n_rows`` rows cut to ``max_rows``: a fifth
    (at least one row) is held out."""
    n = n_rows if max_rows is None else min(n_rows, max_rows)
    n_test = max(1, n // 5)
    return n - n_test, n_test


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
    import tomli_w

    from server_app.admin import ServerAdmin
    from server_app.jobspec import load_job_spec
    from server_app.settings import load_settings

    X, y, task, feat = table if table is not None else load_table(opts.dataset)
    rng = np.random.default_rng(opts.seed)
    idx = rng.permutation(X.shape[0])
    _, n_test = split_sizes(len(idx), opts.max_rows)
    if opts.max_rows is not None:
        idx = idx[: opts.max_rows]
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
    job_id = opts.job_id
    job_toml = out / "job.toml"
    job_toml.write_text(tomli_w.dumps(job_document(opts, job_id, names)))
    with ServerAdmin.from_settings(load_settings(server_toml)) as admin:
        tokens = [admin.add_client(n) for n in names]
        admin.create_job(load_job_spec(job_toml))
    sites = [SiteData(n, p, out / "schema.toml", t, Xk, yk)
             for n, p, t, (Xk, yk) in zip(names, csvs, tokens, parts, strict=True)]
    return SimData(job_id, task, sites, X[test], y[test], job_toml, held_out, held_csvs)
