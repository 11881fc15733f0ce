"""Lists of names on the command line (``--categorical``, ``--continuous``,
``--zero-is-missing``, ``evaluate --names``): a CSV row, a name holding a comma in double
quotes; and the shell word the tools' advice writes for a name reads back as that name."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedforest_secure.name_lists import comma_hint, name_arg, split_names


def test_a_list_is_read_as_a_csv_row_and_the_option_may_be_repeated() -> None:
    assert split_names("age, sex ,,bp", "--x") == ["age", "sex", "bp"]
    assert split_names(['age, "weight, kg"', '"say ""hi"""'], "--x") == [
        "age", "weight, kg", 'say "hi"']
    assert split_names(None, "--x") == []


def test_a_list_that_is_no_csv_row_says_how_to_write_a_name_with_a_comma() -> None:
    with pytest.raises(ValueError) as err:
        split_names('"weight, kg" x', "--categorical")
    assert str(err.value) == (
        "--categorical '\"weight, kg\" x': ',' expected after '\"': write a name that holds a "
        "comma or a double quote in double quotes, as in a CSV header (a double quote inside "
        "it doubled): --categorical '\"weight, kg\"'")


@given(st.text(min_size=1).map(str.strip).filter(bool))
def test_the_advice_word_of_any_name_reads_back_as_that_name(name: str) -> None:
    assert split_names(shlex.split(name_arg(name)), "--x") == [name]


def test_a_plain_name_is_written_as_it_is_and_one_with_a_comma_quoted_twice() -> None:
    assert [name_arg(n) for n in ("age", "blood pressure", "weight, kg")] == [
        "age", "'blood pressure'", "'\"weight, kg\"'"]


def test_a_piece_of_a_name_holding_a_comma_is_told_how_to_name_the_whole() -> None:
    names = ["age", "weight, kg"]
    assert comma_hint("kg", names, "--continuous") == (
        "to name the column 'weight, kg', write it in double quotes: --continuous "
        "'\"weight, kg\"'")
    assert comma_hint("height", names, "--continuous") is None
    # an option that takes one name as it is (no CSV row): the name whole, for the shell only
    assert comma_hint("kg", names, "--target", listed=False) == (
        "to name the column 'weight, kg', give it whole: --target 'weight, kg'")
