"""Missing values in a deployment: a schema column with ``missing = "allowed"``, site tables
with ``?``, ``NA`` and empty cells, a secure job over HTTPS (real uvicorn server and client
processes)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from test_integration_https import reference, run_job, setup_fed, trees

from fedforest_cli.sim_data import write_job_toml
from fedforest_secure import FedForestClassifier
from fedforest_secure.audit import verify_log

pytestmark = pytest.mark.integration

_TOKENS = ("?", "NA", "")


def _parts_with_holes() -> tuple[list[tuple[np.ndarray, np.ndarray]], list[str]]:
    """Three sites, 4 features; x1 and x3 miss values (x3 at one site most of the time), and a
    missing x1 says something about y (so the learned direction matters)."""
    rng = np.random.default_rng(11)
    parts = []
    for k in range(3):
        X = rng.normal(loc=0.2 * k, size=(70, 4)).round(3)
        y = ((X[:, 0] + X[:, 1] + rng.normal(scale=0.3, size=70)) > 0.2 * k).astype(int)
        X[(rng.random(70) < 0.25) & (y == 1), 1] = np.nan
        X[rng.random(70) < (0.8 if k == 2 else 0.1), 3] = np.nan
        parts.append((X, y))
    return parts, [f"x{j}" for j in range(4)]


def _job_dir_with_holes(root: Path, parts: list[tuple[np.ndarray, np.ndarray]],
                        feat: list[str], *, n_clients: int, deadline: float = 60.0,
                        min_clients: int | None = None, profile: str = "open") -> Path:
    """As conftest's ``make_job_dir``, with missing cells written as ``?``, ``NA`` or empty
    and the columns that have them declared ``missing = "allowed"``."""
    root.mkdir(parents=True, exist_ok=True)
    X = np.vstack([p[0] for p in parts])
    features = []
    for j, name in enumerate(feat):
        col = X[:, j][~np.isnan(X[:, j])]
        f: dict[str, object] = {"name": name, "kind": "continuous",
                                "bounds": [float(col.min()), float(col.max())]}
        if np.isnan(X[:, j]).any():
            f["missing"] = "allowed"
        features.append(f)
    schema = {"features": features, "target": {"name": "y", "kind": "classification",
                                               "classes": ["0", "1"]}}
    (root / "schema.toml").write_text(tomli_w.dumps(schema))
    (root / "sites").mkdir(exist_ok=True)
    names = [f"client-{k}" for k in range(n_clients)]
    for k, (name, (Xk, yk)) in enumerate(zip(names, parts, strict=True)):
        with (root / "sites" / f"{name}.csv").open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow([*feat, "y"])
            for i, (row, t) in enumerate(zip(Xk.tolist(), yk.tolist(), strict=True)):
                cells = [_TOKENS[(i + j + k) % 3] if np.isnan(v) else repr(v)
                         for j, v in enumerate(row)]
                w.writerow([*cells, str(int(t))])
    write_job_toml(root / "job.toml", "job-a", names, profile, deadline,
                   {"n_estimators": 3, "max_depth": 3, "n_bins": 8, "random_state": 3,
                    "min_samples_leaf": 3}, min_clients=min_clients)
    return root / "job.toml"


def test_secure_job_with_missing_values_matches_in_process_and_predicts_them(
        tmp_path: Path) -> None:
    parts, feat = _parts_with_holes()
    fed = setup_fed(tmp_path, parts, feat, _job_dir_with_holes, n_clients=3, profile="secure")
    got = run_job(fed, timeout=180)
    # the sites' "?", "NA" and empty cells were read as NaN: the same forest as in process
    assert trees(got) == trees(reference(fed))
    # the forest learned where missing x1 goes (x1 is split on with its own direction)
    x1_splits = [(t.missing_left[nd], nd) for t in got.trees
                 for nd in np.flatnonzero((t.kind != 0) & (t.feature == 1))]
    assert x1_splits
    report = verify_log(fed.root / "audit.db", replay=True)
    assert report.ok, report.problems
    # the job's model predicts rows with holes, read by name from a table with "?" cells
    est = FedForestClassifier.load(fed.root / "client-0.model.json")
    pd = pytest.importorskip("pandas")
    table = pd.read_csv(fed.root / "sites" / "client-1.csv", na_values=["?", "NA"],
                        keep_default_na=True)
    proba = est.predict_proba(table.drop(columns=["y"]))
    assert proba.shape == (70, 2) and np.isfinite(proba).all()
    X1 = parts[1][0]
    np.testing.assert_allclose(proba, got.predict_values(X1), atol=1e-12)


def test_secure_job_whose_trees_split_present_from_missing_finishes_and_replays(
        tmp_path: Path) -> None:
    """x2 is missing in most rows of class 1 and present in class 0: splits "x2 present |
    x2 missing" (threshold +inf) are taken, logged in the audit log (as the model file writes
    them, "inf") and replayed."""
    rng = np.random.default_rng(5)
    parts = []
    for _site in range(3):
        X = rng.normal(size=(60, 3)).round(3)
        y = (rng.random(60) < 0.5).astype(int)
        X[(y == 1) & (rng.random(60) < 0.9), 2] = np.nan
        parts.append((X, y))
    feat = [f"x{j}" for j in range(3)]
    fed = setup_fed(tmp_path, parts, feat, _job_dir_with_holes, n_clients=3, profile="secure")
    got = run_job(fed, timeout=180)
    assert trees(got) == trees(reference(fed))
    assert any(((t.kind != 0) & (t.feature == 2) & np.isinf(t.threshold)).any()
               for t in got.trees)
    report = verify_log(fed.root / "audit.db", replay=True)
    assert report.ok, report.problems
