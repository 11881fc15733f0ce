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

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from fedforest_secure.errors import FedForestError
from fedforest_secure.protocol import Task, layout_size, question_key
from fedforest_secure.secagg import (
    KeyAdvert,
    MaskedUpload,
    RoundSetup,
    SecAggServer,
    ServerStage,
    ShareBundle,
    ShareDelivery,
    UnmaskRequest,
    UnmaskResponse,
    parse,
)

__all__ = ["PHASES", "SecAggBridge", "SecureRound", "StoredRound"]

PHASES = {
    ServerStage.COLLECT_ADVERTS: "advertise",
    ServerStage.COLLECT_SHARES: "share",
    ServerStage.COLLECT_UPLOADS: "upload",
    ServerStage.COLLECT_UNMASK: "unmask",
    ServerStage.DONE: "done",
    ServerStage.ABORTED: "aborted",
}


@dataclass
class SecureRound:
    """One round's secure-aggregation state on the server, and who still owes what."""

    round_id: int
    server: SecAggServer
    participants: frozenset[int]
    setup: RoundSetup | None = None
    deliveries: dict[int, ShareDelivery] = field(default_factory=dict)
    request: UnmaskRequest | None = None
    dropped: set[int] = field(default_factory=set)
    refused: dict[int, str] = field(default_factory=dict)

    @property
    def phase(self) -> str:
        return PHASES[self.server.stage]

    def expected(self) -> frozenset[int]:
        stage = self.server.stage
        if stage is ServerStage.COLLECT_ADVERTS:
            return self.participants
        if stage is ServerStage.COLLECT_SHARES:
            return self.server.advertised
        if stage is ServerStage.COLLECT_UPLOADS:
            return self.server.shared
        if stage is ServerStage.COLLECT_UNMASK and self.request is not None:
            return frozenset(self.request.survivors)
        return frozenset()

    def responded(self) -> frozenset[int]:
        stage = self.server.stage
        if stage is ServerStage.COLLECT_ADVERTS:
            return self.server.advertised
        if stage is ServerStage.COLLECT_SHARES:
            return self.server.shared
        if stage is ServerStage.COLLECT_UPLOADS:
            return self.server.uploaded
        if stage is ServerStage.COLLECT_UNMASK:
            return self.server.answered
        return frozenset()

    def missing(self) -> frozenset[int]:
        return self.expected() - self.responded() - frozenset(self.dropped)

    def advance(self) -> None:
        """Close the current phase with whoever answered (may raise AbortedRound)."""
        stage = self.server.stage
        if stage is ServerStage.COLLECT_ADVERTS:
            self.setup = self.server.setup()
        elif stage is ServerStage.COLLECT_SHARES:
            self.deliveries = self.server.deliver_shares()
        elif stage is ServerStage.COLLECT_UPLOADS:
            self.request = self.server.request_unmask()
        else:
            raise RuntimeError(f"cannot advance from stage {stage.value}")

    def action_for(self, idx: int) -> tuple[str, str | None]:
        """``(action, message JSON)`` for client ``idx``: what it must send now, or ``wait``."""
        if idx in self.dropped or idx not in self.missing():
            return "wait", None
        stage = self.server.stage
        if stage is ServerStage.COLLECT_ADVERTS:
            return "advert", None
        if stage is ServerStage.COLLECT_SHARES and self.setup is not None:
            return "share", self.setup.model_dump_json()
        if stage is ServerStage.COLLECT_UPLOADS and idx in self.deliveries:
            return "upload", self.deliveries[idx].model_dump_json()
        if stage is ServerStage.COLLECT_UNMASK and self.request is not None:
            return "unmask", self.request.model_dump_json()
        return "wait", None


@dataclass(frozen=True)
class StoredRound:
    """What the database holds of an open secure round, as the server received it.

    ``adverts``, ``shares`` and ``unmask`` map a client to the JSON of its accepted message;
    ``uploads`` maps a client to a callable giving ``(MaskedUpload JSON, masked vector)``, so
    the vectors are loaded one at a time (memory O(vector)).
    """

    phase: str
    adverts: Mapping[int, str]
    shares: Mapping[int, str]
    uploads: Mapping[int, Callable[[], tuple[str, np.ndarray]]]
    unmask: Mapping[int, str]
    dropped: Iterable[int] = ()
    refused: Mapping[int, str] = field(default_factory=dict)


_ORDER = ("advertise", "share", "upload", "unmask")


@dataclass
class SecAggBridge:
    """A job's secure-aggregation relay: identity directory, riding adverts, the open round."""

    job_id: str
    threshold: float | int
    neighbours: int | None = None
    directory: dict[int, bytes] = field(default_factory=dict)
    pending: dict[int, KeyAdvert] = field(default_factory=dict)
    current: SecureRound | None = None

    def start(self, task: Task, participants: list[int]) -> SecureRound:
        """Open the secure round of ``task``; feed it the adverts that rode on the last round."""
        server = SecAggServer(self.job_id, task.round_id, question_key(task), task.digest(),
                              layout_size(task.layout), self.threshold, dict(self.directory),
                              self.neighbours, streaming=True)
        sr = SecureRound(task.round_id, server, frozenset(participants))
        for idx in sorted(participants):
            advert = self.pending.get(idx)
            if advert is not None and advert.round_id == task.round_id:
                server.receive_advert(advert)
        self.pending = {}
        self.current = sr
        return sr

    def resume(self, task: Task, participants: list[int], stored: StoredRound) -> SecureRound:
        """Rebuild the open round of ``task`` from its stored messages (after a restart).

        Raises :class:`RuntimeError` if the stored messages do not lead back to the stored
        phase (the state machine's own checks run on every replayed message).
        """
        if stored.phase not in _ORDER:
            raise RuntimeError(f"round {task.round_id} is in phase {stored.phase!r}")
        self.pending = {}
        sr = self.start(task, participants)
        sr.dropped = set(stored.dropped)
        sr.refused = dict(stored.refused)
        target = _ORDER.index(stored.phase)
        server = sr.server
        try:
            for _idx, body in sorted(stored.adverts.items()):
                server.receive_advert(parse(KeyAdvert, body))
            if target > 0:
                sr.advance()
                for _idx, body in sorted(stored.shares.items()):
                    server.receive_shares(parse(ShareBundle, body))
            if target > 1:
                sr.advance()
                for _idx, load in sorted(stored.uploads.items()):
                    header, vector = load()
                    server.receive_upload(parse(MaskedUpload, header), vector)
            if target > 2:
                sr.advance()
                for _idx, body in sorted(stored.unmask.items()):
                    server.receive_unmask(parse(UnmaskResponse, body))
        except FedForestError as exc:
            self.current = None
            raise RuntimeError(f"the stored messages of secure round {task.round_id} do not "
                               f"replay ({type(exc).__name__}: {exc})") from exc
        if sr.phase != stored.phase:
            self.current = None
            raise RuntimeError(f"secure round {task.round_id} replays to phase {sr.phase}, "
                               f"not the stored {stored.phase}")
        return sr

    def finished(self, sr: SecureRound) -> None:
        """Keep the adverts for the next round that rode on this round's unmask responses."""
        self.pending = {k: a for k, a in sr.server.next_adverts.items() if k not in sr.dropped}
