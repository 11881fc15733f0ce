"""X25519 key agreement followed by HKDF-SHA256 (RFC 5869) with a caller-supplied context.

The context (HKDF ``info``) is built by the recipes, e.g.
``b"fedforest/v1/mask|" + job|round|i|j|task_digest``, so that a derived seed is only ever valid for
one job, one round, one ordered pair of clients and one question.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidKey
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SEED_BYTES = 32
KEY_BYTES = 32


def generate_private_key() -> bytes:
    """A fresh X25519 private key as 32 raw bytes (from the OS CSPRNG)."""
    return X25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
        serialization.NoEncryption())


def is_clamped(private: bytes) -> bool:
    """Whether 32 raw private-key bytes are clamped as :func:`generate_private_key` makes them
    (RFC 7748: the low 3 bits of the first byte clear, the top bit of the last clear, the next
    set). X25519 ignores those bits, so a key that differs in them gives the same public key:
    only a clamped key is the one that was made."""
    return len(private) == KEY_BYTES and private[0] & 7 == 0 and private[31] & 0xC0 == 0x40


def public_key(private: bytes) -> bytes:
    """The raw 32-byte X25519 public key of a raw private key."""
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def hkdf_sha256(secret: bytes, info: bytes, length: int = SEED_BYTES) -> bytes:
    """HKDF-SHA256 with an all-zero salt (RFC 5869 default) and the given ``info``."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def agree(private: bytes, peer_public: bytes) -> bytes:
    """Raw X25519 shared secret. Raises ``ValueError`` for a low-order (all-zero) result."""
    try:
        return X25519PrivateKey.from_private_bytes(private).exchange(
            X25519PublicKey.from_public_bytes(peer_public))
    except (InvalidKey, ValueError) as exc:
        raise ValueError("X25519 agreement failed") from exc


#: a private key of no one's, for :func:`usable_public`
_PROBE = X25519PrivateKey.generate().private_bytes(
    serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())


def usable_public(peer_public: bytes) -> bool:
    """Whether ``peer_public`` is a public key every key agreement accepts: 32 bytes and not a
    low-order point (with which every agreement, whoever's the private key, is all zeros)."""
    try:
        agree(_PROBE, peer_public)
    except ValueError:
        return False
    return True


def derive_seed(private: bytes, peer_public: bytes, info: bytes) -> bytes:
    """A 256-bit pairwise seed: ``HKDF-SHA256(X25519(private, peer_public), info)``."""
    return hkdf_sha256(agree(private, peer_public), info)


def derive_seeds(private: bytes, peers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """:func:`derive_seed` for each ``(peer_public, info)``, loading ``private`` once.

    Raises ``ValueError`` if any agreement fails (a malformed or low-order peer key).
    """
    key = X25519PrivateKey.from_private_bytes(private)
    out = []
    for peer_public, info in peers:
        try:
            secret = key.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except (InvalidKey, ValueError) as exc:
            raise ValueError("X25519 agreement failed") from exc
        out.append(hkdf_sha256(secret, info))
    return out
