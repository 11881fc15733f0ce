"""Compiled loops for the engine's hot paths (numba), compiled on first use.

:func:`kernel` wraps a plain Python function over numpy arrays and scalars: the first call
imports numba and compiles it in nopython mode (``nogil``: threads of the in-process driver
run kernels side by side; ``cache``: later processes load the machine code from
``__pycache__`` instead of compiling again). The function stays plain Python, so it reads like
the specification it implements and its signature is what mypy checks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

__all__ = ["kernel"]

P = ParamSpec("P")
R = TypeVar("R")

_lock = threading.Lock()


def kernel(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` compiled by numba on its first call (see the module docstring)."""
    compiled: list[Any] = []

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        if not compiled:
            with _lock:  # threads of one fit may reach the first call together
                if not compiled:
                    import numba

                    compiled.append(numba.njit(cache=True, nogil=True)(fn))
        out: R = compiled[0](*args, **kwargs)
        return out

    call.__name__ = fn.__name__
    call.__doc__ = fn.__doc__
    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call
