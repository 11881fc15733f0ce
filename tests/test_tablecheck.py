"""fedforest check: every problem of a site's table, on the raw UCI heart-disease files."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_secure.errors import SchemaError
from fedforest_secure.experiments.loaders import shared_data_dir
from fedforest_secure.schema import Schema
from fedforest_secure.tablecheck import check_table, clean_rows, read_raw

HEADER = "age,sex,cp,trestbps,chol,fbs,restecg,thalach,exang,oldpeak,slope,ca,thal,num"


def site_csv(tmp_path: Path, center: str) -> Path:
    """A hospital's raw UCI file with the header row a site adds (docs/configuration.md)."""
    raw = (shared_data_dir() / "heart_disease" / f"processed.{center}.data").read_text()
    path = tmp_path / f"{center}.csv"
    path.write_text(HEADER + "\n" + raw)
    return path


@pytest.fixture(scope="module")
def schema() -> Schema:
    from test_config_doc import doc_files

    return Schema.from_dict(tomllib.loads(doc_files()["schema.toml"]))


def by_column(problems, severity, kind=""):  # type: ignore[no-untyped-def]
    """The problems of one severity by column (the first whose message contains ``kind``)."""
    out = {}
    for p in problems:
        if p.severity == severity and kind in p.message:
            out.setdefault(p.column, p)
    return out


def test_every_missing_value_of_the_raw_file_is_listed_not_only_the_first(
        tmp_path: Path, schema: Schema) -> None:
    problems = check_table(read_raw(site_csv(tmp_path, "va")), schema)
    errors = by_column(problems, "error", "missing")
    # every schema column with '?' in the VA file, each with its count
    assert {c: errors[c].message.split(" ")[0] for c in errors} == {
        "trestbps": "56", "chol": "7", "fbs": "7", "thalach": "53", "exang": "53",
        "oldpeak": "56"}
    assert "(?)" in errors["chol"].message and "lines 109, 127" in errors["chol"].message
    assert errors["chol"].lines == (109, 127, 157, 159, 166, 167, 183)
    assert "--clean-out" in errors["chol"].advice
    # the hidden missing values are flagged too, in the same run
    warnings = by_column(problems, "warning")
    assert "49 zeros" in warnings["chol"].message and "hidden missing" in warnings["chol"].message
    assert "1 zero at line 35" in warnings["trestbps"].message
    # ... and that zero is outside the public bounds
    assert "1 value outside the public bounds [50, 250] (0) at line 35" in by_column(
        problems, "error", "outside")["trestbps"].message
    assert "--zero-is-missing chol" in warnings["chol"].advice
    assert "slope, ca, thal" in warnings[None].message  # columns the schema does not use


def test_a_constant_column_and_an_absent_class_are_flagged(tmp_path: Path,
                                                             schema: Schema) -> None:
    swiss = by_column(check_table(read_raw(site_csv(tmp_path, "switzerland")), schema),
                      "warning")
    assert "every value is 0" in swiss["chol"].message and "not measured" in swiss[
        "chol"].message
    hungary = by_column(check_table(read_raw(site_csv(tmp_path, "hungarian")), schema),
                        "warning")
    assert "classes 2, 3, 4 of the schema never occur" in hungary["num"].message
    cleveland = check_table(read_raw(site_csv(tmp_path, "cleveland")), schema)
    assert [p.severity for p in cleveland] == ["warning"]  # only the unused columns


def test_zero_is_missing_makes_zeros_errors_and_clean_rows_drops_every_bad_row(
        tmp_path: Path, schema: Schema) -> None:
    table = read_raw(site_csv(tmp_path, "va"))
    problems = check_table(table, schema, zero_is_missing=["chol", "trestbps"])
    errors = [p for p in problems if p.severity == "error"]
    assert any("49 zeros" in p.message for p in errors)
    header, rows = clean_rows(table, problems, schema)
    assert header == [*schema.feature_names, "num"]
    # what is left is exactly what the client accepts
    X, y, _ = schema.validate_table({h: [r[k] for r in rows] for k, h in enumerate(header)})
    assert len(rows) == X.shape[0] and 0 < len(rows) < len(table.rows)
    assert (X[:, schema.feature_names.index("chol")] > 0).all()


def test_bounds_unknown_levels_ragged_rows_and_numbers_written_as_codes(
        tmp_path: Path) -> None:
    schema = Schema.from_dict({
        "features": [{"name": "age", "kind": "continuous", "bounds": [0.0, 120.0]},
                     {"name": "sex", "kind": "categorical", "levels": ["0", "1"]}],
        "target": {"name": "y", "kind": "classification", "classes": ["0", "1"]}})
    path = tmp_path / "t.csv"
    path.write_text("age,sex,y\n30,1.0,0\n130,2,1\n40,0\n-1,x,1\n50,1,0\n")
    problems = check_table(read_raw(path), schema)
    text = "\n".join(map(str, problems))
    assert "1 row does not have 3 cells (line 4)" in text
    assert "2 values outside the public bounds [0, 120] (-1, 130) at lines 3, 5" in text
    assert "2 unknown levels ('2', 'x') at lines 3, 5" in text
    assert "1.0" not in text  # the code 1.0 is the level "1"
    # the client's own reader agrees: 1.0 is the level "1"
    ok = tmp_path / "ok.csv"
    ok.write_text("age,sex,y\n30,1.0,0\n50,0,1\n")
    X, _, _ = schema.read_csv(ok)
    assert X[:, 1].tolist() == [1.0, 0.0]


def test_a_file_without_header_says_how_to_add_one() -> None:
    raw = shared_data_dir() / "heart_disease" / "processed.va.data"
    with pytest.raises(SchemaError, match=r"has no header row: its first line holds values "
                                          r"\(63, 1, 4, 140"):
        read_raw(raw)


def test_a_schema_without_bounds_is_flagged_for_the_secure_profiles(tmp_path: Path) -> None:
    schema = Schema.from_dict({
        "features": [{"name": "age", "kind": "continuous"}],
        "target": {"name": "y", "kind": "classification", "classes": ["0", "1"]}})
    path = tmp_path / "t.csv"
    path.write_text("age,y\n30,0\n40,1\n")
    (warning,) = check_table(read_raw(path), schema)
    assert "no public bounds for age" in warning.message and "secure" in warning.advice


