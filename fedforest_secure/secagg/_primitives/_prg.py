"""Pseudo-random masks: a 256-bit seed expanded by AES-128-CTR into uint64 words.

The keystream of ``AES-128-CTR(key=seed[:16], initial counter block=seed[16:])`` is read as
little-endian uint64 words. AES-128 matches the security level of the keys the seeds come from
(X25519 agreements and Ed25519 signatures give about 128 bits) and expands faster than AES-256
(``benchmarks/secagg.py --prg``); every bit of the seed is used. A seed is used for exactly one
vector (the recipes derive a fresh seed per round and pair), so no counter block is ever reused
under one key. Keystream is written into a preallocated buffer with ``update_into`` and added
to (or subtracted from) the accumulator in place; numpy uint64 arithmetic wraps modulo 2^64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_U64 = np.dtype("<u8")
_BLOCK = 1 << 14  # words per cache-sized block (128 KiB) in apply_masks


def _encryptor(seed: bytes) -> Any:
    """The AES-128-CTR keystream generator of a 32-byte seed."""
    if len(seed) != 32:
        raise ValueError("a PRG seed is exactly 32 bytes")
    return Cipher(algorithms.AES(seed[:16]), modes.CTR(seed[16:])).encryptor()


def expand(seed: bytes, length: int) -> np.ndarray:
    """``length`` uint64 words of keystream for ``seed`` (allocates; for tests and small uses)."""
    out = np.empty(length, dtype=_U64)
    Expander(length).keystream_into(seed, out)
    return out


class Expander:
    """Reusable buffers for adding many masks of one length to an accumulator."""

    def __init__(self, length: int) -> None:
        if length < 0:
            raise ValueError("length must be non-negative")
        self.length = length
        self._zeros = bytes(8 * length)
        self._buf = bytearray(8 * length)
        self._words = np.frombuffer(self._buf, dtype=_U64)

    def keystream_into(self, seed: bytes, out: np.ndarray) -> None:
        """Write the keystream of ``seed`` into ``out`` (uint64, C-contiguous, ``length`` long)."""
        if out.dtype != _U64 or out.shape != (self.length,) or not out.flags.c_contiguous:
            raise ValueError("out must be a contiguous uint64 vector of the expander's length")
        enc = _encryptor(seed)
        enc.update_into(self._zeros, memoryview(out.view(np.uint8)))  # type: ignore[arg-type]
        enc.finalize()

    def _fill(self, seed: bytes) -> np.ndarray:
        self.keystream_into(seed, self._words)
        return self._words

    def add(self, seed: bytes, acc: np.ndarray) -> None:
        """``acc += PRG(seed)`` modulo 2^64, in place."""
        np.add(acc, self._fill(seed), out=acc)

    def subtract(self, seed: bytes, acc: np.ndarray) -> None:
        """``acc -= PRG(seed)`` modulo 2^64, in place."""
        np.subtract(acc, self._fill(seed), out=acc)


def apply_masks(acc: np.ndarray, plus: list[bytes], minus: list[bytes],
                src: np.ndarray | None = None,
                fill: Callable[[int, int, np.ndarray], None] | None = None) -> None:
    """``acc = (src or acc) + sum PRG(p) - sum PRG(m)`` modulo 2^64, block by block.

    With ``src`` (same shape and dtype as ``acc``) the input is read from ``src`` and ``acc``
    is only written, which saves a copy when masking a vector the caller keeps. With ``fill``,
    ``fill(start, stop, block)`` writes the input of ``acc[start:stop]`` into ``block`` (that
    very slice) just before it is masked, e.g. a fixed-point encoder: the plain block is
    produced and masked while it sits in cache, in one pass over ``acc``.

    All keystreams advance together over cache-sized blocks, so each block of ``acc`` is read
    and written while it is hot in cache (about twice as fast as one full pass per mask).
    """
    if acc.dtype != _U64 or acc.ndim != 1 or not acc.flags.c_contiguous:
        raise ValueError("acc must be a contiguous uint64 vector")
    if src is not None and (src.dtype != _U64 or src.shape != acc.shape):
        raise ValueError("src must be a uint64 vector shaped like acc")
    if src is not None and fill is not None:
        raise ValueError("give src or fill, not both")
    steps: list[tuple[Any, Callable[..., Any]]] = [(_encryptor(s), np.add) for s in plus]
    steps += [(_encryptor(s), np.subtract) for s in minus]
    n = acc.shape[0]
    if n == 0:
        return
    block = min(_BLOCK, n)
    zeros = memoryview(bytes(8 * block))
    buf = np.empty(block, dtype=_U64)
    raw = memoryview(buf.view(np.uint8))  # type: ignore[arg-type]  # numpy's buffer protocol
    calls = [(enc.update_into, op) for enc, op in steps]
    for start in range(0, n, block):
        stop = min(start + block, n)
        part = acc[start:stop]
        if stop - start == block:
            z, r, ks = zeros, raw, buf
        else:  # the last, shorter block
            m = stop - start
            z, r, ks = zeros[:8 * m], raw[:8 * m], buf[:m]
        first = part
        if fill is not None:
            fill(start, stop, part)
        elif src is not None:
            first = src[start:stop]
            if not calls:
                part[:] = first
        for update_into, op in calls:
            update_into(z, r)
            op(first, ks, out=part)
            first = part
    for enc, _ in steps:
        enc.finalize()
