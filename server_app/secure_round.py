"""One secure round on the server: the phases of :data:`~server_app.phases.SECURE` over a
:class:`~fedforest_secure.secagg.SecAggServer`.

Each phase is one row of :data:`_PHASES`: the secure-aggregation stage that collects it, which
clients it expects and which have answered, how it closes (the server's message for the next
phase), what a client is asked to do in it, and how its stored messages are fed back after a
restart. :meth:`SecureRound.advance` moves only along the transition table and checks that the
secure-aggregation server reached the stage of the next phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel

from fedforest_secure.errors import InvalidMessage
from fedforest_secure.secagg import (
    KeyAdvert,
    MaskedUpload,
    RoundSetup,
    SecAggServer,
    ServerStage,
    ShareBundle,
    ShareDelivery,
    SurvivorSet,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
    parse,
)

from .phases import SECURE, Phase, PhaseError

__all__ = ["ACCUSE", "REFUSE", "ClientMessage", "SecureRound", "StoredRound", "parse_message",
           "sender_of"]

#: the stage under which a client's refusal of a round is stored with it (the body: its code)
REFUSE = "refuse"
#: the stage under which a refusal's accusation is stored with its round (the body: the
#: accused client's index), beside the refusal's code (stage :data:`REFUSE`)
ACCUSE = "accuse"

#: a message a client POSTs as JSON in a secure round
ClientMessage = KeyAdvert | ShareBundle | SurvivorSignature | UnmaskResponse


def parse_message(kind: str, body: bytes) -> tuple[Phase, ClientMessage]:
    """The phase that accepts ``kind`` (``advert`` / ``shares`` / ``signature`` / ``unmask``)
    and the parsed message; :class:`InvalidMessage` if the body is not one."""
    if kind == "advert":
        return Phase.ADVERTISE, parse(KeyAdvert, body)
    if kind == "shares":
        return Phase.SHARE, parse(ShareBundle, body)
    if kind == "signature":
        return Phase.SIGN, parse(SurvivorSignature, body)
    if kind == "unmask":
        return Phase.UNMASK, parse(UnmaskResponse, body)
    raise InvalidMessage(f"unknown secure-aggregation message {kind!r}")


def sender_of(msg: ClientMessage) -> int:
    """The client index a message names as its sender."""
    return msg.client_id if isinstance(msg, KeyAdvert) else msg.sender


@dataclass(frozen=True)
class StoredRound:
    """What the database holds of an open secure round, as the server received it.

    ``adverts``, ``shares``, ``signatures`` and ``unmask`` map a client to the JSON of its
    accepted message;
    ``uploads`` maps a client to a callable giving ``(MaskedUpload JSON, masked vector)``, so
    the vectors are loaded one at a time (memory O(vector)).
    """

    phase: Phase
    adverts: Mapping[int, str]
    shares: Mapping[int, str]
    uploads: Mapping[int, Callable[[], tuple[str, np.ndarray]]]
    unmask: Mapping[int, str]
    signatures: Mapping[int, str] = field(default_factory=dict)
    dropped: Iterable[int] = ()
    refused: Mapping[int, str] = field(default_factory=dict)
    #: refusing client -> the peer it accused of a message that did not authenticate
    accused: Mapping[int, int] = field(default_factory=dict)


@dataclass
class SecureRound:
    """One round's secure-aggregation state on the server, and who still owes what."""

    round_id: int
    server: SecAggServer
    participants: frozenset[int]
    setup: RoundSetup | None = None
    deliveries: dict[int, ShareDelivery] = field(default_factory=dict)
    survivor_set: SurvivorSet | None = None
    request: UnmaskRequest | None = None
    dropped: set[int] = field(default_factory=set)
    refused: dict[int, str] = field(default_factory=dict)
    #: refusing client -> the peer it accused of a message that did not authenticate
    accused: dict[int, int] = field(default_factory=dict)
    #: the JSON of the messages every client of a phase gets (setup, survivor set, unmask
    #: request), made once: serialising an O(K) message for each of K clients costs O(K^2).
    #: On the SecAgg+ sparse graph the setup and unmask request are per client (O(k) adverts
    #: and signatures each) and the survivor set is the one shared message
    _wire: dict[str, str] = field(default_factory=dict, repr=False)
    #: the clients the open phase expects, made once per phase
    _expected: tuple[ServerStage, frozenset[int]] | None = field(default=None, repr=False)
    #: seconds each closed phase stayed open, in order (for the round's log line), and when
    #: the open phase opened (``time.perf_counter``: the round's set-up, for its first phase)
    phase_seconds: dict[str, float] = field(default_factory=dict, repr=False)
    phase_opened: float = field(default_factory=time.perf_counter, repr=False)

    def phase_closed(self, phase: Phase) -> None:
        """Note that ``phase`` closes now: :attr:`phase_seconds` gets how long it was open."""
        now = time.perf_counter()
        self.phase_seconds[phase.value] = now - self.phase_opened
        self.phase_opened = now

    def timeline(self) -> str:
        """The closed phases and their seconds, ``advertise:0.002,share:0.420,...`` (one
        token of a log line)."""
        return ",".join(f"{name}:{s:.3f}" for name, s in self.phase_seconds.items())

    def wire(self, key: str, msg: BaseModel) -> str:
        """``msg`` as JSON, made once per round and ``key``."""
        text = self._wire.get(key)
        if text is None:
            text = self._wire[key] = msg.model_dump_json()
        return text

    @property
    def phase(self) -> Phase:
        """The phase collecting messages; :class:`PhaseError` once the round finished or
        aborted."""
        phase = _BY_STAGE.get(self.server.stage)
        if phase is None:
            raise PhaseError(f"secure round {self.round_id} is {self.server.stage.value}")
        return phase

    def _ops(self) -> _PhaseOps | None:
        phase = _BY_STAGE.get(self.server.stage)
        return None if phase is None else _PHASES[phase]

    def expected(self) -> frozenset[int]:
        """The clients the open phase waits for (none once the round finished or aborted)."""
        ops = self._ops()
        if ops is None:
            return frozenset()
        if self._expected is None or self._expected[0] is not ops.stage:
            self._expected = (ops.stage, ops.expected(self))  # fixed while the phase is open
        return self._expected[1]

    def owes(self, idx: int) -> bool:
        """Whether the open phase still waits for client ``idx`` (O(1))."""
        return (idx not in self.dropped and idx in self.expected()
                and not self.server.has_answered(idx))

    def complete(self) -> bool:
        """Whether every client the open phase expects answered or was dropped (stops at the
        first that did not)."""
        return not any(self.owes(idx) for idx in self.expected())

    def responded(self) -> frozenset[int]:
        ops = self._ops()
        return ops.responded(self) if ops is not None else frozenset()

    def missing(self) -> frozenset[int]:
        return self.expected() - self.responded() - frozenset(self.dropped)

    def advance(self) -> Phase:
        """Close the current phase with whoever answered and return the next one (may raise
        :class:`~fedforest_secure.errors.AbortedRound`). The last phase does not advance: the
        round closes with :meth:`finish`."""
        phase = self.phase
        nxt = SECURE.after(phase)
        close = _PHASES[phase].close
        if nxt is None or close is None:
            raise PhaseError(f"phase {phase.value} closes the round: finish it")
        close(self)
        SECURE.check_move(phase, self.phase)
        return nxt

    def finish(self) -> np.ndarray:
        """Close the last phase: remove the masks and return the ring sum of the survivors."""
        SECURE.check_move(self.phase, None)
        return self.server.finish()

    def receive(self, msg: ClientMessage) -> None:
        """Hand a client's message to the secure-aggregation server (its checks apply)."""
        if isinstance(msg, KeyAdvert):
            self.server.receive_advert(msg)
        elif isinstance(msg, ShareBundle):
            self.server.receive_shares(msg)
        elif isinstance(msg, SurvivorSignature):
            self.server.receive_signature(msg)
        else:
            self.server.receive_unmask(msg)

    def action_for(self, idx: int) -> tuple[str, str | None]:
        """``(action, message JSON)`` for client ``idx``: what it must send now, or ``wait``."""
        if not self.owes(idx):
            return "wait", None
        return _PHASES[self.phase].action(self, idx)

    def replay(self, stored: StoredRound) -> None:
        """Feed the stored messages phase by phase, closing each phase the stored round had
        closed (:class:`PhaseError` if they do not lead back to its phase)."""
        self.dropped = set(stored.dropped)
        self.refused = dict(stored.refused)
        self.accused = dict(stored.accused)
        while True:
            _PHASES[self.phase].replay(self, stored)
            if self.phase is stored.phase:
                return
            self.advance()


