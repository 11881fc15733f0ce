"""Wake-ups for long-polling requests (``?wait=``).

A step marks a job as changed (:meth:`Changes.touch`) when it changes what the job's clients
wait for: a member's state, the job's status or round, or the round's phase. After its commit
the step calls :meth:`Changes.notify`, which wakes the pollers only if it marked something.
Accepting one client's message changes nothing another client waits for, so it does not wake
(and re-run) every poller of the job: with K clients that would be K x K offers per step instead
of K. A poller re-checks every second anyway.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["Changes"]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Changes:
    """A generation counter and a condition on the server's lock; long polls on the event loop
    wait on a future that :meth:`notify` resolves (no worker thread per waiting poll)."""

    def __init__(self, lock: threading.RLock) -> None:
        self.condition = threading.Condition(lock)
        self.generation = 0
        self._dirty: set[str] = set()
        #: the event-loop waiters of :meth:`wait_async`, each with its loop
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        self._mu = threading.Lock()

    def touch(self, job_id: str) -> None:
        """Mark that the job's view changed (see :meth:`notify`)."""
        self._dirty.add(job_id)

    def notify(self, job_id: str | None = None) -> None:
        """Wake the long-polling requests (call after the step's commit); with ``job_id``,
        only if the step touched the job."""
        if job_id is not None:
            if job_id not in self._dirty:
                return
            self._dirty.discard(job_id)
        with self.condition:
            with self._mu:
                self.generation += 1
                waiters, self._waiters = self._waiters, set()
            self.condition.notify_all()
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:  # that loop has closed: nobody waits on it any more
                pass

    def wait(self, generation: int, timeout: float) -> None:
        """Block until the generation moved on from ``generation`` (or ``timeout`` seconds)."""
        with self.condition:
            self.condition.wait_for(lambda: self.generation != generation, timeout)

    async def wait_async(self, generation: int, timeout: float) -> None:
        """:meth:`wait` on the event loop: returns when the generation moved on from
        ``generation`` (or after ``timeout`` seconds), without holding a worker thread."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        entry = (loop, fut)
        with self._mu:  # the generation is read and the waiter filed in one step of notify's
            if self.generation != generation:
                return
            self._waiters.add(entry)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            with self._mu:
                self._waiters.discard(entry)
