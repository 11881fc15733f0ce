"""The server side of one secure-aggregation round: :class:`SecAggServer`.

The server relays messages and only ever learns the sum of the survivors' vectors. Its stages
advance by explicit calls; anything out of order is ``errors.ProtocolError``::

    COLLECT_ADVERTS --setup()--> COLLECT_SHARES --deliver_shares()--> COLLECT_UPLOADS
        --request_signatures()--> COLLECT_SIGNATURES --request_unmask()--> COLLECT_UNMASK
        --finish()--> DONE                                            (or ABORTED on any abort)

``t`` is the job's threshold: ``threshold`` resolved against the job's size (the directory), the
value every client computes from its own profile. In the consistency step each survivor signs the
survivor set U3; the unmask request carries those signatures, and a client reveals shares only
for the set it signed, carried by ``t`` valid signatures. With fewer than ``t`` clients left at
any stage the round aborts with
:class:`~fedforest_secure.errors.AbortedRound` and no partial sum. Every reconstructed masking
private key is checked against its advertised public key (and must be clamped, as it was made),
and every self-mask seed against its advertised commitment (Shamir shares carry no integrity).
Holding more than ``t`` shares of a secret, the server routes around corrupt ones
(:func:`._recover.recover`: other ``t``-subsets, bounded) and names their senders
(:attr:`SecAggServer.corrupt_shares`); the sum is then exact. When no subset tried matches, the
round aborts with :class:`KeyMismatch`, naming the senders that may have sent the corrupt shares.

Adverts for the next round that ride along on uploads or unmask responses are verified and kept in
:attr:`SecAggServer.next_adverts`, to be fed to the next round's server with ``receive_advert``.

With ``streaming=True`` every accepted masked vector is added into one running uint64 sum as it
arrives and is not kept: the server's memory is O(vector) instead of O(K x vector). The result is
the same (addition mod 2^64 commutes); only the senders' ids are remembered.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..errors import AbortedRound, InvalidMessage, ProtocolError
from ._primitives import _kdf, _prg, _shamir
from ._recover import MAX_TRIES, recover
from ._rounds import (
    check_job_id,
    consistency_payload,
    graph_seed,
    job_threshold,
    local_threshold,
    mask_info,
    neighbour_groups,
    self_mask_commitment,
)
from ._verify import survivor_signature_ok, verify_advert
from .messages import (
    KeyAdvert,
    MaskedUpload,
    RoundSetup,
    ShareBundle,
    ShareDelivery,
    SurvivorSet,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
)

__all__ = ["KeyMismatch", "SecAggServer", "ServerStage"]

_EMPTY = np.zeros(0, dtype=np.uint64)  # placeholder for a streamed upload (already summed)


#: reconstructions a round may spend searching for matching subsets, beyond the first of
#: each secret: a flood of corrupt shares costs at most this many O(t^2) interpolations
ROUND_TRIES = 4 * MAX_TRIES
_WHAT = {"self": "self-mask seed", "key": "masking private key"}


class KeyMismatch(AbortedRound):
    """A secret could not be reconstructed to match what its owner advertised (corrupt shares).

    ``senders`` are the clients whose shares may be corrupt: those found corrupt, and every
    sender of a share of the secret that could not be recovered.
    """

    def __init__(self, reason: str, senders: Iterable[int] = ()) -> None:
        super().__init__(reason)
        self.senders = frozenset(senders)


def _listed(ids: Iterable[object]) -> str:
    items = [str(i) for i in ids]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class ServerStage(enum.Enum):
    """What the server is waiting for."""

    COLLECT_ADVERTS = "collect-adverts"
    COLLECT_SHARES = "collect-shares"
    COLLECT_UPLOADS = "collect-uploads"
    COLLECT_SIGNATURES = "collect-signatures"
    COLLECT_UNMASK = "collect-unmask"
    DONE = "done"
    ABORTED = "aborted"



def _check_usable_keys(advert: KeyAdvert) -> None:
    """Refuse an advert whose encryption or masking key no key agreement accepts (a low-order
    point): every peer's agreement with it would fail, so kept out of the roster its site
    cannot make the round's honest clients refuse the round. The same check for an advert sent
    on its own and for one riding on a message for the next round."""
    for what, key in (("encryption", advert.enc_key), ("masking", advert.mask_key)):
        if not _kdf.usable_public(key):
            raise InvalidMessage(f"client {advert.client_id} advertised a {what} key no key "
                                 "agreement accepts (a low-order point)")


@dataclass
class SecAggServer:
    """Server state machine for round ``round_id`` of ``job_id``.

    ``threshold`` is a fraction of the job's clients (``len(directory)``, rounded up) or an
    absolute count; ``neighbours=None`` is the complete graph, an int ``k`` the SecAgg+ sparse
    graph.
    """

    job_id: str
    round_id: int
    question: str
    task_digest: bytes
    vector_length: int
    threshold: float | int
    directory: Mapping[int, bytes]
    neighbours: int | None = None
    streaming: bool = False
    stage: ServerStage = ServerStage.COLLECT_ADVERTS
    next_adverts: dict[int, KeyAdvert] = field(default_factory=dict)
    _adverts: dict[int, KeyAdvert] = field(default_factory=dict, repr=False)
    _t: int = 0
    _groups: dict[int, frozenset[int]] = field(default_factory=dict, repr=False)  # in U1
    _job_groups: dict[int, frozenset[int]] = field(default_factory=dict, repr=False)
    _bundles: dict[int, ShareBundle] = field(default_factory=dict, repr=False)
    _uploads: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    _running: np.ndarray | None = field(default=None, repr=False)
    _dropped: frozenset[int] = frozenset()
    _signatures: dict[int, bytes] = field(default_factory=dict, repr=False)
    _responses: dict[int, UnmaskResponse] = field(default_factory=dict, repr=False)
    _consistency: bytes | None = field(default=None, repr=False)
    _roster: tuple[int, ...] = ()
    _sparse: bool = False
    _request: UnmaskRequest | None = field(default=None, repr=False)
    _corrupt: list[tuple[int, int, str]] = field(default_factory=list, repr=False)
    _disputed: list[tuple[int, str, frozenset[int]]] = field(default_factory=list, repr=False)
    _search_left: int = ROUND_TRIES

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        if len(self.task_digest) != 32:
            raise ValueError("task_digest must be 32 bytes")
        if self.vector_length < 0:
            raise ValueError("vector_length must be non-negative")
        self._t = job_threshold(self.threshold, len(self.directory))

    @property
    def t(self) -> int:
        """The job's threshold: fewest clients that may unmask, whatever the roster."""
        return self._t

    def _stage(self, expected: ServerStage, what: str) -> None:
        if self.stage is not expected:
            raise ProtocolError(f"{what} in stage {self.stage.value}, expected {expected.value}")

    def _check_msg(self, msg: object, kind: type, sender: int, senders: object) -> None:
        if not isinstance(msg, kind):
            raise InvalidMessage(f"expected a {kind.__name__}")
        if msg.job_id != self.job_id or msg.round_id != self.round_id:  # type: ignore[attr-defined]
            raise ProtocolError(f"{kind.__name__} for another job or round")
        if sender not in senders:  # type: ignore[operator]
            raise ProtocolError(f"{kind.__name__} from client {sender}, not expected now")

    def _abort(self, reason: str) -> AbortedRound:
        self._discard()
        return AbortedRound(reason)

    def _discard(self) -> None:
        self.stage = ServerStage.ABORTED
        self._uploads.clear()
        self._running = None

    @property
    def uploaded(self) -> frozenset[int]:
        """Clients whose masked upload was accepted this round (U3 once closed)."""
        return frozenset(self._uploads)

    @property
    def shared(self) -> frozenset[int]:
        """Clients whose share bundle was accepted this round (U2 once closed)."""
        return frozenset(self._bundles)

    @property
    def advertised(self) -> frozenset[int]:
        """Clients whose key advertisement was accepted this round (U1 once closed)."""
        return frozenset(self._adverts)

    @property
    def signed(self) -> frozenset[int]:
        """Survivors whose signature on the survivor set was accepted (U4 once closed)."""
        return frozenset(self._signatures)

    @property
    def answered(self) -> frozenset[int]:
        """Survivors whose unmask response was accepted."""
        return frozenset(self._responses)

    def has_answered(self, client: int) -> bool:
        """Whether ``client``'s message of the current stage was accepted (O(1))."""
        tables: dict[ServerStage, Mapping[int, object]] = {
            ServerStage.COLLECT_ADVERTS: self._adverts,
            ServerStage.COLLECT_SHARES: self._bundles,
            ServerStage.COLLECT_UPLOADS: self._uploads,
            ServerStage.COLLECT_SIGNATURES: self._signatures,
            ServerStage.COLLECT_UNMASK: self._responses,
        }
        table = tables.get(self.stage)
        return table is not None and client in table

    # -- adverts ---------------------------------------------------------------------------------
    def receive_advert(self, advert: KeyAdvert) -> None:
        """Accept one client's signed round keys."""
        self._stage(ServerStage.COLLECT_ADVERTS, "key advertisement")
        verify_advert(advert, self.directory, self.job_id, self.round_id)
        _check_usable_keys(advert)
        if advert.client_id in self._adverts:
            raise ProtocolError(f"client {advert.client_id} already advertised for this round")
        self._adverts[advert.client_id] = advert

    def setup(self) -> RoundSetup:
        """Close the roster U1 and return the message every client of the round receives."""
        self._stage(ServerStage.COLLECT_ADVERTS, "setup")
        n, t = len(self._adverts), self._t
        if n < t:
            raise self._abort(f"only {n} clients advertised keys, t={t}")
        ids = sorted(self._adverts)
        members = sorted(self.directory)  # the graph is the job's, as every client derives it
        seed = graph_seed(self.job_id, self.round_id, self.task_digest, members)
        self._job_groups = neighbour_groups(members, self.neighbours, seed)
        roster = frozenset(ids)
        self._groups = {u: self._job_groups[u] & roster for u in ids}
        self._roster = tuple(ids)
        self._sparse = any(len(g) < len(members) for g in self._job_groups.values())
        self.stage = ServerStage.COLLECT_SHARES
        return self._broadcast_setup()

    def _broadcast_setup(self) -> RoundSetup:
        return RoundSetup(job_id=self.job_id, round_id=self.round_id, question=self.question,
                          task_digest=self.task_digest, threshold=self._t,
                          neighbours=self.neighbours, vector_length=self.vector_length,
                          adverts=tuple(self._adverts[u] for u in self._roster))

    @property
    def sparse(self) -> bool:
        """Whether the closed roster's graph is the SecAgg+ sparse graph (groups smaller than
        the roster), so each client gets its own setup and unmask request."""
        return self._sparse

    def setup_for(self, client: int) -> RoundSetup:
        """The round setup ``client`` receives: :meth:`setup`'s message on the complete graph;
        on the sparse graph the roster's ids and the adverts of ``client``'s group only (what it
        verifies and uses), so a client's message is O(K) ids and O(k) adverts."""
        if self.stage is ServerStage.COLLECT_ADVERTS or client not in self._groups:
            raise ProtocolError(f"no round setup for client {client} (roster not closed, or "
                                "not in it)")
        if not self._sparse:
            return self._broadcast_setup()
        group = self._groups[client]
        return RoundSetup(job_id=self.job_id, round_id=self.round_id, question=self.question,
                          task_digest=self.task_digest, threshold=self._t,
                          neighbours=self.neighbours, vector_length=self.vector_length,
                          adverts=tuple(self._adverts[u] for u in sorted(group)),
                          roster=self._roster)

    # -- shares ----------------------------------------------------------------------------------
    def receive_shares(self, bundle: ShareBundle) -> None:
        """Accept one client's encrypted shares (one ciphertext for every peer of its group)."""
        self._stage(ServerStage.COLLECT_SHARES, "share bundle")
        self._check_msg(bundle, ShareBundle, getattr(bundle, "sender", -1), self._adverts)
        if bundle.sender in self._bundles:
            raise ProtocolError(f"client {bundle.sender} already sent its shares")
        if set(bundle.ciphertexts) != self._groups[bundle.sender] - {bundle.sender}:
            raise InvalidMessage("share bundle does not address exactly the sender's peers")
        self._bundles[bundle.sender] = bundle

    def deliver_shares(self) -> dict[int, ShareDelivery]:
        """Close U2 (clients that shared) and route each ciphertext to its recipient."""
        self._stage(ServerStage.COLLECT_SHARES, "share delivery")
        if len(self._bundles) < self._t:
            raise self._abort(f"only {len(self._bundles)} clients shared keys, t={self._t}")
        # one pass over the ciphertexts (a sparse graph's deliveries cost O(K k), not O(K^2))
        inbox: dict[int, dict[int, bytes]] = {v: {} for v in sorted(self._bundles)}
        for u, b in sorted(self._bundles.items()):
            for v, ct in b.ciphertexts.items():
                if v in inbox:
                    inbox[v][u] = ct
        out = {v: ShareDelivery(job_id=self.job_id, round_id=self.round_id, recipient=v,
                                ciphertexts=cts) for v, cts in inbox.items()}
        self.stage = ServerStage.COLLECT_UPLOADS
        return out

    # -- uploads ---------------------------------------------------------------------------------
    def receive_upload(self, header: MaskedUpload, vector: np.ndarray) -> None:
        """Accept one masked vector (uint64, ``vector_length`` entries) from a client of U2."""
        self._stage(ServerStage.COLLECT_UPLOADS, "masked upload")
        self._check_msg(header, MaskedUpload, getattr(header, "sender", -1), self._bundles)
        if header.sender in self._uploads:
            raise ProtocolError(f"client {header.sender} already uploaded (replay?)")
        arr = np.asarray(vector)
        if (arr.dtype != np.uint64 or arr.shape != (self.vector_length,)
                or header.length != self.vector_length):
            raise InvalidMessage("masked vector has the wrong type or length")
        self._take_next(header.next_advert, header.sender)
        if self.streaming:
            if self._running is None:
                self._running = np.zeros(self.vector_length, dtype=np.uint64)
            np.add(self._running, arr, out=self._running)  # wraps mod 2^64 by design
            self._uploads[header.sender] = _EMPTY  # remember the sender, not the vector
        else:
            self._uploads[header.sender] = np.array(arr, dtype=np.uint64, copy=True)

    def _take_next(self, advert: KeyAdvert | None, sender: int) -> None:
        """The next round's advert riding on ``sender``'s message: its own only."""
        if advert is not None:
            if advert.client_id != sender:
                raise InvalidMessage(f"client {sender}'s message carries the next advert of "
                                     f"client {advert.client_id}")
            verify_advert(advert, self.directory, self.job_id, self.round_id + 1)
            _check_usable_keys(advert)
            self.next_adverts[advert.client_id] = advert

    def request_signatures(self) -> SurvivorSet:
        """Close U3 (clients that uploaded) and ask the survivors to sign it; abort below t."""
        self._stage(ServerStage.COLLECT_UPLOADS, "survivor set")
        if len(self._uploads) < self._t:
            raise self._abort(f"only {len(self._uploads)} masked uploads, t={self._t}")
        self._dropped = frozenset(self._bundles) - frozenset(self._uploads)
        self.stage = ServerStage.COLLECT_SIGNATURES
        return self.survivor_set()

    def survivor_set(self) -> SurvivorSet:
        """The survivor set U3 the survivors are asked to sign."""
        return SurvivorSet(job_id=self.job_id, round_id=self.round_id,
                           survivors=tuple(sorted(self._uploads)))

    def receive_signature(self, signature: SurvivorSignature) -> None:
        """Accept one survivor's signature on U3."""
        self._stage(ServerStage.COLLECT_SIGNATURES, "survivor-set signature")
        self._check_msg(signature, SurvivorSignature, getattr(signature, "sender", -1),
                        self._uploads)
        u = signature.sender
        if u in self._signatures:
            raise ProtocolError(f"client {u} already signed the survivor set")
        if self._consistency is None:  # U3 is closed: its payload is made once per round
            self._consistency = consistency_payload(self.job_id, self.round_id,
                                                    self.task_digest, self._uploads)
        payload = self._consistency
        if not survivor_signature_ok(self.directory, u, signature.signature, payload):
            raise InvalidMessage("the survivor-set signature does not verify")
        self._signatures[u] = signature.signature

    def request_unmask(self) -> UnmaskRequest:
        """Close U4 (survivors that signed) and ask them to unmask; abort below ``t``."""
        self._stage(ServerStage.COLLECT_SIGNATURES, "unmask request")
        if len(self._signatures) < self._t:
            raise self._abort(f"only {len(self._signatures)} survivors signed the survivor set, "
                              f"t={self._t}")
        self.stage = ServerStage.COLLECT_UNMASK
        self._request = UnmaskRequest(job_id=self.job_id, round_id=self.round_id,
                                      question=self.question,
                                      survivors=tuple(sorted(self._uploads)),
                                      dropped=tuple(sorted(self._dropped)),
                                      signatures=dict(sorted(self._signatures.items())))
        return self._request

    def unmask_request_for(self, client: int) -> UnmaskRequest:
        """The unmask request ``client`` receives: :meth:`request_unmask`'s message; on the
        sparse graph with only the signatures of the groups of ``client``'s neighbours (the
        only ones it verifies and counts: O(k) of them)."""
        self._stage(ServerStage.COLLECT_UNMASK, "unmask request")
        group = self._groups.get(client)
        if group is None:
            raise ProtocolError(f"client {client} is not in the round")
        if self._request is None:
            raise ProtocolError("no unmask request yet")
        if not self._sparse:
            return self._request
        needed = frozenset().union(*(self._job_groups[p] for p in self._job_groups[client]))
        return self._request.model_copy(update={"signatures": {
            u: self._signatures[u] for u in sorted(needed) if u in self._signatures}})

    # -- unmask ----------------------------------------------------------------------------------
    def receive_unmask(self, response: UnmaskResponse) -> None:
        """Accept one survivor's revealed shares: exactly the requested ones, each an element
        of the Shamir field (:class:`InvalidMessage` otherwise, and nothing is kept)."""
        self._stage(ServerStage.COLLECT_UNMASK, "unmask response")
        self._check_msg(response, UnmaskResponse, getattr(response, "sender", -1),
                        self._signatures)
        u = response.sender
        if u in self._responses:
            raise ProtocolError(f"client {u} already answered the unmask request")
        group = self._groups[u]
        if (set(response.self_mask_shares) != group & set(self._uploads)
                or set(response.key_shares) != group & self._dropped):
            raise InvalidMessage("unmask response does not hold exactly the requested shares")
        for kind, table in (("self", response.self_mask_shares), ("key", response.key_shares)):
            for owner, share in table.items():  # finish() reads each one as a field element
                try:
                    _shamir.from_bytes(share)
                except ValueError:
                    raise InvalidMessage(f"the unmask response holds a share of client "
                                         f"{owner}'s {_WHAT[kind]} outside the Shamir field "
                                         "(not one that was dealt)") from None
        self._take_next(response.next_advert, u)
        self._responses[u] = response

    @property
    def corrupt_shares(self) -> tuple[tuple[int, int, str], ...]:
        """``(sender, owner, what)`` for every share found off its secret's polynomial in
        :meth:`finish` (``what``: ``"self-mask seed"`` or ``"masking private key"``)."""
        return tuple(sorted(self._corrupt))

    def corrupt_report(self, names: Mapping[int, str] | None = None) -> str:
        """The senders of corrupt shares in words (``""`` if none), clients named by ``names``
        when given: ``client 0 sent a corrupt share of client 1's self-mask seed``."""
        def name(i: int) -> str:
            return names[i] if names is not None else f"client {i}"

        said = [f"{name(w)} sent a corrupt share of {name(o)}'s {what}"
                for w, o, what in self.corrupt_shares]
        said += [f"the shares of {name(o)}'s {what} from {_listed(name(w) for w in sorted(ws))} "
                 "are off the polynomial of the ones that match its advertisement (too many to "
                 "tell which are corrupt)" for o, what, ws in self._disputed]
        return "; ".join(said)

    def _check(self, owner: int, kind: str) -> Callable[[int], bool]:
        """Whether a reconstructed secret (an integer) is what ``owner`` advertised."""
        advert = self._adverts[owner]

        def seed_ok(secret: int) -> bool:
            if secret >= 1 << 256:
                return False
            seed = secret.to_bytes(32, "big")
            commit = self_mask_commitment(self.job_id, self.round_id, owner, seed)
            return hmac.compare_digest(commit, advert.self_mask_commit)

        def key_ok(secret: int) -> bool:
            if secret >= 1 << 256:
                return False
            sk = secret.to_bytes(32, "big")
            if not _kdf.is_clamped(sk):  # a key differing in the clamped bits is not the one made
                return False
            try:
                return hmac.compare_digest(_kdf.public_key(sk), advert.mask_key)
            except ValueError:
                return False

        return seed_ok if kind == "self" else key_ok

    def _reconstruct(self, owner: int, kind: str) -> bytes:
        """``owner``'s secret of ``kind`` from the revealed shares, checked against its advert
        (:func:`._recover.recover`), recording the senders of corrupt shares."""
        group = self._groups[owner]
        t_local = local_threshold(self._t, len(self.directory), len(self._job_groups[owner]))
        shares = {}
        for w in group:  # only the owner's group holds its shares: O(k) with a sparse graph
            resp = self._responses.get(w)
            if resp is None:
                continue
            table = resp.self_mask_shares if kind == "self" else resp.key_shares
            if owner in table:
                shares[w + 1] = _shamir.from_bytes(table[owner])  # x = client id + 1
        if len(shares) < t_local:
            raise self._abort(f"only {len(shares)} shares of client {owner}, need {t_local}")
        what = _WHAT[kind]
        suspects = {w + 1 for w, _, _ in self._corrupt}
        found = recover(shares, t_local, self._check(owner, kind), suspects=suspects,
                        max_tries=1 + self._search_left)
        self._search_left -= found.tries - 1
        self._corrupt.extend((x - 1, owner, what) for x in sorted(found.corrupt))
        if found.disputed:
            self._disputed.append((owner, what, frozenset(x - 1 for x in found.disputed)))
        if found.secret is None:
            raise self._mismatch(owner, what, sorted(x - 1 for x in shares), t_local,
                                 found.exhausted)
        return found.secret.to_bytes(32, "big")

    def _mismatch(self, owner: int, what: str, senders: list[int], t: int,
                  exhausted: bool) -> KeyMismatch:
        self._discard()
        n = len(senders)
        where = f"its {n} shares (from clients {_listed(senders)})"
        if n == t:
            why = (f"{where} do not reconstruct it and there is no spare share to try: one of "
                   "them or more is corrupt")
        elif exhausted:
            why = (f"no {t} of {where} reconstruct it: more than {n - t} of them are corrupt")
        else:
            why = (f"none of the {t}-subsets of {where} tried reconstructs it (the search "
                   f"stops after {MAX_TRIES} tries per secret, {ROUND_TRIES} per round): "
                   "corrupt shares")
        found = self.corrupt_report()
        return KeyMismatch((f"{found}; " if found else "")
                           + f"the reconstructed {what} of client {owner} does not match its "
                           f"advertisement: {why} (or client {owner} dealt them wrong); no sum "
                           "is released", senders={*senders, *(w for w, _, _ in self._corrupt)})

    def finish(self) -> np.ndarray:
        """Remove every mask and return the uint64 sum of the survivors' vectors."""
        self._stage(ServerStage.COLLECT_UNMASK, "finish")
        if len(self._responses) < self._t:
            raise self._abort(f"only {len(self._responses)} unmask responses, t={self._t}")
        survivors = sorted(self._uploads)
        if self.streaming:
            total = (self._running.copy() if self._running is not None
                     else np.zeros(self.vector_length, dtype=np.uint64))
        else:
            total = np.zeros(self.vector_length, dtype=np.uint64)
            for u in survivors:
                np.add(total, self._uploads[u], out=total)
        plus: list[bytes] = []
        minus: list[bytes] = []
        for u in survivors:  # each secret is checked against its advert as it is reconstructed
            minus.append(self._reconstruct(u, "self"))
        for v in sorted(self._dropped):
            sk = self._reconstruct(v, "key")
            for u in sorted(self._groups[v] & set(survivors)):
                info = mask_info(self.job_id, self.round_id, u, v, self.task_digest)
                s_uv = _kdf.derive_seed(sk, self._adverts[u].mask_key, info)
                # u added +PRG(s_uv) if v > u and -PRG(s_uv) if v < u: undo that.
                (minus if v > u else plus).append(s_uv)
        _prg.apply_masks(total, plus, minus)
        self.stage = ServerStage.DONE
        self._uploads.clear()
        self._running = None
        return total
