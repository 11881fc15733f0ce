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
from .protocol import Reply, StatKind, Task, kind_code, kinds_vector
from .secagg import InProcessSecureSum, RingCodec

__all__ = ["RingAggregator", "StatCodec", "encode_contribution", "entry_scale_bits", "make_codec"]

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


def _scales(config: JobConfig) -> dict[str, float]:
    bound = float(config.target_bound) if config.task == "regression" else 1.0
    bound = bound if bound > 0 else 1.0
    gain_scale = bound * bound if config.task == "regression" else max(
        1.0, math.log2(max(config.n_classes, 2)))
    return {StatKind.COUNT.value: 1.0, StatKind.SUM.value: bound,
            StatKind.SUMSQ.value: bound * bound, StatKind.GAIN.value: gain_scale}


def entry_scale_bits(config: JobConfig, kind: StatKind) -> float:
    """Ring units per unit of a statistic of this kind: ``2**frac_bits / scale`` (1 for counts)."""
    if kind is StatKind.COUNT:
        return 1.0
    frac = int(config.profile.get("frac_bits", 24))
    return float(2.0**frac) / _scales(config)[kind.value]


def make_codec(config: JobConfig, task: Task) -> StatCodec:
    """The codec of a task's summable vector, from its layout's statistic kinds."""
    key = (config.to_json(), task.round_id, task.layout)
    hit = _CODEC_CACHE.get(key)
    if hit is not None:
        return hit
    kinds = kinds_vector(task.layout)
    frac = int(config.profile.get("frac_bits", 24))
    scales = _scales(config)
    per_kind_scale = np.array([scales[k.value] for k in StatKind])
    per_kind_bits = np.array([0 if k is StatKind.COUNT else frac for k in StatKind],
                             dtype=np.int64)
    per_kind_max = np.array([_MAX_COUNT if k is StatKind.COUNT else _MAX_ROWS
                             for k in StatKind])
    ring = RingCodec(per_kind_bits[kinds], per_kind_max[kinds], max(config.n_clients, 1))
    codec = StatCodec(ring=ring, scale=per_kind_scale[kinds])
    if len(_CODEC_CACHE) >= 4:
        _CODEC_CACHE.pop(next(iter(_CODEC_CACHE)))
    _CODEC_CACHE[key] = codec
    return codec


_CODEC_CACHE: dict[object, StatCodec] = {}


def encode_contribution(config: JobConfig, task: Task, reply: Reply) -> np.ndarray:
    """What a client uploads for a round: its reply encoded in the ring (plus DP noise, if any).

    This runs on the client, before masking; the server only ever adds these up.
    """
    codec = make_codec(config, task)
    encoded = codec.encode(reply.summable)
    dp = task.params.get("dp")
    if dp and encoded.size:
        from .privacy import sample_discrete_gaussian

        kinds = kinds_vector(task.layout)
        noise = np.zeros(encoded.size, dtype=np.int64)
        for kind, sigma in dict(dp["sigma"]).items():
            sel = kinds == kind_code(StatKind(kind))
            if float(sigma) > 0 and sel.any():
                noise[sel] = sample_discrete_gaussian(float(sigma), int(sel.sum()))
        encoded = encoded + noise.view(np.uint64)  # wraps mod 2^64: signed noise in the ring
    return encoded


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
        encoded = {k: encode_contribution(self.config, task, r) for k, r in replies.items()}
        self.last_encoded = encoded
        if self._secagg is not None:
            question = f"level {task.level}/{task.kind.value}/round {task.round_id}"
            total = self._secagg.sum(question, task.digest(), encoded)
        else:
            total = np.zeros(codec.ring.size, dtype=np.uint64)
            for k in sorted(encoded):
                total += encoded[k]
        return codec.decode(total)
