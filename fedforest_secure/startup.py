"""The imports of a ``fedforest`` process, made once for its whole life: the command line's
(:mod:`fedforest_cli.__main__`), a command's own modules, and a site's DP stack
(:func:`client_app.runner.run_client`); and the optional imports of its libraries that it
never uses (:func:`skip_unused_imports`)."""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator

__all__ = ["UNUSED", "lasting_imports", "skip_unused_imports"]

#: modules the libraries of a ``fedforest`` process import when they are installed, each with
#: a fallback when they are not, and which the process never uses: httpcore (under httpx)
#: imports trio, an async framework, for async clients running under it (the site's client
#: is synchronous; selenium, of the development extra, installs trio); httpx its own command
#: line (click, pygments) for the ``httpx`` script; FastAPI pydantic's copy of its first
#: version, to tell whether a route's types are models of that version (the server's models
#: are all of pydantic 2). About a seventh of a site client's start-up CPU and a twentieth of
#: the server's (docs/benchmarks.md, "Start-up").
UNUSED = ("trio", "httpx._main", "pydantic.v1")


def skip_unused_imports() -> None:
    """Mark the modules of :data:`UNUSED` as not installed in this process (``None`` in
    ``sys.modules``: importing one raises ``ImportError``, and the library that tried takes
    its fallback). One already imported is left as it is. For the ``fedforest`` command's
    own process only, never a process that imports this package as a library."""
    for name in UNUSED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


@contextlib.contextmanager
def lasting_imports() -> Iterator[None]:
    """Imports whose objects (modules, classes, functions) live as long as the process. The
    garbage collector does not run while they are made (each collection would walk the growing
    heap of them and free nothing) and freezes them at the end of the block: no later full
    collection, nor the collections of the interpreter's exit, walks them again, which would
    otherwise take a large part of a short-lived client's or server's CPU."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
