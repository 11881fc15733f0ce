"""Fixed-point ring encoding of statistics for secure aggregation (invariant 5).

Every value is range-checked *before* it is encoded, so ``n_clients`` encodings can never wrap the
signed 64-bit ring: overflow is an :class:`~fedforest_secure.errors.OverflowRisk`, never a wrong
sum. Counts use ``frac_bits=0`` and are exact; other statistics are rounded to the nearest multiple
of ``2^-frac_bits``, so the decoded sum of ``n_clients`` vectors is within
``n_clients * 2^-(frac_bits + 1)`` of the true sum (plus float64 rounding of the decoded value,
a relative ``2^-53``, which is zero while the integer sum stays below ``2^53``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .. import _kernels
from ..errors import OverflowRisk
from ..protocol import StatKind
from ._primitives import _ring
from ._primitives._ring import _BLOCK, Periodic

__all__ = ["Periodic", "RingCodec", "decode", "encode"]


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
    _limit: np.ndarray | float = field(init=False, repr=False, compare=False, default=0.0)
    _bounded: bool = field(init=False, repr=False, compare=False, default=False)

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
        scale = _ring.scale(fb)
        object.__setattr__(self, "_scale", scale)
        # one bound for every entry: a scalar range check (two reductions per block)
        uniform = ma.size > 0 and float(ma.min()) == float(ma.max())
        object.__setattr__(self, "_limit", float(ma[0]) if uniform else ma)
        # every in-range |value * 2^f| is below 2^50: the encoder's fast rounding is exact
        object.__setattr__(self, "_bounded", bool(
            ma.size == 0 or float(np.max(ma * scale)) < 2.0**50))

    @classmethod
    def _from_runs(cls, runs: Sequence[tuple[Sequence[int], int]], frac_bits: np.ndarray,
                   max_abs: np.ndarray, n_clients: int) -> RingCodec:
        """A codec whose entries follow a small table: ``runs`` lists ``(pattern, repeats)``,
        a pattern of table indices repeated ``repeats`` times (a layout block: one index per
        column, once per row); entry ``i`` gets ``frac_bits[code_i]`` and ``max_abs[code_i]``.

        The same codec as the constructor given the per-entry arrays, built without one pass
        per entry for the range check (it runs on the table) nor index gathers: a client builds
        one for every round, over vectors of millions of entries with a handful of statistic
        kinds. A value shared by every entry is a read-only broadcast view, not a copy."""
        fb_t = np.asarray(frac_bits)
        ma_t = np.asarray(max_abs, dtype=np.float64)
        if fb_t.ndim != 1 or ma_t.shape != fb_t.shape or fb_t.dtype.kind not in "iu":
            raise ValueError("frac_bits (integers) and max_abs must be 1-d tables of equal "
                             "length")
        if isinstance(n_clients, bool) or not isinstance(n_clients, int):
            raise TypeError("n_clients must be an int")
        fb_t = fb_t.astype(np.int64)
        try:
            _ring.check_config(fb_t, ma_t, n_clients)
        except ValueError as exc:
            raise OverflowRisk(str(exc)) from None
        pats: list[tuple[np.ndarray, int]] = []
        for pattern, repeats in runs:
            pat = np.asarray(pattern, dtype=np.intp)
            if pat.ndim != 1 or (pat.size and (int(pat.min()) < 0
                                               or int(pat.max()) >= fb_t.size)) \
                    or int(repeats) < 0:
                raise ValueError("a run names no entry of the table")
            if pat.size and int(repeats):
                pats.append((pat, int(repeats)))
        n = sum(p.size * r for p, r in pats)
        used = np.unique(np.concatenate([p for p, _ in pats])) if pats else \
            np.zeros(0, dtype=np.intp)
        scale_t = np.ldexp(np.ones(fb_t.shape), fb_t)

        def per_entry(table: np.ndarray) -> np.ndarray | _ring.Periodic:
            if used.size and (table[used] == table[used[0]]).all():
                return np.broadcast_to(table[used[0]], (n,))
            if not pats:
                return np.zeros(0, dtype=table.dtype)
            return _ring.Periodic([(table[p], r) for p, r in pats])

        self = object.__new__(_RunsCodec)
        set_ = object.__setattr__
        set_(self, "n_clients", n_clients)
        set_(self, "_fb", per_entry(fb_t))
        set_(self, "_ma", per_entry(ma_t))
        bits_used, max_used = fb_t[used], ma_t[used]
        one_scale = bool(bits_used.size) and bool((bits_used == bits_used[0]).all())
        set_(self, "_scale", float(scale_t[used[0]]) if one_scale else per_entry(scale_t))
        one_limit = bool(max_used.size) and float(max_used.min()) == float(max_used.max())
        set_(self, "_limit", float(max_used[0]) if one_limit else self._ma)
        set_(self, "_bounded", bool(max_used.size == 0
                                    or float(np.max(max_used * scale_t[used])) < 2.0**50))
        return self

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
        bound: np.ndarray = self.n_clients * np.ldexp(0.5, -self.frac_bits)
        return bound

    def encode(self, values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Range-check then encode one client's float vector into uint64.

        Each block of entries is checked before it is encoded, in one cache-friendly pass;
        ``out`` (a contiguous uint64 vector of :attr:`size`) receives the encoding instead of a
        fresh array. On :class:`~fedforest_secure.errors.OverflowRisk` nothing is returned and
        ``out`` holds a partial encoding, to be discarded.
        """
        vals = _as_values(values)
        if vals.shape != (self.size,):
            raise ValueError(f"expected {self.size} values, got {vals.shape}")
        try:
            return _ring.encode(vals, self._scale, limit=self._limit, out=out,
                                bounded=self._bounded)
        except _ring.OutOfRange as exc:
            raise self._overflow(vals, exc.index) from None

    def block_encoder(self, values: np.ndarray) -> Callable[[int, int, np.ndarray], None]:
        """``fill(start, stop, out)``: range-check and encode ``values[start:stop]`` into
        ``out``, for masking block by block (``SecAggClient.mask(..., codec=)``).

        ``fill`` raises :class:`~fedforest_secure.errors.OverflowRisk` for a value out of range.
        """
        vals = _as_values(values)
        if vals.shape != (self.size,):
            raise ValueError(f"expected {self.size} values, got {vals.shape}")

        def fill(start: int, stop: int, out: np.ndarray) -> None:
            try:
                _ring.encode_block(vals, self._scale, self._limit, self._bounded, start, stop,
                                   out)
            except _ring.OutOfRange as exc:
                raise self._overflow(vals, exc.index) from None

        return fill

    def encode_divided(self, values: np.ndarray, divisor: np.ndarray | Periodic | float
                       ) -> np.ndarray:
        """:meth:`encode` of ``values / divisor`` (per entry), divided a block at a time: the
        same encoding without a full-length temporary."""
        vals = _as_values(values)
        n = self.size
        if vals.shape != (n,):
            raise ValueError(f"expected {n} values, got {vals.shape}")
        out = np.empty(n, dtype=np.uint64)
        if _kernels.KERNELS is not None:  # divided and encoded in one pass per block
            for a in range(0, n, _BLOCK):
                b = min(a + _BLOCK, n)
                try:
                    _ring.encode_compiled(vals[a:b], _ring.window(divisor, a, b),
                                          _ring.window(self._scale, a, b),
                                          _ring.window(self._limit, a, b), out[a:b])
                except _ring.OutOfRange as exc:
                    at = a + exc.index
                    scaled = np.zeros(n)
                    scaled[at] = vals[at] / np.asarray(_ring.window(divisor, at, at + 1)).ravel()[0]
                    raise self._overflow(scaled, at) from None
            return out
        buf = np.empty(min(_BLOCK, n))
        for a in range(0, n, _BLOCK):
            b = min(a + _BLOCK, n)
            chunk = buf[: b - a]
            np.divide(vals[a:b], _ring.window(divisor, a, b), out=chunk)
            try:
                _ring.encode_block(chunk, _ring.window(self._scale, a, b),
                                   _ring.window(self._limit, a, b), self._bounded, 0, b - a,
                                   out[a:b])
            except _ring.OutOfRange as exc:
                scaled = np.zeros(n)
                scaled[a + exc.index] = chunk[exc.index]
                raise self._overflow(scaled, a + exc.index) from None
        return out

    def _overflow(self, vals: np.ndarray, bad: int) -> OverflowRisk:
        return OverflowRisk(
            f"value[{bad}] = {float(vals[bad])!r} is outside [-{self.max_abs[bad]}, "
            f"{self.max_abs[bad]}]: {self.n_clients} clients could overflow the ring. A "
            "statistic this large cannot be summed securely: scale the data down (the target, "
            "or very large sample_weight), or use fewer clients")

    def decode(self, total: np.ndarray) -> np.ndarray:
        """The float64 values of a uint64 sum of encodings."""
        arr = np.asarray(total)
        if arr.dtype != np.uint64 or arr.shape != (self.size,):
            raise ValueError(f"expected a uint64 vector of {self.size} entries")
        return _ring.decode(arr, self.frac_bits)


class _RunsCodec(RingCodec):
    """A :class:`RingCodec` made by :meth:`RingCodec._from_runs`: its per-entry tables repeat
    one pattern per layout block and are kept as such (:class:`~._primitives._ring.Periodic`);
    ``frac_bits`` and ``max_abs`` are built in full only when read."""

    _fb: np.ndarray | _ring.Periodic
    _ma: np.ndarray | _ring.Periodic

    @property
    def frac_bits(self) -> np.ndarray:
        return np.asarray(self._fb)

    @property
    def max_abs(self) -> np.ndarray:
        return np.asarray(self._ma)

    @property
    def size(self) -> int:
        return int(self._fb.shape[0])

    def decode(self, total: np.ndarray) -> np.ndarray:
        arr = np.asarray(total)
        if arr.dtype != np.uint64 or arr.shape != (self.size,):
            raise ValueError(f"expected a uint64 vector of {self.size} entries")
        return _ring.decode(arr, self._fb)


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
