"""A CSV file as text cells (:class:`RawTable`, :func:`read_raw`), and how a table's problems
name its lines (:func:`line_numbers`): what :mod:`.tablecheck` checks and ``fedforest schema
draft`` drafts from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ._cells import blank_columns, header_cells, header_defects, read_csv_rows, without_columns
from .errors import SchemaError

__all__ = ["RawTable", "line_numbers", "read_raw"]

_SHOW = 8  # line numbers shown per problem


@dataclass(frozen=True)
class RawTable:
    """A CSV file as text cells: ``header`` and data ``rows``, ``rows[i]`` starting on the
    file's line ``lines[i]`` (blank lines are skipped, as the client skips them; a quoted
    cell may span lines). Without ``lines``, ``rows[i]`` is line ``i + 2``.

    ``ignored`` are the file's columns (0-based) left out because they have neither a name nor
    a value (an export's trailing empty columns); ``defects`` what makes the file's header
    unusable, each as (what is wrong, what to do), numbering the file's columns."""

    path: Path
    header: list[str]
    rows: list[list[str]]
    lines: tuple[int, ...] = ()
    ignored: tuple[int, ...] = ()
    defects: tuple[tuple[str, str], ...] = ()

    def file_columns(self, idx: Sequence[int]) -> list[int]:
        """The file's columns (0-based) of :attr:`header`'s columns ``idx``."""
        kept = [k for k in range(len(self.header) + len(self.ignored)) if k not in self.ignored]
        return [kept[k] for k in idx]

    def ignored_note(self) -> str | None:
        """What was left out (:attr:`ignored`), as a sentence; None when nothing was."""
        if not self.ignored:
            return None
        return (f"{header_cells(self.ignored)} {'are' if len(self.ignored) > 1 else 'is'} "
                f"empty, as {'are their columns' if len(self.ignored) > 1 else 'is its column'} "
                "in every row: ignored")

    def line_of(self, idx: Sequence[int]) -> tuple[int, ...]:
        """The file's line numbers of data rows ``idx`` (0-based)."""
        return _at(idx, self.lines)

    def column(self, name: str) -> list[str]:
        k = self.header.index(name)
        return [r[k] if k < len(r) else "" for r in self.rows]

    def ragged(self) -> tuple[list[int], str, str]:
        """The data rows (0-based) whose cells are not one per column of the header, what is
        wrong with them (naming their lines) and what to do: a file whose rows separate their
        cells with ``;``, a tab or ``|`` under a comma-separated header is named as such,
        other rows as a stray comma (an unquoted decimal comma) or a cut line. No rows: two
        empty strings."""
        idx = [i for i, r in enumerate(self.rows) if len(r) != len(self.header)]
        if not idx:
            return idx, "", ""
        n = len(idx)
        what = (f"{n} row{'s do' if n > 1 else ' does'} not have {len(self.header)} cells "
                f"({line_numbers(idx, self.lines)})")
        # a separator that splits every such row (its text put back together) into one cell
        # per column of the header: not one that a text column merely holds
        sep = next((c for c in (";", "\t", "|") if len(self.header) > 1
                    and not any(c in h for h in self.header)
                    and all(",".join(self.rows[i]).count(c) + 1 == len(self.header)
                            for i in idx)), None)
        if sep is not None:
            return idx, what, (f"the rows separate their cells with {sep!r} while the header "
                               "uses commas: save the file as comma-separated CSV")
        return idx, what, (f"fix or delete {'those lines' if n > 1 else 'that line'} (a stray "
                           "comma or a cut line?)")

    def separator_advice(self) -> str | None:
        """What to do when the file separates its cells with ``;``, a tab or ``|`` rather
        than commas (its header is one cell holding one of them); None otherwise."""
        sep = next((c for c in (";", "\t", "|") if len(self.header) == 1
                    and c in self.header[0]), None)
        if sep is None:
            return None
        return f"the file separates cells with {sep!r}, not commas: save it as comma-separated CSV"


def _at(idx: Sequence[int], lines: Sequence[int]) -> tuple[int, ...]:
    return tuple(lines[i] if lines else i + 2 for i in idx)


def line_numbers(idx: Sequence[int], lines: Sequence[int] = ()) -> str:
    """Data rows (0-based) as the file's line numbers: ``lines[i]`` (:attr:`RawTable.lines`),
    or ``i + 2`` without them (the header is line 1)."""
    shown = ", ".join(map(str, _at(idx[:_SHOW], lines)))
    more = f" and {len(idx) - _SHOW} more" if len(idx) > _SHOW else ""
    return f"line{'s' if len(idx) > 1 else ''} {shown}{more}"


def _looks_numeric(cells: Sequence[str]) -> bool:
    try:
        for c in cells:
            float(c)
    except ValueError:
        return False
    return bool(cells)


def read_raw(path: str | Path) -> RawTable:
    """Read a CSV file as text.

    Raises
    ------
    SchemaError
        Unreadable, empty, or without a header row (a first line of numbers).
    """
    p = Path(path)
    rows, lines = read_csv_rows(p)
    if not rows:
        raise SchemaError(f"{p}: empty file, expected a header row with the column names")
    header = [h.strip() for h in rows[0]]
    if _looks_numeric([h for h in header if h not in ("?", "")]):
        raise SchemaError(
            f"{p} has no header row: its first line holds values ({', '.join(header[:4])}, "
            "...). Add a first line with the column names, e.g. "
            f"(echo 'name1,name2,...'; cat {p.name}) > site.csv")
    body = [[c.strip() for c in r] for r in rows[1:]]
    blank = blank_columns(header, body)
    defects = tuple(header_defects(header, blank))
    if blank:
        header, body = without_columns([header], blank)[0], without_columns(body, blank)
    return RawTable(p, header, body, tuple(lines[1:]), tuple(blank), defects)
