"""What the server needs of the engine: the job's coordinator (training or evaluation), the
round codec, and the public bounds every plaintext upload is checked against."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.plain_bounds import PlainBounds
from fedforest_secure.protocol import Task
from fedforest_secure.secure_sum import StatCodec, check_frac_bits, make_codec

__all__ = ["JobOutput", "PlainBounds", "RoundEngine", "make_codec", "new_coordinator",
           "plain_bounds", "round_codec", "uses_ring", "uses_secagg"]


class JobOutput(Protocol):
    """What a finished job yields: a forest, or an evaluation's result."""

    def to_json(self) -> str: ...


class RoundEngine(Protocol):
    """The server side of a job, round by round: the training
    :class:`~fedforest_secure.coordinator.Coordinator` or the
    :class:`~fedforest_secure.evaluation.coordinator.EvalCoordinator`."""

    def next_task(self) -> Task | None: ...

    def submit(self, round_id: int, total: np.ndarray,
               disclosed: Mapping[int, Mapping[str, np.ndarray]] | None = None,
               participants: Sequence[int] | None = None) -> None: ...

    def result(self) -> JobOutput: ...

    def pop_events(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]: ...


def new_coordinator(config: JobConfig) -> RoundEngine:
    """The coordinator of the job's kind (:class:`~fedforest_secure.errors.OverflowRisk` for
    a fixed-point job whose ``frac_bits`` its sites' sums cannot hold)."""
    if uses_ring(config):
        check_frac_bits(config)  # else the first round's codec fails, after every join
    if config.evaluation is not None:
        from fedforest_secure.evaluation.coordinator import EvalCoordinator

        return EvalCoordinator(config)
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
