"""The client side of secure aggregation: one :class:`SecAggClient` per client and job.

The client knows its job on its own, never from a server message: the identity directory it
verified (client id -> Ed25519 key; exactly ``n_clients`` members), the threshold of its own
profile (``t = job_threshold(threshold, n_clients)``, a strict majority of the *job*, whatever a
round's roster), the SecAgg+ degree of its own profile (``neighbours``; ``None`` is the complete
graph) and the fewest survivors it helps unmask (``min_survivors``: at least 3, and the ``K_min``
its DP noise is calibrated for).

Per round ``r`` the client (Bonawitz et al. 2017, actively secure variant, with the SecAgg+ sparse
graph as an option):

1. ``advertise(r)``: draws a fresh X25519 masking key pair and a fresh 32-byte self-mask seed
   ``b_u`` and signs them (with its per-job encryption key) under its Ed25519 identity. The
   advert for ``r + 1`` may be produced while round ``r`` is still running and ride along on
   ``r``'s upload or unmask response (``next_advert``).
2. ``share_keys(setup)``: checks the roster has at least ``t`` members and that the announced
   threshold and graph are its own, derives its group (itself and its neighbours) from the public
   seed (hash of job, round, roster and task), verifies the adverts of its group against the
   directory (on the SecAgg+ sparse graph, only those: the other roster members' adverts are
   neither needed nor verified), Shamir-shares ``b_u`` and the masking private key among its
   group with threshold ``t_local`` (``t`` on the complete graph) and encrypts each pair of shares
   to its peer.
3. ``mask(delivery, x)``: decrypts the shares it received and uploads
   ``y = x + PRG(b_u) + sum_{v>u} PRG(s_uv) - sum_{v<u} PRG(s_uv)`` in Z_{2^64}, over the peers
   ``v`` that shared, and only if at least ``t - 1`` of its group's peers shared (fewer masks
   than that would let the survivors' self-mask shares strip them all). The round's secrets are
   then dropped from memory. A peer's share that does not open, or its advertised key that no
   agreement accepts, is :class:`~fedforest_secure.errors.InvalidMessage` naming that peer
   (``peer``): the client cannot mask, and its refusal accuses that peer.
4. ``sign_survivors(survivor_set)``: signs job, round, task digest and the survivor set, once per
   round (a second, different set is refused), if the set is inside its roster, holds the client,
   names no group member it did not mask with, and has at least ``max(t, 3, min_survivors)``
   members.
5. ``unmask(request)``: reveals self-mask shares of survivors and masking-key shares of dropped
   peers, under the privacy rules below (a breach is ``errors.RefusedRequest``):

   * only for the very set it signed, carried with valid signatures of at least ``t_local``
     distinct members of its group on that set (a strict majority of the group, and each client
     signs one set per round, so no two sets both gather them from one group's honest members).
     On the complete graph the group is the roster and ``t_local = t`` (``2t > n_clients``: no
     two honest clients reveal shares for different sets, while fewer than ``2t - n_clients``
     colluders sign both; threat_model.md §2.3). On the SecAgg+ sparse graph the
     check is local to the neighbourhood, as in Bell et al. (2020): a client verifies ``k + 1``
     signatures, not ``t`` of the job, and different neighbourhoods may be shown different sets
     (threat_model.md §2.2 says what that leaves to a malicious server);
   * only shares of its own group (the only ones it holds);
   * never both kinds of share for the same peer in one round (even across repeated requests);
   * never the same ``(job, question)`` twice with a different set of survivors.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from nacl.exceptions import CryptoError
from nacl.public import Box, PrivateKey, PublicKey
from nacl.signing import SigningKey

from ..errors import InvalidMessage, ProtocolError, RefusedRequest
from ._primitives import _kdf, _prg, _shamir
from ._rounds import (
    advert_payload,
    check_job_id,
    consistency_payload,
    graph_seed,
    job_threshold,
    local_groups,
    local_threshold,
    mask_info,
    self_mask_commitment,
    share_header,
)
from ._verify import survivor_signature_ok, unique_ids, verify_advert
from .encoding import RingCodec
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

__all__ = ["ClientStage", "SecAggClient"]

_SELF, _KEY = "self-mask", "masking-key"


class ClientStage(enum.Enum):
    """Where the client is in its current round."""

    IDLE = "idle"
    ADVERTISED = "advertised"
    SHARED = "shared"
    MASKED = "masked"
    SIGNED = "signed"
    DONE = "done"


@dataclass
class _RoundKeys:
    mask_private: bytes
    self_seed: bytes
    advert: KeyAdvert


@dataclass
class _Round:
    round_id: int
    question: str
    task_digest: bytes
    threshold: int
    vector_length: int
    roster: frozenset[int]  # the round's clients (U1), as ids
    adverts: dict[int, KeyAdvert]  # the verified adverts of the group
    group: frozenset[int]
    keys: _RoundKeys | None
    held: dict[int, tuple[int, int]] = field(default_factory=dict)  # sender -> (b, sk) shares
    revealed: dict[int, str] = field(default_factory=dict)
    signed: frozenset[int] | None = None  # the one survivor set this client signed
    signature: bytes = b""
    local_t: int = 0  # the threshold of each group (t on a complete graph)
    #: the job groups of this client and of each of its neighbours (None: the complete graph)
    owners: dict[int, frozenset[int]] | None = None
    masked_with: frozenset[int] = frozenset()  # itself and the peers its masks cover


@dataclass
class SecAggClient:
    """Client state machine for one job.

    ``directory`` maps the job's client ids to their Ed25519 verify keys (the membership as this
    client verified it, exactly ``n_clients`` entries); ``threshold`` (a fraction of the job's
    clients or a count) and ``neighbours`` come from the client's own profile;
    ``min_survivors`` is the fewest survivors it helps unmask (raised to 3 if lower).
    """

    client_id: int
    job_id: str
    identity: SigningKey
    directory: Mapping[int, bytes]
    n_clients: int = field(kw_only=True)
    threshold: float | int = field(kw_only=True)
    neighbours: int | None = field(default=None, kw_only=True)
    min_survivors: int = field(default=3, kw_only=True)
    stage: ClientStage = ClientStage.IDLE
    round_id: int = -1
    _t: int = field(default=0, init=False, repr=False)
    _enc_key: PrivateKey = field(default_factory=PrivateKey.generate, repr=False)
    _keys: dict[int, _RoundKeys] = field(default_factory=dict, repr=False)
    _round: _Round | None = field(default=None, repr=False)
    _answered: dict[str, frozenset[int]] = field(default_factory=dict, repr=False)
    _boxes: dict[bytes, Box] = field(default_factory=dict, repr=False)  # peer enc key -> Box
    _members: tuple[int, ...] = field(default=(), init=False, repr=False)  # the job's ids

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        if self.directory.get(self.client_id) != bytes(self.identity.verify_key):
            raise ValueError("the directory must hold this client's own verify key")
        self._t = job_threshold(self.threshold, self.n_clients)
        if len(self.directory) != self.n_clients:
            raise ValueError(f"the identity directory holds {len(self.directory)} clients, the "
                             f"job has {self.n_clients}")
        if len(set(self.directory.values())) != len(self.directory):
            # one site's signature would count for every entry holding its key: t signatures
            # of the consistency step from fewer than t sites
            raise ValueError("two entries of the identity directory hold the same identity key")
        if self.neighbours is not None and (isinstance(self.neighbours, bool)
                                            or not isinstance(self.neighbours, int)
                                            or self.neighbours < 2):
            raise ValueError("neighbours must be None (complete graph) or an int >= 2")
        if isinstance(self.min_survivors, bool) or not isinstance(self.min_survivors, int):
            raise TypeError("min_survivors must be an int")
        self.min_survivors = max(3, self.min_survivors)
        self._members = tuple(sorted(self.directory))

    @property
    def t(self) -> int:
        """The job's threshold as this client computes it from its own profile."""
        return self._t

    # -- 1. advertise ------------------------------------------------------------------------
    def advertise(self, round_id: int) -> KeyAdvert:
        """Fresh, signed round keys for ``round_id`` (may be the next round while one runs)."""
        return self._advertise_from_parts(round_id, _kdf.generate_private_key(),
                                          secrets.token_bytes(32))

    def _advertise_from_parts(self, round_id: int, mask_private: bytes,
                              self_seed: bytes) -> KeyAdvert:
        if isinstance(round_id, bool) or not isinstance(round_id, int) or round_id < 0:
            raise TypeError("round_id must be a non-negative int")
        if round_id <= self.round_id:
            raise ProtocolError(f"round {round_id} is not after the current round {self.round_id}")
        if round_id in self._keys:
            raise ProtocolError(f"keys for round {round_id} were already advertised")
        if len(mask_private) != 32 or len(self_seed) != 32:
            raise ValueError("masking key and self-mask seed are 32 bytes each")
        enc = bytes(self._enc_key.public_key)
        mask_pub = _kdf.public_key(mask_private)
        commit = self_mask_commitment(self.job_id, round_id, self.client_id, self_seed)
        sig = self.identity.sign(advert_payload(self.job_id, round_id, self.client_id, enc,
                                                mask_pub, commit)).signature
        advert = KeyAdvert(job_id=self.job_id, round_id=round_id, client_id=self.client_id,
                           enc_key=enc, mask_key=mask_pub, self_mask_commit=commit, signature=sig)
        self._keys = {r: k for r, k in self._keys.items() if r > self.round_id}
        self._keys[round_id] = _RoundKeys(mask_private, self_seed, advert)
        if self.stage in (ClientStage.IDLE, ClientStage.DONE):
            self.round_id, self.stage, self._round = round_id, ClientStage.ADVERTISED, None
        return advert

    def pending_advert(self, round_id: int) -> KeyAdvert | None:
        """The advert already made for ``round_id`` and not yet used, if any."""
        keys = self._keys.get(round_id)
        if keys is None or round_id < self.round_id:
            return None
        if round_id == self.round_id and self.stage is not ClientStage.ADVERTISED:
            return None
        return keys.advert

    # -- 2. share keys -----------------------------------------------------------------------
    def share_keys(self, setup: RoundSetup) -> ShareBundle:
        """Check the roster and return this client's encrypted Shamir shares for its group."""
        return self._share_keys_from_parts(setup, secrets.randbelow)

    def _share_keys_from_parts(self, setup: RoundSetup,
                               randbelow: Callable[[int], int]) -> ShareBundle:
        if not isinstance(setup, RoundSetup) or setup.job_id != self.job_id:
            raise InvalidMessage("not a round setup for this job")
        r = setup.round_id
        keys = self._keys.get(r)
        if keys is None or (r == self.round_id and self.stage is not ClientStage.ADVERTISED):
            raise ProtocolError(f"round setup for round {r} arrived in stage {self.stage.value} "
                                f"of round {self.round_id} (keys not advertised or already shared)")
        ids = unique_ids(setup.roster if setup.roster is not None
                         else (a.client_id for a in setup.adverts), "roster")
        n, t = len(ids), self._t
        if setup.threshold != t:
            raise RefusedRequest(f"the round announces threshold {setup.threshold}; this client's "
                                 f"profile gives t={t} of the job's {self.n_clients} clients",
                                 code="roster")
        if setup.neighbours != self.neighbours:
            raise RefusedRequest(f"the round announces a graph of {setup.neighbours} neighbours; "
                                 f"this client's profile says {self.neighbours}", code="roster")
        need = max(t, self.min_survivors)
        if n < need:
            raise RefusedRequest(f"refusing a roster of {n} clients: this client unmasks sums "
                                 f"over at least {need} (t={t} of the job's {self.n_clients})",
                                 code="roster")
        roster = frozenset(ids)
        if self.client_id not in roster:
            raise InvalidMessage("the roster does not carry this client's advertisement")
        if not roster <= self.directory.keys():
            raise InvalidMessage("the roster names clients outside the job")
        # the graph is the job's (its pinned membership), whatever roster the server shows
        seed = graph_seed(self.job_id, r, setup.task_digest, self._members)
        owners = local_groups(self._members, self.neighbours, seed, self.client_id)
        job_group = frozenset(self._members) if owners is None else owners[self.client_id]
        group = job_group & roster
        t_local = local_threshold(t, self.n_clients, len(job_group))
        if len(group) < t_local:
            raise RefusedRequest(f"only {len(group)} of this client's group are in the roster of "
                                 f"round {r}; its shares need {t_local}", code="roster")
        adverts = self._group_adverts(setup, r, roster, group)
        if adverts[self.client_id] != keys.advert:
            raise InvalidMessage("the roster does not carry this client's advertisement")
        xs = [u + 1 for u in sorted(group)]
        b = int.from_bytes(keys.self_seed, "big")
        sk = int.from_bytes(keys.mask_private, "big")
        b_sh = _shamir._split_from_parts(b, t_local, xs, [randbelow(_shamir.PRIME)
                                                          for _ in range(t_local - 1)])
        sk_sh = _shamir._split_from_parts(sk, t_local, xs, [randbelow(_shamir.PRIME)
                                                            for _ in range(t_local - 1)])
        cts: dict[int, bytes] = {}
        for v in sorted(group - {self.client_id}):
            try:
                box = self._box(adverts[v].enc_key)
            except CryptoError as exc:  # a low-order key, signed by v itself
                raise InvalidMessage(f"the encryption key client {v} advertised is not a "
                                     "usable X25519 key", peer=v) from exc
            plain = (share_header(self.job_id, r, self.client_id, v, setup.task_digest)
                     + _shamir.to_bytes(b_sh[v + 1]) + _shamir.to_bytes(sk_sh[v + 1]))
            cts[v] = bytes(box.encrypt(plain))
        me = self.client_id + 1
        self._round = _Round(r, setup.question, setup.task_digest, t, setup.vector_length,
                             roster, adverts, group, keys,
                             held={self.client_id: (b_sh[me], sk_sh[me])}, local_t=t_local,
                             owners=owners)
        self._keys = {q: k for q, k in self._keys.items() if q > r}
        self.round_id, self.stage = r, ClientStage.SHARED
        return ShareBundle(job_id=self.job_id, round_id=r, sender=self.client_id, ciphertexts=cts)

    def _group_adverts(self, setup: RoundSetup, round_id: int, roster: frozenset[int],
                       group: frozenset[int]) -> dict[int, KeyAdvert]:
        """The verified adverts of this client's group. Adverts of other roster members are
        neither verified nor used (the client never encrypts to them nor derives a mask with
        them); an advert of a client outside the roster, a repeated one or a missing neighbour
        is :class:`InvalidMessage`."""
        adverts: dict[int, KeyAdvert] = {}
        for advert in setup.adverts:
            v = advert.client_id
            if v not in roster:
                raise InvalidMessage(f"an advertisement of client {v}, outside the roster")
            if v not in group:
                continue
            if v in adverts:
                raise InvalidMessage("duplicate client in roster")
            adverts[v] = verify_advert(advert, self.directory, self.job_id, round_id)
        missing = group - set(adverts)
        if missing:
            raise InvalidMessage(f"the round setup lacks the advertisement of neighbour "
                                 f"{min(missing)}")
        return adverts

    # -- 3. masked upload --------------------------------------------------------------------
    def mask(self, delivery: ShareDelivery, vector: np.ndarray, *,
             next_advert: KeyAdvert | None = None, inplace: bool = False,
             codec: RingCodec | None = None) -> tuple[MaskedUpload, np.ndarray]:
        """Decrypt the delivered shares and return the upload header and the masked vector.

        With ``inplace=True`` the (contiguous, writable) ``vector`` itself is overwritten with
        its masked value and returned: no second buffer, for callers that drop the plain
        encoding anyway (the client runner does).

        With ``codec`` (a :class:`~fedforest_secure.secagg.RingCodec` of the round's length),
        ``vector`` holds the float statistics themselves: each block is range-checked, encoded
        and masked while it sits in cache (one pass; the same upload as
        ``mask(delivery, codec.encode(vector))``). A value out of range raises
        :class:`~fedforest_secure.errors.OverflowRisk` and burns the round's keys, so the
        same masks can never cover a second vector: the client drops out of the round.
        """
        rnd = self._expect(ClientStage.SHARED, delivery, ShareDelivery)
        if delivery.recipient != self.client_id:
            raise InvalidMessage("share delivery addressed to another client")
        x = np.asarray(vector)
        fill = None
        if codec is not None:
            if inplace:
                raise ValueError("inplace masking takes an encoded uint64 vector, not a codec")
            if codec.size != rnd.vector_length:
                raise ValueError(f"the codec encodes {codec.size} entries, the round "
                                 f"{rnd.vector_length}")
            fill = codec.block_encoder(x)
        elif x.dtype != np.uint64 or x.shape != (rnd.vector_length,):
            raise TypeError(f"the vector to mask must be a numpy uint64 array of "
                            f"{rnd.vector_length} entries")
        peers = set(delivery.ciphertexts)
        if not peers <= rnd.group - {self.client_id}:
            raise InvalidMessage("shares from clients outside this client's group")
        if len(peers) + 1 < rnd.local_t:
            # masks with fewer than t - 1 peers: the t shares of the self mask the server can
            # collect from the survivors would strip every mask of this vector
            raise RefusedRequest(f"shares of only {len(peers)} peers delivered in round "
                                 f"{rnd.round_id}; masking needs at least {rnd.local_t - 1}",
                                 code="too_few_peers")
        opened = {v: self._open_share(rnd, v, ct) for v, ct in delivery.ciphertexts.items()}
        keys = rnd.keys
        if keys is None:
            raise ProtocolError("round keys already consumed")
        if inplace and not (x.flags.c_contiguous and x.flags.writeable):
            raise ValueError("inplace masking needs a contiguous, writable vector")
        if fill is not None:
            src, masked = None, np.empty(rnd.vector_length, dtype=np.uint64)
        else:
            src = x if inplace else np.ascontiguousarray(x)
            masked = src if inplace else np.empty_like(src)
        order = sorted(peers)
        try:
            seeds = _kdf.derive_seeds(keys.mask_private, [
                (rnd.adverts[v].mask_key,
                 mask_info(self.job_id, rnd.round_id, self.client_id, v, rnd.task_digest))
                for v in order])
        except ValueError as exc:
            bad = next((v for v in order if not _kdf.usable_public(rnd.adverts[v].mask_key)),
                       None)  # a low-order key, signed by that peer itself
            if bad is None:
                raise InvalidMessage("bad masking key in the roster") from exc
            raise InvalidMessage(f"the masking key client {bad} advertised is not a usable "
                                 "X25519 key", peer=bad) from exc
        plus = [keys.self_seed] + [s for v, s in zip(order, seeds, strict=True)
                                   if v > self.client_id]
        minus = [s for v, s in zip(order, seeds, strict=True) if v < self.client_id]
        try:
            _prg.apply_masks(masked, plus, minus, src=None if inplace else src, fill=fill)
        except BaseException:
            rnd.keys = None  # never mask another vector with these seeds
            raise
        rnd.held.update(opened)
        rnd.masked_with = frozenset(peers | {self.client_id})
        rnd.keys = None  # the round's secrets are no longer needed
        self.stage = ClientStage.MASKED
        header = MaskedUpload(job_id=self.job_id, round_id=rnd.round_id, sender=self.client_id,
                              length=int(masked.shape[0]), next_advert=next_advert)
        return header, masked

    def _open_share(self, rnd: _Round, sender: int, ct: bytes) -> tuple[int, int]:
        head = share_header(self.job_id, rnd.round_id, sender, self.client_id,
                            rnd.task_digest)
        try:
            plain = self._box(rnd.adverts[sender].enc_key).decrypt(ct)
            if not plain.startswith(head) or len(plain) != len(head) + 2 * _shamir.SHARE_BYTES:
                raise ValueError("share context mismatch")
            body = plain[len(head):]
            return (_shamir.from_bytes(body[:_shamir.SHARE_BYTES]),
                    _shamir.from_bytes(body[_shamir.SHARE_BYTES:]))
        except (CryptoError, ValueError, TypeError, KeyError) as exc:
            # the sender is named: a refusal of the round then accuses it (or the server that
            # relayed it) instead of leaving the honest sites looking like the ones who quit
            raise InvalidMessage(f"the share ciphertext of client {sender} does not "
                                 "authenticate", peer=sender) from exc

    def _box(self, peer_enc_key: bytes) -> Box:
        """The authenticated box with a peer's per-job encryption key (its X25519 agreement is
        computed once per job and peer, not once per round)."""
        box = self._boxes.get(peer_enc_key)
        if box is None:
            box = self._boxes[peer_enc_key] = Box(self._enc_key, PublicKey(peer_enc_key))
        return box

    # -- 4. consistency ----------------------------------------------------------------------
    def sign_survivors(self, survivor_set: SurvivorSet) -> SurvivorSignature:
        """Sign the round's survivor set (once per round), or refuse (:class:`RefusedRequest`).

        Asked again for the set it signed, the client returns the same signature; asked for
        another set of the same round, it refuses.
        """
        if not isinstance(survivor_set, SurvivorSet):
            raise InvalidMessage("expected a SurvivorSet")
        rnd = self._round
        if (self.stage in (ClientStage.SIGNED, ClientStage.DONE) and rnd is not None
                and rnd.signed is not None and survivor_set.job_id == self.job_id
                and survivor_set.round_id == rnd.round_id):
            if frozenset(unique_ids(survivor_set.survivors, "survivors")) != rnd.signed:
                raise RefusedRequest(f"already signed another survivor set in round "
                                     f"{rnd.round_id}; one set per round", code="survivor_set")
            return self._signature(rnd)
        rnd = self._expect(ClientStage.MASKED, survivor_set, SurvivorSet)
        survivors = frozenset(unique_ids(survivor_set.survivors, "survivors"))
        if not survivors <= rnd.roster:
            raise InvalidMessage("the survivor set names clients outside this client's roster")
        if self.client_id not in survivors:
            raise ProtocolError("the survivor set does not list this client")
        outside = (survivors & rnd.group) - rnd.masked_with
        if outside:
            # a survivor this client never masked with means some peer it did mask with is
            # "dropped": its masking key would be revealed while this client's self mask is too
            raise RefusedRequest(f"the survivor set of round {rnd.round_id} names client "
                                 f"{min(outside)}, whose shares this client never received",
                                 code="survivor_set")
        self._check_survivors(len(survivors), rnd.round_id)
        previous = self._answered.get(rnd.question)
        if previous is not None and previous != survivors:
            raise RefusedRequest(f"question {rnd.question!r} of job {self.job_id} was already "
                                 "answered for a different set of clients", code="question_reused")
        rnd.signed = survivors
        rnd.signature = self.identity.sign(consistency_payload(
            self.job_id, rnd.round_id, rnd.task_digest, survivors)).signature
        self.stage = ClientStage.SIGNED
        return self._signature(rnd)

    def _signature(self, rnd: _Round) -> SurvivorSignature:
        return SurvivorSignature(job_id=self.job_id, round_id=rnd.round_id,
                                 sender=self.client_id, signature=rnd.signature)

    def _check_survivors(self, n: int, round_id: int) -> None:
        if n < self._t:
            raise RefusedRequest(f"only {n} survivors in round {round_id}, fewer than t={self._t} "
                                 f"of the job's {self.n_clients} clients", code="too_few_survivors")
        if n < 3:
            raise RefusedRequest(f"refusing a sum over {n} < 3 clients", code="too_few_survivors")
        if n < self.min_survivors:
            raise RefusedRequest(f"refusing a sum over {n} clients in round {round_id}: this "
                                 f"client unmasks sums over at least {self.min_survivors} (its "
                                 "differential-privacy noise is calibrated for that many)",
                                 code="too_few_survivors")

    # -- 5. unmask ---------------------------------------------------------------------------
    def unmask(self, request: UnmaskRequest, *,
               next_advert: KeyAdvert | None = None) -> UnmaskResponse:
        """Reveal the shares the server needs, or refuse (:class:`RefusedRequest`)."""
        if self.stage is ClientStage.DONE:
            rnd = self._expect(ClientStage.DONE, request, UnmaskRequest)
        else:
            rnd = self._expect(ClientStage.SIGNED, request, UnmaskRequest)
        survivors = set(unique_ids(request.survivors, "survivors"))
        dropped = set(unique_ids(request.dropped, "dropped"))
        if not (survivors | dropped) <= rnd.roster:
            raise InvalidMessage("unmask request names clients outside the round")
        if request.question != rnd.question:
            raise InvalidMessage("unmask request for another question")
        if rnd.signed is None or frozenset(survivors) != rnd.signed:
            raise RefusedRequest(f"the unmask request's survivors differ from the set this "
                                 f"client signed in round {rnd.round_id}", code="survivor_set")
        both = survivors & dropped
        if both:
            raise RefusedRequest(f"refusing both a self-mask and a key share of client "
                                 f"{min(both)} in round {rnd.round_id}", code="both_shares")
        # only the group holds shares: O(k) on the sparse graph whatever the roster's size
        wanted = ({u: _SELF for u in survivors & rnd.group}
                  | {v: _KEY for v in dropped & rnd.group})
        signers = self._valid_signers(rnd, request, survivors)
        for owner in sorted(p for p in wanted if p in rnd.held):
            backers = self._backers(rnd, owner)
            backing = signers if backers is None else signers & backers
            if len(backing) < rnd.local_t:
                where = "the roster" if backers is None else f"client {owner}'s group"
                raise RefusedRequest(f"only {len(backing)} signatures of {where} on the survivor "
                                     f"set of round {rnd.round_id}, {rnd.local_t} needed",
                                     code="signatures")
        self._check_survivors(len(survivors), rnd.round_id)
        members = frozenset(survivors)
        previous = self._answered.get(rnd.question)
        if previous is not None and previous != members:
            raise RefusedRequest(f"question {rnd.question!r} of job {self.job_id} was already "
                                 "answered for a different set of clients", code="question_reused")
        for peer, kind in wanted.items():
            if rnd.revealed.get(peer, kind) != kind:
                raise RefusedRequest(f"already revealed the {rnd.revealed[peer]} share of client "
                                     f"{peer} in round {rnd.round_id}; refusing its {kind} share",
                                     code="both_shares")
        self._answered[rnd.question] = members
        rnd.revealed.update({p: k for p, k in wanted.items() if p in rnd.held})
        self.stage = ClientStage.DONE
        return UnmaskResponse(
            job_id=self.job_id, round_id=rnd.round_id, sender=self.client_id,
            self_mask_shares={u: _shamir.to_bytes(rnd.held[u][0])
                              for u in sorted(wanted) if wanted[u] == _SELF and u in rnd.held},
            key_shares={v: _shamir.to_bytes(rnd.held[v][1])
                        for v in sorted(wanted) if wanted[v] == _KEY and v in rnd.held},
            next_advert=next_advert)

    @staticmethod
    def _backers(rnd: _Round, owner: int) -> frozenset[int] | None:
        """Whose signatures back the reveal of ``owner``'s shares: ``owner``'s own group (the
        only clients holding its shares); ``None`` (the roster) on the complete graph."""
        return None if rnd.owners is None else rnd.owners[owner]

    def _valid_signers(self, rnd: _Round, request: UnmaskRequest,
                       survivors: set[int]) -> frozenset[int]:
        """The members whose signature on ``survivors`` verifies, among those whose signatures
        this client needs: the roster on the complete graph; on the sparse graph the groups of
        its own neighbours (a share of owner ``p`` is revealed only when ``t_local`` members of
        ``p``'s group signed the set, so every honest holder of ``p``'s shares reveals them
        for one set only). Other signatures are not verified.

        A signer outside the survivor set is :class:`InvalidMessage`, and so is a needed
        signature that does not verify.
        """
        needed = (None if rnd.owners is None
                  else frozenset().union(*rnd.owners.values()))
        payload = consistency_payload(self.job_id, rnd.round_id, rnd.task_digest, survivors)
        valid = set()
        for signer, sig in request.signatures.items():
            if signer not in survivors:
                raise InvalidMessage(f"a signature of client {signer}, outside the survivor set")
            if needed is not None and signer not in needed:
                continue
            if not survivor_signature_ok(self.directory, signer, sig, payload):
                raise InvalidMessage(f"the signature of client {signer} on the survivor set "
                                     "does not verify")
            valid.add(signer)
        return frozenset(valid)

    def _expect(self, stage: ClientStage, msg: object, kind: type) -> _Round:
        if not isinstance(msg, kind):
            raise InvalidMessage(f"expected a {kind.__name__}")
        job, r = getattr(msg, "job_id", None), getattr(msg, "round_id", None)
        if job != self.job_id:
            raise InvalidMessage("message for another job")
        if self.stage is not stage or self._round is None or r != self.round_id:
            raise ProtocolError(f"{kind.__name__} for round {r} arrived in stage "
                                f"{self.stage.value} of round {self.round_id}")
        return self._round