def test_cli_check_lists_every_problem_exits_1_and_writes_a_clean_table(
        tmp_path: Path, schema: Schema) -> None:
    from test_config_doc import doc_files

    (tmp_path / "schema.toml").write_text(doc_files()["schema.toml"])
    csv = site_csv(tmp_path, "va")
    runner = CliRunner()
    res = runner.invoke(app, ["check", "--data", str(csv), "--schema",
                              str(tmp_path / "schema.toml"), "--zero-is-missing",
                              "chol,trestbps", "--clean-out", str(tmp_path / "clean.csv")])
    assert res.exit_code == 1, res.output
    assert res.output.count("error   column") == 8  # 6 columns with '?', 2 with zeros
    assert "8 errors, 1 warning: the client would refuse this table" in res.output
    assert "rows to" in res.output
    res = runner.invoke(app, ["check", "--data", str(tmp_path / "clean.csv"), "--schema",
                              str(tmp_path / "schema.toml")])
    assert res.exit_code == 0, res.output
    assert "0 errors" in res.output and "the client accepts this table" in res.output


def test_missing_cells_of_a_column_allowing_them_are_no_problem(tmp_path: Path) -> None:
    from fedforest_secure.schema import Schema
    from fedforest_secure.tablecheck import check_table, read_raw

    sch = Schema.from_dict({
        "features": [{"name": "a", "kind": "continuous", "bounds": [0.0, 10.0],
                      "missing": "allowed"},
                     {"name": "b", "kind": "continuous", "bounds": [0.0, 10.0]}],
        "target": {"name": "y", "kind": "classification", "classes": ["0", "1"]}})
    p = tmp_path / "t.csv"
    p.write_text("a,b,y\n?,1,0\nNA,2,1\n,3,0\n4,?,1\n5,5,0\n")
    problems = [q for q in check_table(read_raw(p), sch) if q.severity == "error"]
    assert [q.column for q in problems] == ["b"]  # a's holes are allowed, b's one is not
    assert "missing = \"allowed\"" in problems[0].advice


_TWO_COLUMNS = """
[[features]]
name = "age"
kind = "continuous"
bounds = [0.0, 120.0]

[target]
name = "y"
kind = "classification"
classes = ["0", "1"]
"""


def _two_column_schema() -> Schema:
    return Schema.from_dict(tomllib.loads(_TWO_COLUMNS))


def test_blank_lines_are_skipped_by_check_and_client_alike_and_lines_stay_the_files(
        tmp_path: Path) -> None:
    """What check accepts the client accepts: both skip blank lines, and a problem after a
    blank line or a cell quoted over two lines is named by the line it is on."""
    from client_app.data import load_site_table

    sch = _two_column_schema()
    (tmp_path / "s.toml").write_text(_TWO_COLUMNS)
    blank = tmp_path / "blank.csv"
    blank.write_text("age,y\n30,0\n\n40,1\n50,0\n\n")
    assert check_table(read_raw(blank), sch) == []
    X, y = load_site_table(blank, tmp_path / "s.toml")
    assert X[:, 0].tolist() == [30.0, 40.0, 50.0] and y.tolist() == [0, 1, 0]
    bad = tmp_path / "bad.csv"
    bad.write_text('age,y\n30,0\n\n"4\n0",1\n500,0\n60,1,7\n')
    text = "\n".join(map(str, check_table(read_raw(bad), sch)))
    assert "(500) at line 6" in text  # line 6 holds the 500
    assert "(line 7)" in text  # the ragged row
    assert "('4\\n0') at line 4" in text  # the cell quoted over lines 4-5 is no number
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("age,y\n30,0\n\n40,1\n50,0\n60,1,7\n")
    with pytest.raises(SchemaError, match=r"ragged\.csv, line 6: has 3 cells"):
        sch.read_csv(ragged)


