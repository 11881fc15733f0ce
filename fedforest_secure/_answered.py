"""The rounds a worker has answered in its job, and what it refuses because of them.

A retried round (the same round id and the same task) gets the same reply; an older round, a
round already answered for another question, and a question answered in an earlier round are
refused (answering it again could isolate a client by differencing); under differential
privacy the noisy aggregates a client releases are counted against its plan's limit.
"""

from __future__ import annotations

from .config import JobConfig
from .errors import ProtocolError, RefusedRequest
from .protocol import Reply, Task

__all__ = ["AnsweredRounds"]


class AnsweredRounds:
    """What one worker has answered: its last round (and reply) and every question.

    Parameters
    ----------
    config : the job's configuration
    keep_last_reply : keep the last reply, so a retried round gets the same answer
    """

    def __init__(self, config: JobConfig, keep_last_reply: bool) -> None:
        self.config = config
        self._last_round: int | None = None
        self._last_reply: Reply | None = None
        self._last_digest = b""
        self._keep_last_reply = keep_last_reply
        self._questions: set[bytes] = set()
        self._dp_releases = 0

    def replay(self, round_id: int, digest: bytes) -> Reply | None:
        """The reply already given in round ``round_id`` to the task of ``digest`` (a retry),
        or None for a round after the last one answered.

        Raises
        ------
        ProtocolError
            The round was answered for another question, or without keeping its reply, or
            is older than the last one answered.
        """
        if self._last_round is not None and round_id == self._last_round:
            if digest != self._last_digest:
                raise ProtocolError(f"round {round_id} was already answered for another "
                                    "question; refusing to answer it twice")
            if self._last_reply is None:
                raise ProtocolError(f"round {round_id} was already answered")
            return self._last_reply
        if self._last_round is not None and round_id < self._last_round:
            raise ProtocolError(f"round {round_id} is older than round {self._last_round}")
        return None

    def check_new(self, task: Task, question: bytes) -> None:
        """Refuse a question answered in an earlier round, and under DP a noisy aggregate
        beyond the plan's.

        Raises
        ------
        RefusedRequest
            The question was answered before, or the client's noisy releases are spent.
        """
        if question in self._questions:
            raise RefusedRequest("this question was already answered in an earlier round; "
                                 "answering it again could isolate a client by differencing",
                                 code="question_reused")
        if self.config.dp is not None and task.layout:
            # one noisy aggregate per planned release: a histogram round per splitting level,
            # or with random splits the marginal counts (with the class totals, if planned)
            # and the leaves' totals
            limit = 2 if self.config.method == "random" else self.config.max_depth
            if self._dp_releases >= limit:
                raise RefusedRequest(f"privacy budget spent: this client releases at most "
                                     f"{limit} noisy aggregates per job")

    def answered(self, round_id: int, digest: bytes, reply: Reply) -> None:
        """Record ``reply`` as the answer of round ``round_id`` to the task of ``digest``."""
        self._last_round, self._last_digest = round_id, digest
        # the last reply is kept so a retried round gets the same answer; an in-process
        # federation, which never retries, can skip keeping it (memory)
        self._last_reply = reply if self._keep_last_reply else None

    def counted(self, task: Task, question: bytes) -> None:
        """Count ``task``'s question as answered (and under DP its noisy release)."""
        self._questions.add(question)
        if self.config.dp is not None and task.layout:
            self._dp_releases += 1
