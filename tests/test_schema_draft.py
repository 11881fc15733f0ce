"""fedforest schema draft: kinds, levels and classes from a site's file, never bounds."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_tablecheck import site_csv
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_secure.errors import SchemaError
from fedforest_secure.schema import Schema
from fedforest_secure.schema_draft import draft_schema
from fedforest_secure.tablecheck import read_raw


def test_the_draft_of_a_raw_hospital_file_has_kinds_levels_classes_and_no_bounds(
        tmp_path: Path) -> None:
    text = draft_schema(read_raw(site_csv(tmp_path, "cleveland")), "num").text
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
    text = draft_schema(table, "chol", categorical=["age"], continuous=["sex"]).text
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
    # a path with brackets is printed as it is (they are not console markup)
    (tmp_path / "d[old]").mkdir()
    odd = tmp_path / "d[old]" / "schema.toml"
    res = runner.invoke(app, ["schema", "draft", "--data", str(csv), "--target", "num",
                              "--out", str(odd)])
    assert res.exit_code == 0 and odd.is_file()
    assert str(odd) in res.output.replace("\n", ""), res.output


def small_csv(tmp_path: Path, name: str, header: str = "age,color,y",
              rows: list[str] | None = None) -> Path:
    """A site's file: ``header`` and ``rows`` (default: 40 rows of age, color and a 0/1 y)."""
    if rows is None:
        rows = [f"{20 + (7 * i) % 60},{'red' if i % 3 else 'green'},{i % 2}" for i in range(40)]
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_a_target_with_one_class_at_this_site_is_refused_saying_what_to_do(
        tmp_path: Path) -> None:
    rows = [f"{20 + i},red,1" for i in range(40)]
    table = read_raw(small_csv(tmp_path, "one.csv", rows=rows))
    with pytest.raises(SchemaError) as err:
        draft_schema(table, "y")
    msg = str(err.value)
    assert "target 'y' has one class at this site ('1')" in msg
    assert "classes = [...]" in msg and "another --target" in msg
    # the draft is refused, not written for check to reject
    res = CliRunner().invoke(app, ["schema", "draft", "--data", str(table.path), "--target", "y",
                                   "--out", str(tmp_path / "d.toml")])
    assert res.exit_code == 2 and "has one class at this site" in res.output
    assert not (tmp_path / "d.toml").exists()


def test_duplicate_column_names_are_refused_naming_them(tmp_path: Path) -> None:
    rows = [f"{20 + i},red,{i % 2},{200 + i}" for i in range(40)]
    table = read_raw(small_csv(tmp_path, "dup.csv", "age,color,y,age", rows))
    with pytest.raises(SchemaError, match=r"duplicate column names: 'age' \(columns 1 and 4\)"):
        draft_schema(table, "y")


def test_the_client_column_cannot_be_the_target_nor_a_column_both_kinds(tmp_path: Path) -> None:
    table = read_raw(small_csv(tmp_path, "s.csv"))
    with pytest.raises(SchemaError, match="'y' cannot be both the target and the client column"):
        draft_schema(table, "y", client_column="y")
    with pytest.raises(SchemaError, match="'age' is in both --categorical and --continuous"):
        draft_schema(table, "y", categorical=["age"], continuous=["age"])


def test_a_file_without_data_rows_is_refused(tmp_path: Path) -> None:
    table = read_raw(small_csv(tmp_path, "h.csv", rows=[]))
    with pytest.raises(SchemaError, match=r"h\.csv has no data rows to draft from"):
        draft_schema(table, "y")


def test_continuous_for_a_text_column_is_refused_naming_a_cell_and_its_line(
        tmp_path: Path) -> None:
    table = read_raw(small_csv(tmp_path, "s.csv"))
    with pytest.raises(SchemaError, match=r"--continuous color: the column holds text \('green' "
                                          r"at line 2, 'red' at line 3 and 38 more cells\)"):
        draft_schema(table, "y", continuous=["color"])
    # numbers with a few stray cells may be forced continuous (check reports the cells)
    rows = [f"{20 + i},{'red' if i % 3 else 'green'},{i % 2}" for i in range(39)] + ["abc,red,0"]
    stray = read_raw(small_csv(tmp_path, "t.csv", rows=rows))
    forced = Schema.from_dict(tomllib.loads(draft_schema(stray, "y", continuous=["age"]).text))
    assert forced.feature_kinds[0] == "continuous"


