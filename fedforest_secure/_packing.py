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

        Raises ``ValueError`` for a lane width outside ``MIN_COUNT_BITS .. MAX_COUNT_BITS``."""
        if isinstance(count_bits, bool) or not isinstance(count_bits, int) or not (
                MIN_COUNT_BITS <= count_bits <= MAX_COUNT_BITS):
            raise ValueError(f"a count lane of {count_bits!r} bits: expected an int in "
                             f"{MIN_COUNT_BITS}..{MAX_COUNT_BITS}")
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
        if enc.dtype != np.uint64 or enc.shape != (self.entries,):
            raise ValueError(f"expected {self.entries} uint64 entries, got {enc.dtype} "
                             f"{enc.shape}")
        c, s_bits = self.count_bits, 64 - self.count_bits
        out = np.empty(self.words, dtype=np.uint64)
        w = 0
        for a, b, packed in self.spans:
            if not packed:
                out[w:w + b - a] = enc[a:b]
                w += b - a
                continue
            counts, sums = enc[a:b:2], enc[a + 1:b:2]
            limit = 2.0 * counts.astype(np.float64) * 2.0**self.frac_bits
            bad = (counts >= np.uint64(1 << (c - 1))) | ~(
                np.abs(sums.view(np.int64).astype(np.float64)) <= limit)
            if bad.any():
                cell = int(np.flatnonzero(bad)[0])
                raise OverflowRisk(
                    f"entry {a + 2 * cell}: a cell of count {int(counts[cell].view(np.int64))} "
                    f"and sum {int(sums[cell].view(np.int64))} ring units does not fit the "
                    f"task's packing (a count in [0, 2^{c - 1}), |sum| at most 2 x count x "
                    f"2^{self.frac_bits}: a target outside the job's bound?)")
            n = (b - a) // 2
            np.left_shift(counts, np.uint64(s_bits), out=out[w:w + n])
            out[w:w + n] += sums  # wraps modulo 2^64: a negative sum borrows from the count
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
