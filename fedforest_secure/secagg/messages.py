"""Wire messages of one secure-aggregation round, as plain pydantic models.

Flow of round ``r`` (server in the middle, every arrow relayed by it)::

    client -> server  KeyAdvert       signed round keys (may ride along on round r-1's
                                      MaskedUpload or UnmaskResponse as ``next_advert``)
    server -> client  RoundSetup      the verified adverts of the round (U1), question, t
    client -> server  ShareBundle     Shamir shares of b_u and s_u^SK, encrypted to each peer
    server -> client  ShareDelivery   the ciphertexts addressed to that client (from U2)
    client -> server  MaskedUpload    header; the uint64 vector travels beside it, in binary
    server -> client  SurvivorSet     the survivors U3 (uploaded), to be signed
    client -> server  SurvivorSignature  Ed25519 signature over job, round, task digest and U3
    server -> client  UnmaskRequest   survivors U3, dropped U2 \\ U3, and the signatures on U3
    client -> server  UnmaskResponse  self-mask shares for survivors, key shares for dropped

The two consistency messages are the actively secure variant of Bonawitz et al. (2017): a client
reveals unmask shares only for a survivor set that ``t`` distinct members of its roster signed
(on the SecAgg+ sparse graph: ``t_local`` members of its own group, Bell et al. 2020), and signs
one set per round, so no two sets each gather the signatures a client needs from one group.

Every model forbids extra fields and bounds its sizes. Big vectors are never JSON: they are numpy
uint64 arrays carried next to :class:`MaskedUpload`. :func:`parse` turns any parse failure into
the opaque :class:`~fedforest_secure.errors.InvalidMessage`.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBytes, ValidationError

from ..errors import InvalidMessage
from ._primitives._shamir import SHARE_BYTES

__all__ = [
    "KeyAdvert",
    "MaskedUpload",
    "RoundSetup",
    "ShareBundle",
    "ShareDelivery",
    "SurvivorSet",
    "SurvivorSignature",
    "UnmaskRequest",
    "UnmaskResponse",
    "parse",
]

MAX_CLIENTS = 10_000
MAX_VECTOR = 1 << 28  # 2 GiB of uint64
MAX_CIPHERTEXT = 512

JobId = Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
RoundId = Annotated[int, Field(ge=0, le=(1 << 62))]
ClientId = Annotated[int, Field(ge=0, le=(1 << 31) - 2)]
Key32 = Annotated[StrictBytes, Field(min_length=32, max_length=32)]
Signature = Annotated[StrictBytes, Field(min_length=64, max_length=64)]
Ciphertext = Annotated[StrictBytes, Field(min_length=1, max_length=MAX_CIPHERTEXT)]
ShareBytes = Annotated[StrictBytes, Field(min_length=SHARE_BYTES, max_length=SHARE_BYTES)]
Question = Annotated[str, Field(min_length=1, max_length=256)]
Roster = Annotated[tuple[ClientId, ...], Field(min_length=1, max_length=MAX_CLIENTS)]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_bytes="base64",
                              val_json_bytes="base64")

    job_id: JobId
    round_id: RoundId


class KeyAdvert(_Message):
    """A client's keys for one round, signed with its long-term Ed25519 identity.

    ``enc_key`` is the per-job X25519 key that peers encrypt shares to; ``mask_key`` the fresh
    per-round X25519 masking key; ``self_mask_commit`` a SHA-256 commitment to the self-mask seed.
    """

    client_id: ClientId
    enc_key: Key32
    mask_key: Key32
    self_mask_commit: Key32
    signature: Signature


class RoundSetup(_Message):
    """Server -> clients: the round's roster (U1) as signed adverts, and what is being summed.

    Without ``roster`` the adverts are the roster (every client gets every advert: the complete
    graph). With ``roster`` (the ids of U1; the SecAgg+ sparse graph) ``adverts`` holds only
    the recipient's group: a client needs, and verifies, only its neighbours' adverts.
    """

    question: Question
    task_digest: Key32
    threshold: Annotated[int, Field(ge=1, le=MAX_CLIENTS)]
    neighbours: Annotated[int, Field(ge=2, le=MAX_CLIENTS)] | None = None
    vector_length: Annotated[int, Field(ge=0, le=MAX_VECTOR)]
    adverts: Annotated[tuple[KeyAdvert, ...], Field(min_length=1, max_length=MAX_CLIENTS)]
    roster: Roster | None = None


class ShareBundle(_Message):
    """Client -> server: ``{recipient: ciphertext}`` of the sender's two shares for each peer."""

    sender: ClientId
    ciphertexts: Annotated[dict[ClientId, Ciphertext], Field(max_length=MAX_CLIENTS)]


class ShareDelivery(_Message):
    """Server -> client: ``{sender: ciphertext}`` addressed to ``recipient``."""

    recipient: ClientId
    ciphertexts: Annotated[dict[ClientId, Ciphertext], Field(max_length=MAX_CLIENTS)]


class MaskedUpload(_Message):
    """Client -> server header of a masked vector; the ``length`` uint64 words travel beside it."""

    sender: ClientId
    length: Annotated[int, Field(ge=0, le=MAX_VECTOR)]
    next_advert: KeyAdvert | None = None


class SurvivorSet(_Message):
    """Server -> survivors: the clients whose masked upload entered the sum (U3), to sign."""

    survivors: Annotated[tuple[ClientId, ...], Field(max_length=MAX_CLIENTS)]


class SurvivorSignature(_Message):
    """Client -> server: the sender's Ed25519 signature over job, round, task digest and U3."""

    sender: ClientId
    signature: Signature


class UnmaskRequest(_Message):
    """Server -> survivors: who uploaded (``survivors``), who shared but did not (``dropped``),
    and the survivors' signatures on ``survivors`` (``{signer: signature}``; on the SecAgg+
    sparse graph only those of the recipient's group, the only ones it counts)."""

    question: Question
    survivors: Annotated[tuple[ClientId, ...], Field(max_length=MAX_CLIENTS)]
    dropped: Annotated[tuple[ClientId, ...], Field(max_length=MAX_CLIENTS)]
    signatures: Annotated[dict[ClientId, Signature], Field(max_length=MAX_CLIENTS)]


class UnmaskResponse(_Message):
    """Client -> server: self-mask shares of survivors and masking-key shares of dropped peers."""

    sender: ClientId
    self_mask_shares: Annotated[dict[ClientId, ShareBytes], Field(max_length=MAX_CLIENTS)]
    key_shares: Annotated[dict[ClientId, ShareBytes], Field(max_length=MAX_CLIENTS)]
    next_advert: KeyAdvert | None = None


M = TypeVar("M", bound=_Message)


def parse(model: type[M], data: bytes | str) -> M:
    """Validate JSON ``data`` as ``model``; any failure is :class:`InvalidMessage`."""
    try:
        return model.model_validate_json(data)
    except (ValidationError, ValueError, TypeError) as exc:
        raise InvalidMessage(f"malformed {model.__name__}") from exc
