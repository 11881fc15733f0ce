"""Names a package imports from its submodules on first use (PEP 562).

A package lists them as ``{name: submodule}`` and sets, for the run time only (to mypy its
names are the ``TYPE_CHECKING`` imports, so a misspelt one is an error)::

    if not TYPE_CHECKING:
        __getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, names: Mapping[str, str], namespace: dict[str, Any]
               ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: a name of ``names`` is
    imported from its submodule when first looked up and kept in ``namespace`` (the
    package's globals), so later look-ups are plain attribute reads; any other name is an
    AttributeError."""

    def getattr_(name: str) -> object:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(names))

    return getattr_, dir_
