"""Two statistics in one ring word: a regression grid cell's (count, sum y) under secure
aggregation.

A block of kinds ``(COUNT, SUM)`` (a regression grid or histogram: per cell a count, 0 fraction
bits, and a fixed-point sum of y) is uploaded one word per cell, ``count * 2^S + sum`` modulo
2^64 (the sum signed, two's complement), so the masks, the upload and the server's sum cover
half the words. The server unpacks the unmasked sum's words: the low ``S`` bits, sign-extended,
are the pooled sum, the high ``c = 64 - S`` bits the pooled count; both are the very ring values
an unpacked sum gives, so the decoded statistics are the same bits.

That holds while the pooled count stays below ``2^(c-1)`` and the pooled |sum| below
``2^(S-1)``. The coordinator names ``c`` in the task (``params["pack"]``) from the largest pooled
root count ``N`` of the forest, public to it (no node of a tree holds more): ``N < 2^(c-1)``,
and packs only if ``4 N 2^f + K < 2^(S-1)`` (``f`` the sums' fraction bits, ``K`` the clients).
Each client checks its own cells before it packs: a count in ``[0, 2^(c-1))`` and
``|sum| <= 2 count 2^f`` (a cell's mean |y| within twice the job's target bound: room for float
rounding), otherwise :class:`~fedforest_secure.errors.OverflowRisk`; then the pooled values of
honest clients fit both lanes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _kernels
from .config import JobConfig
from .errors import OverflowRisk
from .protocol import Block, StatKind

__all__ = ["PACKED_KINDS", "Packing", "count_lane_bits", "packs"]

#: the kinds of a block whose cells are packed, in column order
PACKED_KINDS = (StatKind.COUNT, StatKind.SUM)
#: the count lane's width: at least 2 bits, at most 40 (the sum lane keeps 24 or more)
MIN_COUNT_BITS, MAX_COUNT_BITS = 2, 40


def packs(config: JobConfig) -> bool:
    """Whether this job's rounds may pack grid cells: regression under secure aggregation
    without DP noise (a masked upload cannot be range-checked entry by entry anyway; plaintext
    uploads and noisy entries stay one word each)."""
    return (config.task == "regression" and bool(config.profile.get("secure_aggregation"))
            and config.dp is None and config.evaluation is None)


def count_lane_bits(max_count: float, frac_bits: int, n_clients: int) -> int | None:
    """The count lane's width for pooled counts up to ``max_count``, or None where the two
    lanes do not both fit in 64 bits (then nothing is packed)."""
    if not (math.isfinite(max_count) and max_count >= 0) or frac_bits < 0 or n_clients < 1:
        return None
    c = max(int(max_count).bit_length() + 1, MIN_COUNT_BITS)  # max_count < 2^(c-1)
    if c > MAX_COUNT_BITS:
        return None
    s = 64 - c
    if 4.0 * max_count * 2.0**frac_bits + n_clients >= 2.0 ** (s - 1):
        return None
    return c


def _pack_cells(entries: np.ndarray, out: np.ndarray, count_bits: int, frac_bits: int) -> int:
    """``out[i] = (count << S) + sum`` for each cell ``(count, sum) = entries[2i:2i+2]``
    (``S = 64 - count_bits``), after checking ``count < 2^(count_bits-1)`` and
    ``|sum| <= count << (frac_bits + 1)``: -1, or the first cell outside (``out`` then partly
    written). ``2 count_bits + frac_bits <= 63``, so the limits do not wrap."""
    s_bits, limit, shift = 64 - count_bits, 1 << (count_bits - 1), frac_bits + 1
    kernels = _kernels.KERNELS
    if kernels is not None:
        return int(kernels.pack_cells(entries, out, s_bits, limit, shift))
    counts, sums = entries[0::2], entries[1::2]
    lim = counts << np.uint64(shift)
    # |sum| <= lim exactly when sum + lim (modulo 2^64) is at most 2 lim
    bad = (counts >= np.uint64(limit)) | ((sums + lim) > (lim << np.uint64(1)))
    if bad.any():
        return int(np.flatnonzero(bad)[0])
    np.left_shift(counts, np.uint64(s_bits), out=out)
    out += sums  # wraps modulo 2^64: a negative sum borrows from the count
    return -1


@dataclass(frozen=True)
class Packing:
    """Where a layout's ``(COUNT, SUM)`` blocks sit and how their cells are packed."""

    #: ``(start, stop, packed)``: entry ranges of the layout's blocks, in order
    spans: tuple[tuple[int, int, bool], ...]
    #: the count lane's width ``c``; the sum lane has ``64 - c`` bits
    count_bits: int
    #: fraction bits of the packed sums (the client's check ``|sum| <= 2 count 2^f``)
    frac_bits: int

    @classmethod
    def of(cls, layout: tuple[Block, ...], count_bits: int, frac_bits: int) -> Packing | None:
        """The packing of ``layout``'s ``(COUNT, SUM)`` blocks; None if it has none.

        Raises ``ValueError`` for a lane width outside ``MIN_COUNT_BITS .. MAX_COUNT_BITS`` or
        one whose largest checked sum, ``2 (2^(c-1) - 1) 2^f``, would not fit the sum lane
        (``2 c + f > 63``): every cell a client packs then fits its word."""
        if isinstance(count_bits, bool) or not isinstance(count_bits, int) or not (
                MIN_COUNT_BITS <= count_bits <= MAX_COUNT_BITS) \
                or 2 * count_bits + frac_bits > 63:
            raise ValueError(f"a count lane of {count_bits!r} bits: expected an int in "
                             f"{MIN_COUNT_BITS}..{MAX_COUNT_BITS} with 2 x bits + "
                             f"{frac_bits} fraction bits <= 63 (a cell's largest sum must fit "
                             f"its sum lane)")
        spans: list[tuple[int, int, bool]] = []
        at = 0
        for b in layout:
            spans.append((at, at + b.size, tuple(b.kinds) == PACKED_KINDS))
            at += b.size
        if not any(p for _, _, p in spans):
            return None
        return cls(tuple(spans), count_bits, frac_bits)

    @property
    def entries(self) -> int:
        """Entries of the layout (values before packing)."""
        return self.spans[-1][1] if self.spans else 0

    @property
    def words(self) -> int:
        """Words of the packed vector: one per packed cell, one per other entry."""
        return sum((b - a) // 2 if p else b - a for a, b, p in self.spans)

    def pack(self, entries: np.ndarray) -> np.ndarray:
        """One client's ring encoding (uint64, one per entry) as packed words.

        Raises :class:`~fedforest_secure.errors.OverflowRisk` for a cell whose count is
        negative or not below ``2^(c-1)``, or whose |sum| exceeds ``2 count 2^f``."""
        enc = np.asarray(entries)
        if enc.dtype != np.uint64 or enc.shape != (self.entries,) or not enc.flags.c_contiguous:
            raise ValueError(f"expected {self.entries} contiguous uint64 entries, got "
                             f"{enc.dtype} {enc.shape}")
        out = np.empty(self.words, dtype=np.uint64)
        w = 0
        for a, b, packed in self.spans:
            if not packed:
                out[w:w + b - a] = enc[a:b]
                w += b - a
                continue
            n = (b - a) // 2
            bad = _pack_cells(enc[a:b], out[w:w + n], self.count_bits, self.frac_bits)
            if bad >= 0:
                count, total = enc[a + 2 * bad:a + 2 * bad + 2].view(np.int64)
                c = self.count_bits
                raise OverflowRisk(
                    f"entry {a + 2 * bad}: a cell of count {int(count)} and sum {int(total)} "
                    f"ring units does not fit the task's packing (a count in [0, 2^{c - 1}), "
                    f"|sum| at most 2 x count x 2^{self.frac_bits}: a target outside the "
                    f"job's bound?)")
            w += n
        return out

    def unpack(self, words: np.ndarray) -> np.ndarray:
        """A sum of packed words (uint64) as the ring sums of the layout's entries."""
        arr = np.asarray(words)
        if arr.dtype != np.uint64 or arr.shape != (self.words,):
            raise ValueError(f"expected {self.words} uint64 words, got {arr.dtype} {arr.shape}")
        c, s_bits = np.uint64(self.count_bits), np.uint64(64 - self.count_bits)
        out = np.empty(self.entries, dtype=np.uint64)
        w = 0
        for a, b, packed in self.spans:
            if not packed:
                out[a:b] = arr[w:w + b - a]
                w += b - a
                continue
            n = (b - a) // 2
            part = arr[w:w + n]
            # the low S bits sign-extended: shift them to the top, then arithmetically back
            sums = (part << c).view(np.int64) >> np.int64(self.count_bits)
            out[a + 1:b:2] = sums.view(np.uint64)
            out[a:b:2] = (part - sums.view(np.uint64)) >> s_bits
            w += n
        return out
