"""Secure aggregation over the REST API: one :class:`SecAggServer` per summable round.

The server only relays: it never holds a key that opens a share or a mask. Per round ``r``
(the task's round id is the secure-aggregation round id) the phases are::

    advertise  clients without a key advert for r riding on round r-1 POST one (first round only
               in steady state: every unmask response carries the advert of the next round)
    share      GET /secagg gives the RoundSetup (U1: the signed adverts); clients POST their
               encrypted Shamir shares (ShareBundle); the server routes them (ShareDelivery)
    upload     clients POST the masked uint64 vector as a binary body; it is added into one
               running sum on arrival (``SecAggServer(streaming=True)``: memory O(vector))
    unmask     survivors POST self-mask shares of survivors and key shares of dropped clients;
               ``finish`` removes the masks and yields the sum, decoded with ``make_codec``

A phase ends when every client it expects has answered, or at the deadline: then the missing
clients are dropped (their masks are recovered from their key shares if they had shared) and the
phase closes with whoever answered. With fewer than ``t`` left, the round aborts
(:class:`~fedforest_secure.errors.AbortedRound`): no partial sum is released and the job fails.

Restart: every message the server accepts for the open round is stored with the round (the
adverts it starts with, each share bundle, each masked upload's header and vector, each unmask
response; :mod:`server_app.runtime`). A restarted server rebuilds the round with
:meth:`SecAggBridge.resume`: it feeds the stored messages, phase by phase, to a fresh
:class:`SecAggServer` and closes each phase the round had already closed. Every phase closes on
exactly the messages it accepted before the restart, so the rebuilt ``RoundSetup``,
``ShareDelivery`` and ``UnmaskRequest`` are the ones the clients already saw: a client (which
keeps its round secrets in memory) is never asked for its shares of another set of survivors,
and the running sum is the sum of the same masked vectors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedforest_secure.errors import FedForestError, InvalidMessage
from fedforest_secure.protocol import Task, question_key
from fedforest_secure.secagg import KeyAdvert, SecAggServer

from .secure_round import SecureRound, StoredRound

__all__ = ["SecAggBridge"]


@dataclass
class SecAggBridge:
    """A job's secure-aggregation relay: identity directory, riding adverts, the open round."""

    job_id: str
    threshold: float | int
    neighbours: int | None = None
    directory: dict[int, bytes] = field(default_factory=dict)
    pending: dict[int, KeyAdvert] = field(default_factory=dict)
    current: SecureRound | None = None

    def start(self, task: Task, participants: list[int], words: int) -> SecureRound:
        """Open the secure round of ``task``, whose uploads are ``words`` long (the round
        codec's :attr:`~fedforest_secure.secure_sum.StatCodec.words`); feed it the adverts
        that rode on the last round."""
        server = SecAggServer(self.job_id, task.round_id, question_key(task), task.digest(),
                              words, self.threshold, dict(self.directory),
                              self.neighbours, streaming=True)
        sr = SecureRound(task.round_id, server, frozenset(participants))
        for idx in sorted(participants):
            advert = self.pending.get(idx)
            if advert is not None and advert.round_id == task.round_id:
                try:
                    server.receive_advert(advert)
                except InvalidMessage:  # stored before its keys were checked: not in the
                    continue  # roster (the site advertises again, or the round goes on)
        self.pending = {}
        self.current = sr
        return sr

    def resume(self, task: Task, participants: list[int], stored: StoredRound,
               words: int) -> SecureRound:
        """Rebuild the open round of ``task`` from its stored messages (after a restart).

        Raises :class:`RuntimeError` if the stored messages do not lead back to the stored
        phase (the state machine's own checks run on every replayed message).
        """
        self.pending = {}
        sr = self.start(task, participants, words)
        try:
            sr.replay(stored)
        except FedForestError as exc:
            self.current = None
            raise RuntimeError(f"the stored messages of secure round {task.round_id} do not "
                               f"replay ({type(exc).__name__}: {exc})") from exc
        except RuntimeError:
            self.current = None
            raise
        return sr

    def finished(self, sr: SecureRound) -> None:
        """The round's sum is out: keep the adverts for the next round that rode on its
        unmask responses."""
        self.pending = {k: a for k, a in sr.server.next_adverts.items() if k not in sr.dropped}
        self.current = None
