"""The compiled loops of the engine's hot paths (``_ckernels*.c``, built by ``setup.py``).

:data:`KERNELS` is the extension module, or None where it was not built (no C compiler at
install time) or where ``FEDFOREST_NUMPY_KERNELS=1`` asks for the numpy code. Each compiled
loop stands for a numpy function beside its caller and gives the same bits
(``tests/test_sketch_kernels.py`` runs both); callers read ``_kernels.KERNELS`` at call time.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np

__all__ = ["KERNELS", "compiled", "f64", "i64"]


def source_digest() -> str | None:
    """SHA-256 over the loops' sources beside this module (each file's name and bytes, in name
    order; ``setup.py`` builds it into the extension as ``SOURCE_DIGEST``), or None where
    they are not there (an installed wheel carries the built extension only)."""
    here = Path(__file__).parent
    if not (here / "_ckernels.c").is_file():
        return None
    h = hashlib.sha256()
    for path in sorted(here.glob("_ckernels*.[ch]"), key=lambda p: p.name):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def compiled() -> ModuleType | None:
    """The extension module, or None: not built, numpy asked for, or built from other
    sources than those beside it (a warning: the code of a `git pull` run with the loops
    of before, which may lack one or compute another way)."""
    if os.environ.get("FEDFOREST_NUMPY_KERNELS") == "1":
        return None
    try:  # by name: the extension has no Python source for the import graph to resolve
        mod = importlib.import_module("fedforest_secure._ckernels")
    except ImportError:  # pragma: no cover - a build without a C compiler
        return None
    want = source_digest()
    if want is not None and getattr(mod, "SOURCE_DIGEST", None) != want:
        warnings.warn("fedforest_secure's compiled loops were built from other sources than "
                      "the ones beside them (the code changed since the install): the numpy "
                      "code runs instead, with the same results, more slowly; build them "
                      "again with `make install` (or `pip install -e .`)",
                      RuntimeWarning, stacklevel=2)
        return None
    return mod


#: the compiled loops, or None: numpy throughout
KERNELS: ModuleType | None = compiled()


def i64(a: np.ndarray) -> np.ndarray:
    """``a`` as the C-contiguous int64 array the compiled loops read (no copy if it is one)."""
    return np.ascontiguousarray(a, dtype=np.int64)


def f64(a: np.ndarray) -> np.ndarray:
    """``a`` as the C-contiguous float64 array the compiled loops read (no copy if it is one)."""
    return np.ascontiguousarray(a, dtype=np.float64)
