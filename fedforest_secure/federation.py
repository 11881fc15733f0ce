"""In-process federation: the coordinator and one worker per client in one Python process.

This is the reference transport. The HTTPS deployment (``server_app`` / ``client_app``) moves the
same :class:`~fedforest_secure.protocol.Task` and :class:`~fedforest_secure.protocol.Reply`
objects over the network instead; the model is the same for the same seeds and profile.

Per round every client answers the task; the aggregator turns the replies' summable vectors
into their sum, which is all the coordinator receives, together with the per-client items the
profile discloses. With ``fixed_point`` the vectors are encoded into the 64-bit ring first
(and, with ``secure_aggregation``, masked so that only the sum can be recovered).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .config import JobConfig
from .coordinator import Coordinator
from .model import ForestModel
from .protocol import Reply, Task
from .worker import Worker

__all__ = ["IN_PROCESS_ROUND_BYTES", "Aggregator", "PlainSum", "RoundRecord", "client_seed",
           "run_in_process"]

#: in process, a level whose estimated state (every client's sorted level order and the
#: coordinator's copy of their sketches) exceeds this is evaluated in groups of nodes that
#: stay within it (:class:`~fedforest_secure.coordinator.Coordinator`): the same forest in
#: bounded memory, for a few more rounds
IN_PROCESS_ROUND_BYTES = 32 << 20


def client_seed(config: JobConfig, client_index: int) -> np.random.SeedSequence:
    """The seed of a client's own randomness (its bootstrap), derived from the job's seed."""
    return np.random.SeedSequence([config.random_state, 0xC1, client_index])


class Aggregator(Protocol):
    def aggregate(self, task: Task, replies: Mapping[int, Reply]) -> np.ndarray: ...


class PlainSum:
    """Sums float64 vectors in the clear, in client order (the open profile)."""

    def aggregate(self, task: Task, replies: Mapping[int, Reply]) -> np.ndarray:
        total = np.zeros_like(next(iter(replies.values())).summable, dtype=np.float64)
        for k in sorted(replies):
            total += replies[k].summable
        return total


@dataclass
class RoundRecord:
    """What the server saw in one round (for audits and tests)."""

    task: Task
    total: np.ndarray
    disclosed: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    participants: list[int] = field(default_factory=list)


def _stream_plain(task: Task, workers: Sequence[Worker]
                  ) -> tuple[np.ndarray, dict[int, dict[str, np.ndarray]]]:
    """Add the clients' vectors one by one, in client order (same floats as PlainSum)."""
    total: np.ndarray | None = None
    disclosed: dict[int, dict[str, np.ndarray]] = {}
    digests = (task.digest(), task.question_digest())  # the same task for every client
    for k, w in enumerate(workers):
        reply = w.handle(task, digests=digests)
        if total is None:
            total = np.zeros_like(reply.summable, dtype=np.float64)
        total += reply.summable
        if reply.disclosed:
            disclosed[k] = reply.disclosed
    return (total if total is not None else np.zeros(0)), disclosed


def make_aggregator(config: JobConfig) -> Aggregator:
    """The aggregator the job's profile calls for."""
    prof = config.profile
    if prof.get("fixed_point") or prof.get("secure_aggregation"):
        # imported here: the open profile never loads the secure-aggregation stack
        from .secure_sum import RingAggregator

        return RingAggregator(config)
    return PlainSum()


def _is_ring(agg: Aggregator) -> bool:
    """Whether ``agg`` is a :class:`~fedforest_secure.secure_sum.RingAggregator` (without
    importing the secure-aggregation stack when it cannot be one)."""
    import sys

    mod = sys.modules.get(f"{__package__}.secure_sum")
    return mod is not None and isinstance(agg, mod.RingAggregator)


def run_in_process(config: JobConfig, clients: Iterable[tuple[Any, Any]], *,
                   aggregator: Aggregator | None = None,
                   on_round: Callable[[RoundRecord], None] | None = None,
                   workers: Sequence[Worker] | None = None,
                   max_round_bytes: int | None = IN_PROCESS_ROUND_BYTES,
                   max_nodes_per_round: int | None = None) -> ForestModel:
    """Train a forest with every client in this process, through the real protocol.

    Parameters
    ----------
    config : the job configuration
    clients : one ``(X_k, y_k)`` per client, in client-index order (a sequence, or an iterable
        such as a generator)
    aggregator : how summable vectors are added up (default: what the profile asks for)
    on_round : called with what the server saw after each round (audit hook)
    workers : ready-made workers, one per client, in client-index order (then ``clients`` is
        not used)
    max_round_bytes, max_nodes_per_round : evaluate a level in groups of nodes when it is
        larger than this (see :class:`~fedforest_secure.coordinator.Coordinator`; the forest
        is the same). None and None: one sketch and one histogram round per level, as over
        HTTPS.
    """
    if workers is None:
        # clients may be a generator: each share can be dropped once its worker is built (a
        # worker keeps codes, not the table)
        if isinstance(clients, Sequence) and len(clients) != config.n_clients:
            raise ValueError(f"config expects {config.n_clients} clients, got {len(clients)}")
        workers = [Worker(config, X, y, client_index=k, seed=client_seed(config, k),
                          keep_last_reply=False, keep_level_order=None)
                   for k, (X, y) in enumerate(clients)]
    if len(workers) != config.n_clients:
        raise ValueError(f"config expects {config.n_clients} clients, got {len(workers)}")
    agg = aggregator or make_aggregator(config)
    coord = Coordinator(config, max_nodes_per_round=max_nodes_per_round,
                        max_round_bytes=max_round_bytes,
                        total_rows=sum(w.n_rows for w in workers))
    while (task := coord.next_task()) is not None:
        if isinstance(agg, PlainSum) and on_round is None:
            # plain sums stream: one client's vector at a time (memory O(vector), not K x)
            total, disclosed = _stream_plain(task, workers)
        elif _is_ring(agg):
            # each client's float vector lives only until it is encoded for the ring
            total, disclosed = agg.aggregate_stream(  # type: ignore[attr-defined]
                task, lambda k: workers[k].handle(task), len(workers))
        else:
            replies = {k: w.handle(task) for k, w in enumerate(workers)}
            total = agg.aggregate(task, replies)
            disclosed = {k: r.disclosed for k, r in replies.items() if r.disclosed}
            del replies
        coord.submit(task.round_id, total, disclosed, participants=list(range(len(workers))))
        if on_round is not None:
            on_round(RoundRecord(task, total, disclosed, list(range(len(workers)))))
        del total, disclosed  # the next round's workers should not share memory with these
    model = coord.result()
    model.meta["abstained"] = {str(k): dict(w.abstained) for k, w in enumerate(workers)}
    return model