def test_a_few_non_numbers_in_a_numeric_column_are_reported_and_it_stays_continuous(
        tmp_path: Path) -> None:
    rows = [f"{20 + i},{'red' if i % 3 else 'green'},{i % 2}" for i in range(39)]
    rows.insert(3, "abc,red,0")
    path = small_csv(tmp_path, "stray.csv", rows=rows)
    draft = draft_schema(read_raw(path), "y")
    schema = Schema.from_dict(tomllib.loads(draft.text))
    age = schema.features[schema.feature_names.index("age")]
    assert age.kind == "continuous" and age.levels is None
    (note,) = draft.notes
    assert note.startswith("column 'age': 1 cell is not a number ('abc' at line 5)")
    assert "drafted continuous" in note and "--categorical age" in note
    assert f"# {note}" in draft.text  # the draft file says so too
    res = CliRunner().invoke(app, ["schema", "draft", "--data", str(path), "--target", "y",
                                   "--out", str(tmp_path / "d.toml")])
    assert res.exit_code == 0
    assert "warning: column 'age': 1 cell is not a number ('abc' at line 5)" in " ".join(
        res.output.split())
    # many text cells: a text column, drafted categorical with its levels, without a note
    rows = [f"{20 + i if i % 2 else 'young'},{'red' if i % 3 else 'green'},{i % 2}"
            for i in range(40)]
    text = draft_schema(read_raw(small_csv(tmp_path, "mixed.csv", rows=rows)), "y")
    assert text.notes == () and '"young"' in text.text


def test_a_feature_with_one_value_at_this_site_is_drafted_valid_or_flagged(
        tmp_path: Path) -> None:
    # a number constant at this site: continuous (one code cannot make a categorical
    # feature); one text level: written with a note asking for the other sites' levels
    rows = [f"{20 + i},red,0,{i % 2}" for i in range(40)]
    draft = draft_schema(read_raw(small_csv(tmp_path, "c.csv", "age,color,fbs,y", rows)), "y")
    assert 'name = "fbs"\nkind = "continuous"' in draft.text
    (note,) = draft.notes
    assert note.startswith("column 'color' has 1 level at this site ('red'): a categorical "
                           "feature needs at least 2. Add the levels the other sites use")


def test_a_semicolon_separated_file_is_told_to_use_commas_as_check_tells_it(
        tmp_path: Path) -> None:
    table = read_raw(small_csv(tmp_path, "semi.csv", "age;y", ["30;0", "40;1"]))
    with pytest.raises(SchemaError, match=r"column 'y' is not in .*semi\.csv \(columns: "
                                          r"'age;y'\): the file separates cells with ';', not "
                                          r"commas: save it as comma-separated CSV"):
        draft_schema(table, "y")
    res = CliRunner().invoke(app, ["schema", "draft", "--data", str(table.path), "--target",
                                   "y"])
    assert res.exit_code == 2
    assert "save it as comma-separated CSV" in res.output


def test_ragged_rows_are_refused_naming_their_lines_as_check_names_them(
        tmp_path: Path) -> None:
    """Read by position, a decimal comma (8,1674) would shift a number into the target's
    classes and a cut line would make a feature "missing": the draft refuses such rows."""
    rows = [f"{20 + i}.5,{i % 2}" for i in range(40)]
    rows[1] = "8,1674,1"  # line 3: an unquoted decimal comma
    rows[6] = "33.5"  # line 8: a cut line
    path = small_csv(tmp_path, "ragged.csv", "age,y", rows)
    with pytest.raises(SchemaError, match=r"ragged\.csv: 2 rows do not have 2 cells \(lines 3, "
                                          r"8\): fix or delete those lines \(a stray comma or "
                                          r"a cut line\?\), then draft again"):
        draft_schema(read_raw(path), "y")
    path.write_text(path.read_text().replace("33.5\n", "33.5,1\n"))
    with pytest.raises(SchemaError, match=r"ragged\.csv: 1 row does not have 2 cells \(line 3\): "
                                          r"fix or delete that line \(a stray comma"):
        draft_schema(read_raw(path), "y")
    res = CliRunner().invoke(app, ["schema", "draft", "--data", str(path), "--target", "y",
                                   "--out", str(tmp_path / "d.toml")])
    assert res.exit_code == 2 and "1 row does not have 2 cells (line 3)" in res.output
    assert not (tmp_path / "d.toml").exists()


