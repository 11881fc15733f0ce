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
from .secure_sum import RingAggregator
from .worker import Worker

__all__ = ["Aggregator", "PlainSum", "RoundRecord", "client_seed", "run_in_process"]


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
    for k, w in enumerate(workers):
        reply = w.handle(task)
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
        return RingAggregator(config)
    return PlainSum()


def run_in_process(config: JobConfig, clients: Iterable[tuple[Any, Any]], *,
                   aggregator: Aggregator | None = None,
                   on_round: Callable[[RoundRecord], None] | None = None,
                   workers: Sequence[Worker] | None = None) -> ForestModel:
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
    coord = Coordinator(config)
    while (task := coord.next_task()) is not None:
        if isinstance(agg, PlainSum) and on_round is None:
            # plain sums stream: one client's vector at a time (memory O(vector), not K x)
            total, disclosed = _stream_plain(task, workers)
        elif isinstance(agg, RingAggregator):
            # each client's float vector lives only until it is encoded for the ring
            total, disclosed = agg.aggregate_stream(task, lambda k: workers[k].handle(task),
                                                    len(workers))
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
