"""Cells of a site's table: missing-value spellings, canonical label text, and the numeric and
label columns a :class:`~fedforest_secure.schema.Schema` encodes (errors name column and row)."""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .errors import SchemaError
from .printable import normalisation_twin

_MISSING = frozenset({"", "na", "nan", "n/a", "null", "none"})
_Column = Sequence[Any] | NDArray[Any]

#: csv's default limit on one cell (131,072 characters) refuses a valid file with a long free
#: text cell; raised once, at import, to the largest C long on every platform (a long is 32 bits
#: on Windows), never lowered below a limit the application set
_FIELD_LIMIT = 2**31 - 1
if csv.field_size_limit() < _FIELD_LIMIT:
    csv.field_size_limit(_FIELD_LIMIT)


class _CellError(SchemaError):
    """A cell's defect, ``column 'x', row 3: what`` (``row`` 1-based among the data rows),
    with its parts kept so that a reader of a file names the file's line instead
    (:meth:`Schema.read_csv <fedforest_secure.schema.Schema.read_csv>`)."""

    def __init__(self, column: str, row: int, what: str) -> None:
        super().__init__(f"column {column!r}, row {row}: {what}")
        self.column = column
        self.row = row
        self.what = what


def read_csv_rows(path: Path) -> tuple[list[list[str]], list[int]]:
    """The rows of a CSV file (UTF-8, a byte-order mark allowed), blank lines skipped, and
    the line each row starts on (a quoted cell may span lines).

    Raises
    ------
    SchemaError
        The file cannot be read or is not CSV.
    """
    rows: list[list[str]] = []
    lines: list[int] = []
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            start = 1
            for r in reader:
                if r:  # a blank line is no row
                    rows.append(r)
                    lines.append(start)
                start = reader.line_num + 1
    except OSError as exc:
        raise SchemaError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SchemaError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}): save "
                          "the table as CSV in UTF-8") from None
    except csv.Error as exc:
        raise SchemaError(f"{path}: malformed CSV: {exc}") from None
    return rows, lines


def header_cells(idx: Sequence[int]) -> str:
    """Columns ``idx`` (0-based) by the numbers a spreadsheet user counts: ``header cells 3
    and 4``."""
    nums = [str(k + 1) for k in idx]
    listed = nums[0] if len(nums) == 1 else f"{', '.join(nums[:-1])} and {nums[-1]}"
    return f"header cell{'s' if len(nums) > 1 else ''} {listed}"


def blank_columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    """The columns (0-based) without a name and without a value in any row, which readers
    ignore: the empty columns a spreadsheet's export may add (a header ending ``,y,,``)."""
    return [k for k, h in enumerate(header) if not h.strip()
            and all(k >= len(r) or not r[k].strip() for r in rows)]


def without_columns(rows: Sequence[Sequence[str]], drop: Sequence[int]) -> list[list[str]]:
    """``rows`` without the cells of columns ``drop`` (0-based)."""
    gone = set(drop)
    return [[c for k, c in enumerate(r) if k not in gone] for r in rows]


def header_defects(header: Sequence[str], blank: Sequence[int] = ()) -> list[tuple[str, str]]:
    """What makes a header unusable, each as (what is wrong, what to do): several unnamed
    columns holding values (besides the ``blank`` ones, ignored), and names given twice."""
    out = []
    unnamed = [k for k, h in enumerate(header) if not h.strip() and k not in blank]
    if len(unnamed) > 1:
        out.append((f"{header_cells(unnamed)} are empty", "name those columns, or delete them"))
    named = [h.strip() for h in header if h.strip()]
    dups = [h for h, n in Counter(named).items() if n > 1]
    if dups:
        at = ["{!r} (columns {})".format(h, " and ".join(
            str(k + 1) for k, x in enumerate(header) if x.strip() == h)) for h in dups]
        out.append((f"duplicate column names: {'; '.join(at)}",
                    "rename the columns so that each name appears once"))
    return out


def _number(text: str) -> float:
    """``float(text)`` for a number as a table writes it: ASCII digits, without the ``_``
    grouping (``2_50``) and the non-ASCII digits (full-width ``４０``) that Python's float
    also reads. Surrounding whitespace is stripped, as float strips it.

    Raises
    ------
    ValueError
        Not a number.
    """
    text = text.strip()
    if "_" in text or not text.isascii():
        raise ValueError(f"not a number: {text!r}")
    return float(text)


def _canon(value: Any) -> str:
    """Canonical text of a label: strings stripped, integral numbers without ``.0``."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        v = float(value)
        if math.isfinite(v) and v.is_integer():
            return str(int(v))
        return repr(v)
    return str(value).strip()


def _label_key(value: Any, labels: Mapping[str, int] | set[str]) -> str:
    """The label ``value`` stands for: its canonical text, or, for a numeric text such as
    ``"1.0"`` that is not itself a label, the canonical text of the number (``"1"``), so
    sites that write codes as ``1`` and as ``1.0`` share one list of levels."""
    key = _canon(value)
    if key in labels or not isinstance(value, str):
        return key
    try:
        return _canon(_number(key))
    except ValueError:
        return key


def _show(value: Any) -> str:
    """``repr`` of a cell for error messages (numpy scalars shown as plain Python values)."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def no_value(value: Any) -> bool:
    """Whether a value is absent: None, NaN (not equal to itself, as pandas' NaT too) or
    pandas' NA (whose comparisons have no truth value)."""
    if value is None:
        return True
    try:
        return bool(value != value)
    except TypeError:
        return True
    except ValueError:  # an array: many values, not an absent one
        return False


