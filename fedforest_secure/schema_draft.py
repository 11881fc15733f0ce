"""``fedforest schema draft``: a starting schema.toml from one site's CSV file.

The draft names every column and guesses its kind: text columns and numeric columns with a few
integer codes become categorical (their levels listed), the rest continuous (also a feature
with one number at this site). A numeric column with a few cells that are not numbers (a typo
such as ``abc``) is drafted from its numbers, and the draft's notes name those cells.

It never writes bounds: bounds are *public* (they fix fixed-point scales, the secure sketch grid
and DP sensitivities), so the federation agrees on them from domain knowledge, not from one
site's minimum and maximum, which would disclose that site's extremes to everyone.

Cells of a categorical column spelled as a missing value (``None``, ``NA``, ``null``, ...) are
read as missing, so a real level so spelled would vanish: the notes name them. Columns without
a name and without a value (a spreadsheet export's trailing empty columns) are left out, with a
note.

What cannot become a valid schema is refused with a :class:`SchemaError`: a file without data
rows, duplicate column names, a column holding values under an empty header cell, rows whose
cells are not one per column (named by their lines, as ``fedforest check`` names them), a
classification target with fewer than two classes at this site, a column given two roles,
``continuous`` for a column of text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ._cells import (
    _canon,
    _is_missing_cell,
    _label_sort_key,
    _missing_word,
    _number,
    header_cells,
)
from ._schema_checks import _numeric_key
from .errors import SchemaError
from .name_lists import comma_hint, name_arg
from .printable import printable
from .tablecheck import RawTable

__all__ = ["SchemaDraft", "draft_schema"]

Kind = Literal["continuous", "categorical"]

#: Numeric columns with at most this many distinct integer values are drafted categorical.
MAX_CODES = 10
#: A numeric column keeps its numbers' kind when at most this many of its cells (and at most
#: one in 20) are not numbers: typos to fix, not a text column.
_STRAY_MAX = 5
_SHOW = 3  # stray cells named per note

_NOTE = """\
# Draft schema from {path} ({rows} rows). Review every entry with the federation.
#
# BOUNDS MUST BE PUBLIC. Every continuous feature (and a regression target) needs
# bounds = [lo, hi] agreed by the federation from domain knowledge (e.g. age [0, 120]),
# never derived from one site's data: a site's minimum and maximum would then be disclosed
# to everyone. The secure profiles refuse a job whose schema lacks them.
#
# Categorical levels and classes list every value seen at THIS site only: add the values other
# sites use, so that every site shares one list.
"""


@dataclass(frozen=True)
class SchemaDraft:
    """What :func:`draft_schema` drafted.

    Attributes
    ----------
    text : str
        The schema as TOML, with comments (the notes among them).
    notes : tuple of str
        What to look at before using it, e.g. cells of a numeric column that are not numbers.
    """

    text: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Column:
    """A column's cells read for the draft: its finite numbers and the other present cells
    (``text``), as row indices."""

    cells: list[str]
    numbers: dict[int, float]
    text: list[int]

    @classmethod
    def of(cls, cells: list[str]) -> _Column:
        numbers: dict[int, float] = {}
        text: list[int] = []
        for i, c in enumerate(cells):
            if _is_missing_cell(c):
                continue
            try:
                v = _number(c)
            except ValueError:
                text.append(i)
                continue
            if math.isfinite(v):
                numbers[i] = v
            else:
                text.append(i)
        return cls(cells, numbers, text)

    @property
    def stray(self) -> bool:
        """Numbers with a few cells that are not (typos), rather than a column of text."""
        n = len(self.numbers) + len(self.text)
        return 0 < len(self.text) <= max(1, min(_STRAY_MAX, n // 20)) \
            and len(self.numbers) > len(self.text)

    def guess(self, min_codes: int = 2) -> tuple[Kind, list[str]]:
        """The drafted kind and levels: text is categorical, unless its text cells are
        :attr:`stray` (then the numbers decide); ``min_codes`` to :data:`MAX_CODES` distinct
        integers are categorical."""
        if self.text and not self.stray:
            return "categorical", self.levels()
        distinct = set(self.numbers.values())
        if min_codes <= len(distinct) <= MAX_CODES and all(v.is_integer() for v in distinct):
            return "categorical", sorted({_canon(v) for v in distinct}, key=_label_sort_key)
        return "continuous", []

    def levels(self) -> list[str]:
        """Every present value as a label, numbers in canonical form (``1.0`` is ``"1"``,
        ``Infinity`` is ``"inf"``): a cell matches a label by its number, so a column holding
        one number spelled two ways has one level for it (a schema lists each number once)."""
        labels = {_canon(v) for v in self.numbers.values()}
        labels |= {_numeric_key(self.cells[i]) or _canon(self.cells[i]) for i in self.text}
        return sorted(labels, key=_label_sort_key)


def _cells_at(table: RawTable, cells: list[str], idx: list[int]) -> str:
    """The first few distinct values of rows ``idx``, each with the line it first occurs on."""
    first: dict[str, int] = {}
    for i in idx:
        first.setdefault(cells[i], i)
    shown = list(first.items())[:_SHOW]
    text = ", ".join(f"{v!r} at line {table.line_of([i])[0]}" for v, i in shown)
    rest = len(idx) - len(shown)
    return text + (f" and {rest} more cell{'s' if rest > 1 else ''}" if rest else "")


def _comment(note: str) -> str:
    """``note`` as one TOML comment line: a line break or another control character of a
    column's name in it escaped (``\\n``), so that it cannot end the comment (and what
    follows be read as TOML)."""
    return f"# {printable(note)}"


def _stray_note(table: RawTable, name: str, col: _Column, kind: Kind, forced: bool) -> str:
    n = len(col.text)
    how = "as --continuous asks" if forced else "from its numbers"
    return (f"column {name!r}: {n} cell{'s are' if n > 1 else ' is'} not a number "
            f"({_cells_at(table, col.cells, col.text)}): drafted {kind} {how}. Fix "
            f"{'those cells' if n > 1 else 'that cell'} at the site (fedforest check lists "
            f"them), or rerun with --categorical {name_arg(name)} if the column holds text")


def _missing_words_note(table: RawTable, name: str, cells: list[str], what: str) -> str | None:
    """A note naming the cells of a categorical column (``what``: level or class) spelled as a
    missing value (``None``, ``NA``, ``null``, ...), each spelling with its count and first
    line: a real level so spelled (smoking ``None``) would vanish from the draft unsaid."""
    at: dict[str, list[int]] = {}
    for i, c in enumerate(cells):
        if _missing_word(c):
            at.setdefault(c, []).append(i)
    if not at:
        return None
    parts = [f"{len(idx)} cell{'s' if len(idx) > 1 else ''} {c!r} "
             f"({'first at ' if len(idx) > 1 else ''}line {table.line_of(idx[:1])[0]})"
             for c, idx in at.items()]
    first = next(iter(at))
    whats = what + ("es" if what.endswith("s") else "s")
    left = ("the draft leaves them out of the levels (missing = \"allowed\")" if what == "level"
            else "the draft leaves them out of the classes (a row without its class is refused)")
    return (f"column {name!r}: {' and '.join(parts)} are read as missing values by FedForest "
            f"(its missing spellings: empty, ?, NA, N/A, NaN, null, None, in any letter case): "
            f"{left}. If "
            f"{first!r} is a {what} here, not 'not recorded', rename it at every site, or add "
            f"it to the {whats} in the schema")


def _check_roles(table: RawTable, target: str, categorical: Sequence[str],
                 continuous: Sequence[str], client_column: str | None) -> None:
    if not table.rows:
        raise SchemaError(f"{table.path} has no data rows to draft from: export the site's "
                          "rows below the header")
    if table.defects:
        raise SchemaError(f"{table.path}: " + "; ".join(f"{what}: {todo}"
                                                         for what, todo in table.defects))
    unnamed = [k for k, h in enumerate(table.header) if not h]
    if unnamed:  # a feature needs a name (the ignored empty columns are gone)
        raise SchemaError(f"{table.path}: {header_cells(table.file_columns(unnamed))} is empty "
                          "while its column holds values: name the column, or delete it")
    given = [(target, "--target", False), *((c, "--categorical", True) for c in categorical),
             *((c, "--continuous", True) for c in continuous),
             *((c, "--client-column", False) for c in [client_column] if c)]
    for name, option, listed in given:  # --target and --client-column name one column each
        if name not in table.header:
            hint = (table.separator_advice()
                    or comma_hint(name, table.header, option, listed=listed))
            raise SchemaError(f"column {name!r} is not in {table.path} (columns: "
                              f"{', '.join(map(repr, table.header))})"
                              + (f": {hint}" if hint else ""))
    ragged, what, fix = table.ragged()
    if ragged:  # read by position, their cells would land in other columns
        raise SchemaError(f"{table.path}: {what}: {fix}, then draft again")
    if client_column == target:
        raise SchemaError(f"{target!r} cannot be both the target and the client column: "
                          "the client column names each row's site, the target is predicted")
    both = [c for c in categorical if c in continuous]
    if both:
        raise SchemaError(f"{both[0]!r} is in both --categorical and --continuous: give it one "
                          "kind")


def draft_schema(table: RawTable, target: str, *,
                 task: Literal["auto", "classification", "regression"] = "auto",
                 categorical: Sequence[str] = (), continuous: Sequence[str] = (),
                 client_column: str | None = None) -> SchemaDraft:
    """A draft schema for ``table``: TOML text (comments included) and notes.

    Parameters
    ----------
    target : str
        The column to predict.
    task : {"auto", "classification", "regression"}
        ``auto``: classification when the target holds labels or a few integer codes.
    categorical, continuous : sequence of str
        Columns whose guessed kind is overridden.
    client_column : str, optional
        A column naming each row's site (left out of the features).

    Raises
    ------
    SchemaError
        The table cannot give a valid schema (module docstring), naming what to change.
    """
    _check_roles(table, target, categorical, continuous, client_column)
    notes: list[str] = [n for n in [table.ignored_note()] if n]
    lines = [_NOTE.format(path=printable(table.path.name), rows=len(table.rows))]
    if client_column:
        lines.append(f"client_column = {_q(client_column)}\n")
    col = _Column.of(table.column(target))
    if not col.numbers and not col.text:
        raise SchemaError(f"target {target!r} has no values at this site (every cell is "
                          "missing): choose another --target")
    kind, labels = col.guess(min_codes=1)
    if col.stray:
        notes.append(_stray_note(table, target, col, kind, False))
        lines.append(_comment(notes[-1]))
    if task == "regression" or (task == "auto" and kind == "continuous"):
        if col.text and not col.stray:
            raise SchemaError(f"target {target!r} holds text "
                              f"({_cells_at(table, col.cells, col.text)}): a regression "
                              "target is a number")
        lines += ["[target]", f"name = {_q(target)}", 'kind = "regression"',
                  "# bounds = [lo, hi]   # REQUIRED by the secure profiles: agree on public "
                  "bounds", ""]
    else:
        if kind == "continuous":
            raise SchemaError(f"target {target!r} has more than {MAX_CODES} distinct numbers: "
                              "use --task regression, or recode it into classes")
        if len(labels) < 2:
            raise SchemaError(
                f"target {target!r} has one class at this site ({labels[0]!r}): a "
                "classification needs at least 2. Draft from a site's file that has every class "
                "(or write classes = [...] with the federation's classes by hand), or choose "
                "another --target")
        words = _missing_words_note(table, target, col.cells, "class")
        if words:
            notes.append(words)
            lines.append(_comment(words))
        lines += ["[target]", f"name = {_q(target)}", 'kind = "classification"',
                  f"classes = [{', '.join(_q(c) for c in labels)}]", ""]
    for name in table.header:
        if name in (target, client_column):
            continue
        lines += ["[[features]]", f"name = {_q(name)}"]
        col = _Column.of(table.column(name))
        if name in categorical:
            kind, levels = "categorical", col.levels()
        elif name in continuous:
            if col.text and not col.stray:
                raise SchemaError(
                    f"--continuous {name}: the column holds text "
                    f"({_cells_at(table, col.cells, col.text)}): a continuous column holds "
                    "numbers; leave it categorical, or fix the cells")
            kind, levels = "continuous", []
        else:
            kind, levels = col.guess()
        if col.stray and name not in categorical:
            notes.append(_stray_note(table, name, col, kind, name in continuous))
            lines.append(_comment(notes[-1]))
        lines.append(f'kind = "{kind}"')
        if any(_is_missing_cell(c) for c in col.cells):
            lines.append('missing = "allowed"   # this site has missing cells in this column')
        words = _missing_words_note(table, name, col.cells, "level") \
            if kind == "categorical" else None
        if words:
            notes.append(words)
            lines.append(_comment(words))
        if kind == "categorical":
            if len(levels) < 2:
                notes.append(f"column {name!r} has {len(levels) or 'no'} level"
                             f"{'' if levels else 's'} at this site{_listed(levels)}: a "
                             "categorical feature needs at least 2. Add the levels the other "
                             "sites use, or leave the column out of the schema")
                lines.append(_comment(notes[-1]))
            lines.append(f"levels = [{', '.join(_q(v) for v in levels)}]")
        else:
            lines.append("# bounds = [lo, hi]   # agree on public bounds with the federation")
        lines.append("")
    return SchemaDraft("\n".join(lines), tuple(notes))


def _listed(levels: list[str]) -> str:
    return f" ({', '.join(map(repr, levels))})" if levels else ""


#: TOML basic-string escapes; other control characters (U+0000-U+001F, U+007F) as \uXXXX
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}


def _q(s: str) -> str:
    """``s`` as a TOML basic string (a header cell may hold a line break or a tab)."""
    return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if ord(c) < 0x20 or c == "\x7f"
                                             else c) for c in s) + '"'