@dataclass(frozen=True)
class _PhaseOps:
    stage: ServerStage
    expected: Callable[[SecureRound], frozenset[int]]
    responded: Callable[[SecureRound], frozenset[int]]
    #: closes the phase (None: the last phase, closed by finish)
    close: Callable[[SecureRound], None] | None
    action: Callable[[SecureRound, int], tuple[str, str | None]]
    replay: Callable[[SecureRound, StoredRound], None]


def _close_adverts(sr: SecureRound) -> None:
    sr.setup = sr.server.setup()


def _close_shares(sr: SecureRound) -> None:
    sr.deliveries = sr.server.deliver_shares()


def _close_uploads(sr: SecureRound) -> None:
    sr.survivor_set = sr.server.request_signatures()


def _close_signatures(sr: SecureRound) -> None:
    sr.request = sr.server.request_unmask()


def _share_action(sr: SecureRound, idx: int) -> tuple[str, str | None]:
    if sr.setup is None:
        return "wait", None
    if sr.server.sparse:  # each client gets its group's adverts only (O(k), made per client)
        return "share", sr.server.setup_for(idx).model_dump_json()
    return "share", sr.wire("setup", sr.setup)


def _upload_action(sr: SecureRound, idx: int) -> tuple[str, str | None]:
    delivery = sr.deliveries.get(idx)
    return ("upload", delivery.model_dump_json()) if delivery is not None else ("wait", None)


