"""A site's table before training: every problem at once, with what to do about it.

:meth:`Schema.read_csv <fedforest_secure.schema.Schema.read_csv>` stops at the first defect;
that is right for the client (nothing leaves the site unless the whole table fits), but a data
engineer fixing a file wants the whole list. :func:`check_table` reads the raw cells and reports

* errors (the client would refuse the table): a missing header, missing columns, duplicate or
  several empty column names, ragged rows (whose shifted cells are not checked again),
  missing values (``?``, ``NA``, empty), non-numbers (``2_50`` and non-ASCII digits among
  them), infinite numbers (``inf``), values outside the public bounds, unknown levels or
  classes, rows without their site (a missing cell in the schema's ``client_column``),
  several sites' rows in one table (a site gives its own rows only);
* warnings (it trains, but look first): hidden missing values (a zero in a column whose other
  values are all far above zero, like ``chol = 0``), constant columns, features missing in
  every row, categorical cells spelled as a missing value (``None``, ``NA``, ...: a level so
  spelled is read as missing), classes absent at this site, columns the schema does not use,
  empty unnamed columns (ignored), ``--zero-is-missing`` zeros in a column allowing missing
  values (the client would read them as the number 0), a target or feature whose spread at
  the site is too narrow for its public bounds under a secure profile
  (:mod:`~fedforest_secure._spread_checks`).

:func:`clean_rows` keeps the rows without errors, for ``fedforest check --clean-out``, with the
cells of :attr:`Problem.blank` problems written empty.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from ._cells import _canon, _is_missing, _label_key, _missing_word, _number, header_cells
from ._rawtable import _SHOW, RawTable, _at, line_numbers, read_raw
from ._spread_checks import feature_spread_problem, target_spread_problem
from .errors import SchemaError
from .name_lists import comma_hint, name_arg
from .printable import normalisation_twin
from .schema import Schema

__all__ = ["Problem", "RawTable", "check_table", "clean_rows", "line_numbers", "read_raw"]

Severity = Literal["error", "warning"]
_DROP = ("drop those rows (fedforest check --clean-out writes the rows without errors), fill "
         "them in at the site, or let the federation declare the column missing = \"allowed\" "
         "in schema.toml (the forest then learns where such rows go)")
#: a target cannot be declared missing: a row without its target teaches nothing
_DROP_TARGET = ("drop those rows (fedforest check --clean-out writes the rows without errors) "
                "or fill them in at the site: a row without its target cannot be trained on")
#: Zeros are suspected missing values when they are a minority and every other value is at
#: least this fraction of their median (cholesterol 0 among 85..600), not when zero is the most
#: common value or small values are common (ST depression 0, 0.1, 0.5, ...).
_ZERO_GAP = 0.3
#: a column's (values, bounds) -> (what, advice) of a warning, or None
_Spread = Callable[[list[float], tuple[float, float]], tuple[str, str] | None]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a table: where, what, and what to do.

    ``blank``: the cells of ``column`` on ``lines`` are missing values written otherwise (a
    ``--zero-is-missing`` zero in a column allowing missing values): :func:`clean_rows`
    writes them empty and keeps their rows."""

    severity: Severity
    column: str | None
    message: str
    advice: str
    lines: tuple[int, ...] = field(default=())
    blank: bool = False

    def __str__(self) -> str:
        where = f"column {self.column!r}: " if self.column else ""
        return f"{self.severity}: {where}{self.message} -> {self.advice}"


