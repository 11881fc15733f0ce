"""What the benchmark scripts share on their command lines: argparse types for counts, and
rich tables printed whole when the output goes to a file or a pipe.

Importing this module imports no more than argparse: the children that ``speed.py`` measures
import it too, and their peak memory is part of the measurement.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from rich.table import Table


def at_least(low: int, why: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low``; anything else is a usage error (exit 2)
    that says the bound and, when given, ``why``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(
                f"{value}: at least {low}" + (f" ({why})" if why else ""))
        return value

    parse.__name__ = "integer"  # argparse names the type in its message
    return parse


def print_table(table: Table, file: IO[str] | None = None) -> None:
    """Print ``table`` on a terminal at its width, and to a file or a pipe at the table's own
    width (rich would cut the columns to 80 characters: ``trai…``)."""
    from rich.console import Console

    console = Console(file=file or sys.stdout)
    if not console.is_terminal:
        wide = Console(file=file or sys.stdout, width=10_000)
        console = Console(file=file or sys.stdout, width=max(wide.measure(table).maximum, 80))
    console.print(table)
