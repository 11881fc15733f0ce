"""What the ``fedforest`` sub-commands share: the error console and the failure exit."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["console", "fail"]

#: Progress and errors go to stderr; results (tables, tokens) to stdout.
console = Console(stderr=True)


def fail(exc: Exception) -> NoReturn:
    """Print ``exc`` as an error and exit with code 2."""
    console.print(f"[red]error:[/red] {escape(str(exc))}")
    raise typer.Exit(2)