def _is_missing(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in _MISSING
    return no_value(value)


def _missing_word(value: Any) -> bool:
    """Whether a cell is a word read as a missing value (``None``, ``NA``, ``N/A``, ``NaN``,
    ``null``, any case): in a categorical column it may be a real level so spelled (smoking
    ``None``), unlike ``?`` or an empty cell."""
    return isinstance(value, str) and _is_missing(value) and any(c.isalpha() for c in value)


def _is_missing_cell(value: Any) -> bool:
    """A missing cell where a column allows missing values: also ``?`` (the UCI files')."""
    return _is_missing(value) or (isinstance(value, str) and value.strip() == "?")


def _label_sort_key(label: str) -> tuple[int, float, str]:
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def _plain_numbers(col: _Column) -> NDArray[np.float64] | None:
    """The column as floats when every cell is a string that ``float`` reads as a finite
    number (a CSV column without missing or odd cells) in one pass, else None:
    :func:`_checked_numbers` then decides, with its messages. ``float`` strips the whitespace
    that path strips."""
    if isinstance(col, np.ndarray) and col.dtype.kind not in "OU":
        return None
    cells = col.tolist() if isinstance(col, np.ndarray) else list(col)
    if set(map(type, cells)) != {str}:
        return None
    joined = "".join(cells)
    if "_" in joined or not joined.isascii():  # float reads 2_50 and ４０: cell by cell
        return None
    try:
        out = np.fromiter(map(float, cells), dtype=np.float64, count=len(cells))
    except ValueError:
        return None
    return out if np.isfinite(out).all() else None


def _checked_numbers(arr: NDArray[Any], name: str, allow_missing: bool, bools: bool = False,
                     missing_words: bool = True) -> NDArray[np.float64]:
    """The column as floats, cell by cell for other than numeric arrays: missing cells NaN
    where allowed, otherwise a :class:`SchemaError` naming the column and the 1-based row.
    A bool is 1 or 0 with ``bools``, otherwise no number. Without ``missing_words`` a text
    cell is a number or an error (``"?"``, ``"NA"``, empty: not missing; ``"nan"``, which
    ``float`` reads, is NaN), as numpy and scikit-learn read text."""
    if bools and arr.dtype.kind == "b":
        return arr.astype(np.float64)
    if arr.dtype.kind in "fiu":
        out = arr.astype(np.float64)
        bad = ~np.isfinite(out)
        if allow_missing:
            bad &= ~np.isnan(out)
        if bad.any():
            i = int(np.argmax(bad)) + 1
            raise _CellError(name, i, "missing or non-finite value")
    else:
        out = np.empty(len(arr), dtype=np.float64)
        for i, v in enumerate(arr, start=1):
            words = missing_words or not isinstance(v, str)
            if allow_missing and words and _is_missing_cell(v):
                out[i - 1] = np.nan
                continue
            if words and _is_missing_cell(v):
                raise _CellError(name, i, "missing value")
            if isinstance(v, bool | np.bool_):
                if bools:
                    out[i - 1] = float(v)
                    continue
                raise _CellError(name, i, f"{_show(v)} is not a number")
            try:
                x = _number(v) if isinstance(v, str) else float(v)
            except (TypeError, ValueError):
                raise _CellError(name, i, f"{_show(v)} is not a number") from None
            # a NaN written as a number (``-nan``) where missing words are read: not one of
            # them, and not finite (as ``fedforest check`` says)
            if allow_missing and math.isnan(x) and not (words and isinstance(v, str)):
                out[i - 1] = np.nan
                continue
            if not math.isfinite(x):
                raise _CellError(name, i, f"non-finite value {_show(v)}")
            out[i - 1] = x
    return out


def _numeric_column(
    col: _Column, name: str, bounds: tuple[float, float] | None = None, *,
    allow_missing: bool = False, bools: bool = False, missing_words: bool = True,
) -> NDArray[np.float64]:
    """A column of numbers; with ``allow_missing`` its missing cells (NaN, ``?``, ``NA``,
    empty, ...) are NaN, otherwise an error; with ``bools`` a bool is 1 or 0 (as
    scikit-learn reads a DataFrame's bool column), otherwise an error; without
    ``missing_words`` the words (``?``, ``NA``, empty, ...) are no numbers, not missing
    cells (:func:`_checked_numbers`)."""
    out = _plain_numbers(col)
    if out is None:
        arr = np.asarray(col)
        if arr.dtype.kind == "U" and not isinstance(col, np.ndarray):
            arr = np.asarray(col, dtype=object)  # numpy's text arrays drop trailing NULs
        out = _checked_numbers(arr, name, allow_missing, bools, missing_words)
    if bounds is not None:
        lo, hi = bounds
        bad = (out < lo) | (out > hi)
        if bad.any():
            i = int(np.argmax(bad))
            raise _CellError(name, i + 1, f"value {_show(out[i])} outside the public bounds "
                             f"[{lo}, {hi}]")
    return out


def _label_codes(col: _Column, name: str, labels: list[str], what: str, *,
                 allow_missing: bool = False) -> NDArray[np.float64]:
    """Level (class) codes; with ``allow_missing`` a missing cell that is not itself a label
    is NaN, otherwise an error."""
    index = {lab: k for k, lab in enumerate(labels)}
    out = np.empty(len(col), dtype=np.float64)
    for i, v in enumerate(col, start=1):
        if allow_missing and _is_missing_cell(v) and _canon(v) not in index:
            out[i - 1] = np.nan
            continue
        if _is_missing_cell(v) and _canon(v) not in index:
            raise _CellError(name, i, "missing value")
        code = index.get(_label_key(v, index))
        if code is None:
            twin = next((t for t in (normalisation_twin(lab, [_canon(v)]) for lab in labels)
                         if t), None)
            raise _CellError(name, i, f"unknown {what} {_canon(v)!r}"
                             + (f" ({twin})" if twin else ""))
        out[i - 1] = code
    return out