def test_a_file_not_in_utf8_says_so_and_how_to_save_it(tmp_path: Path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes("âge,y\n30,0\n".encode("latin-1"))
    for read in (read_raw, _two_column_schema().read_csv):
        with pytest.raises(SchemaError, match=r"latin\.csv: not UTF-8 text .* save the table "
                                              r"as CSV in UTF-8"):
            read(path)


def test_a_semicolon_separated_file_is_told_to_use_commas(tmp_path: Path) -> None:
    path = tmp_path / "semi.csv"
    path.write_text("age;y\n30;0\n40;1\n")
    problems = check_table(read_raw(path), _two_column_schema())
    assert problems and all("separates cells with ';', not commas" in p.advice
                            for p in problems if p.message == "missing from the table")


SMALL = ('[target]\nname = "y"\nkind = "classification"\nclasses = ["0", "1"]\n\n'
         '[[features]]\nname = "age"\nkind = "continuous"\nbounds = [0.0, 120.0]\n')


def test_cli_check_names_the_schema_file_it_cannot_validate(tmp_path: Path) -> None:
    (tmp_path / "site.csv").write_text("age,y\n30,1\n40,0\n")
    path = tmp_path / "draft.toml"
    path.write_text(SMALL.replace('["0", "1"]', '["1"]'))
    res = CliRunner().invoke(app, ["check", "--data", str(tmp_path / "site.csv"), "--schema",
                                   str(path)])
    assert res.exit_code == 2
    assert (f"error: invalid schema file {path}: target.classes: needs at least 2 classes, "
            "got 1" in " ".join(res.output.split()))


def test_infinite_values_are_their_own_problem_not_text(tmp_path: Path) -> None:
    rows = ["30,1", "inf,0", "-Infinity,1", "nan,0", "40,1", "abc,0"]
    (tmp_path / "site.csv").write_text("age,y\n" + "\n".join(rows) + "\n")
    schema = Schema.from_dict(tomllib.loads(SMALL))
    problems = check_table(read_raw(tmp_path / "site.csv"), schema)
    by_msg = {p.message.split(" (")[0]: p for p in problems if p.column == "age"}
    inf = by_msg["2 non-finite values"]
    assert inf.message == "2 non-finite values ('inf', '-Infinity') at lines 3, 4"
    assert inf.lines == (3, 4)
    assert "not a measurement" in inf.advice and "categorical" not in inf.advice
    # 'nan' is a missing value, 'abc' is text: each reported as before
    assert by_msg["1 missing value"].lines == (5,)
    assert by_msg["1 value that are not numbers"].lines == (7,)


def test_clean_rows_refuses_a_schema_column_named_twice(tmp_path: Path) -> None:
    """Which of two `age` columns holds the values is for the site to say: --clean-out does
    not pick one."""
    path = tmp_path / "dup.csv"
    path.write_text("age,y,age\n30,0,300\n40,1,400\n")
    table = read_raw(path)
    sch = _two_column_schema()
    with pytest.raises(SchemaError, match="header names age twice"):
        clean_rows(table, check_table(table, sch), sch)


def test_a_missing_or_unknown_target_is_told_what_can_be_done_about_it(tmp_path: Path) -> None:
    """A schema's target cannot be declared missing = "allowed" (the schema refuses the key):
    a missing target is told to drop or fill the rows only; an unknown class names the
    schema's classes in good English."""
    sch = _two_column_schema()
    path = tmp_path / "t.csv"
    path.write_text("age,y\n30,0\n40,\n50,2\n")
    problems = {str(p.message): p for p in check_table(read_raw(path), sch)}
    missing = next(p for m, p in problems.items() if "missing value" in m)
    assert "allowed" not in missing.advice and "drop those rows" in missing.advice
    unknown = next(m for m in problems if "unknown class" in m)
    assert "the schema's classes are 0, 1" in unknown


_WITH_SITE = 'client_column = "site"\n' + _TWO_COLUMNS


def test_a_row_without_its_site_is_an_error_as_for_the_client_and_clean_out_drops_it(
        tmp_path: Path) -> None:
    """The client refuses a missing cell in the schema's client column: check said the
    table was accepted."""
    from client_app.data import load_site_table

    (tmp_path / "s.toml").write_text(_WITH_SITE)
    path = tmp_path / "t.csv"
    path.write_text("age,y,site\n30,0,va\n40,1,\n50,0,NA\n60,1,va\n")
    # the client refuses it, listing check's problem (before: only its own first one)
    with pytest.raises(SchemaError, match=r"(?s)\(1 problem; .*column 'site': 2 missing values"):
        load_site_table(path, tmp_path / "s.toml")
    sch = Schema.from_dict(tomllib.loads(_WITH_SITE))
    (error,) = [p for p in check_table(read_raw(path), sch) if p.severity == "error"]
    assert error.column == "site" and error.lines == (3, 4)
    assert "2 missing values ((empty), NA) at lines 3, 4" in error.message
    assert "site" in error.advice and "--clean-out" in error.advice
    res = CliRunner().invoke(app, ["check", "--data", str(path), "--schema",
                                   str(tmp_path / "s.toml"), "--clean-out",
                                   str(tmp_path / "clean.csv")])
    assert res.exit_code == 1
    assert "1 error, 0 warnings: the client would refuse this table" in res.output
    assert "wrote 2 of 4 rows" in res.output
    X, y = load_site_table(tmp_path / "clean.csv", tmp_path / "s.toml")
    assert X[:, 0].tolist() == [30.0, 60.0]


def test_zero_is_missing_refuses_a_column_that_is_not_a_numeric_one_of_the_schema(
        tmp_path: Path, schema: Schema) -> None:
    """A misspelt or categorical --zero-is-missing column was ignored: the 'clean' file kept
    its zeros."""
    table = read_raw(site_csv(tmp_path, "va"))
    with pytest.raises(SchemaError, match=r"--zero-is-missing: the schema has no column 'chl'; "
                                          r"its numeric columns are 'age', 'trestbps', 'chol', "
                                          r"'thalach', 'oldpeak'"):
        check_table(table, schema, zero_is_missing=["chol", "chl"])
    with pytest.raises(SchemaError, match=r"--zero-is-missing: column 'fbs' is categorical: "
                                          r"its cells are levels \(0, 1\), a zero is never a "
                                          r"missing number; name numeric columns only \(the "
                                          r"schema's: 'age', 'trestbps', 'chol', 'thalach', "
                                          r"'oldpeak'\)"):
        check_table(table, schema, zero_is_missing=["fbs"])
    with pytest.raises(SchemaError, match=r"--zero-is-missing: column 'num' is the "
                                          r"classification target"):
        check_table(table, schema, zero_is_missing=["num"])
    site = Schema.from_dict(tomllib.loads(_WITH_SITE))
    with pytest.raises(SchemaError, match=r"column 'site' is the client column \(each row's "
                                          r"site\), not a number; .*\(the schema's: 'age'\)"):
        check_table(table, site, zero_is_missing=["site"])
    res = CliRunner().invoke(app, ["check", "--data", str(table.path), "--schema",
                                   str(_doc_schema(tmp_path)), "--zero-is-missing", "chl",
                                   "--clean-out", str(tmp_path / "clean.csv")])
    assert res.exit_code == 2
    assert "error: --zero-is-missing: the schema has no column 'chl'" in res.output
    assert not (tmp_path / "clean.csv").exists()


def _doc_schema(tmp_path: Path) -> Path:
    from test_config_doc import doc_files

    path = tmp_path / "schema.toml"
    path.write_text(doc_files()["schema.toml"])
    return path


def test_a_level_spelled_like_a_missing_value_is_a_warning_naming_it(tmp_path: Path) -> None:
    """A categorical cell spelled None, NA, null, nan or N/A is read as missing: a real level
    so spelled would vanish silently, so check warns; '?' and empty cells stay quiet, and a
    level the schema lists as 'None' is a level."""
    sch = Schema.from_dict({
        "features": [
            {"name": "smoking", "kind": "categorical", "levels": ["Heavy", "Light"],
             "missing": "allowed"},
            {"name": "ward", "kind": "categorical", "levels": ["A", "B"], "missing": "allowed"},
            {"name": "age", "kind": "continuous", "bounds": [0.0, 120.0], "missing": "allowed"},
            {"name": "diet", "kind": "categorical", "levels": ["None", "Vegan"]}],
        "target": {"name": "y", "kind": "classification", "classes": ["0", "1"]}})
    path = tmp_path / "site.csv"
    path.write_text("smoking,ward,age,diet,y\nHeavy,A,30,None,0\nNone,?,NA,Vegan,1\n"
                    "Light,,40,None,0\nnone,B,,Vegan,1\nNone,A,50,None,0\n")
    problems = check_table(read_raw(path), sch)
    assert [p.severity for p in problems] == ["warning"]
    (p,) = problems
    assert p.column == "smoking"
    assert p.message == ("3 cells spelled as a missing value ('None': 2, 'none': 1) at lines 3, "
                         "5, 6: FedForest reads them as missing values, not as levels")
    assert p.lines == (3, 5, 6)
    assert "rename it at every site" in p.advice and "add it to the schema's levels" in p.advice
    res = CliRunner().invoke(app, ["check", "--data", str(path), "--schema",
                                   str(_dump(tmp_path, sch))])
    assert res.exit_code == 0 and "0 errors, 1 warning" in res.output


def _dump(tmp_path: Path, sch: Schema) -> Path:
    out = tmp_path / "schema.toml"
    sch.dump(out)
    return out


def test_a_cell_longer_than_the_csv_modules_default_limit_is_read(tmp_path: Path) -> None:
    """A free-text note of 200,000 characters in a column the schema does not use: the file
    is valid CSV, so check and the client read it (csv's default limit is 131,072)."""
    path = tmp_path / "notes.csv"
    note = "very long text, with commas " * 8000
    path.write_text(f'age,note,y\n30,"{note}",0\n40,short,1\n')
    problems = check_table(read_raw(path), _two_column_schema())
    assert [p.message for p in problems] == ["columns not in the schema are ignored: note"]
    X, y, _ = _two_column_schema().read_csv(path)
    assert X[:, 0].tolist() == [30.0, 40.0] and y is not None and y.tolist() == [0, 1]


def test_a_ragged_row_is_reported_once_not_again_by_its_shifted_cells(tmp_path: Path) -> None:
    """An unquoted 1,234 shifts the row's cells: the row is named as ragged, and its shifted
    cells are not checked again as unknown levels or missing values of other columns."""
    sch = Schema.from_dict({
        "features": [{"name": "chol", "kind": "continuous", "bounds": [0.0, 700.0]},
                     {"name": "fbs", "kind": "categorical", "levels": ["0", "1"]}],
        "target": {"name": "y", "kind": "classification", "classes": ["0", "1"]}})
    path = tmp_path / "site.csv"
    path.write_text("chol,fbs,y\n200,0,0\n1,234,1,1\n210,1,1\n220,0\n230,1,0\n")
    problems = check_table(read_raw(path), sch)
    assert [str(p) for p in problems] == [
        "error: 2 rows do not have 3 cells (lines 3, 5) -> fix or delete those lines (a stray "
        "comma or a cut line?); their cells are checked once they fit the header"]


def test_rows_separated_by_semicolons_under_a_comma_header_are_named_as_such(
        tmp_path: Path) -> None:
    sch = Schema.from_dict({
        "features": [{"name": "chol", "kind": "continuous", "bounds": [0.0, 700.0]}],
        "target": {"name": "y", "kind": "classification", "classes": ["0", "1"]}})
    path = tmp_path / "site.csv"
    path.write_text("chol,y\n200;0\n210;1\n")
    problems = check_table(read_raw(path), sch)
    assert [str(p) for p in problems] == [
        "error: 2 rows do not have 2 cells (lines 2, 3) -> the rows separate their cells with "
        "';' while the header uses commas: save the file as comma-separated CSV; their cells "
        "are checked once they fit the header"]


def test_a_text_column_holding_a_bar_does_not_make_a_stray_comma_a_separator(
        tmp_path: Path) -> None:
    """A '|' in a column's text, in every row, is no separator: a row with a stray comma
    (split by the '|' into 2 pieces, not 3 cells) is named as a stray comma or a cut line."""
    path = tmp_path / "site.csv"
    path.write_text("note,chol,y\na|b,200,0\nc|d,2,10,1\n")
    idx, what, todo = read_raw(path).ragged()
    assert (idx, what) == ([1], "1 row does not have 3 cells (line 3)")
    assert todo == "fix or delete that line (a stray comma or a cut line?)"


def test_a_spreadsheets_empty_trailing_columns_are_ignored_with_a_warning(
        tmp_path: Path) -> None:
    """An Excel export's header ending `,y,,` names no column twice: its empty, unnamed columns
    are ignored (a warning says so) by check, draft and client alike; unnamed columns holding
    values are named by their column numbers."""
    from fedforest_secure.schema_draft import draft_schema

    sch = _two_column_schema()
    empty = tmp_path / "excel.csv"
    empty.write_text("age,y,,\n30,0,,\n40,1,,\n50,0, ,\n")
    problems = check_table(read_raw(empty), sch)
    assert [str(p) for p in problems] == [
        "warning: header cells 3 and 4 are empty, as are their columns in every row: "
        "ignored -> nothing to do (a spreadsheet's export may add empty columns); delete "
        "them to silence this warning"]
    X, y, _ = sch.read_csv(empty)
    assert X[:, 0].tolist() == [30.0, 40.0, 50.0] and y is not None
    draft = draft_schema(read_raw(empty), "y", task="classification")
    assert Schema.from_dict(tomllib.loads(draft.text)).feature_names == ["age"]
    assert draft.notes == ("header cells 3 and 4 are empty, as are their columns in every "
                           "row: ignored",)
    full = tmp_path / "unnamed.csv"
    full.write_text("age,,y,\n30,a,0,b\n40,,1,\n")
    (p,) = [p for p in check_table(read_raw(full), sch) if p.severity == "error"]
    assert p.message == "header cells 2 and 4 are empty"
    assert p.advice == "name those columns, or delete them"
    with pytest.raises(SchemaError, match=r"unnamed\.csv: header cells 2 and 4 are empty: "
                                          r"name those columns, or delete them"):
        sch.read_csv(full)
    with pytest.raises(SchemaError, match=r"unnamed\.csv: header cells 2 and 4 are empty"):
        draft_schema(read_raw(full), "y")
    one = tmp_path / "one.csv"
    one.write_text("age,,,y,\n30,,a,0,\n40,,,1,\n")
    assert [str(p) for p in check_table(read_raw(one), sch)] == [
        "warning: header cells 2 and 5 are empty, as are their columns in every row: ignored "
        "-> nothing to do (a spreadsheet's export may add empty columns); delete them to "
        "silence this warning",
        "warning: columns not in the schema are ignored: header cell 3 (no name) -> nothing to "
        "do if that is intended; they never leave the site"]
    with pytest.raises(SchemaError, match=r"one\.csv: header cell 3 is empty while its column "
                                          r"holds values: name the column, or delete it"):
        draft_schema(read_raw(one), "y")


def test_a_feature_missing_in_every_row_is_a_warning(tmp_path: Path) -> None:
    """A column that allows missing values but has none at this site (every cell '?' or
    empty): the client accepts it, check warns that the column is missing in every row."""
    sch = Schema.from_dict({
        "features": [{"name": "age", "kind": "continuous", "bounds": [0.0, 120.0]},
                     {"name": "chol", "kind": "continuous", "bounds": [0.0, 700.0],
                      "missing": "allowed"},
                     {"name": "fbs", "kind": "categorical", "levels": ["0", "1"],
                      "missing": "allowed"}],
        "target": {"name": "y", "kind": "classification", "classes": ["0", "1"]}})
    path = tmp_path / "site.csv"
    path.write_text("age,chol,fbs,y\n30,?,,0\n40,?,,1\n50,?,?,0\n")
    assert [str(p) for p in check_table(read_raw(path), sch)] == [
        f"warning: column '{c}': every cell is missing at this site ({cells}) -> check the "
        "export (a column left out?); if it is not recorded here, tell the federation"
        for c, cells in (("chol", "?"), ("fbs", "(empty), ?"))]
    sch.read_csv(path)  # the client accepts it


def test_numbers_with_underscores_or_non_ascii_digits_are_not_numbers(tmp_path: Path) -> None:
    """Python's float reads 2_50 as 250 and full-width ４０ as 40: in a CSV file they are typos
    or foreign text, refused by check and client alike as any other non-number."""
    sch = _two_column_schema()
    path = tmp_path / "site.csv"
    path.write_text("age,y\n30,0\n2_50,1\n４０,0\n١٢٠,1\n 45 ,0\n", encoding="utf-8")
    (p,) = check_table(read_raw(path), sch)
    assert p.message == ("3 values that are not numbers ('2_50', '４０', '١٢٠') at lines 3, 4, 5")
    with pytest.raises(SchemaError,
                       match=r"site\.csv, line 3: column 'age': '2_50' is not a number"):
        sch.read_csv(path)
    for cell in ("４０", "١٢٠"):
        with pytest.raises(SchemaError, match=f"column 'age', row 2: '{cell}' is not a number"):
            sch.validate_table({"age": ["30", cell], "y": ["0", "1"]})
    X, _, _ = sch.validate_table({"age": ["30", "\u00a045 "], "y": ["0", "1"]})
    assert X[:, 0].tolist() == [30.0, 45.0]  # surrounding (non-ASCII) spaces are no digits


def test_a_table_holding_several_sites_rows_is_an_error_naming_each_site_and_its_rows(
        tmp_path: Path) -> None:
    """One file holding every site's rows, given to each site, was accepted: each row was
    counted once per site (root weighted_n_node_samples 4 x 650). check names the sites and
    their row counts; --clean-out cannot tell which rows are this site's and refuses."""
    (tmp_path / "s.toml").write_text(_WITH_SITE)
    path = tmp_path / "all_sites.csv"
    path.write_text("age,y,site\n30,0,va\n40,1,cle\n50,0,va\n60,1,hu\n70,0,va\n")
    sch = Schema.from_dict(tomllib.loads(_WITH_SITE))
    (error,) = [p for p in check_table(read_raw(path), sch) if p.severity == "error"]
    assert error.column == "site"
    assert "3 sites (va: 3 rows, cle: 1 row, hu: 1 row)" in error.message
    assert "each site gives its own rows" in error.advice
    res = CliRunner().invoke(app, ["check", "--data", str(path), "--schema",
                                   str(tmp_path / "s.toml")])
    assert res.exit_code == 1, res.output
    assert "1 error, 0 warnings: the client would refuse this table" in res.output
    res = CliRunner().invoke(app, ["check", "--data", str(path), "--schema",
                                   str(tmp_path / "s.toml"), "--clean-out",
                                   str(tmp_path / "clean.csv")])
    assert res.exit_code == 2
    assert "cannot clean a table holding several sites' rows" in res.output
    assert not (tmp_path / "clean.csv").exists()
    # a pooled table split in process (experiments, estimators' client=) is still read whole
    _, _, client = sch.read_csv(path)
    assert client is not None and client.tolist() == ["va", "cle", "va", "hu", "va"]


def test_the_client_refuses_a_table_of_several_sites_and_declines_the_job_as_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client read the client column and threw it away: a table of every site's rows
    joined the job. It refuses it with check's error and tells the server "table"."""
    from client_app import runner
    from client_app.data import load_site_table

    (tmp_path / "s.toml").write_text(_WITH_SITE)
    path = tmp_path / "all_sites.csv"
    path.write_text("age,y,site\n30,0,va\n40,1,cle\n50,0,va\n")
    with pytest.raises(SchemaError, match=r"(?s)\(1 problem; .*column 'site': the table holds "
                                          r"2 sites \(va: 2 rows, cle: 1 row\)"):
        load_site_table(path, tmp_path / "s.toml")
    one = tmp_path / "va.csv"
    one.write_text("age,y,site\n30,0,va\n50,1,va\n")
    X, _ = load_site_table(one, tmp_path / "s.toml")
    assert X[:, 0].tolist() == [30.0, 50.0]

    sent: list[tuple[str, object]] = []

    class Recorder:
        def __init__(self, *a: object, **k: object) -> None:
            pass

        def post_json(self, path: str, body: object = None) -> object:
            sent.append((path, body))
            return {}

        def close(self) -> None:
            pass

    from client_app import declines

    monkeypatch.setattr(declines, "Transport", Recorder)  # the decline's own connection
    opts = runner.ClientOptions(server="https://fedforest.example.org", token="t", job="job-t",
                                data=path, schema=tmp_path / "s.toml", ca=None,
                                state_dir=tmp_path / "state", quiet=True)
    with pytest.raises(SchemaError, match="2 sites"):
        runner.run_client(opts)
    assert sent == [("/v1/jobs/job-t/decline", {"reason": "table"})]


_ZERO_SCHEMA = """
[target]
name = "y"
kind = "classification"
classes = ["no", "yes"]

[[features]]
name = "age"
kind = "continuous"
bounds = [0.0, 120.0]

[[features]]
name = "chol"
kind = "continuous"
bounds = [0.0, 700.0]
missing = "allowed"
"""


def test_zero_is_missing_on_a_column_allowing_missing_values_writes_empty_cells_not_drops(
        tmp_path: Path) -> None:
    """--zero-is-missing on a column whose schema allows missing values dropped whole rows
    and advised allowing missing values, which the schema already did: the zeros are a
    warning and --clean-out writes them as empty cells, keeping every row."""
    from client_app.data import load_site_table

    (tmp_path / "s.toml").write_text(_ZERO_SCHEMA)
    path = tmp_path / "site.csv"
    path.write_text("age,chol,y\n50,200,no\n60,0,yes\n70,,yes\n40,180,no\n55,0,no\n")
    sch = Schema.from_dict(tomllib.loads(_ZERO_SCHEMA))
    table = read_raw(path)
    problems = check_table(table, sch, zero_is_missing=["chol"])
    assert [p.severity for p in problems] == ["warning"]
    (note,) = problems
    assert note.column == "chol" and note.lines == (3, 6)
    assert "2 zeros (--zero-is-missing: missing values) at lines 3, 6" in note.message
    assert "allowed" not in note.advice and "empty" in note.advice
    header, rows = clean_rows(table, problems, sch)
    assert header == ["age", "chol", "y"]
    assert rows == [["50", "200", "no"], ["60", "", "yes"], ["70", "", "yes"],
                    ["40", "180", "no"], ["55", "", "no"]]
    res = CliRunner().invoke(app, ["check", "--data", str(path), "--schema",
                                   str(tmp_path / "s.toml"), "--zero-is-missing", "chol",
                                   "--clean-out", str(tmp_path / "clean.csv")])
    # the client reads those zeros as the number 0: only the clean file is read as checked
    assert res.exit_code == 1, res.output
    assert ("0 errors, 1 warning: the client would accept this table but read its "
            "--zero-is-missing zeros as the number 0, not as missing values: train on the file "
            "--clean-out writes (and check it again), with those zeros as empty cells"
            ) in " ".join(res.output.split())
    assert "wrote 5 of 5 rows" in res.output
    assert load_site_table(path, tmp_path / "s.toml")[0][1, 1] == 0.0
    res = CliRunner().invoke(app, ["check", "--data", str(tmp_path / "clean.csv"), "--schema",
                                   str(tmp_path / "s.toml"), "--zero-is-missing", "chol"])
    assert res.exit_code == 0 and "the client accepts this table" in res.output, res.output
    X, _ = load_site_table(tmp_path / "clean.csv", tmp_path / "s.toml")
    assert np.isnan(X[[1, 2, 4], 1]).all() and X[[0, 3], 1].tolist() == [200.0, 180.0]
    # without --zero-is-missing, the hint says what --clean-out will do with the zeros
    path.write_text("age,chol,y\n50,200,no\n60,0,yes\n70,250,yes\n40,180,no\n55,220,no\n")
    (hint,) = [p for p in check_table(read_raw(path), sch) if "hidden" in p.message]
    assert "--zero-is-missing chol" in hint.advice and "empty cells" in hint.advice


def test_unknown_classes_and_levels_are_counted_in_good_english(tmp_path: Path) -> None:
    """'11 unknown classs': the plural of class is classes (and one class occurs)."""
    sch = Schema.from_dict({
        "features": [{"name": "sex", "kind": "categorical", "levels": ["f", "m"]}],
        "target": {"name": "y", "kind": "classification", "classes": ["0", "1"]}})
    path = tmp_path / "t.csv"
    path.write_text("sex,y\nf,0\nx,2\nm,3\n")
    text = "\n".join(p.message for p in check_table(read_raw(path), sch))
    assert "2 unknown classes ('2', '3') at lines 3, 4" in text
    assert "1 unknown level ('x') at line 3" in text
    assert "class 1 of the schema never occurs at this site" in text  # not 'never occur'
    path.write_text("sex,y\nf,0\nm,2\n")
    text = "\n".join(p.message for p in check_table(read_raw(path), sch))
    assert "1 unknown class ('2') at line 3" in text


def test_zero_is_missing_zeros_outside_the_bounds_are_no_verdict_of_acceptance(
        tmp_path: Path) -> None:
    """With --zero-is-missing b, the zero of b (bounds [1, 10], missing values allowed) is a
    missing value to check: the client, which reads it as the number 0, refuses the file.
    The verdict says so, and that the client accepts the clean file; exit code 1."""
    from client_app.data import load_site_table

    schema = tmp_path / "s.toml"
    schema.write_text(_ZERO_SCHEMA.replace("[0.0, 700.0]", "[1.0, 10.0]")
                      .replace('"chol"', '"b"').replace('"age"', '"a"'))
    data = tmp_path / "site.csv"
    data.write_text("a,b,y\n2,0,no\n3,4,yes\n5,6,no\n7,8,yes\n")
    clean = tmp_path / "clean.csv"
    res = CliRunner().invoke(app, ["check", "--data", str(data), "--schema", str(schema),
                                   "--zero-is-missing", "b", "--clean-out", str(clean)])
    assert res.exit_code == 1, res.output
    assert ("0 errors, 1 warning: the client would refuse this table, reading a zero as the "
            "number 0 (column 'b': 1 value outside the public bounds [1, 10] (0) at line 2): "
            "train on the file --clean-out writes (and check it again), with the "
            "--zero-is-missing zeros as empty cells") in " ".join(res.output.split())
    with pytest.raises(SchemaError) as refused:  # as the verdict says
        load_site_table(data, schema)
    assert "column 'b': 1 value outside the public bounds [1, 10] (0) at line 2" in str(
        refused.value)
    # the client's message names the check that lists the same problems: it does
    named = CliRunner().invoke(app, ["check", "--data", str(data), "--schema", str(schema)])
    assert named.exit_code == 1
    assert "column 'b': 1 value outside the public bounds [1, 10] (0) at line 2" in named.output
    X, _ = load_site_table(clean, schema)  # the clean file, as the verdict says
    assert np.isnan(X[0, 1]) and X[1:, 1].tolist() == [4.0, 6.0, 8.0]
    # zeros of a column without missing values: errors under --zero-is-missing, numbers to
    # the client, which accepts the table
    data.write_text("a,b,y\n0,3,no\n3,4,yes\n5,6,no\n7,8,yes\n")
    schema.write_text(schema.read_text().replace("bounds = [1.0, 10.0]\n\n",
                                                 "bounds = [0.0, 10.0]\n\n", 1))
    load_site_table(data, schema)
    res = CliRunner().invoke(app, ["check", "--data", str(data), "--schema", str(schema),
                                   "--zero-is-missing", "a"])
    assert res.exit_code == 1, res.output
    assert ("1 error, 0 warnings: the client would accept this table but read its "
            "--zero-is-missing zeros as the number 0, not as missing values: train on the file "
            "--clean-out writes (and check it again)") in " ".join(res.output.split())
    # a --zero-is-missing column without zeros changes nothing
    res = CliRunner().invoke(app, ["check", "--data", str(data), "--schema", str(schema),
                                   "--zero-is-missing", "b"])
    assert res.exit_code == 0 and "0 errors, 1 warning: the client accepts this table" in \
        res.output, res.output


def _spread_schema(x_bounds: list[float], y_bounds: list[float]) -> Schema:
    return Schema.from_dict({
        "features": [{"name": "x", "kind": "continuous", "bounds": x_bounds}],
        "target": {"name": "y", "kind": "regression", "bounds": y_bounds}})


def test_a_target_spread_too_narrow_for_its_bounds_is_a_warning_naming_both(
        tmp_path: Path) -> None:
    """Targets of standard deviation about 1,000 under bounds [0, 1e8]: under a secure profile
    the sums of y^2 come in steps of (5e7)^2 * 2^-24, too coarse for the trees (test R^2 0.81
    against 0.99). Bounds [0, 1e5] are fine; a feature whose bulk is below the secure sketch's
    narrowest cell of its bounds is flagged too."""
    y = 21674.0 + 1000.0 * np.sin(np.arange(200))
    x = np.linspace(0.0, 10.0, 200)
    path = tmp_path / "site.csv"
    rows = zip(x.tolist(), y.tolist(), strict=True)
    path.write_text("x,y\n" + "".join(f"{a!r},{b!r}\n" for a, b in rows))
    sd = float(np.std(y))
    wide = check_table(read_raw(path), _spread_schema([-1e300, 1e300], [0.0, 1e8]))
    assert [(p.severity, p.column) for p in wide] == [("warning", "x"), ("warning", "y")]
    assert wide[1].message == (
        f"its standard deviation at this site ({sd:.3g}) is below 2.44e+04, 1/2048 of the "
        "half-width of its bounds [0, 1e+08]: under a secure profile (frac_bits 24) the "
        "sites' sums of y^2 are kept in steps of 1.49e+08, too coarse for the target's "
        "variance in small nodes, and the trees lose splits")
    assert "narrow the target's bounds in schema.toml" in wide[1].advice
    assert wide[0].message == (
        "the middle half of its distinct values at this site spans 5, less than 1e-12 of the "
        "width of its bounds [-1e+300, 1e+300]: the secure sketch cuts no finer, so the "
        "forest may split on it rarely or never")
    assert check_table(read_raw(path), _spread_schema([0.0, 10.0], [0.0, 1e5])) == []


def test_bounds_wider_than_the_largest_float_are_refused() -> None:
    with pytest.raises(SchemaError, match=r"bounds \[-1e\+308, 1e\+308\] are wider than the "
                       r"largest float: give the column's plausible range"):
        _spread_schema([-1e308, 1e308], [0.0, 1.0])


@pytest.mark.parametrize("cell,what", [("-nan", "non-finite value"),
                                       ("1\x00", "not a number"), ("\x00", "not a number")])
def test_a_nan_written_as_a_number_or_a_nul_byte_is_refused_by_check_and_client_alike(
        tmp_path: Path, cell: str, what: str) -> None:
    """In a column that allows missing values: missing is a word ('nan', 'NA', '?', empty),
    not a NaN printed as a number; a cell holding a NUL byte is no number (numpy's text
    arrays would drop it, reading '1\\x00' as 1)."""
    sch = Schema.from_dict({
        "features": [{"name": "x", "kind": "continuous", "bounds": [-5.0, 5.0],
                      "missing": "allowed"}],
        "target": {"name": "y", "kind": "regression", "bounds": [-10.0, 10.0]}})
    path = tmp_path / "site.csv"
    path.write_bytes(f"x,y\n1,1\nnan,2\n{cell},3\n".encode())
    errors = [p for p in check_table(read_raw(path), sch) if p.severity == "error"]
    assert [(p.column, p.lines) for p in errors] == [("x", (4,))]
    with pytest.raises(SchemaError, match=rf"site.csv, line 4: column 'x': .*{what}"):
        sch.read_csv(path)


_COMMA_SCHEMA = """\
[target]
name = "outcome"
kind = "classification"
classes = ["no", "yes"]
[[features]]
name = "age"
kind = "continuous"
bounds = [0, 120]
[[features]]
name = "weight, kg"
kind = "continuous"
bounds = [1, 300]
missing = "allowed"
"""


def test_a_zero_is_missing_column_holding_a_comma_is_named_as_the_advice_writes_it(
        tmp_path: Path) -> None:
    """The advice said ``--zero-is-missing weight, kg``, which named the columns 'weight'
    and 'kg': the column's zeros could not be marked missing. It says how to quote the name,
    and the command it prints works."""
    import re
    import shlex

    (tmp_path / "s.toml").write_text(_COMMA_SCHEMA)
    (tmp_path / "site.csv").write_text('age,"weight, kg",outcome\n50,70.5,yes\n60,80.1,no\n'
                                       "70,0,no\n")
    base = ["check", "--data", str(tmp_path / "site.csv"), "--schema", str(tmp_path / "s.toml")]
    runner = CliRunner()
    said = runner.invoke(app, base).output
    advice = re.search(r"rerun with --zero-is-missing (.*) \(--clean-out", said)
    assert advice is not None and advice[1] == "'\"weight, kg\"'", said
    said = runner.invoke(app, [*base, "--zero-is-missing", *shlex.split(advice[1])]).output
    assert ("column 'weight, kg': 1 zero (--zero-is-missing: missing values) at line 4"
            in said), said
    said = " ".join(runner.invoke(app, [*base, "--zero-is-missing", "weight, kg"]).output.split())
    assert ("error: --zero-is-missing: the schema has no column 'weight'; its numeric columns "
            "are 'age', 'weight, kg': to name the column 'weight, kg', write it in double "
            "quotes: --zero-is-missing '\"weight, kg\"'") in said, said


def test_a_name_or_label_in_another_unicode_normalisation_is_told_apart(
        tmp_path: Path) -> None:
    """A header or class written in NFD (e and U+0301, as some macOS tools write it) against
    the schema's NFC was refused with messages showing the same text twice: both are shown in
    ASCII escapes, with the normalisation to save the table in."""
    import unicodedata

    from client_app.data import load_site_table

    nfc, nfd = (lambda s: unicodedata.normalize("NFC", s)), (
        lambda s: unicodedata.normalize("NFD", s))
    (tmp_path / "s.toml").write_text(
        f'[target]\nname = "outcome"\nkind = "classification"\nclasses = ["{nfc("élevé")}", '
        f'"bas"]\n\n[[features]]\nname = "{nfc("poids_é")}"\nkind = "continuous"\n'
        "bounds = [0, 300]\n")
    (tmp_path / "site.csv").write_text(f"{nfd('poids_é')},outcome\n50,bas\n60,{nfd('élevé')}\n")
    problems = check_table(read_raw(tmp_path / "site.csv"), Schema.load(tmp_path / "s.toml"))
    errors = {p.column: p for p in problems if p.severity == "error"}
    assert errors[nfc("poids_é")].advice == (
        f"the table's {nfd('poids_é')!r} differs from the schema's {nfc('poids_é')!r} in Unicode "
        "normalisation only ('poids_e\\u0301' against 'poids_\\xe9'): save the table's text in "
        "NFC")
    assert errors["outcome"].advice.endswith(
        "in Unicode normalisation only ('e\\u0301leve\\u0301' against '\\xe9lev\\xe9'): save "
        "the table's text in NFC")
    with pytest.raises(SchemaError, match=r"in Unicode normalisation only \('poids_e\\u0301' "
                                          r"against 'poids_\\xe9'\)"):
        load_site_table(tmp_path / "site.csv", tmp_path / "s.toml")
    (tmp_path / "site.csv").write_text(f"{nfc('poids_é')},outcome\n50,bas\n60,{nfd('élevé')}\n")
    with pytest.raises(SchemaError, match=r"unknown class .*in Unicode normalisation only"):
        load_site_table(tmp_path / "site.csv", tmp_path / "s.toml")
    schema = Schema.load(tmp_path / "s.toml")  # the in-process reader says the same
    with pytest.raises(SchemaError, match=r"unknown class '.*' \(the table's .* in Unicode "
                                          r"normalisation only"):
        schema.read_csv(tmp_path / "site.csv")
    (tmp_path / "site.csv").write_text(f"{nfd('poids_é')},outcome\n50,bas\n60,bas\n")
    with pytest.raises(SchemaError, match=r"missing from the table \(the table's .* in Unicode "
                                          r"normalisation only \('poids_e\\u0301' against"):
        schema.read_csv(tmp_path / "site.csv")


def test_target_bounds_far_wider_than_the_data_are_a_warning_in_every_profile(
        tmp_path: Path) -> None:
    """Targets of 100 +- 10 under bounds [0, 1e8]: the sites centre them on 5e7, and a node
    whose spread is below 1e-6 of that distance (50) reads as pure in every profile, open
    included (every tree a single leaf). The warning names it beside the fixed-point one;
    bounds [0, 300] are fine."""
    y = 100.0 + 10.0 * np.sin(np.arange(200))
    path = tmp_path / "site.csv"
    path.write_text("x,y\n" + "".join(f"{i},{v!r}\n" for i, v in enumerate(y.tolist())))
    q1, median, q3 = np.percentile(y, [25.0, 50.0, 75.0])
    wide = check_table(read_raw(path), _spread_schema([0.0, 200.0], [0.0, 1e8]))
    assert [(p.severity, p.column) for p in wide] == [("warning", "y")]
    assert wide[0].message.endswith(
        f"trees lose splits; the middle half of its values at this site spreads about "
        f"{(q3 - q1) / 1.349:.3g} (as a standard deviation) around {median:.6g}, far from the "
        "middle of its bounds (5e+07) that the sites centre it on: in every profile a node "
        "whose spread is below about 50 there reads as pure (float rounding of the sums of "
        "y^2), and the trees stop splitting")
    assert check_table(read_raw(path), _spread_schema([0.0, 200.0], [0.0, 300.0])) == []
