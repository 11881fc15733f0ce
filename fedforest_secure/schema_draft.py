"""``fedforest schema draft``: a starting schema.toml from one site's CSV file.

The draft names every column and guesses its kind: text columns and numeric columns with a few
integer codes become categorical (their levels listed), the rest continuous. It never writes
bounds: bounds are *public* (they fix fixed-point scales, the secure sketch grid and DP
sensitivities), so the federation agrees on them from domain knowledge, not from one site's
minimum and maximum, which would disclose that site's extremes to everyone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ._cells import _canon, _is_missing, _label_sort_key
from .errors import SchemaError
from .tablecheck import RawTable

__all__ = ["draft_schema"]

#: Numeric columns with at most this many distinct integer values are drafted categorical.
MAX_CODES = 10

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


def _kind(cells: list[str]) -> tuple[Literal["continuous", "categorical"], list[str]]:
    present = [c for c in cells if not (_is_missing(c) or c == "?")]
    try:
        values = [float(c) for c in present]
    except ValueError:
        return "categorical", sorted({_canon(c) for c in present}, key=_label_sort_key)
    distinct = set(values)
    if values and len(distinct) <= MAX_CODES and all(v.is_integer() for v in distinct):
        return "categorical", sorted({_canon(v) for v in values}, key=_label_sort_key)
    return "continuous", []


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def draft_schema(table: RawTable, target: str, *,
                 task: Literal["auto", "classification", "regression"] = "auto",
                 categorical: Sequence[str] = (), continuous: Sequence[str] = (),
                 client_column: str | None = None) -> str:
    """TOML text of a draft schema for ``table`` (comments included).

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
    """
    for name in (target, *categorical, *continuous, *(c for c in [client_column] if c)):
        if name not in table.header:
            raise SchemaError(f"column {name!r} is not in {table.path} (columns: "
                              f"{', '.join(table.header)})")
    lines = [_NOTE.format(path=table.path.name, rows=len(table.rows))]
    if client_column:
        lines.append(f"client_column = {_q(client_column)}\n")
    kind, labels = _kind(table.column(target))
    if task == "regression" or (task == "auto" and kind == "continuous"):
        lines += ["[target]", f"name = {_q(target)}", 'kind = "regression"',
                  "# bounds = [lo, hi]   # REQUIRED by the secure profiles: agree on public "
                  "bounds", ""]
    else:
        if kind == "continuous":
            raise SchemaError(f"target {target!r} has more than {MAX_CODES} distinct numbers: "
                              "use --task regression, or recode it into classes")
        lines += ["[target]", f"name = {_q(target)}", 'kind = "classification"',
                  f"classes = [{', '.join(_q(c) for c in labels)}]", ""]
    for name in table.header:
        if name in (target, client_column):
            continue
        kind, levels = _kind(table.column(name))
        if name in continuous:
            kind, levels = "continuous", []
        elif name in categorical and kind == "continuous":
            kind = "categorical"
            cells = [c for c in table.column(name) if not (_is_missing(c) or c == "?")]
            levels = sorted({_canon(c) for c in cells}, key=_label_sort_key)
        lines += ["[[features]]", f"name = {_q(name)}", f'kind = "{kind}"']
        if any(_is_missing(c) or c == "?" for c in table.column(name)):
            lines.append('missing = "allowed"   # this site has missing cells in this column')
        if kind == "categorical":
            lines.append(f"levels = [{', '.join(_q(v) for v in levels)}]")
        else:
            lines.append("# bounds = [lo, hi]   # agree on public bounds with the federation")
        lines.append("")
    return "\n".join(lines)
