"""Two statistics in one ring word: a regression grid cell's (count, sum y) under secure
aggregation.

A block of kinds ``(COUNT, SUM)`` (a regression grid or histogram: per cell a count, 0 fraction
bits, and a fixed-point sum of y) is uploaded one word per cell, ``count * 2^S + sum`` modulo
2^64 (the sum signed, two's complement), so the masks, the upload and the server's sum cover
half the words. Packing is linear modulo 2^64: the sum of the clients' packed words is the
packing of their summed entries, so the unmasked sum tells the server a function of the
pooled sums and nothing else, whatever the lanes; a client packs every reply it computes and
never refuses for its data.

The server unpacks the sum's words: the low ``S`` bits, sign-extended, are the pooled sum, the
high ``c = 64 - S`` bits the pooled count. These are the very ring values an unpacked sum
gives (so the decoded statistics are the same bits) while the pooled count stays below
``2^(c-1)`` and the pooled |sum| below ``2^(S-1)``. The coordinator names ``c`` in the task
(``params["pack"]``) from the forest's root totals, public to it: no node of a tree holds
more than its root's weighted count ``N``, and no cell's |sum of w y| exceeds
``sqrt(N * sum of w y^2)`` of its root (Cauchy-Schwarz), whatever the job's target bound. It
packs only where both bounds, with a factor 2 and ``K`` rounding units to spare, fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _kernels
from .config import JobConfig
from .errors import OverflowRisk
from .protocol import Block, StatKind

__all__ = ["PACKED_KINDS", "Packing", "count_lane_bits", "packs", "root_lane_bits"]

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


def count_lane_bits(max_count: float, max_sum: float) -> int | None:
    """The count lane's width for pooled counts up to ``max_count`` and pooled sums of
    absolute value up to ``max_sum`` ring units, or None where the two lanes do not both fit
    in 64 bits (then nothing is packed)."""
    if not (math.isfinite(max_count) and max_count >= 0 and math.isfinite(max_sum)
            and max_sum >= 0):
        return None
    c = max(int(max_count).bit_length() + 1, MIN_COUNT_BITS)  # max_count < 2^(c-1)
    if c > MAX_COUNT_BITS or max_sum >= 2.0 ** (64 - c - 1):
        return None
    return c


def root_lane_bits(root_count: np.ndarray, root_sumsq: np.ndarray, units_per_y: float,
                   n_clients: int) -> int | None:
    """:func:`count_lane_bits` of a forest from its trees' pooled root totals (weighted
    counts, weighted sums of y^2): counts up to the largest root count, sums up to twice the
    largest ``sqrt(count * sumsq)`` in ring units (``units_per_y`` per unit of y, the codec's
    :func:`~fedforest_secure.secure_sum.entry_scale_bits` of sums) plus one rounding unit per
    client."""
    n = np.asarray(root_count, dtype=np.float64)
    ss = np.asarray(root_sumsq, dtype=np.float64)
    if n.size == 0 or n.shape != ss.shape or not (np.all(n >= 1.0) and np.all(ss >= 0.0)) \
            or not (math.isfinite(units_per_y) and units_per_y > 0):
        return None
    q = float(np.max(np.sqrt(n * ss)))
    return count_lane_bits(float(n.max()), 2.0 * q * units_per_y + n_clients)


def _pack_cells(entries: np.ndarray, out: np.ndarray, count_bits: int) -> None:
    """``out[i] = (count << S) + sum`` modulo 2^64 for each cell ``(count, sum) =
    entries[2i:2i+2]`` (``S = 64 - count_bits``)."""
    kernels = _kernels.KERNELS
    if kernels is not None:
        kernels.pack_cells(entries, out, 64 - count_bits)
        return
    np.left_shift(entries[0::2], np.uint64(64 - count_bits), out=out)
    out += entries[1::2]  # wraps modulo 2^64: a negative sum borrows from the count


@dataclass(frozen=True)
class Packing:
    """Where a layout's ``(COUNT, SUM)`` blocks sit and how their cells are packed."""

    #: ``(start, stop, packed)``: entry ranges of the layout's blocks, in order
    spans: tuple[tuple[int, int, bool], ...]
    #: the count lane's width ``c``; the sum lane has ``64 - c`` bits
    count_bits: int

    @classmethod
    def of(cls, layout: tuple[Block, ...], count_bits: int) -> Packing | None:
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
        return cls(tuple(spans), count_bits)

    @property
    def entries(self) -> int:
        """Entries of the layout (values before packing)."""
        return self.spans[-1][1] if self.spans else 0

    @property
    def words(self) -> int:
        """Words of the packed vector: one per packed cell, one per other entry."""
        return sum((b - a) // 2 if p else b - a for a, b, p in self.spans)

    def pack(self, entries: np.ndarray) -> np.ndarray:
        """One client's ring encoding (uint64, one per entry) as packed words (linear modulo
        2^64: the packed words of a sum of encodings are the sum of their packed words)."""
        enc = np.asarray(entries)
        if enc.dtype != np.uint64 or enc.shape != (self.entries,) or not enc.flags.c_contiguous:
            raise ValueError(f"expected {self.entries} contiguous uint64 entries, got "
                             f"{enc.dtype} {enc.shape}")
        out = np.empty(self.words, dtype=np.uint64)
        w = 0
        for a, b, packed in self.spans:
            n = (b - a) // 2 if packed else b - a
            if packed:
                _pack_cells(enc[a:b], out[w:w + n], self.count_bits)
            else:
                out[w:w + n] = enc[a:b]
            w += n
        return out

    def unpack(self, words: np.ndarray) -> np.ndarray:
        """A sum of packed words (uint64) as the ring sums of the layout's entries.

        Raises :class:`~fedforest_secure.errors.OverflowRisk` where a pooled count comes out
        at ``2^(c-1)`` or more: lanes the coordinator sized from the root totals never hold
        one, so a lane wrapped (so did the sum lane of a cell with no rows whose sum came out
        beyond it: its count comes out negative), or a site added to its words what no
        encoding holds (2^63 lands in the count lane's top bit), and the sum is not used."""
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
            counts = (part - sums.view(np.uint64)) >> s_bits
            wrapped = np.flatnonzero(counts >= np.uint64(1 << (self.count_bits - 1)))
            if wrapped.size:
                raise OverflowRisk(f"entry {a + 2 * int(wrapped[0])}: a pooled count of "
                                   f"{self.count_bits}-bit lane wrapped in a packed sum "
                                   "(the task's packing is too narrow for this data, or a "
                                   "site sent values outside the codec's range)")
            out[a + 1:b:2] = sums.view(np.uint64)
            out[a:b:2] = counts
            w += n
        return out
