"""Checks shared by client and server: advert signatures and roster validation."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from ..errors import InvalidMessage
from ._rounds import advert_payload
from .messages import KeyAdvert


def verify_advert(advert: object, directory: Mapping[int, bytes], job_id: str,
                  round_id: int | None = None) -> KeyAdvert:
    """``advert`` if it is a :class:`KeyAdvert` for this job (and round) signed by its client."""
    if not isinstance(advert, KeyAdvert):
        raise InvalidMessage("not a key advertisement")
    if advert.job_id != job_id or (round_id is not None and advert.round_id != round_id):
        raise InvalidMessage("key advertisement for another job or round")
    identity = directory.get(advert.client_id)
    if identity is None:
        raise InvalidMessage("key advertisement from an unknown client")
    payload = advert_payload(advert.job_id, advert.round_id, advert.client_id, advert.enc_key,
                             advert.mask_key, advert.self_mask_commit)
    if not _signed(identity, payload, advert.signature):
        raise InvalidMessage("bad key advertisement signature")
    return advert


def unique_ids(ids: Iterable[int], what: str) -> list[int]:
    """``ids`` as a list, or :class:`InvalidMessage` if one repeats."""
    out = list(ids)
    if len(out) != len(set(out)):
        raise InvalidMessage(f"duplicate client in {what}")
    return out


def survivor_signature_ok(directory: Mapping[int, bytes], signer: int, signature: bytes,
                          payload: bytes) -> bool:
    """Whether ``signature`` is ``signer``'s Ed25519 signature (by the directory) of ``payload``."""
    identity = directory.get(signer)
    if identity is None:
        return False
    return _signed(identity, payload, signature)


def _signed(identity: object, payload: object, signature: object) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``payload`` by the key ``identity``.
    The verdict of the same three byte strings is kept (:func:`_ed25519_ok`): it is the same
    whoever asks, and a run of several clients in one process checks each advert and survivor
    signature once for all of them, not once per client."""
    if isinstance(identity, bytes) and isinstance(payload, bytes) \
            and isinstance(signature, bytes):
        return _ed25519_ok(identity, payload, signature)
    return _ed25519_check(identity, payload, signature)


@functools.lru_cache(maxsize=4096)
def _ed25519_ok(identity: bytes, payload: bytes, signature: bytes) -> bool:
    return _ed25519_check(identity, payload, signature)


def _ed25519_check(identity: object, payload: object, signature: object) -> bool:
    try:
        VerifyKey(identity).verify(payload, signature)  # type: ignore[arg-type]
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True
