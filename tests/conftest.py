"""Shared fixtures: a tiny federated table, dev certificates, a job spec, free ports, and
databases on each backend (SQLite files; PostgreSQL in a throwaway cluster, marker
``postgres``)."""

from __future__ import annotations

import os
import signal
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pg_cluster import Cluster, PostgresUnavailable
from worker_order import spread

from fedforest_cli.sim_data import schema_dict, write_job_toml, write_site_files
from fedforest_secure import _kernels
from fedforest_secure.pki import DevPKI, init_dev_pki

# A run started in the background of a shell without job control (`pytest ... &` in a script)
# inherits SIGINT ignored, and passes that on to every process the tests start: the tests of
# Ctrl-C would see it do nothing. Such a run takes Python's own handler back, which the
# processes it starts reset to the default on exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that start servers and client processes (marker ``integration``) run first,
    each group in its collection order. Under ``make test`` (``-n 3 --dist worksteal``) they
    are split between the starts of the first two workers' shares, the third worker running
    short tests beside them (tests/worker_order.py): they spend much of their time waiting on
    their processes, and the short tests fill the cores those waits leave idle."""
    long = [item for item in items if item.get_closest_marker("integration") is not None]
    short = [item for item in items if item.get_closest_marker("integration") is None]
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")  # set in xdist's workers
    workers = int(count) if count.isdigit() else 1
    items[:] = spread(long, short, workers, group=lambda item: item.nodeid.split("::")[0])


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
    """A job's files in ``root``: its sites' tables, schema and ``job.toml`` (a regression
    job where the targets are floats, else classification)."""
    root.mkdir(parents=True, exist_ok=True)
    parts = parts[:n_clients]
    X = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    names = [f"client-{k}" for k in range(n_clients)]
    task = "regression" if y.dtype.kind == "f" else "classification"
    write_site_files(root, names, parts, feat, task, schema_dict(X, y, task, feat))
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


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One throwaway PostgreSQL cluster per test process (see tests/pg_cluster.py)."""
    try:
        cluster = Cluster()
    except PostgresUnavailable as exc:
        if os.environ.get("FEDFOREST_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required here (FEDFOREST_REQUIRE_POSTGRES=1): {exc}")
        pytest.skip(f"PostgreSQL tests skipped: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def _no_postgres_connection_left_open(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``postgres`` closes the database connections it opens in this process:
    one left open (an audit log or engine never closed) would be deleted open whenever its
    owner goes, psycopg's warning then failing whichever later test of the worker runs
    (warnings are errors), so it fails its own test's teardown here, naming the databases.
    The connections are those ``psycopg.connect`` made during the test (SQLAlchemy's
    psycopg dialect connects through it), held by weak references."""
    if request.node.get_closest_marker("postgres") is None:
        yield
        return
    import psycopg  # the postgres tests' driver: installed with the development extra

    made: list[weakref.ref[psycopg.Connection[Any]]] = []
    connect = psycopg.connect

    def recorded(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        conn = connect(*args, **kwargs)
        made.append(weakref.ref(conn))
        return conn

    psycopg.connect = recorded  # type: ignore[assignment]
    try:
        yield
    finally:
        psycopg.connect = connect  # type: ignore[assignment]
    left = sorted(str(c.info.dbname) for c in (ref() for ref in made)
                  if c is not None and not c.closed)
    if left:
        pytest.fail(f"connections to {left} left open by {request.node.nodeid}")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_backend(request: pytest.FixtureRequest) -> str:
    """The database backend a test runs on: every test using it runs once per backend."""
    return str(request.param)


@pytest.fixture()
def make_db_url(db_backend: str, tmp_path: Path, request: pytest.FixtureRequest
                ) -> Callable[[str], str]:
    """``make_db_url(name)``: the SQLAlchemy URL of a new, empty database on the test's
    backend (a SQLite file ``<tmp_path>/<name>.db``, or a new PostgreSQL database)."""
    if db_backend == "sqlite":
        return lambda name: f"sqlite:///{tmp_path / name}.db"
    cluster: Cluster = request.getfixturevalue("pg_cluster")
    return lambda name: cluster.new_database(name.replace("-", "_")[:20])


@pytest.fixture()
def db_url(make_db_url: Callable[[str], str]) -> str:
    """A new server database on the test's backend."""
    return make_db_url("server")


@pytest.fixture(params=["compiled", "numpy"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test runs with the compiled loops and with the numpy code they stand for
    (``fedforest_secure._kernels``)."""
    if request.param == "numpy":
        monkeypatch.setattr(_kernels, "KERNELS", None)
    elif _kernels.KERNELS is None:
        pytest.skip("the compiled loops are not built")
    return str(request.param)
