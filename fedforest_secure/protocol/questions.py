"""The identity of the question a secure sum answers, as both sides compute it."""

from __future__ import annotations

from .tasks import Task

__all__ = ["question_key"]


def question_key(task: Task) -> str:
    """The secure-aggregation question of a task: its *content*, without the round id.

    :meth:`Task.question_digest` (SHA-256 of the task's canonical bytes with ``round_id`` set
    to 0), hex: the same key the in-process :class:`~fedforest_secure.secure_sum.RingAggregator`
    uses. The same histogram re-asked in a later round is the same question, and a client
    answers a question for one set of clients only (``SecAggClient`` refuses it for a different
    set), so a server cannot subtract two sums of one statistic over sets that differ by one
    client. Clients recompute it from the task they fetched and refuse a round setup that
    announces another question.
    """
    return task.question_digest().hex()
