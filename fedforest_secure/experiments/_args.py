"""Argument checks and array types shared by the experiment modules (private)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

Task = Literal["regression", "classification"]
SeedLike = int | np.random.Generator | None
FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

TASKS = ("regression", "classification")


def as_rng(seed: SeedLike) -> np.random.Generator:
    """A seed or generator as a generator (a generator is returned as is, not copied)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | np.integer)):
        raise TypeError(f"seed must be an int, a numpy Generator or None, got {seed!r}")
    return np.random.default_rng(seed)


def check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_fraction(value: float, name: str, *, closed: bool) -> float:
    ok = np.isfinite(value) and (0.0 <= value <= 1.0 if closed else 0.0 < value < 1.0)
    if isinstance(value, bool) or not ok:
        interval = "[0, 1]" if closed else "(0, 1)"
        raise ValueError(f"{name} must lie in {interval}, got {value!r}")
    return float(value)


def check_nonneg(value: float, name: str, *, strict: bool = False) -> float:
    if isinstance(value, bool) or not np.isfinite(value) or value < 0 or (strict and value == 0):
        bound = "> 0" if strict else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)
