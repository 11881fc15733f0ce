"""Whether this process was asked to stop (Ctrl-C, SIGTERM, SIGHUP). The `fedforest`
command's signal handlers record the interrupt they raise here, so one that surfaces wrapped in
another error (a library that met it inside its own code and raised an error of its own, as
pydantic's JSON serializer does) is still taken for the stop it was."""

from __future__ import annotations

__all__ = ["asked", "forget", "raise_if_asked", "record"]

_asked: list[KeyboardInterrupt] = []


def record(stop: KeyboardInterrupt) -> None:
    """Note that ``stop`` was raised by a signal (the first one is kept)."""
    if not _asked:
        _asked.append(stop)


def asked() -> KeyboardInterrupt | None:
    """The interrupt a signal raised in this process, if any."""
    return _asked[0] if _asked else None


def forget() -> None:
    """Forget a recorded interrupt (a command that ran to its end)."""
    _asked.clear()


def raise_if_asked(exc: BaseException) -> None:
    """Raise the recorded interrupt in place of ``exc`` (its cause), if a signal raised one:
    an error met while stopping is the stop."""
    stop = asked()
    if stop is not None and stop is not exc:
        raise stop from exc