def check_table(table: RawTable, schema: Schema, *,
                zero_is_missing: Sequence[str] = ()) -> list[Problem]:
    """Every problem of ``table`` against ``schema``, errors first, in column order.

    ``zero_is_missing`` names columns whose zeros are missing values (errors, not warnings).

    Raises
    ------
    SchemaError
        A ``zero_is_missing`` name that is not a continuous feature or a regression target of
        ``schema`` (a misspelt or a categorical column would leave its zeros unnoticed).
    """
    zero_missing = _zero_missing_columns(schema, zero_is_missing)
    out: list[Problem] = []
    out += [Problem("error", None, what, todo) for what, todo in table.defects]
    ignored = table.ignored_note()
    if ignored:
        out.append(Problem("warning", None, ignored, "nothing to do (a spreadsheet's export may "
                           "add empty columns); delete them to silence this warning"))
    ragged, what, fix = table.ragged()
    if ragged:
        out.append(Problem("error", None, what,
                           f"{fix}; {'their' if len(ragged) > 1 else 'its'} cells are "
                           f"checked once {'they fit' if len(ragged) > 1 else 'it fits'} the "
                           "header",
                           table.line_of(ragged)))
        # a ragged row's cells are shifted: checked by column they would be reported again,
        # as values of the wrong columns (an unknown level '234' of an unquoted 1,234)
        keep = sorted(set(range(len(table.rows))) - set(ragged))
        table = replace(table, rows=[table.rows[i] for i in keep], lines=table.line_of(keep))
    if not table.rows and not ragged:
        out.append(Problem("error", None, "the table has no data rows",
                           "export the site's rows below the header"))
    needed = [*schema.feature_names, schema.target.name]
    if schema.client_column is not None:
        needed.append(schema.client_column)
    for name in needed:
        if name not in table.header:
            advice = (table.separator_advice() or normalisation_twin(name, table.header)
                      or f"add the column (header has: {', '.join(table.header)})")
            out.append(Problem("error", name, "missing from the table", advice))
    extra = [h or f"{header_cells(table.file_columns([k]))} (no name)"
             for k, h in enumerate(table.header) if h not in needed]
    if extra:
        out.append(Problem("warning", None, f"columns not in the schema are ignored: "
                           f"{', '.join(extra)}",
                           "nothing to do if that is intended; they never leave the site"))
    unbounded = schema.missing_bounds()
    if unbounded:
        out.append(Problem("warning", None, f"the schema has no public bounds for "
                           f"{', '.join(unbounded)}",
                           "the secure profiles refuse such a job: the federation agrees on "
                           "bounds from domain knowledge and adds them to schema.toml"))
    for f in schema.features:
        if f.name not in table.header:
            continue
        cells = table.column(f.name)
        if f.kind == "continuous":
            out += _check_numeric(f.name, cells, f.bounds, f.name in zero_missing,
                                  allow_missing=f.may_miss, lines=table.lines,
                                  spread=feature_spread_problem)
        else:
            out += _check_labels(f.name, cells, f.levels or [], "level",
                                 allow_missing=f.may_miss, lines=table.lines)
    t = schema.target
    if t.name in table.header:
        cells = table.column(t.name)
        if t.kind == "regression":
            out += _check_numeric(t.name, cells, t.bounds, t.name in zero_missing,
                                  lines=table.lines, fix=_DROP_TARGET,
                                  spread=target_spread_problem)
        else:
            out += _check_labels(t.name, cells, t.classes or [], "class", lines=table.lines,
                                 fix=_DROP_TARGET)
            present = {_label_key(c, set(t.classes or [])) for c in cells}
            absent = [c for c in t.classes or [] if c not in present]
            if absent and table.rows:
                out.append(Problem(
                    "warning", t.name, f"class{'es' if len(absent) > 1 else ''} "
                    f"{', '.join(absent)} of the schema never occur{'' if len(absent) > 1 else 's'}"
                    " at this site",
                    "fine for training (the forest learns them from the other sites); check "
                    "that the labels are coded as the schema says"))
    if schema.client_column is not None and schema.client_column in table.header:
        out += _check_client_column(schema.client_column, table.column(schema.client_column),
                                    table.lines)
    return sorted(out, key=lambda p: p.severity != "error")


def _zero_missing_columns(schema: Schema, names: Sequence[str]) -> set[str]:
    """The ``--zero-is-missing`` columns, each a continuous feature or a regression target.

    Raises
    ------
    SchemaError
        A name that is no column of the schema, or one whose cells are not numbers.
    """
    numeric = [f.name for f in schema.features if f.kind == "continuous"]
    if schema.target.kind == "regression":
        numeric.append(schema.target.name)
    listed = ", ".join(map(repr, numeric)) or "none"
    only = f"name numeric columns only (the schema's: {listed})"
    for name in names:
        if name in numeric:
            continue
        levels = {f.name: f.levels or [] for f in schema.features if f.kind != "continuous"}
        if name in levels:
            raise SchemaError(f"--zero-is-missing: column {name!r} is categorical: its cells are "
                              f"levels ({', '.join(levels[name])}), a zero is never a missing "
                              f"number; {only}")
        if name == schema.target.name:
            classes = ", ".join(schema.target.classes or [])
            raise SchemaError(f"--zero-is-missing: column {name!r} is the classification "
                              f"target: its cells are classes ({classes}), a zero is never a "
                              f"missing number; {only}")
        if name == schema.client_column:
            raise SchemaError(f"--zero-is-missing: column {name!r} is the client column (each "
                              f"row's site), not a number; {only}")
        hint = comma_hint(name, numeric, "--zero-is-missing")
        raise SchemaError(f"--zero-is-missing: the schema has no column {name!r}; its numeric "
                          f"columns are {listed}" + (f": {hint}" if hint else ""))
    return set(names)


