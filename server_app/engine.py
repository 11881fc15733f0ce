"""Late imports of the training engine, so the server starts (and its tests run) without it."""

from __future__ import annotations

from typing import Any

from fedforest_secure.config import JobConfig
from fedforest_secure.protocol import Task
from fedforest_secure.protocol.bounds import PlainBounds

__all__ = ["PlainBounds", "make_codec", "new_coordinator", "plain_bounds", "uses_ring"]


def new_coordinator(config: JobConfig) -> Any:
    from fedforest_secure.coordinator import Coordinator

    return Coordinator(config)


def uses_ring(config: JobConfig) -> bool:
    """True when clients send fixed-point uint64 vectors summed mod 2^64."""
    prof = config.profile
    return bool(prof.get("fixed_point", prof.get("secure_aggregation", False)))


def uses_secagg(config: JobConfig) -> bool:
    return bool(config.profile.get("secure_aggregation", False))


def make_codec(config: JobConfig, task: Task) -> Any:
    from fedforest_secure.secure_sum import make_codec as _make_codec

    return _make_codec(config, task)


def plain_bounds(config: JobConfig, task: Task) -> PlainBounds:
    """The bounds every plaintext upload of ``task`` is checked against on receipt."""
    return PlainBounds(config, task)