def _sign_action(sr: SecureRound, _idx: int) -> tuple[str, str | None]:
    return (("sign", sr.wire("sign", sr.survivor_set)) if sr.survivor_set is not None
            else ("wait", None))


def _unmask_action(sr: SecureRound, idx: int) -> tuple[str, str | None]:
    if sr.request is None:
        return "wait", None
    if sr.server.sparse:  # each client gets its group's signatures only
        return "unmask", sr.server.unmask_request_for(idx).model_dump_json()
    return "unmask", sr.wire("unmask", sr.request)


def _replay_adverts(sr: SecureRound, stored: StoredRound) -> None:
    for _idx, body in sorted(stored.adverts.items()):
        sr.server.receive_advert(parse(KeyAdvert, body))


def _replay_shares(sr: SecureRound, stored: StoredRound) -> None:
    for _idx, body in sorted(stored.shares.items()):
        sr.server.receive_shares(parse(ShareBundle, body))


def _replay_uploads(sr: SecureRound, stored: StoredRound) -> None:
    for _idx, load in sorted(stored.uploads.items()):
        header, vector = load()
        sr.server.receive_upload(parse(MaskedUpload, header), vector)


def _replay_signatures(sr: SecureRound, stored: StoredRound) -> None:
    for _idx, body in sorted(stored.signatures.items()):
        sr.server.receive_signature(parse(SurvivorSignature, body))


def _replay_unmask(sr: SecureRound, stored: StoredRound) -> None:
    for _idx, body in sorted(stored.unmask.items()):
        sr.server.receive_unmask(parse(UnmaskResponse, body))


_PHASES: dict[Phase, _PhaseOps] = {
    Phase.ADVERTISE: _PhaseOps(
        ServerStage.COLLECT_ADVERTS,
        expected=lambda sr: sr.participants,
        responded=lambda sr: sr.server.advertised,
        close=_close_adverts,
        action=lambda _sr, _idx: ("advert", None),
        replay=_replay_adverts),
    Phase.SHARE: _PhaseOps(
        ServerStage.COLLECT_SHARES,
        expected=lambda sr: sr.server.advertised,
        responded=lambda sr: sr.server.shared,
        close=_close_shares,
        action=_share_action,
        replay=_replay_shares),
    Phase.UPLOAD: _PhaseOps(
        ServerStage.COLLECT_UPLOADS,
        expected=lambda sr: sr.server.shared,
        responded=lambda sr: sr.server.uploaded,
        close=_close_uploads,
        action=_upload_action,
        replay=_replay_uploads),
    Phase.SIGN: _PhaseOps(
        ServerStage.COLLECT_SIGNATURES,
        expected=lambda sr: (frozenset(sr.survivor_set.survivors)
                             if sr.survivor_set is not None else frozenset()),
        responded=lambda sr: sr.server.signed,
        close=_close_signatures,
        action=_sign_action,
        replay=_replay_signatures),
    Phase.UNMASK: _PhaseOps(
        ServerStage.COLLECT_UNMASK,
        expected=lambda sr: (frozenset(sr.request.signatures) if sr.request is not None
                             else frozenset()),
        responded=lambda sr: sr.server.answered,
        close=None,
        action=_unmask_action,
        replay=_replay_unmask),
}
_BY_STAGE = {ops.stage: phase for phase, ops in _PHASES.items()}

if set(_PHASES) != set(SECURE.transitions):
    raise PhaseError("every phase of the secure round plan needs its operations")
