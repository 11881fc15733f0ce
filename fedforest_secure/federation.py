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

import os
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

import numpy as np

from .config import JobConfig
from .coordinator import Coordinator
from .errors import ProfileError
from .model import ForestModel
from .protocol import Reply, Task, TaskKind, layout_size, seal
from .worker import Worker, client_seed

__all__ = ["IN_PROCESS_ROUND_BYTES", "Aggregator", "PlainSum", "RoundRecord", "client_seed",
           "effective_n_jobs", "run_in_process"]

#: in process, a level whose estimated state (every client's sorted level order and the
#: coordinator's copy of their sketches) exceeds this is evaluated in groups of nodes that
#: stay within it (:class:`~fedforest_secure.coordinator.Coordinator`): the same forest in
#: bounded memory, for a few more rounds
IN_PROCESS_ROUND_BYTES = 32 << 20

T = TypeVar("T")


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


def effective_n_jobs(n_jobs: int | None) -> int:
    """The number of threads ``n_jobs`` asks for, scikit-learn's way: None is 1, -1 every
    CPU, -2 all but one, and so on.

    Raises
    ------
    ValueError
        ``n_jobs`` is 0 or not an integer.
    """
    if n_jobs is None:
        return 1
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, (int, np.integer)) or n_jobs == 0:
        raise ValueError(f"n_jobs must be a non-zero integer or None, got {n_jobs!r}")
    if n_jobs > 0:
        return int(n_jobs)
    return max(1, (os.cpu_count() or 1) + 1 + int(n_jobs))


@dataclass(frozen=True)
class _Threads:
    """A thread pool for the clients' work and how many calls may be in flight at once."""

    pool: ThreadPoolExecutor
    ahead: int


def _in_order(calls: Iterable[Callable[[], T]], threads: _Threads | None
              ) -> Generator[T, None, None]:
    """The results of ``calls``, in their order.

    With a thread pool, the calls run concurrently (numpy releases the GIL in the heavy
    steps), at most ``threads.ahead`` at a time, so the results alive at once stay bounded.
    The results come back in the calls' order, so whatever adds them up does so in the same
    order as without threads.
    """
    if threads is None:
        for call in calls:
            yield call()
        return
    pending: deque[Future[T]] = deque()
    todo = iter(calls)
    more = True
    try:
        while more or pending:
            while more and len(pending) < threads.ahead:
                nxt: Callable[[], T] | None = next(todo, None)
                if nxt is None:
                    more = False
                else:
                    pending.append(threads.pool.submit(nxt))
            if pending:
                yield pending.popleft().result()
    finally:  # a failing call (or a consumer that stops): the other results are not needed
        for f in pending:
            f.cancel()
        for f in pending:
            if not f.cancelled():
                f.exception()  # wait for it: no call outlives this iteration


def _answers(task: Task, workers: Sequence[Worker], threads: _Threads | None,
             digests: tuple[bytes, bytes] | None = None, into: np.ndarray | None = None
             ) -> Generator[Reply, None, None]:
    """Every client's reply to ``task``, in client order (:func:`_in_order`). Each worker
    touches only its own state and reads the shared task; with ``into`` (no threads: the
    clients one after the other) a worker may add its vector to that running total
    (:meth:`~fedforest_secure.worker.Worker.handle`)."""
    extra: dict[str, Any] = {} if digests is None else {"digests": digests}
    if into is not None:
        extra["into"] = into
    calls = (partial(w.handle, task, **extra) for w in workers)
    yield from _in_order(calls, threads)


def _by_index(replies: Iterator[Reply]) -> Callable[[int], Reply]:
    """``answer(k)`` for a consumer that asks the clients in order k = 0, 1, ..."""
    return lambda k: next(replies)


def _stream_plain(task: Task, workers: Sequence[Worker], threads: _Threads | None = None
                  ) -> tuple[np.ndarray, dict[int, dict[str, np.ndarray]]]:
    """Add the clients' vectors one by one, in client order (same floats as PlainSum).

    A histogram round without threads hands the running total to each client, which adds its
    histogram to it (the same floats, without a vector of its own) or returns its vector."""
    total: np.ndarray | None = None
    disclosed: dict[int, dict[str, np.ndarray]] = {}
    digests = (task.digest(), task.question_digest())  # the same task for every client
    if threads is None and task.kind is TaskKind.HISTOGRAM:
        total = np.zeros(layout_size(task.layout))
    for k, reply in enumerate(_answers(task, workers, threads, digests, total)):
        if total is None:
            total = np.zeros_like(reply.summable, dtype=np.float64)
        if reply.summable.size or task.kind is not TaskKind.HISTOGRAM:
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