def _check_client_column(name: str, cells: list[str], lines: Sequence[int]) -> list[Problem]:
    """The client column's missing cells (the client refuses a row without its site) and
    several sites in one table (a site's table holds its own rows only)."""
    out: list[Problem] = []
    missing = [i for i, c in enumerate(cells) if _is_missing(c)]
    if missing:
        tokens = sorted({cells[i] or "(empty)" for i in missing})
        out.append(Problem("error", name, f"{len(missing)} missing value"
                           f"{'s' if len(missing) > 1 else ''} ({', '.join(tokens)}) at "
                           f"{line_numbers(missing, lines)}",
                           "write each row's site in the client column, or drop those rows "
                           "(fedforest check --clean-out writes the rows without errors): the "
                           "client column cannot be declared missing", _at(missing, lines)))
    sites = _site_counts(cells)
    if len(sites) > 1:
        shown = ", ".join(f"{s}: {n} row{'s' if n > 1 else ''}" for s, n in sites[:_SHOW])
        more = f" and {len(sites) - _SHOW} more" if len(sites) > _SHOW else ""
        out.append(Problem("error", name, f"the table holds {len(sites)} sites ({shown}{more}): "
                           "a site's table holds that site's rows only",
                           "each site gives its own rows: split the file by this column and "
                           "give each site its part (a table of every site's rows, given to "
                           "each site, counts every row once per site)"))
    return out


def _site_counts(cells: Sequence[str]) -> list[tuple[str, int]]:
    """The distinct sites of a client column's ``cells`` with their row counts, in the order
    they first occur (missing cells left out; labels compared as the client reads them)."""
    return list(Counter(_canon(c) for c in cells if not _is_missing(c)).items())


