"""Prediction on a site's CSV file as docs/configuration.md (step 6) shows it: the rows are
read as the site's client reads the file (:meth:`Schema.read_csv`), so a level spelled like a
missing value, zero-padded levels and a header with spaces after its commas predict what the
client's reading of the file predicts."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedforest_cli.config_doc import DOC_PATH
from fedforest_secure import FedForestClassifier, FedForestRegressor, load_profile
from fedforest_secure.errors import SchemaError
from fedforest_secure.schema import Schema

SCHEMA = """
[target]
name = "num"
kind = "classification"
classes = ["0", "1"]

[[features]]
name = "age"
kind = "continuous"
bounds = [0.0, 120.0]

[[features]]
name = "smoking"
kind = "categorical"
levels = ["None", "Light", "Heavy"]
missing = "allowed"

[[features]]
name = "region"
kind = "categorical"
levels = ["01", "02", "10"]
"""


def _site_table(n: int = 400, seed: int = 0) -> tuple[list[str], list[list[str]]]:
    """A site's CSV file as text: a header and rows whose target follows smoking and
    region."""
    rng = np.random.default_rng(seed)
    smoking = rng.choice(["None", "Light", "Heavy"], n)
    region = rng.choice(["01", "02", "10"], n)
    age = rng.uniform(20, 80, n).round(1)
    num = ((smoking == "Heavy") | ((smoking == "Light") & (region == "10"))).astype(int)
    header = ["age", "smoking", "region", "num"]
    return header, [[str(a), s, r, str(t)] for a, s, r, t in
                    zip(age, smoking, region, num, strict=True)]


def _write(path: Path, header: list[str], rows: list[list[str]], sep: str = ",") -> None:
    path.write_text("\n".join([sep.join(header)] + [",".join(r) for r in rows]) + "\n")


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Schema]:
    """A job's model on :data:`SCHEMA` (trained on the site reader's codes) and its site's
    CSV file."""
    root = tmp_path_factory.mktemp("job")
    schema = Schema.from_dict(tomllib.loads(SCHEMA))
    header, rows = _site_table()
    _write(root / "train.csv", header, rows)
    X, y, _ = schema.read_csv(root / "train.csv")
    forest = FedForestClassifier(profile=load_profile("open"), n_estimators=5, max_depth=4,
                                 random_state=0).fit(X, y, client=np.arange(len(y)) % 2).model_
    model = root / "model.json"
    model.write_text(forest.for_job(SCHEMA, ["a", "b"]).to_json())
    return model, root / "train.csv", schema


def _documented_snippet() -> str:
    """The Python block of docs/configuration.md's step 6 (the model)."""
    text = DOC_PATH.read_text()
    step = text[text.index("**6. The model.**"):]
    found = re.search(r"```python\n(.*?)```", step, re.S)
    assert found is not None
    return found.group(1)


CASES = {
    # a level spelled like a missing value ("None"), listed in the levels (region "10": a
    # number any reader takes as the level)
    "missing word as a level": lambda h, r: (h, [[a, s, "10", t] for a, s, _, t in r], ","),
    # zero-padded levels ("01"), which a reader guessing numbers makes 1
    "zero-padded levels": lambda h, r: (h, [[a, "Light" if s == "None" else s, g, t]
                                            for a, s, g, t in r], ","),
    # a header written with a space after each comma
    "spaces after the header's commas": lambda h, r: (h, r, ", "),
}


@pytest.mark.parametrize("case", CASES)
def test_the_documented_prediction_on_a_csv_is_the_site_readers(
        job: tuple[Path, Path, Schema], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        case: str) -> None:
    model_path, _, schema = job
    header, rows, sep = CASES[case](*_site_table(120, seed=1))
    (tmp_path / "cleveland").mkdir()
    csv = tmp_path / "cleveland" / "clean.csv"
    _write(csv, header, rows, sep)
    (tmp_path / "model.json").write_bytes(model_path.read_bytes())
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {}
    exec(_documented_snippet(), scope)  # noqa: S102 - the page's own code
    model, rows_read = scope["model"], scope["rows"]
    assert isinstance(model, FedForestClassifier)
    X_site, _, _ = schema.read_csv(csv)  # what the site's client reads
    expected = model.model_.outputs_of(X_site)
    np.testing.assert_array_equal(model.predict_proba(rows_read), expected)
    np.testing.assert_array_equal(model.predict(rows_read),
                                  model.classes_[np.argmax(expected, axis=1)])
    assert case != "missing word as a level" or not np.isnan(X_site[:, 1]).any()
    # the page's way of reading the file with pandas
    table = pd.read_csv(csv, dtype=str, keep_default_na=False).rename(columns=str.strip)
    assert "pd.read_csv(path, dtype=str, keep_default_na=False).rename(columns=str.strip)" \
        in " ".join(DOC_PATH.read_text().split())
    np.testing.assert_array_equal(model.predict_proba(table), expected)


def test_read_rows_gives_the_models_features_as_text_in_its_column_order(
        job: tuple[Path, Path, Schema], tmp_path: Path) -> None:
    model = FedForestClassifier.load(job[0])
    csv = tmp_path / "site.csv"
    csv.write_text("num , region,extra, age,smoking\n1,01,x,50,None\n0, 10 ,,61.5,\n")
    rows = model.read_rows(csv)
    assert rows.dtype == object
    assert rows.tolist() == [["50", "None", "01"], ["61.5", "", " 10 "]]
    X_site, _, _ = Schema.from_dict(tomllib.loads(SCHEMA)).read_csv(csv)
    np.testing.assert_array_equal(model.predict_proba(rows), model.model_.outputs_of(X_site))


def test_read_rows_names_the_file_and_its_line_for_what_the_site_reader_refuses(
        job: tuple[Path, Path, Schema], tmp_path: Path) -> None:
    model = FedForestClassifier.load(job[0])
    csv = tmp_path / "site.csv"
    csv.write_text("age,smoking\n50,None\n")
    with pytest.raises(SchemaError, match=re.escape(
            f"{csv}: column 'region': missing from the table")):
        model.read_rows(csv)
    csv.write_text("age,smoking,region\n50,None,01\n\n61,Light,1\n")
    with pytest.raises(SchemaError, match=re.escape(
            f"{csv}, line 4: column 'region': unknown level '1'")):
        model.read_rows(csv)
    # a value outside the schema's public bounds is read: a tree routes any number, as
    # predict takes it from a table
    csv.write_text("age,smoking,region\n130,Heavy,02\n")
    assert model.read_rows(csv).tolist() == [["130", "Heavy", "02"]]
    with pytest.raises(SchemaError, match=re.escape(f"cannot read {tmp_path / 'nosuch.csv'}")):
        model.read_rows(tmp_path / "nosuch.csv")


def test_read_rows_of_a_model_without_a_schema_says_how_to_read_the_file(
        tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2))
    model = FedForestRegressor(n_estimators=2, max_depth=2).fit(X, X[:, 0])
    (tmp_path / "t.csv").write_text("x0,x1\n1,2\n")
    with pytest.raises(SchemaError, match=re.escape(
            "read_rows reads a site's CSV file by the schema of a federated job's model; "
            "this model has none (fitted in process): read the file with pandas")):
        model.read_rows(tmp_path / "t.csv")
    assert os.path.exists(tmp_path / "t.csv")
