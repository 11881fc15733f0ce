"""The imports of a ``fedforest`` process, made once for its whole life: the command line's
(:mod:`fedforest_cli.__main__`), a command's own modules, and a site's DP stack
(:func:`client_app.runner.run_client`)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["lasting_imports"]


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
