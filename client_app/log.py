"""What a site's operator reads while the client runs.

On a terminal: rich's console (and the progress bar). Anywhere else (a service manager, a log
file, ``nohup``): one plain line per event, ``2024-05-01T12:00:00Z fedforest-client <message>``,
never wrapped, never a progress bar, flushed at once.

The log is informational: a write that fails (the disk under a log file is full, a closed
pipe, a terminal gone) never stops the client. The line is lost, whole or the part not
written, and never written later (on a terminal rich's unwritten output is dropped, not kept
to replay); in plain mode the next event after such a failure starts on a new line, so a
line cut short never runs into it. The first such failure is told once on the other stream
(stdout for a log on stderr, and stderr otherwise), if that one is writable.

A message may quote the server (a job's failure reason, a site's name, an error's ``detail``):
in both modes each character that is not printable is escaped
(:func:`fedforest_secure.printable.printable`: ``\\x1b``, ``\\r``, ``\\u2028``) and rich markup
is not read, so whatever the server sent, the operator reads it as text, one line per message.
"""

from __future__ import annotations

import errno
import sys
import time
from typing import TextIO

from rich.console import Console
from rich.text import Text

from fedforest_secure.printable import printable

__all__ = ["SiteLog"]


class SiteLog:
    """Events of one client run: :meth:`info`, :meth:`warn`."""

    def __init__(self, *, stream: TextIO | None = None, plain: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.plain = (not _isatty(self.stream)) if plain is None else plain
        self.console = Console(file=self.stream, quiet=self.plain, emoji=False)
        #: the last :meth:`warn` message (the command does not print again what it said)
        self.last_warning: str | None = None
        self._told_lost_lines = False
        self._cut = False  # a plain line's write failed: the next starts on a new line

    def info(self, message: str) -> None:
        self._emit(message)

    def warn(self, message: str) -> None:
        self.last_warning = message
        self._emit(message, warning=True)

    def _emit(self, message: str, *, warning: bool = False) -> None:
        text = printable(message)
        try:
            if self.plain:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                said = f"warning: {text}" if warning else text
                start = "\n" if self._cut else ""  # after a line cut short
                self._cut = True  # until the whole line is written
                self.stream.write(f"{start}{stamp} fedforest-client {said}\n")
                self.stream.flush()
                self._cut = False
            else:
                self.console.log(Text.assemble(("warning: ", "yellow"), text) if warning
                                 else Text(text))
        except OSError as exc:
            # what rich could not write is dropped, not written next time (its buffer is
            # rich's own: a version without it has nothing to drop here)
            pending = None if self.plain else getattr(self.console, "_buffer", None)
            if isinstance(pending, list):
                del pending[:]
            self._tell_lost_lines(exc)

    def _tell_lost_lines(self, exc: OSError) -> None:
        """Say once, on the other stream, that the log lost lines; never raise."""
        if self._told_lost_lines:
            return
        self._told_lost_lines = True
        other = sys.stdout if self.stream is not sys.stdout else sys.stderr
        if other is None or other is self.stream:
            return
        name = getattr(self.stream, "name", None)
        where = f"the log ({name})" if isinstance(name, str) else "the log"
        why = exc.strerror or str(exc) or type(exc).__name__
        if exc.errno == errno.ENOSPC:
            why = "the disk is full"
        try:
            other.write(f"fedforest-client warning: cannot write {where}: {why}; the client "
                        "goes on, and its log lines are lost until the write succeeds again\n")
            other.flush()
        except (OSError, ValueError):
            pass


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
