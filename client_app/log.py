"""What a site's operator reads while the client runs.

On a terminal: rich's console (and the progress bar). Anywhere else (a service manager, a log
file, ``nohup``): one plain line per event, ``2024-05-01T12:00:00Z fedforest-client <message>``,
never wrapped, never a progress bar, flushed at once.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console

__all__ = ["SiteLog"]


class SiteLog:
    """Events of one client run: :meth:`info`, :meth:`warn`."""

    def __init__(self, *, stream: TextIO | None = None, plain: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.plain = (not _isatty(self.stream)) if plain is None else plain
        self.console = Console(file=self.stream, quiet=self.plain)
        #: the last :meth:`warn` message (the command does not print again what it said)
        self.last_warning: str | None = None

    def info(self, message: str) -> None:
        self._emit(message)

    def warn(self, message: str) -> None:
        self.last_warning = message
        self._emit(f"warning: {message}", style="[yellow]warning:[/yellow] "
                   + message.replace("[", "\\["))

    def _emit(self, message: str, style: str | None = None) -> None:
        if self.plain:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.stream.write(f"{stamp} fedforest-client {message}\n")
            self.stream.flush()
        else:
            self.console.log(style if style is not None else message.replace("[", "\\["))


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