def test_rows_separated_by_semicolons_under_a_comma_header_are_named_as_such(
        tmp_path: Path) -> None:
    rows = [f"{20 + i};{i % 2}" for i in range(40)]
    path = small_csv(tmp_path, "semi_rows.csv", "age,y", rows)
    with pytest.raises(SchemaError, match=r"semi_rows\.csv: 40 rows do not have 2 cells \(lines "
                                          r"2, 3, 4, 5, 6, 7, 8, 9 and 32 more\): the rows "
                                          r"separate their cells with ';' while the header uses "
                                          r"commas: save the file as comma-separated CSV, then "
                                          r"draft again"):
        draft_schema(read_raw(path), "y")


def test_a_level_spelled_like_a_missing_value_is_named_with_its_count_and_what_to_do(
        tmp_path: Path) -> None:
    """'None' (no smoking) is a real level that FedForest reads as missing: the draft says so,
    naming the column, the spelling, the count and the first line, instead of dropping it."""
    rows = [f"{20 + i},{('Heavy', 'None', 'Light')[i % 3]},{'NA' if i == 5 else i},{i % 2}"
            for i in range(40)] + ["60,null,7,0", "61,?,8,1"]
    path = small_csv(tmp_path, "smoking.csv", "age,smoking,score,y", rows)
    draft = draft_schema(read_raw(path), "y")
    schema = Schema.from_dict(tomllib.loads(draft.text))
    smoking = schema.features[schema.feature_names.index("smoking")]
    assert smoking.levels == ["Heavy", "Light"] and smoking.may_miss
    (note,) = draft.notes  # the continuous score's 'NA' and smoking's '?' are missing values
    assert note.startswith("column 'smoking': 13 cells 'None' (first at line 3) and 1 cell "
                           "'null' (line 42) are read as missing values by FedForest")
    assert "rename it at every site" in note and "add it to the levels" in note
    assert f"# {note}" in draft.text
    res = CliRunner().invoke(app, ["schema", "draft", "--data", str(path), "--target", "y",
                                   "--out", str(tmp_path / "d.toml")])
    assert res.exit_code == 0
    assert "warning: column 'smoking': 13 cells 'None'" in " ".join(res.output.split())


def test_a_header_with_a_line_break_or_a_control_character_drafts_valid_toml(
        tmp_path: Path) -> None:
    """Spreadsheets allow line breaks in a header cell: the draft escapes them as TOML basic
    strings do, so it parses and names the column exactly as the file does."""
    rows = [f"{20 + i},{100 + 2 * i},{'AB'[i % 2]},{'no' if i % 3 else 'yes'}"
            for i in range(40)]
    header = 'age,"Blood pressure\n(mmHg)","Ward\tname \\ ""x""\x01",outcome'
    path = small_csv(tmp_path, "h.csv", header, rows)
    table = read_raw(path)
    draft = draft_schema(table, "outcome")
    schema = Schema.from_dict(tomllib.loads(draft.text))
    assert schema.feature_names == ["age", "Blood pressure\n(mmHg)", 'Ward\tname \\ "x"\x01']
    assert schema.feature_names == table.header[:3]
    assert '"Blood pressure\\n(mmHg)"' in draft.text and "\\u0001" in draft.text


@given(st.text())
def test_every_text_quoted_for_the_draft_reads_back_from_toml_unchanged(text: str) -> None:
    from fedforest_secure.schema_draft import _q

    assert tomllib.loads(f"name = {_q(text)}")["name"] == text


def test_columns_holding_a_comma_are_named_in_double_quotes_as_the_advice_writes_them(
        tmp_path: Path) -> None:
    """``--categorical 'weight, kg'`` named two columns 'weight' and 'kg', and the draft's own
    advice said to pass it so: no column holding a comma could be named. A name is now
    written as in the CSV header, in double quotes, and the advice runs as printed."""
    import re
    import shlex

    rows = [f"{20 + i},{i % 3},{60 + i}.5,{i % 2}" for i in range(12)] + ["55,2,n/a?,1"]
    data = small_csv(tmp_path, "site.csv", 'age,"ward, code","weight, kg",y', rows)
    base = ["schema", "draft", "--data", str(data), "--target", "y"]
    runner = CliRunner()
    said = " ".join(runner.invoke(app, base).output.split())
    advice = re.search(r"rerun with --categorical (.*?) if the column holds text", said)
    assert advice is not None and advice[1] == "'\"weight, kg\"'", said
    res = runner.invoke(app, [*base, "--categorical", *shlex.split(advice[1]),
                              "--categorical", '"ward, code"'])
    assert res.exit_code == 0, res.output
    kinds = {f.name: f.kind for f in Schema.from_dict(tomllib.loads(
        res.output[res.output.index("# Draft"):])).features}
    assert kinds == {"age": "continuous", "ward, code": "categorical",
                     "weight, kg": "categorical"}
    res = runner.invoke(app, [*base, "--categorical", "ward, code"])
    assert res.exit_code == 2
    assert (f"column 'ward' is not in {data} (columns: 'age', 'ward, code', 'weight, kg', "
            "'y'): to name the column 'ward, code', write it in double quotes: --categorical "
            "'\"ward, code\"'") in " ".join(res.output.split())


