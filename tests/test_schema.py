"""Tests for fedforest_secure.schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st

from fedforest_secure.errors import SchemaError
from fedforest_secure.schema import Schema

BASE: dict[str, Any] = {
    "client_column": "site",
    "target": {"name": "los", "kind": "regression", "bounds": [0.0, 100.0]},
    "features": [
        {"name": "age", "kind": "continuous", "bounds": [0, 120]},
        {"name": "sex", "kind": "categorical", "levels": ["F", "M"]},
        {"name": "bmi", "kind": "continuous", "bounds": [10.0, 60.0]},
    ],
}

CLF: dict[str, Any] = {
    "target": {"name": "outcome", "kind": "classification", "classes": ["dead", "alive"]},
    "features": [{"name": "x", "kind": "continuous", "bounds": [-1.0, 1.0]}],
}


def _with(path: tuple[Any, ...], value: Any, base: dict[str, Any] = BASE) -> dict[str, Any]:
    data = json.loads(json.dumps(base))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def _csv(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.csv"
    p.write_text(text, encoding="utf-8")
    return p


GOOD_CSV = "site,age,sex,bmi,los,extra\nA,30,F,22.5,3,x\nB,71.5,M,30,12.25,y\nA,0,M,10,0,z\n"


# ---------------------------------------------------------------- schema validation
def test_from_dict_and_helpers() -> None:
    s = Schema.from_dict(BASE)
    assert s.n_features == 3
    assert s.feature_names == ["age", "sex", "bmi"]
    assert s.feature_kinds == ["continuous", "categorical", "continuous"]
    assert s.n_levels == [0, 2, 0]
    b = s.bounds_array
    assert b.shape == (3, 2)
    assert b[0].tolist() == [0.0, 120.0]
    assert np.isnan(b[1]).all()
    assert not s.is_classification and s.n_classes == 0
    c = Schema.from_dict(CLF)
    assert c.is_classification and c.n_classes == 2


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("features", 0, "bounds"), [5, 5], "features[0] ('age').bounds"),
        (("features", 0, "bounds"), [10, 1], "lower bound must be < upper bound"),
        (("features", 0, "bounds"), [0, float("inf")], "finite"),
        (("features", 0, "bounds"), ["a", 1], "features[0] ('age').bounds"),
        (("features", 1, "levels"), ["F"], "at least 2 levels"),
        (("features", 1, "levels"), ["F", "F", "M"], "duplicate levels"),
        (("features", 1, "bounds"), [0, 1], "categorical feature has no bounds"),
        (("features", 0, "kind"), "ordinal", "features[0] ('age').kind"),
        (("features", 0, "colour"), "red", "colour"),
        (("target", "classes"), ["a", "b"], "regression target has no classes"),
        (("target", "kind"), "survival", "target.kind"),
        (("features", 2, "name"), "age", "duplicate column name 'age'"),
        (("client_column",), "los", "duplicate column name 'los'"),
        (("features",), [], "at least one feature"),
        (("features", 0, "name"), " age", "surrounding spaces"),
    ],
)
def test_invalid_schema_names_the_field(path: tuple[Any, ...], value: Any, needle: str) -> None:
    with pytest.raises(SchemaError) as exc:
        Schema.from_dict(_with(path, value))
    assert needle in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_levels_or_classes_that_are_the_same_number_are_refused() -> None:
    """A cell matches a label by its number (1.0 is the level "1"), so "1" and "1.0" listed
    both would give sites writing 1 and 1.0 two codes for one category."""
    levels = ["1", "2", "3", "1.0", "2.0", "3.0"]  # two sites' lists, joined by hand
    with pytest.raises(SchemaError) as exc:
        Schema.from_dict(_with(("features", 1, "levels"), levels))
    assert str(exc.value) == (
        "invalid schema: features[1] ('sex').levels: levels '1' and '1.0' are the same "
        "number: sites that write it as 1 and as 1.0 would give one category two codes (a "
        "cell matches a label by its number); list each number once")
    with pytest.raises(SchemaError) as exc:
        Schema.from_dict(_with(("target", "classes"), ["0", "1", "01"], CLF))
    assert str(exc.value) == (
        "invalid schema: target.classes: classes '1' and '01' are the same number: sites "
        "that write it as 1 and as 01 would give one class two codes (a cell matches a label "
        "by its number); list each number once")
    kept = Schema.from_dict(_with(("features", 1, "levels"), ["1", "1.5", "10", "a1"]))
    assert kept.n_levels == [0, 4, 0]


def test_categorical_needs_levels_and_classification_needs_classes() -> None:
    data = _with(("features", 1, "levels"), None)
    with pytest.raises(SchemaError, match="needs levels"):
        Schema.from_dict(data)
    with pytest.raises(SchemaError, match="needs classes"):
        Schema.from_dict(_with(("target", "classes"), None, CLF))


def test_load_dump_roundtrip_toml_and_json(tmp_path: Path) -> None:
    s = Schema.from_dict(BASE)
    for name in ("s.toml", "s.json"):
        p = tmp_path / name
        s.dump(p)
        assert Schema.load(p) == s
    (tmp_path / "bad.toml").write_text("features = [", encoding="utf-8")
    with pytest.raises(SchemaError, match="cannot parse"):
        Schema.load(tmp_path / "bad.toml")
    with pytest.raises(SchemaError, match="cannot read"):
        Schema.load(tmp_path / "missing.toml")


@settings(max_examples=40, deadline=None)
@given(
    lo=st.floats(-1e6, 1e6),
    width=st.floats(1e-3, 1e6),
    levels=st.lists(st.text("abcxyz", min_size=1, max_size=4), min_size=2, max_size=5, unique=True),
)
def test_roundtrip_property(
    lo: float, width: float, levels: list[str], tmp_path_factory: Any
) -> None:
    data = {
        "target": {"name": "y", "kind": "regression", "bounds": [lo, lo + width]},
        "features": [
            {"name": "c", "kind": "categorical", "levels": levels},
            {"name": "x", "kind": "continuous", "bounds": [lo, lo + width]},
        ],
    }
    s = Schema.from_dict(data)
    assert Schema.from_dict(s.to_dict()) == s
    p = tmp_path_factory.mktemp("rt") / "s.toml"
    s.dump(p)
    assert Schema.load(p) == s


# ---------------------------------------------------------------- CSV tables
def test_read_csv_encodes(tmp_path: Path) -> None:
    s = Schema.from_dict(BASE)
    X, y, client = s.read_csv(_csv(tmp_path, GOOD_CSV))
    assert X.dtype == np.float64 and X.shape == (3, 3)
    np.testing.assert_array_equal(X[:, 1], [0, 1, 1])  # F -> 0, M -> 1
    np.testing.assert_array_equal(X[:, 0], [30, 71.5, 0])
    assert y is not None
    np.testing.assert_array_equal(y, [3, 12.25, 0])
    assert client is not None and client.tolist() == ["A", "B", "A"]


def test_read_csv_without_target(tmp_path: Path) -> None:
    s = Schema.from_dict(BASE)
    X, y, _ = s.read_csv(_csv(tmp_path, "site,age,sex,bmi\nA,1,F,20\n"), with_target=False)
    assert y is None and X.shape == (1, 3)


def test_read_csv_classification(tmp_path: Path) -> None:
    s = Schema.from_dict(CLF)
    X, y, client = s.read_csv(_csv(tmp_path, "x,outcome\n0.5,alive\n-1,dead\n"))
    assert y is not None and y.dtype == np.int64
    assert y.tolist() == [1, 0]
    assert client is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("site,age,sex,los\nA,3,F,1\n", "column 'bmi': missing"),
        (
            "site,age,sex,bmi,los\nA,3,F,20,1\nA,3,X,20,1\n",
            "line 3: column 'sex': unknown level 'X'",
        ),
        ("site,age,sex,bmi,los\nA,abc,F,20,1\n", "line 2: column 'age': 'abc' is not a number"),
        ("site,age,sex,bmi,los\nA,3,F,20,1\nA,3,F,20,1\nA,121,F,20,1\n", "line 4: column 'age'"),
        ("site,age,sex,bmi,los\nA,3,F,20,1\nA,3,F,9.99,1\n", "outside the public bounds"),
        ("site,age,sex,bmi,los\nA,3,F,,1\n", "line 2: column 'bmi': missing value"),
        ("site,age,sex,bmi,los\nA,3,F,NaN,1\n", "line 2: column 'bmi': missing value"),
        ("site,age,sex,bmi,los\nA,inf,F,20,1\n", "line 2: column 'age': non-finite"),
        ("site,age,sex,bmi,los\nA,3,F,20,1\n,3,F,20,1\n", "line 3: column 'site': missing"),
        ("site,age,sex,bmi,los\nA,3,F,20,-1\n", "line 2: column 'los'"),
        ("site,age,sex,bmi,los\nA,3,F,20\n", "line 2: has 4 cells"),
        ("site,age,sex,bmi,los\n", "no data rows"),
        ("", "empty file"),
        ("site,age,age,bmi,los\nA,1,1,20,1\n", "duplicate column names"),
    ],
)
def test_read_csv_rejects(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(SchemaError) as exc:
        Schema.from_dict(BASE).read_csv(_csv(tmp_path, text))
    assert needle in str(exc.value)


def test_read_csv_unknown_class(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="line 3: column 'outcome': unknown class 'maybe'"):
        Schema.from_dict(CLF).read_csv(_csv(tmp_path, "x,outcome\n0,dead\n0,maybe\n"))


def test_bounds_are_inclusive(tmp_path: Path) -> None:
    s = Schema.from_dict(BASE)
    X, _, _ = s.read_csv(_csv(tmp_path, "site,age,sex,bmi,los\nA,120,M,60,100\nA,0,F,10,0\n"))
    assert X[0, 0] == 120 and X[1, 2] == 10


# ---------------------------------------------------------------- in-memory tables
def test_validate_table_columns_rows_and_dataframe_like() -> None:
    s = Schema.from_dict(BASE)
    cols = {"site": ["A", "B"], "age": [1, 2], "sex": ["M", "F"], "bmi": [20, 30], "los": [1, 2]}
    X1, y1, c1 = s.validate_table(cols)
    rows = [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]
    X2, y2, c2 = s.validate_table(rows)

    class FakeFrame:
        columns = list(cols)

        def __getitem__(self, key: str) -> list[Any]:
            return cols[key]

    X3, _, _ = s.validate_table(FakeFrame())
    np.testing.assert_array_equal(X1, X2)
    np.testing.assert_array_equal(X1, X3)
    assert y1 is not None and y2 is not None
    np.testing.assert_array_equal(y1, y2)
    assert c1 is not None and c2 is not None and c1.tolist() == c2.tolist() == ["A", "B"]
    with pytest.raises(SchemaError, match="column 'bmi', row 2: missing"):
        s.validate_table([rows[0], {k: v for k, v in rows[1].items() if k != "bmi"}])
    with pytest.raises(SchemaError, match="column 'age', row 2"):
        s.validate_table({**cols, "age": [1, None]})


def test_check_arrays() -> None:
    s = Schema.from_dict(BASE)
    X = np.array([[30.0, 1.0, 20.0], [40.0, 0.0, 25.0]])
    with pytest.raises(SchemaError, match="column 'sex', row 1: unknown level '1'"):
        s.check_arrays(X)  # levels are "F"/"M": numeric codes are not levels
    s2 = Schema.from_dict(_with(("features", 1, "levels"), ["0", "1"]))
    Xo, yo = s2.check_arrays(X, np.array([1.0, 2.0]))
    np.testing.assert_array_equal(Xo, X)
    assert yo is not None and yo.tolist() == [1.0, 2.0]
    with pytest.raises(SchemaError, match="column 'bmi', row 2: missing or non-finite"):
        s2.check_arrays(np.array([[30.0, 1.0, 20.0], [40.0, 0.0, np.nan]]))
    with pytest.raises(SchemaError, match="column 'age', row 2: value 130.0 outside"):
        s2.check_arrays(np.array([[30.0, 1.0, 20.0], [130.0, 0.0, 20]]))
    with pytest.raises(SchemaError, match="shape"):
        s2.check_arrays(np.zeros((2, 2)))
    with pytest.raises(SchemaError, match="column 'los', row 1"):
        s2.check_arrays(X, np.array([101.0, 1.0]))


# ---------------------------------------------------------------- inference
def test_infer_regression_and_classification() -> None:
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(size=50), rng.integers(0, 3, size=50)])
    y = rng.normal(size=50)
    s = Schema.infer(X, y, feature_names=["a", "b"], categorical=["b"])
    assert s.feature_kinds == ["continuous", "categorical"]
    assert s.features[1].levels == ["0", "1", "2"]
    assert s.features[0].bounds == (X[:, 0].min(), X[:, 0].max())
    assert s.target.bounds == (y.min(), y.max())
    Xo, yo = s.check_arrays(X, y)
    np.testing.assert_array_equal(Xo[:, 1], X[:, 1])
    yc = np.array(["b", "a"] * 25)
    c = Schema.infer(X, yc, task="classification", categorical=[1])
    assert c.target.classes == ["a", "b"] and c.feature_names == ["x0", "x1"]
    _, codes = c.check_arrays(X, yc)
    assert codes is not None and codes[:2].tolist() == [1, 0]
    with pytest.raises(SchemaError, match="y must have shape"):
        Schema.infer(X, y[:-1])
    with pytest.raises(SchemaError, match="unknown feature 'zz'"):
        Schema.infer(X, y, categorical=["zz"])
    with pytest.raises(SchemaError, match="column 'x0', row 3"):
        Schema.infer(np.where(np.arange(50)[:, None] == 2, np.nan, X), y)


def test_infer_constant_column_gets_valid_bounds() -> None:
    X = np.ones((4, 1))
    s = Schema.infer(X, np.arange(4.0))
    lo, hi = s.features[0].bounds or (0.0, 0.0)
    assert lo == 1.0 and hi > lo


def test_missing_bounds() -> None:
    data = _with(("features", 0, "bounds"), None)
    data["target"].pop("bounds")
    assert Schema.from_dict(data).missing_bounds() == ["age", "los"]
    assert Schema.from_dict(BASE).missing_bounds() == []


def test_columns_allowing_missing_values_read_them_as_nan_and_others_refuse_them(
        tmp_path: Path) -> None:
    """``missing = "allowed"``: ``?``, ``NA``, empty and ``nan`` cells become NaN in that
    column (continuous or categorical) and nowhere else; the schema round-trips and says
    which features may miss."""
    data = _with(("features", 0, "missing"), "allowed")
    data = _with(("features", 1, "missing"), "allowed", data)
    sch = Schema.from_dict(data)
    assert sch.missing_allowed == [True, True, False]
    assert Schema.from_dict(sch.to_dict()) == sch
    assert "missing" not in sch.to_dict()["features"][2]  # the default is not written
    assert "missing" not in Schema.from_dict(BASE).to_dict()["features"][0]
    text = ("site,age,sex,bmi,los\nA,?,F,22.5,3\nB,71.5,NA,30,12.25\nA,,?,10,0\n"
            "B,40,M,20,1\n")
    X, y, _ = sch.read_csv(_csv(tmp_path, text))
    assert np.isnan(X[:, 0]).tolist() == [True, False, True, False]
    assert np.isnan(X[:, 1]).tolist() == [False, True, True, False]
    assert X[3].tolist() == [40.0, 1.0, 20.0]
    # bmi may not be missing
    with pytest.raises(SchemaError, match="line 2: column 'bmi': missing value"):
        sch.read_csv(_csv(tmp_path, "site,age,sex,bmi,los\nA,30,F,?,3\n"))
    # nor age without the declaration
    with pytest.raises(SchemaError, match="line 2: column 'age': missing value"):
        Schema.from_dict(BASE).read_csv(_csv(tmp_path, text))
    with pytest.raises(SchemaError, match="missing"):
        Schema.from_dict(_with(("features", 0, "missing"), "sometimes"))
    # arrays and tables: NaN where allowed
    Xa, _ = sch.check_arrays(np.array([[np.nan, "F", 20.0]], dtype=object), [1.0])
    assert np.isnan(Xa[0, 0])
    with pytest.raises(SchemaError, match="'bmi'"):
        sch.check_arrays(np.array([[30.0, "F", np.nan]], dtype=object), [1.0])


def test_a_column_of_number_strings_reads_as_the_cell_by_cell_path_reads_it() -> None:
    """A column whose every cell is a finite number string is read in one pass; the values are
    the cell-by-cell path's (the same column with one non-string cell takes that path), and a
    column with a missing cell still gets its row-numbered error."""
    from fedforest_secure._cells import _numeric_column

    cells = [" 1.5", "2e3", "-0.25 ", "7", "+3.", ".5e-2", "\t42\n"]
    fast = _numeric_column(np.array(cells, dtype=object), "x")
    slow = _numeric_column(np.array([*cells, 0], dtype=object), "x")[:-1]
    assert fast.tolist() == slow.tolist() == [float(c) for c in cells]
    # what float alone reads but a table does not write: both paths refuse it
    for odd in ("1_000", "\uff14\uff10"):
        for col in ([*cells, odd], [*cells, odd, 0]):
            with pytest.raises(SchemaError, match=f"column 'x', row 8: '{odd}' is not a number"):
                _numeric_column(np.array(col, dtype=object), "x")
    with pytest.raises(SchemaError, match="column 'x', row 3: missing value"):
        _numeric_column(np.array(["1", "2", " NA "], dtype=object), "x")
    with pytest.raises(SchemaError, match="column 'x', row 2: non-finite"):
        _numeric_column(np.array(["1", "-inf"], dtype=object), "x")
    got = _numeric_column(np.array(["1", "nan", "?"], dtype=object), "x", allow_missing=True)
    assert got[0] == 1.0 and np.isnan(got[1:]).all()


def test_an_invalid_schema_file_is_named_in_the_error(tmp_path: Path) -> None:
    data = _with(("target", "classes"), ["1"], CLF)
    path = tmp_path / "draft.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    with pytest.raises(SchemaError) as exc:
        Schema.load(path)
    assert str(exc.value) == (f"invalid schema file {path}: target.classes: needs at least 2 "
                              "classes, got 1")


def test_a_schema_file_saved_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    """Windows editors save UTF-8 with a byte-order mark: TOML and JSON schemas load alike."""
    s = Schema.from_dict(BASE)
    for name in ("s.toml", "s.json"):
        p = tmp_path / name
        s.dump(p)
        p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes())
        assert Schema.load(p) == s


def test_read_csv_names_the_file_and_its_line_and_a_missing_target_is_missing(
        tmp_path: Path) -> None:
    """The client's errors point where `fedforest check` points: the file and its line (a
    blank line counted), and '?' in the target is a missing class, not an unknown one."""
    clf = Schema.from_dict(CLF)
    path = _csv(tmp_path, "x,outcome\n0,dead\n\n0,alive\n0,?\n")
    with pytest.raises(SchemaError) as exc:
        clf.read_csv(path)
    assert str(exc.value) == f"{path}, line 5: column 'outcome': missing value"
    with pytest.raises(SchemaError) as exc:
        clf.read_csv(_csv(tmp_path, "x,outcome\n0,dead\n\n7,alive\n"))
    assert str(exc.value) == (f"{tmp_path / 't.csv'}, line 4: column 'x': value 7.0 outside "
                              "the public bounds [-1.0, 1.0]")
    with pytest.raises(SchemaError) as exc:
        clf.read_csv(_csv(tmp_path, "outcome\ndead\n"))
    assert str(exc.value) == f"{tmp_path / 't.csv'}: column 'x': missing from the table"
    with pytest.raises(SchemaError, match="column 'outcome', row 2: missing value"):
        clf.validate_table({"x": [0.0, 0.5], "outcome": ["dead", "?"]})
