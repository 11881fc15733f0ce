"""A job's configuration from its schema file: which features may be missing."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

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