def _check_numeric(name: str, cells: list[str], bounds: tuple[float, float] | None,
                   zero_missing: bool, *, allow_missing: bool = False,
                   lines: Sequence[int] = (), fix: str = _DROP,
                   spread: _Spread | None = None) -> list[Problem]:
    """The problems of a continuous column; ``spread``: the warning, if any, about the
    spread of its values within ``bounds`` (:mod:`~fedforest_secure._spread_checks`)."""
    out: list[Problem] = []
    missing = [i for i, c in enumerate(cells) if _is_missing(c) or c == "?"]
    if missing and not allow_missing:
        tokens = sorted({cells[i] or "(empty)" for i in missing})
        out.append(Problem("error", name, f"{len(missing)} missing value"
                           f"{'s' if len(missing) > 1 else ''} ({', '.join(tokens)}) at "
                           f"{line_numbers(missing, lines)}",
                           fix,
                           _at(missing, lines)))
    if missing and allow_missing and len(missing) == len(cells):
        return [_all_missing(name, cells)]
    values: dict[int, float] = {}
    bad: list[int] = []
    infinite: list[int] = []  # numbers that are not finite: inf, -Infinity, -nan
    skip = set(missing)
    for i, c in enumerate(cells):
        if i in skip:
            continue
        try:
            v = _number(c)
        except ValueError:
            bad.append(i)
            continue
        if not math.isfinite(v):
            infinite.append(i)
        else:
            values[i] = v
    if infinite:
        shown = ", ".join(repr(c) for c in dict.fromkeys(cells[i] for i in infinite))
        n = len(infinite)
        empty = (" or, as the column allows missing values, leave the cells empty"
                 if allow_missing else "")
        out.append(Problem("error", name, f"{n} non-finite value{'s' if n > 1 else ''} "
                           f"({shown}) at {line_numbers(infinite, lines)}",
                           "infinity or NaN is not a measurement (an overflow or a division "
                           "by zero in the export?): write the measured value" + empty
                           + ", or drop those rows (fedforest check --clean-out writes the rows "
                           "without errors)", _at(infinite, lines)))
    if bad:
        shown = ", ".join(repr(cells[i]) for i in bad[:3])
        out.append(Problem("error", name, f"{len(bad)} value{'s' if len(bad) > 1 else ''} "
                           f"that are not numbers ({shown}) at {line_numbers(bad, lines)}",
                           "a continuous column holds numbers only: fix the cells, or declare "
                           "the column categorical in the schema", _at(bad, lines)))
    zeros = [i for i, v in values.items() if v == 0.0]
    if zero_missing and zeros:
        what = (f"{len(zeros)} zero{'s' if len(zeros) > 1 else ''} (--zero-is-missing: missing "
                f"values) at {line_numbers(zeros, lines)}")
        if allow_missing:  # the rows stay: --clean-out writes these cells empty
            out.append(Problem("warning", name, what + "; the column allows missing values",
                               "--clean-out writes them as empty cells (missing values) and "
                               "keeps the rows: train on that file (the client reads a zero "
                               "as the number 0)", _at(zeros, lines), blank=True))
        else:
            out.append(Problem("error", name, what, fix, _at(zeros, lines)))
        values = {i: v for i, v in values.items() if v != 0.0}
    if bounds is not None:
        lo, hi = bounds
        outside = [i for i, v in values.items() if not lo <= v <= hi]
        if outside:
            vals = sorted({values[i] for i in outside})
            shown = ", ".join(f"{v:g}" for v in vals[:4])
            out.append(Problem("error", name, f"{len(outside)} value"
                               f"{'s' if len(outside) > 1 else ''} outside the public "
                               f"bounds [{lo:g}, {hi:g}] ({shown}) at "
                               f"{line_numbers(outside, lines)}",
                               "values are never clipped: correct them, drop the rows, or ask "
                               "the federation to widen the bounds in schema.toml for every site",
                               _at(outside, lines)))
    if values and bounds is not None and spread is not None:
        narrow = spread(list(values.values()), bounds)
        if narrow is not None:
            out.append(Problem("warning", name, *narrow))
    if values:
        distinct = set(values.values())
        if len(distinct) == 1 and len(values) > 1:
            (v,) = distinct
            out.append(Problem("warning", name, f"every value is {v:g}: the column is constant "
                               "at this site" + (" (all zero: not measured here?)" if v == 0
                                                 else ""),
                               "if it was not measured here, tell the federation (a constant "
                               "column teaches nothing and may hide missing values)"))
        elif zeros and not zero_missing:
            nonzero = [v for v in values.values() if v != 0.0]
            if (nonzero and len(zeros) < len(nonzero) and min(nonzero) > 0
                    and min(nonzero) >= _ZERO_GAP * statistics.median(nonzero)):
                out.append(Problem(
                    "warning", name, f"{len(zeros)} zero{'s' if len(zeros) > 1 else ''} at "
                    f"{line_numbers(zeros, lines)} while every other value is >= "
                    f"{min(nonzero):g}: hidden "
                    "missing values?",
                    "if a zero means 'not measured', rerun with --zero-is-missing "
                    f"{name_arg(name)} "
                    + ("(--clean-out then writes the zeros as empty cells)" if allow_missing else
                       "(they become errors that --clean-out drops)"), _at(zeros, lines)))
    return out


def _check_labels(name: str, cells: list[str], labels: list[str], what: str, *,
                  allow_missing: bool = False, lines: Sequence[int] = (),
                  fix: str = _DROP) -> list[Problem]:
    out: list[Problem] = []
    whats = what + ("es" if what.endswith("s") else "s")
    index = set(labels)
    missing = [i for i, c in enumerate(cells)
               if (_is_missing(c) or c == "?") and _label_key(c, index) not in index]
    if missing and not allow_missing:
        tokens = sorted({cells[i] or "(empty)" for i in missing})
        out.append(Problem("error", name, f"{len(missing)} missing value"
                           f"{'s' if len(missing) > 1 else ''} ({', '.join(tokens)}) at "
                           f"{line_numbers(missing, lines)}",
                           fix,
                           _at(missing, lines)))
    words = [i for i in missing if _missing_word(cells[i])]
    if words:
        out.append(_missing_words(name, cells, words, what, lines))
    if missing and allow_missing and len(missing) == len(cells):
        return [*out, _all_missing(name, cells)]
    miss = set(missing)
    unknown = [i for i, c in enumerate(cells)
               if i not in miss and _label_key(c, index) not in index]
    if unknown:
        vals = sorted({_canon(cells[i]) for i in unknown})
        out.append(Problem("error", name, f"{len(unknown)} unknown "
                           f"{whats if len(unknown) > 1 else what} "
                           f"({', '.join(map(repr, vals[:5]))})"
                           f" at {line_numbers(unknown, lines)}; the schema's {whats} are "
                           f"{', '.join(labels)}",
                           next((t for t in (normalisation_twin(lab, vals) for lab in labels)
                                 if t), f"recode them to the schema's {whats}, or ask the "
                                "federation to add them to schema.toml"), _at(unknown, lines)))
    if len({_label_key(c, index) for c in cells}) == 1 and len(cells) > 1 and what == "level":
        out.append(Problem("warning", name, f"every row has the level {_canon(cells[0])!r}",
                           "if it was not recorded here, tell the federation"))
    return out


