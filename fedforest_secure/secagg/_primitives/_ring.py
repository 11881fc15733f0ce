"""Fixed-point encoding of float64 vectors into the ring Z_{2^64} (numpy uint64, wraparound).

``encode`` maps ``x`` to ``round(x * 2^f)`` as a signed 64-bit integer stored as uint64 (two's
complement); ``decode`` reads a sum back as signed and divides by ``2^f``. Sums of encodings are
exact as long as the true integer sum stays within the signed range, which the range check
guarantees *before* encoding: every ``|x| <= max_abs`` and ``n_clients * round(max_abs * 2^f)
<= 2^63 - 1``.

Quantisation error bound: each encoded entry is off by at most ``2^-(f+1)`` (round to nearest),
so ``|decode(sum_k encode(x_k)) - sum_k x_k| <= n_clients * 2^-(f+1)`` in exact arithmetic. The
final int64 -> float64 conversion in ``decode`` adds a relative error of at most ``2^-53`` of the
decoded value (nothing when the integer sum is below ``2^53``, e.g. for counts).

``frac_bits`` and ``max_abs`` may be scalars, per-entry arrays, or :class:`Periodic` runs of a
pattern (a layout block's columns) that are never built in full.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _kernels

_INT64_MAX = (1 << 63) - 1
_MAGIC = 1.5 * 2.0**52
_MAGIC_BITS = np.float64(_MAGIC).view(np.int64)
_MAGIC_LIMIT = 2.0**50
MAX_FRAC_BITS = 62
_BLOCK = 1 << 14  # entries per block in encode (128 KiB of float64: stays in L2)


class Periodic:
    """Per-entry values that repeat a short pattern over consecutive runs of entries (a layout
    block: one value per statistic column, once per row), never built in full.

    ``runs`` lists ``(pattern, repeats)``. :meth:`window` returns the values of entries
    ``[start, stop)`` as a view into a tiled copy of the run's pattern (a few KiB per run), so
    a codec over millions of entries keeps a handful of numbers per block instead of one per
    entry. numpy reads it as the full array (``__array__``) where one is needed.
    """

    def __init__(self, runs: list[tuple[np.ndarray, int]]) -> None:
        self.patterns = [np.asarray(p) for p, r in runs if r and np.size(p)]
        reps = [int(r) for p, r in runs if r and np.size(p)]
        self.reps = reps
        self.starts = np.concatenate([[0], np.cumsum([p.size * r for p, r in
                                                      zip(self.patterns, reps, strict=True)])]
                                     ).astype(np.int64)
        self.size = int(self.starts[-1])
        self._tiles: dict[int, np.ndarray] = {}

    def _tile(self, i: int, n: int) -> np.ndarray:
        tile = self._tiles.get(i)
        if tile is None or tile.size < n:
            p = self.patterns[i]
            tile = np.tile(p, -(-max(n, _BLOCK + p.size) // p.size))
            self._tiles[i] = tile
        return tile

    def window(self, start: int, stop: int) -> np.ndarray:
        """The values of entries ``[start, stop)``."""
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        if stop <= self.starts[i + 1]:
            n = stop - start
            phase = int(start - self.starts[i]) % self.patterns[i].size
            return self._tile(i, phase + n)[phase:phase + n]
        parts = []
        a = start
        while a < stop:
            j = int(np.searchsorted(self.starts, a, side="right")) - 1
            b = min(stop, int(self.starts[j + 1]))
            parts.append(self.window(a, b))
            a = b
        return np.concatenate(parts)

    def rows(self) -> list[tuple[int, int, np.ndarray]]:
        """Each run as ``(start, stop, pattern)``: its entries reshape to (repeats, pattern)."""
        return [(int(self.starts[i]), int(self.starts[i + 1]), p)
                for i, p in enumerate(self.patterns)]

    def full(self) -> np.ndarray:
        if not self.patterns:
            return np.zeros(0)
        return np.concatenate([np.tile(p, r) for p, r in zip(self.patterns, self.reps,
                                                             strict=True)])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.full()
        return out if dtype is None else out.astype(dtype)

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)


def window(values: np.ndarray | Periodic | float, start: int, stop: int
           ) -> np.ndarray | float:
    """Entries ``[start, stop)`` of a per-entry array or :class:`Periodic`; a scalar as is."""
    if isinstance(values, np.ndarray):
        return values[start:stop]
    if isinstance(values, Periodic):
        return values.window(start, stop)
    return values


def _per_entry(name: str, value: np.ndarray | float | int, size: int, dtype: type) -> np.ndarray:
    arr: np.ndarray = np.asarray(value, dtype=dtype)
    if arr.ndim == 0:
        return np.full(size, arr, dtype=dtype)
    if arr.shape != (size,):
        raise ValueError(f"{name} must be a scalar or have one entry per value ({size})")
    return arr


def check_config(frac_bits: np.ndarray, max_abs: np.ndarray, n_clients: int) -> None:
    """Raise ``ValueError`` (with the first offending index) for an unsafe configuration."""
    if n_clients < 1:
        raise ValueError("n_clients must be at least 1")
    bad = np.flatnonzero((frac_bits < 0) | (frac_bits > MAX_FRAC_BITS))
    if bad.size:
        raise ValueError(f"frac_bits[{bad[0]}] = {frac_bits[bad[0]]} outside [0, {MAX_FRAC_BITS}]")
    bad = np.flatnonzero(~np.isfinite(max_abs) | (max_abs < 0))
    if bad.size:
        raise ValueError(f"max_abs[{bad[0]}] = {max_abs[bad[0]]} must be finite and >= 0")
    # Exact integer check of n * round(max_abs * 2^f) <= 2^63 - 1 (float64 rounding would lie).
    scaled = np.ldexp(max_abs, frac_bits.astype(np.int64))
    limit = np.ldexp(1.0, 63) / n_clients
    suspicious = np.flatnonzero(np.rint(scaled) >= limit * (1 - 1e-12))
    for i in suspicious:
        if n_clients * int(np.rint(scaled[i])) > _INT64_MAX:
            raise ValueError(
                f"max_abs[{i}] = {max_abs[i]} with frac_bits {frac_bits[i]} lets {n_clients} "
                "clients overflow the signed 64-bit ring")


def first_out_of_range(values: np.ndarray, max_abs: np.ndarray) -> int | None:
    """Index of the first value that is not finite or exceeds its ``max_abs``, else ``None``."""
    if values.size and max_abs.size and max_abs[0] == max_abs[-1] and (
            max_abs.min() == max_abs.max()):
        # one bound for all: two reductions, no temporaries (NaN makes max/min NaN: slow path)
        lim = float(max_abs[0])
        if float(values.max()) <= lim and float(values.min()) >= -lim:
            return None
    ok = np.abs(values) <= max_abs  # NaN compares False; max_abs is finite, so inf fails too
    if ok.all():
        return None
    return int(np.flatnonzero(~ok)[0])


class OutOfRange(ValueError):
    """A value is not finite or exceeds its bound; ``index`` is the first such entry."""

    def __init__(self, index: int) -> None:
        super().__init__(f"value[{index}] is out of range")
        self.index = index


def _chunk_ok(chunk: np.ndarray, limit: np.ndarray | float) -> bool:
    if isinstance(limit, float):
        # two reductions, no temporaries; NaN makes max/min NaN and fails the comparison
        return bool(float(chunk.max()) <= limit and float(chunk.min()) >= -limit)
    return bool((np.abs(chunk) <= limit).all())  # NaN compares False; inf exceeds any limit


def encode(values: np.ndarray, factor: np.ndarray | Periodic | float, *,
           limit: np.ndarray | Periodic | float | None = None, out: np.ndarray | None = None,
           bounded: bool = False) -> np.ndarray:
    """``round(values * factor)`` as uint64 (two's complement), ``factor = scale(frac_bits)``.

    Works block by block (:data:`_BLOCK` entries, see :func:`encode_block`), so a block is
    range-checked, scaled, rounded and reinterpreted while it sits in cache, and writes straight
    into ``out`` (a contiguous uint64 vector, allocated when ``None``) without temporaries.

    ``limit`` (a scalar, or one bound per entry) range-checks ``|values| <= limit`` before a
    block is encoded and raises :class:`OutOfRange` with the first offending index; ``None``
    skips the check. ``bounded=True`` states that every ``|values * factor| < 2^50`` is already
    guaranteed (by ``limit * factor < 2^50``), which skips the magnitude test of the
    magic-number rounding. On an exception ``out`` holds a partial encoding.
    """
    n = values.shape[0]
    if out is None:
        out = np.empty(n, dtype=np.uint64)
    elif out.dtype != np.uint64 or out.shape != (n,) or not out.flags.c_contiguous:
        raise ValueError("out must be a contiguous uint64 vector of the values' length")
    if isinstance(limit, np.ndarray) and limit.ndim == 0:
        limit = float(limit)
    for start in range(0, n, _BLOCK):
        stop = min(start + _BLOCK, n)
        encode_block(values, factor, limit, bounded, start, stop, out[start:stop])
    return out


def encode_block(values: np.ndarray, factor: np.ndarray | Periodic | float,
                 limit: np.ndarray | Periodic | float | None, bounded: bool, start: int,
                 stop: int,
                 out: np.ndarray) -> None:
    """Encode ``values[start:stop]`` into ``out`` (uint64, ``stop - start`` long), as
    :func:`encode` does for each block (``factor`` and ``limit``: scalars or full-length)."""
    if _kernels.KERNELS is not None:
        encode_compiled(values[start:stop], None, window(factor, start, stop),
                        None if limit is None else window(limit, start, stop), out, start)
        return
    chunk = values[start:stop]
    lim = None if limit is None else window(limit, start, stop)
    if lim is not None and not _chunk_ok(chunk, lim):
        bad = first_out_of_range(chunk, np.broadcast_to(lim, chunk.shape))
        raise OutOfRange(start + (bad if bad is not None else 0))
    f_part, i_part = out.view(np.float64), out.view(np.int64)
    fac = window(factor, start, stop)
    np.multiply(chunk, fac, out=f_part)  # exact: a power of two
    if bounded or (float(f_part.max()) < _MAGIC_LIMIT
                   and -float(f_part.min()) < _MAGIC_LIMIT):  # NaN: the slow path
        # round-half-even to an integer in place: adding 1.5 * 2^52 leaves the integer in the
        # low mantissa bits (same rounding as np.rint); then subtract the magic's bits
        np.add(f_part, _MAGIC, out=f_part)
        np.subtract(i_part, _MAGIC_BITS, out=i_part)
    else:  # large (or non-finite, unchecked) values: round, then convert through a copy
        np.rint(f_part, out=f_part)
        np.copyto(i_part, f_part, casting="unsafe")


_NONE = np.zeros(0)


def _entries(x: np.ndarray | float | None) -> np.ndarray:
    """A block's per-entry values (one entry: the same for all; none: not given) as the
    compiled encoder reads them."""
    if x is None:
        return _NONE
    return np.ascontiguousarray(x, dtype=np.float64).reshape(-1)


def encode_compiled(chunk: np.ndarray, divisor: np.ndarray | float | None,
                    factor: np.ndarray | float, limit: np.ndarray | float | None,
                    out: np.ndarray, offset: int = 0) -> None:
    """``round(chunk / divisor * factor)`` into ``out`` in one compiled pass (the bits of
    numpy's steps: the same division, product and round-half-even), after the range check
    ``|chunk / divisor| <= limit``; :class:`OutOfRange` names the first offending entry plus
    ``offset``."""
    kernels = _kernels.KERNELS
    if kernels is None:  # pragma: no cover - callers check
        raise RuntimeError("internal: the compiled encoder is not built")
    bad = kernels.encode_values(np.ascontiguousarray(chunk, dtype=np.float64),
                                _entries(divisor), _entries(factor), _entries(limit), out)
    if bad >= 0:
        raise OutOfRange(offset + bad)


def scale(frac_bits: np.ndarray) -> np.ndarray | float:
    """``2.0 ** frac_bits`` as float64 (exact); a scalar when every entry has the same bits."""
    if frac_bits.size and (frac_bits == frac_bits[0]).all():
        return float(2.0 ** int(frac_bits[0]))
    return np.ldexp(np.ones(frac_bits.shape), frac_bits.astype(np.int64))


def decode(total: np.ndarray, frac_bits: np.ndarray | Periodic) -> np.ndarray:
    """Read a uint64 (sum of encodings) as signed and divide by ``2^frac_bits``."""
    signed = np.ascontiguousarray(total, dtype=np.uint64).view(np.int64)
    out = signed.astype(np.float64)
    if isinstance(frac_bits, Periodic):
        for a, b, pat in frac_bits.rows():  # one power of two per column of each block
            rows = out[a:b].reshape(-1, pat.size)
            np.divide(rows, np.ldexp(1.0, pat.astype(np.int64)), out=rows)
        return out
    np.divide(out, scale(frac_bits), out=out)  # exact: a power of two
    return out


def broadcast(name: str, value: np.ndarray | float | int, size: int, dtype: type) -> np.ndarray:
    """``value`` as a per-entry array of ``size`` (scalars are repeated)."""
    return _per_entry(name, value, size, dtype)
