"""Lists of names on the command line: the columns of ``--categorical``, ``--continuous`` and
``--zero-is-missing``, the model labels of ``evaluate --names``.

A list is written as a CSV row, as the table's header writes the same names: names separated
by commas, a name that holds a comma, a double quote or a line break written in double quotes
(a double quote inside doubled): ``age,"weight, kg"``. On the command line the row is one
shell word: ``--categorical 'age,"weight, kg"'``. :func:`name_arg` writes a name so.
"""

from __future__ import annotations

import csv
import io
import shlex
from collections.abc import Iterable

__all__ = ["comma_hint", "name_arg", "split_names"]

#: what an error of a list says to write for a name that holds a comma
QUOTE_RULE = ("write a name that holds a comma or a double quote in double quotes, as in a CSV "
              "header (a double quote inside it doubled)")


def split_names(values: str | Iterable[str] | None, option: str) -> list[str]:
    """The names that ``values`` (an option's value, or each of its values when it is given
    more than once) list: each value read as a CSV row, each name stripped, empty ones left
    out.

    Raises
    ------
    ValueError
        A value that is no CSV row (a double quote not closed, text after a closing one),
        naming ``option`` and how to write the name.
    """
    given = [values] if isinstance(values, str) else list(values or ())
    names: list[str] = []
    for value in given:
        try:
            rows = list(csv.reader(io.StringIO(value, newline=""), skipinitialspace=True,
                                   strict=True))
        except csv.Error as exc:
            raise ValueError(f"{option} {value!r}: {exc}: {QUOTE_RULE}: {option} "
                             f"{name_arg('weight, kg')}") from None
        names += [n.strip() for row in rows for n in row if n.strip()]
    return names


def name_arg(name: str) -> str:
    """``name`` as a shell word that :func:`split_names` reads as that one name: in double
    quotes if it holds a comma, a double quote or a line break, then quoted for the shell
    (``'"weight, kg"'``; a plain name as it is: ``age``)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow([name])  # quotes a name with \r or \n
    return shlex.quote(buf.getvalue()[:-2])


def comma_hint(part: str, names: Iterable[str], option: str, *,
               listed: bool = True) -> str | None:
    """When ``part``, a name ``option`` gave that is none of ``names``, is a piece of one of
    them that holds a comma (``weight`` of ``weight, kg``: the name was not in double quotes),
    how to write that one; None otherwise. A ``listed`` option reads its value as a CSV row
    (:func:`split_names`): the name goes in double quotes; another takes the name as it is,
    quoted for the shell only."""
    whole = next((n for n in names if "," in n and part in (p.strip() for p in n.split(","))),
                 None)
    if whole is None:
        return None
    if not listed:
        return f"to name the column {whole!r}, give it whole: {option} {shlex.quote(whole)}"
    return (f"to name the column {whole!r}, write it in double quotes: {option} "
            f"{name_arg(whole)}")
