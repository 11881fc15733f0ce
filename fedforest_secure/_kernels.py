"""The compiled loops of the engine's hot paths (``_ckernels*.c``, built by ``setup.py``).

:data:`KERNELS` is the extension module, or None where it was not built (no C compiler at
install time) or where ``FEDFOREST_NUMPY_KERNELS=1`` asks for the numpy code. Each compiled
loop stands for a numpy function beside its caller and gives the same bits
(``tests/test_sketch_kernels.py`` runs both); callers read ``_kernels.KERNELS`` at call time.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import numpy as np

__all__ = ["KERNELS", "compiled", "f64", "i64"]


def compiled() -> ModuleType | None:
    """The extension module, or None: not built, or numpy asked for."""
    if os.environ.get("FEDFOREST_NUMPY_KERNELS") == "1":
        return None
    try:  # by name: the extension has no Python source for the import graph to resolve
        return importlib.import_module("fedforest_secure._ckernels")
    except ImportError:  # pragma: no cover - a build without a C compiler
        return None


#: the compiled loops, or None: numpy throughout
KERNELS: ModuleType | None = compiled()


def i64(a: np.ndarray) -> np.ndarray:
    """``a`` as the C-contiguous int64 array the compiled loops read (no copy if it is one)."""
    return np.ascontiguousarray(a, dtype=np.int64)


def f64(a: np.ndarray) -> np.ndarray:
    """``a`` as the C-contiguous float64 array the compiled loops read (no copy if it is one)."""
    return np.ascontiguousarray(a, dtype=np.float64)
