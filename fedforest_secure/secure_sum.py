"""Fixed-point encoding of replies and secure summation for profiles with ``fixed_point``.

Every summable vector is divided by a public per-entry scale (1 for counts, the target bound
for sums of y, its square for sums of y^2 and for regression gains), range-checked and encoded
into the 64-bit ring by :class:`~fedforest_secure.secagg.RingCodec`. Under
``secure_aggregation`` the encodings are masked (pairwise masks with Shamir-shared keys) so the
server recovers only their sum; with ``secure_aggregation = false`` the same encodings are summed
in the clear, so both settings grow the same forest (invariant 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .config import JobConfig
from .protocol import Reply, StatKind, Task, kinds_vector
from .secagg import InProcessSecureSum, RingCodec

__all__ = ["RingAggregator", "StatCodec", "make_codec"]

#: Largest |value| per client, in units of the entry's scale (rows times bound).
_MAX_ROWS = float(2**28)
_MAX_COUNT = float(2**36)


@dataclass(frozen=True)
class StatCodec:
    """Scale then fixed-point-encode one round's summable vector."""

    ring: RingCodec
    scale: np.ndarray

    def encode(self, values: np.ndarray) -> np.ndarray:
        return self.ring.encode(np.asarray(values, dtype=np.float64) / self.scale)

    def decode(self, total: np.ndarray) -> np.ndarray:
        return self.ring.decode(total) * self.scale

    def quantum(self) -> np.ndarray:
        """Value of one unit of the ring per entry (the resolution of the encoding)."""
        return self.scale * np.ldexp(1.0, -self.ring.frac_bits)


def make_codec(config: JobConfig, task: Task) -> StatCodec:
    """The codec of a task's summable vector, from its layout's statistic kinds."""
    kinds = kinds_vector(task.layout)
    frac = int(config.profile.get("frac_bits", 24))
    bound = float(config.target_bound) if config.task == "regression" else 1.0
    bound = bound if bound > 0 else 1.0
    gain_scale = bound * bound if config.task == "regression" else max(
        1.0, math.log2(max(config.n_classes, 2)))
    scales = {StatKind.COUNT.value: 1.0, StatKind.SUM.value: bound,
              StatKind.SUMSQ.value: bound * bound, StatKind.GAIN.value: gain_scale}
    scale = np.ones(kinds.size)
    for k, v in scales.items():
        scale[kinds == k] = v
    ring = RingCodec.from_kinds(
        kinds.tolist(), frac_bits={k: frac for k in StatKind},
        max_abs={StatKind.COUNT: _MAX_COUNT, StatKind.SUM: _MAX_ROWS,
                 StatKind.SUMSQ: _MAX_ROWS, StatKind.GAIN: _MAX_ROWS},
        n_clients=max(config.n_clients, 1))
    return StatCodec(ring=ring, scale=scale)


class RingAggregator:
    """Sums ring encodings: masked (secure aggregation) or in the clear, same result."""

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        prof = config.profile
        self.secure = bool(prof.get("secure_aggregation"))
        self.min_clients = int(prof.get("min_clients", 1))
        self._secagg: InProcessSecureSum | None = None
        if self.secure:
            self._secagg = InProcessSecureSum(range(config.n_clients),
                                              threshold=float(prof.get("threshold", 0.67)),
                                              job_id=config.job_id)
        self.last_encoded: dict[int, np.ndarray] = {}

    @property
    def transcript(self) -> list[object]:
        return self._secagg.transcript if self._secagg is not None else []

    def aggregate(self, task: Task, replies: Mapping[int, Reply]) -> np.ndarray:
        codec = make_codec(self.config, task)
        encoded = {k: codec.encode(r.summable) for k, r in replies.items()}
        self.last_encoded = encoded
        if self._secagg is not None:
            question = f"level {task.level}/{task.kind.value}/round {task.round_id}"
            total = self._secagg.sum(question, task.digest(), encoded)
        else:
            total = np.zeros(codec.ring.size, dtype=np.uint64)
            for k in sorted(encoded):
                total += encoded[k]
        return codec.decode(total)
