"""Wake-ups for long-polling requests (``?wait=``).

A step marks a job as changed (:meth:`Changes.touch`) when it changes what the job's clients
wait for: a member's state, the job's status or round, or the round's phase. After its commit
the step calls :meth:`Changes.notify`, which wakes the pollers only if it marked something.
Accepting one client's message changes nothing another client waits for, so it does not wake
(and re-run) every poller of the job: with K clients that would be K x K offers per step instead
of K. A poller re-checks every second anyway.
"""

from __future__ import annotations

import threading

__all__ = ["Changes"]


class Changes:
    """A generation counter and a condition on the server's lock."""

    def __init__(self, lock: threading.RLock) -> None:
        self.condition = threading.Condition(lock)
        self.generation = 0
        self._dirty: set[str] = set()

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
            self.generation += 1
            self.condition.notify_all()

    def wait(self, generation: int, timeout: float) -> None:
        """Block until the generation moved on from ``generation`` (or ``timeout`` seconds)."""
        with self.condition:
            self.condition.wait_for(lambda: self.generation != generation, timeout)
