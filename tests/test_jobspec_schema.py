"""A job's configuration from its schema file: which features may be missing, and the
regression target's centre and half-width from its public bounds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomli_w

from fedforest_secure.config import JobConfig
from fedforest_secure.federation import run_in_process
from server_app.jobspec import JobSpec, build_config, load_job_spec
from server_app.settings import ConfigError

SCHEMA = {
    "features": [{"name": "age", "kind": "continuous", "bounds": [0.0, 120.0]},
                 {"name": "ca", "kind": "continuous", "bounds": [0.0, 3.0],
                  "missing": "allowed"},
                 {"name": "thal", "kind": "categorical", "levels": ["3", "6", "7"],
                  "missing": "allowed"}],
    "target": {"name": "num", "kind": "classification", "classes": ["0", "1"]},
}


def _spec(schema: dict[str, object]) -> JobSpec:
    return JobSpec.model_validate({"id": "j", "clients": ["a", "b", "c"], "profile": "secure",
                                   "schema_text": tomli_w.dumps(schema)})


def test_missing_allowed_columns_reach_the_job_config() -> None:
    cfg = build_config(_spec(SCHEMA))
    assert cfg.missing_allowed == (False, True, True) and cfg.has_missing
    plain = {**SCHEMA, "features": [{k: v for k, v in f.items() if k != "missing"}
                                    for f in SCHEMA["features"]]}  # type: ignore[attr-defined]
    cfg = build_config(_spec(plain))
    assert not cfg.has_missing and cfg.missing_allowed == ()


def test_a_job_whose_schema_file_is_invalid_names_the_file(tmp_path: Path) -> None:
    bad = {**SCHEMA, "target": {"name": "num", "kind": "classification", "classes": ["1"]}}
    (tmp_path / "schema.toml").write_text(tomli_w.dumps(bad))
    path = tmp_path / "job.toml"
    path.write_text('id = "j"\nclients = ["a", "b", "c"]\nschema = "schema.toml"\n')
    with pytest.raises(ConfigError) as exc:
        load_job_spec(path)
    assert str(exc.value) == (f"invalid schema file {tmp_path / 'schema.toml'}: "
                              "target.classes: needs at least 2 classes, got 1")


def _offset_job(lo: float, hi: float) -> tuple[JobConfig, np.ndarray, np.ndarray]:
    schema = {"features": [{"name": f"x{j}", "kind": "continuous", "bounds": [-5.0, 5.0]}
                           for j in range(3)],
              "target": {"name": "y", "kind": "regression", "bounds": [lo, hi]}}
    cfg = build_config(JobSpec.model_validate({
        "id": "j", "clients": ["a", "b", "c", "d"], "profile": "secure",
        "schema_text": tomli_w.dumps(schema),
        "forest": {"n_estimators": 5, "max_depth": 6, "max_features": 1.0}}))
    rng = np.random.default_rng(14)
    X = np.clip(rng.normal(size=(1200, 3)), -5, 5)
    y = np.clip(X[:, 0] + 0.1 * rng.normal(size=1200), -4.9, 4.9)
    return cfg, X, y


@pytest.mark.parametrize("mid", [0.0, 3e6])
def test_a_server_job_centres_the_target_on_its_bounds_and_grows_the_same_forest(
        mid: float) -> None:
    """y = 3 * 10^6 + signal in the public bounds [mid - 5, mid + 5]: the sites subtract the
    bounds' middle before taking sums, so the fixed-point sums of the secure profile keep the
    signal's splits, and the model adds the middle back."""
    cfg, X, y = _offset_job(mid - 5.0, mid + 5.0)
    assert cfg.target_offset == mid and cfg.target_bound == 5.0
    h = np.arange(1200) % 4
    model = run_in_process(cfg, [(X[:900][h[:900] == k], y[:900][h[:900] == k] + mid)
                                 for k in range(4)])
    assert model.y_offset == mid
    pred = model.predict(X[900:])
    resid = ((pred - (y[900:] + mid)) ** 2).sum()
    r2 = 1.0 - resid / ((y[900:] - y[900:].mean()) ** 2).sum()
    assert r2 > 0.8, r2
    assert min(t.n_nodes for t in model.trees) > 20


def test_a_schema_file_with_a_byte_order_mark_is_the_same_schema_for_server_and_site(
        tmp_path: Path) -> None:
    """A schema (and a job file) saved with a UTF-8 byte-order mark loads, and its hash is the
    one the sites compute of their copy, with or without the mark."""
    from client_app.data import schema_sha256

    text = tomli_w.dumps(SCHEMA)
    (tmp_path / "schema.toml").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (tmp_path / "plain.toml").write_text(text, encoding="utf-8")
    path = tmp_path / "job.toml"
    path.write_bytes(b'\xef\xbb\xbfid = "j"\nclients = ["a", "b", "c"]\nschema = "schema.toml"\n')
    spec = load_job_spec(path)
    assert build_config(spec).missing_allowed == (False, True, True)
    assert spec.schema_sha256() == schema_sha256(tmp_path / "schema.toml") \
        == schema_sha256(tmp_path / "plain.toml")
