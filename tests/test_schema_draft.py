"""fedforest schema draft: kinds, levels and classes from a site's file, never bounds."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from test_tablecheck import site_csv
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_secure.errors import SchemaError
from fedforest_secure.schema import Schema
from fedforest_secure.schema_draft import draft_schema
from fedforest_secure.tablecheck import read_raw


def test_the_draft_of_a_raw_hospital_file_has_kinds_levels_classes_and_no_bounds(
        tmp_path: Path) -> None:
    text = draft_schema(read_raw(site_csv(tmp_path, "cleveland")), "num")
    schema = Schema.from_dict(tomllib.loads(text))
    kinds = dict(zip(schema.feature_names, schema.feature_kinds, strict=True))
    assert len(kinds) == 13
    assert {n for n, k in kinds.items() if k == "continuous"} == {
        "age", "trestbps", "chol", "thalach", "oldpeak"}
    assert schema.features[schema.feature_names.index("cp")].levels == ["1", "2", "3", "4"]
    assert schema.target.classes == ["0", "1", "2", "3", "4"]
    # cleveland's "?" cells are in ca and thal only
    assert {f.name for f in schema.features if f.may_miss} == {"ca", "thal"}
    # no bounds anywhere, and a loud note why
    assert schema.missing_bounds() == ["age", "trestbps", "chol", "thalach", "oldpeak"]
    assert "BOUNDS MUST BE PUBLIC" in text and "never derived from one site's data" in text
    assert "29" not in text and "77" not in text  # the site's own age range is not written


def test_kind_overrides_regression_targets_and_unknown_columns(tmp_path: Path) -> None:
    table = read_raw(site_csv(tmp_path, "cleveland"))
    text = draft_schema(table, "chol", categorical=["age"], continuous=["sex"])
    schema = Schema.from_dict(tomllib.loads(text))
    assert schema.target.kind == "regression" and schema.target.bounds is None
    assert schema.features[schema.feature_names.index("age")].kind == "categorical"
    assert schema.features[schema.feature_names.index("sex")].kind == "continuous"
    with pytest.raises(SchemaError, match="column 'nope' is not in"):
        draft_schema(table, "nope")
    with pytest.raises(SchemaError, match="use --task regression"):
        draft_schema(table, "chol", task="classification")


def test_cli_schema_draft_writes_a_file_that_check_reads(tmp_path: Path) -> None:
    csv = site_csv(tmp_path, "cleveland")
    runner = CliRunner()
    res = runner.invoke(app, ["schema", "draft", "--data", str(csv), "--target", "num"])
    assert res.exit_code == 0, res.output
    assert 'name = "thal"' in res.output
    out = tmp_path / "draft.toml"
    res = runner.invoke(app, ["schema", "draft", "--data", str(csv), "--target", "num",
                              "--out", str(out)])
    assert res.exit_code == 0 and out.is_file()
    res = runner.invoke(app, ["check", "--data", str(csv), "--schema", str(out)])
    assert "no public bounds for age, trestbps, chol, thalach, oldpeak" in res.output
