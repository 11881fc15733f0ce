"""What the server needs of the training engine: the coordinator, the round codec, and the
public bounds every plaintext upload is checked against."""

from __future__ import annotations

from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.protocol import Task
from fedforest_secure.protocol.bounds import PlainBounds
from fedforest_secure.secure_sum import StatCodec, make_codec

__all__ = ["PlainBounds", "make_codec", "new_coordinator", "plain_bounds", "round_codec",
           "uses_ring", "uses_secagg"]


def new_coordinator(config: JobConfig) -> Coordinator:
    return Coordinator(config)


def uses_ring(config: JobConfig) -> bool:
    """True when clients send fixed-point uint64 vectors summed mod 2^64."""
    prof = config.profile
    return bool(prof.get("fixed_point", prof.get("secure_aggregation", False)))


def uses_secagg(config: JobConfig) -> bool:
    return bool(config.profile.get("secure_aggregation", False))


def round_codec(config: JobConfig, task: Task) -> StatCodec | None:
    """The fixed-point codec of the round of ``task``, or None for float64 rounds."""
    return make_codec(config, task) if uses_ring(config) else None


def plain_bounds(config: JobConfig, task: Task) -> PlainBounds:
    """The bounds every plaintext upload of ``task`` is checked against on receipt."""
    return PlainBounds(config, task)
