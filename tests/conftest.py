"""Shared fixtures: a tiny federated table, dev certificates, a job spec, free ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fedforest_cli.sim_data import schema_dict, write_job_toml, write_site_files
from fedforest_secure.pki import DevPKI, init_dev_pki


@pytest.fixture(scope="session")
def tiny_parts() -> tuple[list[tuple[np.ndarray, np.ndarray]], list[str]]:
    """Five sites of a small two-class problem (60 rows each, 4 features)."""
    rng = np.random.default_rng(7)
    parts = []
    for k in range(5):
        X = rng.normal(loc=0.3 * k, size=(60, 4)).round(3)
        y = ((X[:, 0] + X[:, 1] * 0.5 + rng.normal(scale=0.3, size=60)) > 0.3 * k).astype(int)
        parts.append((X, y))
    return parts, [f"x{j}" for j in range(4)]


def make_job_dir(root: Path, parts: list[tuple[np.ndarray, np.ndarray]], feat: list[str],
                 *, n_clients: int, deadline: float = 30.0, min_clients: int | None = None,
                 job_id: str = "job-a", trees: int = 3, depth: int = 3,
                 profile: str = "open") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    parts = parts[:n_clients]
    X = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    names = [f"client-{k}" for k in range(n_clients)]
    write_site_files(root, names, parts, feat, "classification",
                     schema_dict(X, y, "classification", feat))
    write_job_toml(root / "job.toml", job_id, names, profile, deadline,
                   {"n_estimators": trees, "max_depth": depth, "n_bins": 8,
                    "random_state": 3, "min_samples_leaf": 3}, min_clients=min_clients)
    return root / "job.toml"


@pytest.fixture(scope="session")
def dev_pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevPKI]:
    yield init_dev_pki(tmp_path_factory.mktemp("certs"), 5)


@pytest.fixture(scope="session")
def job_dir():  # type: ignore[no-untyped-def]
    """The :func:`make_job_dir` helper, as a fixture (tests are not a package)."""
    return make_job_dir
