"""What the ``fedforest`` sub-commands share: the error console, the failure exit and how
this command was started (for the commands a sub-command suggests next)."""

from __future__ import annotations

import math
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from fedforest_secure.errors import ProtocolError
from fedforest_secure.files import os_error_text
from fedforest_secure.printable import printable, printable_lines

__all__ = ["MAX_SEED", "check_output", "console", "duration", "fail", "own_command"]

#: Progress and errors go to stderr; results (tables, tokens) to stdout.
console = Console(stderr=True, emoji=False)

#: the largest ``--seed``: scikit-learn's forests take a ``random_state`` below 2**32
MAX_SEED = 2**32 - 1


def fail(exc: Exception) -> NoReturn:
    """Print ``exc`` as an error and exit with code 2: on one line whatever the terminal's
    width (the terminal wraps it, so a path in it copies whole), and whatever it quotes (a
    server's ``detail``) as text, rich markup not read. A protocol error (what a server
    sent did not check) is one line, every character that is not printable escaped
    (``\\n``, ``\\x1b``, ``\\r``); another error keeps its own line breaks (a data file's
    problems, one a line). An :class:`OSError` reads as its file and why, "the disk is full"
    when it is (:func:`~fedforest_secure.files.os_error_text`), without ``[Errno N]``."""
    said = os_error_text(exc) if isinstance(exc, OSError) else str(exc)
    text = printable(said) if isinstance(exc, ProtocolError) else printable_lines(said)
    console.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True)
    raise typer.Exit(2)


def check_output(path: Path, *, force: bool, inputs: Sequence[tuple[str, Path]] = ()) -> None:
    """Exit with an error (code 2) before anything is written, or fetched, when ``path`` is a
    directory, lies in a directory that does not exist, is one of the command's ``inputs``
    (``(option, path)`` pairs), or exists and ``force`` is not set."""
    if path.is_dir():
        fail(IsADirectoryError(f"{path} is a directory: name the file to write"))
    if not path.parent.is_dir():
        fail(FileNotFoundError(f"{path}: the directory {path.parent} does not exist (nothing "
                               "was written)"))
    for option, source in inputs:
        if path.exists() and source.exists() and os.path.samefile(path, source):
            fail(ValueError(f"{path} is the {option} file: write the output elsewhere"))
    if (path.exists() or path.is_symlink()) and not force:
        fail(FileExistsError(f"{path} exists: nothing was written (--force replaces it)"))



def duration(unit: str) -> Callable[[float | None], float | None]:
    """The ``callback`` of a float option that is a duration in ``unit`` (``"seconds"``,
    ``"days"``): a value that is not a finite number, 0 or more (``nan``, ``inf``, ``-5``) is a
    usage error naming the option, before the command does anything; None (left out)
    passes."""

    def check(value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise typer.BadParameter(f"must be a finite number of {unit}, 0 or more; got "
                                     f"{value:g}")
        return value

    return check


def own_command() -> str:
    """How to run ``fedforest`` again the way it runs now, for a command to suggest: the bare
    name where it is the ``fedforest`` found on PATH, else the path it was started by (a
    virtualenv's ``.venv/bin/fedforest`` not on PATH), else (``python -m fedforest_cli``, or
    the app called in process) this interpreter with ``-m fedforest_cli``."""
    started = sys.argv[0] if sys.argv else ""
    if Path(started).name == "fedforest" and Path(started).is_file():
        on_path = shutil.which("fedforest")
        if on_path is not None and os.path.samefile(on_path, started):
            return "fedforest"
        return shlex.quote(started)
    return f"{shlex.quote(sys.executable)} -m fedforest_cli"
