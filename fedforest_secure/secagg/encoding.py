"""Fixed-point ring encoding of statistics for secure aggregation (invariant 5).

Every value is range-checked *before* it is encoded, so ``n_clients`` encodings can never wrap the
signed 64-bit ring: overflow is an :class:`~fedforest_secure.errors.OverflowRisk`, never a wrong
sum. Counts use ``frac_bits=0`` and are exact; other statistics are rounded to the nearest multiple
of ``2^-frac_bits``, so the decoded sum of ``n_clients`` vectors is within
``n_clients * 2^-(frac_bits + 1)`` of the true sum (plus float64 rounding of the decoded value,
a relative ``2^-53``, which is zero while the integer sum stays below ``2^53``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import OverflowRisk
from ..protocol import StatKind
from ._primitives import _ring

__all__ = ["RingCodec", "decode", "encode"]


def _as_values(values: np.ndarray) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.dtype.kind not in "fiu":
        raise TypeError("values must be a 1-d numeric array")
    return arr.astype(np.float64, copy=False)


@dataclass(frozen=True)
class RingCodec:
    """Per-entry fixed-point codec. ``frac_bits`` and ``max_abs`` have one entry per value.

    Build it from the :class:`~fedforest_secure.protocol.StatKind` of each entry with
    :meth:`from_kinds`; ``encode`` range-checks and encodes one client's vector, ``decode``
    turns the uint64 sum over clients back into float64.
    """

    frac_bits: np.ndarray
    max_abs: np.ndarray
    n_clients: int
    _scale: np.ndarray | float = field(init=False, repr=False, compare=False, default=1.0)

    def __post_init__(self) -> None:
        fb = np.asarray(self.frac_bits)
        ma = np.asarray(self.max_abs, dtype=np.float64)
        if fb.ndim != 1 or ma.shape != fb.shape or fb.dtype.kind not in "iu":
            raise ValueError("frac_bits (integers) and max_abs must be 1-d arrays of equal length")
        if isinstance(self.n_clients, bool) or not isinstance(self.n_clients, int):
            raise TypeError("n_clients must be an int")
        fb = fb.astype(np.int64)
        try:
            _ring.check_config(fb, ma, self.n_clients)
        except ValueError as exc:
            raise OverflowRisk(str(exc)) from None
        object.__setattr__(self, "frac_bits", fb)
        object.__setattr__(self, "max_abs", ma)
        object.__setattr__(self, "_scale", _ring.scale(fb))

    @classmethod
    def from_kinds(cls, kinds: Sequence[StatKind | str], *, frac_bits: Mapping[StatKind, int],
                   max_abs: Mapping[StatKind, float], n_clients: int) -> RingCodec:
        """A codec for entries of the given kinds. ``COUNT`` always uses ``frac_bits=0``."""
        ks = [StatKind(k) for k in kinds]
        try:
            fb = [0 if k is StatKind.COUNT else int(frac_bits[k]) for k in ks]
            ma = [float(max_abs[k]) for k in ks]
        except KeyError as exc:
            kind = StatKind(exc.args[0]).value
            raise ValueError(f"no frac_bits/max_abs given for kind {kind!r}") from None
        return cls(np.array(fb, dtype=np.int64), np.array(ma, dtype=np.float64), n_clients)

    @property
    def size(self) -> int:
        return int(self.frac_bits.shape[0])

    def error_bound(self) -> np.ndarray:
        """Per-entry bound on ``|decode(sum of encodings) - sum of values|`` (exact arithmetic)."""
        return self.n_clients * np.ldexp(0.5, -self.frac_bits)

    def encode(self, values: np.ndarray) -> np.ndarray:
        """Range-check then encode one client's float vector into uint64."""
        vals = _as_values(values)
        if vals.shape != (self.size,):
            raise ValueError(f"expected {self.size} values, got {vals.shape}")
        bad = _ring.first_out_of_range(vals, self.max_abs)
        if bad is not None:
            raise OverflowRisk(
                f"value[{bad}] = {float(vals[bad])!r} is outside [-{self.max_abs[bad]}, "
                f"{self.max_abs[bad]}]: {self.n_clients} clients could overflow the ring")
        return _ring.encode(vals, self._scale)

    def decode(self, total: np.ndarray) -> np.ndarray:
        """The float64 values of a uint64 sum of encodings."""
        arr = np.asarray(total)
        if arr.dtype != np.uint64 or arr.shape != (self.size,):
            raise ValueError(f"expected a uint64 vector of {self.size} entries")
        return _ring.decode(arr, self.frac_bits)


def encode(values: np.ndarray, frac_bits: int | np.ndarray, max_abs: float | np.ndarray,
           n_clients: int) -> np.ndarray:
    """Range-check ``values`` (|v| <= max_abs, finite) and encode them into Z_{2^64}.

    Raises :class:`~fedforest_secure.errors.OverflowRisk` naming the first offending index and
    value, or when ``n_clients * round(max_abs * 2^frac_bits)`` does not fit in a signed int64.
    """
    vals = _as_values(values)
    fb = _ring.broadcast("frac_bits", frac_bits, vals.shape[0], np.int64)
    ma = _ring.broadcast("max_abs", max_abs, vals.shape[0], np.float64)
    return RingCodec(fb, ma, n_clients).encode(vals)


def decode(total: np.ndarray, frac_bits: int | np.ndarray) -> np.ndarray:
    """Two's-complement decode of a uint64 sum: ``int64(total) / 2^frac_bits`` as float64."""
    arr = np.asarray(total)
    if arr.dtype != np.uint64 or arr.ndim != 1:
        raise ValueError("total must be a 1-d uint64 array")
    fb = _ring.broadcast("frac_bits", frac_bits, arr.shape[0], np.int64)
    if ((fb < 0) | (fb > _ring.MAX_FRAC_BITS)).any():
        raise ValueError(f"frac_bits must lie in [0, {_ring.MAX_FRAC_BITS}]")
    return _ring.decode(arr, fb)