def _all_missing(name: str, cells: list[str]) -> Problem:
    """A warning: every cell of a column allowing missing values is missing at this site."""
    tokens = sorted({c or "(empty)" for c in cells})
    return Problem("warning", name, f"every cell is missing at this site ({', '.join(tokens)})",
                   "check the export (a column left out?); if it is not recorded here, tell "
                   "the federation")


def _missing_words(name: str, cells: list[str], idx: list[int], what: str,
                   lines: Sequence[int]) -> Problem:
    """A warning naming the cells ``idx`` of a categorical column spelled as a missing value
    (``None``, ``NA``, ...): a level so spelled would be read as missing without a word."""
    counts = Counter(cells[i] for i in idx)
    shown = ", ".join(f"{c!r}: {n}" for c, n in counts.most_common())
    first = counts.most_common(1)[0][0]
    whats = what + ("es" if what.endswith("s") else "s")
    n = len(idx)
    return Problem("warning", name, f"{n} cell{'s' if n > 1 else ''} spelled as a missing value "
                   f"({shown}) at {line_numbers(idx, lines)}: FedForest reads "
                   f"{'them' if n > 1 else 'it'} as missing value{'s' if n > 1 else ''}, not as "
                   f"{whats}",
                   f"if {first!r} is a {what} here (not 'not recorded'), rename it at every "
                   f"site or ask the federation to add it to the schema's {whats}; nothing to "
                   "do if these cells are missing values",
                   _at(idx, lines))


def clean_rows(table: RawTable, problems: Sequence[Problem], schema: Schema
               ) -> tuple[list[str], list[list[str]]]:
    """The schema's columns of the rows no error points at: ``(header, rows)``, with the
    cells of the ``blank`` problems written empty (missing values).

    Raises
    ------
    SchemaError
        The table lacks a schema column or names one twice, or holds several sites' rows
        (which of them are this site's is for the site to say).
    """
    bad = {line for p in problems if p.severity == "error" for line in p.lines}
    blank = {(p.column, line) for p in problems if p.blank for line in p.lines}
    cols = [*schema.feature_names, schema.target.name]
    if schema.client_column is not None:
        cols.append(schema.client_column)
    if any(c not in table.header for c in cols):
        raise SchemaError("cannot clean a table that lacks the schema's columns")
    if schema.client_column is not None:
        sites = _site_counts(table.column(schema.client_column))
        if len(sites) > 1:
            raise SchemaError(f"cannot clean a table holding several sites' rows "
                              f"({', '.join(s for s, _ in sites[:_SHOW])}"
                              f"{', ...' if len(sites) > _SHOW else ''} in column "
                              f"{schema.client_column!r}): split it by that column and give "
                              "each site its own rows first")
    dups = sorted({c for c in cols if table.header.count(c) > 1})
    if dups:  # which of the two columns holds the values is for the site to say
        raise SchemaError(f"cannot clean a table whose header names {', '.join(dups)} twice: "
                          "rename or delete the extra column first")
    idx = [table.header.index(c) for c in cols]
    rows = []
    for line, r in zip(table.line_of(range(len(table.rows))), table.rows, strict=True):
        if line in bad or len(r) != len(table.header):
            continue
        rows.append(["" if (c, line) in blank else r[k] for c, k in zip(cols, idx, strict=True)])
    return cols, rows