@pytest.mark.parametrize("option", ["--target", "--client-column"])
def test_a_piece_of_a_column_named_with_a_comma_is_answered_with_a_command_that_runs(
        tmp_path: Path, option: str) -> None:
    """``--target`` and ``--client-column`` name one column each, their value taken as it is
    (no CSV row): the advice to write the name in double quotes gave a command that named no
    column. The advice gives the name whole, quoted for the shell only, and runs as printed."""
    import re
    import shlex

    rows = [f"{20 + i},{60 + i}.5,site-{i % 2},{i % 2}" for i in range(12)]
    data = small_csv(tmp_path, "site.csv", 'age,"weight, kg","site, id",y', rows)
    piece, base = ("weight", ["--target"]) if option == "--target" else \
        ("site", ["--target", "y", "--client-column"])
    runner = CliRunner()
    res = runner.invoke(app, ["schema", "draft", "--data", str(data), *base, piece])
    assert res.exit_code == 2
    said = " ".join(res.output.split())
    whole = "weight, kg" if option == "--target" else "site, id"
    assert (f"column {piece!r} is not in {data} (columns: 'age', 'weight, kg', 'site, id', "
            f"'y'): to name the column {whole!r}, give it whole: {option} '{whole}'") in said
    advice = re.search(rf"give it whole: {option} (.*)$", said)
    assert advice is not None
    res = runner.invoke(app, ["schema", "draft", "--data", str(data), *base,
                              *shlex.split(advice[1])])
    assert res.exit_code == 0, res.output
    drafted = Schema.from_dict(tomllib.loads(res.output[res.output.index("# Draft"):]))
    if option == "--target":
        assert drafted.target.name == "weight, kg"
    else:
        assert drafted.client_column == "site, id"


@pytest.mark.parametrize(("file", "odd"), [
    ("site.csv", "blood pressure\n(systolic)"), ("site.csv", 'x\n[target]\nname = "x"'),
    ("site.csv", "bell\x07 \u2028sep\r"), ("odd\nname.csv", "bp")])
def test_a_name_with_a_line_break_gives_a_draft_that_reads_back(
        tmp_path: Path, file: str, odd: str) -> None:
    """The draft's notes are comments; a note quoting a column's (or the file's) name with a
    line break ended its comment line, so the rest of the name was read as TOML: a draft that
    did not parse, or one with keys the header wrote. The notes escape such characters
    (``\\n``)."""
    import csv

    data = tmp_path / file
    with data.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["age", odd, "outcome"])
        w.writerows([[40 + i, "n/a?" if i == 4 else 110 + i, "yes" if i % 2 else "no"]
                     for i in range(30)])
    draft = draft_schema(read_raw(data), "outcome")
    assert any(repr(odd.strip()) in note for note in draft.notes)
    schema = Schema.from_dict(tomllib.loads(draft.text))
    assert [f.name for f in schema.features] == ["age", odd.strip()]
    assert schema.target.name == "outcome"
    shown = file.replace("\n", "\\n")
    assert draft.text.startswith(f"# Draft schema from {shown} ")


def test_one_number_spelled_two_ways_is_drafted_as_one_level(tmp_path: Path) -> None:
    """A cell matches a label by its number, so "inf" and "Infinity" (or "1" and "1.0") are
    one level, written once, in the form a schema file may list."""
    csv = tmp_path / "site.csv"
    csv.write_text("y,dose,grade\n0,inf,1\n1,Infinity,1.0\n0,2,2\n1,-inf,2\n")
    text = draft_schema(read_raw(csv), "y", categorical=["dose"]).text
    assert 'levels = ["-inf", "2", "inf"]' in text
    assert 'levels = ["1", "2"]' in text
    out = tmp_path / "schema.toml"
    out.write_text(text)
    schema = Schema.load(out)
    assert schema.features[0].levels == ["-inf", "2", "inf"]