def run_in_process(config: JobConfig, clients: Iterable[tuple[Any, ...]], *,
                   aggregator: Aggregator | None = None,
                   on_round: Callable[[RoundRecord], None] | None = None,
                   workers: Sequence[Worker] | None = None,
                   max_round_bytes: int | None = IN_PROCESS_ROUND_BYTES,
                   max_nodes_per_round: int | None = None,
                   n_jobs: int | None = None) -> ForestModel:
    """Train a forest with every client in this process, through the real protocol.

    Parameters
    ----------
    config : the job configuration
    clients : one ``(X_k, y_k)`` or ``(X_k, y_k, sample_weight_k)`` per client, in
        client-index order (a sequence, or an iterable such as a generator)
    aggregator : how summable vectors are added up (default: what the profile asks for)
    on_round : called with what the server saw after each round (audit hook)
    workers : ready-made workers, one per client, in client-index order (then ``clients`` is
        not used)
    max_round_bytes, max_nodes_per_round : evaluate a level in groups of nodes when it is
        larger than this (see :class:`~fedforest_secure.coordinator.Coordinator`; the forest
        is the same). None and None: one sketch and one histogram round per level, as over
        HTTPS.
    n_jobs : threads for the clients' work (:func:`effective_n_jobs`; None: one). The forest
        is the same for every value: replies are added in client order.
    """
    n_threads = effective_n_jobs(n_jobs)
    if isinstance(clients, Sequence) and workers is None and len(clients) != config.n_clients:
        raise ValueError(f"config expects {config.n_clients} clients, got {len(clients)}")
    floor = int(config.profile.get("min_clients", 1) or 1)
    if config.n_clients < floor:  # every sum of the job would be over fewer clients
        raise ProfileError(f"profile {config.profile.get('name', '?')!r} refuses sums over "
                           f"fewer than {floor} clients (min_clients); this job has "
                           f"{config.n_clients}")
    pool = ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix="fedforest-client") \
        if n_threads > 1 and config.n_clients > 1 else None
    threads = _Threads(pool, n_threads) if pool is not None else None
    try:
        if workers is None:
            # clients may be a generator: each share can be dropped once its worker is built
            # (a worker keeps codes, not the table)
            workers = list(_in_order(
                (partial(Worker, config, share[0], share[1], client_index=k,
                         seed=client_seed(config, k), keep_last_reply=False,
                         keep_level_order=None,
                         sample_weight=share[2] if len(share) > 2 else None)
                 for k, share in enumerate(clients)), threads))
        if len(workers) != config.n_clients:
            raise ValueError(f"config expects {config.n_clients} clients, got {len(workers)}")
        agg = aggregator or make_aggregator(config)
        coord = Coordinator(config, max_nodes_per_round=max_nodes_per_round,
                            max_round_bytes=max_round_bytes,
                            total_rows=sum(w.n_rows for w in workers), executor=pool)
        _train(coord, workers, agg, on_round, threads)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    model = coord.result()
    # keys as a model file reads them back (JSON keys are text), so that the digest of the
    # model trained and of the model loaded are one
    model.meta["abstained"] = {str(k): {str(level): count for level, count in
                                        sorted(w.abstained.items())}
                               for k, w in enumerate(workers)}
    return model


def _train(coord: Coordinator, workers: Sequence[Worker], agg: Aggregator,
           on_round: Callable[[RoundRecord], None] | None, threads: _Threads | None) -> None:
    """Run the coordinator's rounds to the end over the in-process ``workers``."""
    while (issued := coord.next_task()) is not None:
        task = seal(issued)  # hashed once for every client of the round
        if isinstance(agg, PlainSum) and on_round is None:
            # plain sums stream: one client's vector at a time (memory O(vector), not K x)
            total, disclosed = _stream_plain(task, workers, threads)
        elif _is_ring(agg):
            # each client's float vector lives only until it is encoded for the ring
            answers = _answers(task, workers, threads)
            total, disclosed = agg.aggregate_stream(  # type: ignore[attr-defined]
                task, _by_index(answers), len(workers))
            answers.close()
        else:
            replies = dict(enumerate(_answers(task, workers, threads)))
            total = agg.aggregate(task, replies)
            disclosed = {k: r.disclosed for k, r in replies.items() if r.disclosed}
            del replies
        coord.submit(task.round_id, total, disclosed, participants=list(range(len(workers))))
        if on_round is not None:
            on_round(RoundRecord(task, total, disclosed, list(range(len(workers)))))
        del total, disclosed  # the next round's workers should not share memory with these
