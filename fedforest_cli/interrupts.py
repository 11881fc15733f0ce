"""How every ``fedforest`` command stops on Ctrl-C, SIGTERM and SIGHUP: SIGTERM (how a service
manager, ``timeout`` or a CI job stops a process) and SIGHUP (the terminal or the ssh session
closed) raise :class:`Terminated`, a :class:`KeyboardInterrupt`, so the code being run rolls
back as on Ctrl-C (the files being written by :func:`~fedforest_secure.files.write_atomic` and
:func:`~fedforest_secure.files.replacing` are left as they were); the command then says so on
one line and exits with 128 + the signal's number (130, 143, 129)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import typer
from typer.core import TyperGroup

from client_app import stop

from ._common import console

__all__ = ["FedforestGroup", "Terminated", "how_stopped", "signals_as_interrupts",
           "terminated"]


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the command: it stops as on Ctrl-C (and exits with 128 + the
    signal's number: 143, 129)."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signum)
        self.signum = signum


def terminated(signum: int, _frame: FrameType | None) -> None:
    """The handler of SIGTERM and SIGHUP: :class:`Terminated` (recorded: :mod:`client_app.stop`)."""
    raised = Terminated(signum)
    stop.record(raised)
    raise raised


def interrupted(_signum: int, _frame: FrameType | None) -> None:
    """The handler of SIGINT: ``KeyboardInterrupt``, as Python's own, recorded too."""
    raised = KeyboardInterrupt()
    stop.record(raised)
    raise raised


def how_stopped(exc: KeyboardInterrupt) -> tuple[str, int]:
    """What stopped the command, as its last line says it, and its exit status:
    ``("interrupted", 130)`` (Ctrl-C), ``("terminated", 143)``, ``("hung up", 129)``."""
    if not isinstance(exc, Terminated):
        return "interrupted", 128 + signal.SIGINT
    return ("hung up" if exc.signum == signal.SIGHUP else "terminated"), 128 + exc.signum


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` inside the block (SIGHUP stays ignored
    under ``nohup``); the handlers found are back afterwards. In the main thread only (where
    Python handles signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    if kept[signal.SIGINT] is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, terminated)
    if kept[signal.SIGHUP] is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, terminated)
    try:
        yield
    finally:
        for s, handler in kept.items():
            if handler is not None:  # None: a handler not set from Python, left as it is
                signal.signal(s, handler)
        stop.forget()


class FedforestGroup(TyperGroup):
    """The ``fedforest`` command group: every sub-command runs with SIGTERM and SIGHUP raised
    as :class:`Terminated`, and one that an interrupt stops (and that did not say so itself,
    as ``client`` and ``simulate`` do) ends with one line and 128 + the signal's number."""

    def invoke(self, ctx: Any) -> Any:
        with signals_as_interrupts():
            try:
                return super().invoke(ctx)
            except KeyboardInterrupt as exc:
                how, code = how_stopped(exc)
                with contextlib.suppress(OSError):  # a terminal that closed takes no line
                    console.print(f"[yellow]{how}[/yellow]: the command stopped before it "
                                  "finished; a file it was writing is left as it was",
                                  soft_wrap=True)
                raise typer.Exit(code) from None
