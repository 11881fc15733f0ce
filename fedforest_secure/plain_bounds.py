"""The public range of every entry of a client's plaintext summable vector in one round,
from the round's codec (:func:`~fedforest_secure.secure_sum.make_codec`); the server checks
every plaintext upload against it
(:func:`~fedforest_secure.protocol.uploads.check_against_task`)."""

from __future__ import annotations

import numpy as np

from .config import JobConfig
from .errors import FedForestError
from .protocol import StatKind, Task, kind_code, kinds_vector, layout_size
from .secure_sum import make_codec

__all__ = ["PlainBounds"]


class PlainBounds:
    """Per-entry bounds on one client's *plaintext* (unmasked) summable vector of a round.

    ``value``: |v| <= ``max_abs * scale`` of the round's codec
    (:func:`~fedforest_secure.secure_sum.make_codec`: 2^36 for counts, 2^28 times the entry's
    public scale for sums, sums of squares and gains), and never more than
    ``float64 max / (2 n_clients)``, so the sum over every client of the round stays finite.
    ``ring``: the same bound in ring units, for fixed-point uploads summed in the clear
    (``|signed(v)| <= round(max_abs * 2^frac_bits)``), which keeps the ring sum from wrapping.
    ``nonneg``: entries that are counts or sums of squares, never negative in a plaintext upload
    (plaintext rounds carry no DP noise: a negative count is a lie that lowers a sum).
    Masked uploads are uniform ring elements and cannot be range-checked (threat model M7).
    """

    def __init__(self, config: JobConfig, task: Task) -> None:
        n = layout_size(task.layout)
        cap = float(np.finfo(np.float64).max) / (2.0 * max(int(config.n_clients), 1))
        try:
            codec = make_codec(config, task)
            value = np.asarray(codec.ring.max_abs * codec.scale, dtype=np.float64)
            ring = np.rint(np.ldexp(np.asarray(codec.ring.max_abs, dtype=np.float64),
                                    np.asarray(codec.ring.frac_bits, dtype=np.int64)))
        except (FedForestError, ValueError, KeyError, TypeError):
            # no codec for this configuration: the documented float64 cap only
            value = np.full(n, cap)
            ring = np.full(n, float(2**62 // max(int(config.n_clients), 1)))
        if value.shape != (n,):
            raise ValueError("codec bounds do not match the task layout")
        self.value = np.minimum(value, cap)
        self.ring = np.minimum(ring, float(2**62)).astype(np.int64)
        kinds = kinds_vector(task.layout)
        self.nonneg = (kinds == kind_code(StatKind.COUNT)) | (kinds == kind_code(StatKind.SUMSQ))

    def first_violation(self, vec: np.ndarray) -> int | None:
        """Index of the first entry outside its bound (or not finite), else ``None``."""
        if vec.dtype == np.uint64:
            signed = vec.view(np.int64)
            bad = (signed > self.ring) | (signed < -self.ring) | (self.nonneg & (signed < 0))
        else:
            with np.errstate(invalid="ignore"):
                bad = ~(np.abs(vec) <= self.value)  # NaN compares False: out of range too
                bad |= self.nonneg & (vec < 0)
        idx = np.flatnonzero(bad)
        return int(idx[0]) if idx.size else None
