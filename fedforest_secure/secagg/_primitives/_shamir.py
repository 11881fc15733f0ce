"""Shamir secret sharing over the prime field GF(p), p = 2^521 - 1 (a Mersenne prime).

A secret is an integer in ``[0, p)`` (the recipes share 32-byte keys, read big-endian). A share is
the point ``(x, f(x))`` of a random polynomial ``f`` of degree ``t - 1`` with ``f(0) = secret``;
any ``t`` shares with distinct non-zero ``x`` give the secret back by Lagrange interpolation at 0,
and ``t - 1`` shares reveal nothing about it. Shares carry no integrity: the recipes check a
reconstructed key against its advertised public key or commitment.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Mapping, Sequence

PRIME = (1 << 521) - 1
SHARE_BYTES = 66  # ceil(521 / 8)


def split(secret: int, threshold: int, xs: Sequence[int]) -> dict[int, int]:
    """Shares ``{x: f(x)}`` of ``secret`` for the evaluation points ``xs`` (fresh randomness)."""
    coeffs = [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    return _split_from_parts(secret, threshold, xs, coeffs)


def _split_from_parts(secret: int, threshold: int, xs: Sequence[int],
                      coeffs: Sequence[int]) -> dict[int, int]:
    """:func:`split` with the ``threshold - 1`` non-constant coefficients given (for tests)."""
    if not 0 <= secret < PRIME:
        raise ValueError("secret outside the field")
    if threshold < 1 or threshold > len(xs):
        raise ValueError("need 1 <= threshold <= number of shares")
    if len(coeffs) != threshold - 1 or any(not 0 <= c < PRIME for c in coeffs):
        raise ValueError("need threshold - 1 coefficients in the field")
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValueError("evaluation points must be distinct and non-zero")
    poly = [secret, *coeffs]
    out: dict[int, int] = {}
    for x in xs:
        acc = 0
        for c in reversed(poly):  # Horner
            acc = (acc * x + c) % PRIME
        out[x] = acc
    return out


def combine(shares: Mapping[int, int], threshold: int) -> int:
    """The secret from at least ``threshold`` shares ``{x: y}`` (uses the first ``threshold``)."""
    if len(shares) < threshold:
        raise ValueError(f"need {threshold} shares, got {len(shares)}")
    points = sorted(shares.items())[:threshold]
    xs = tuple(x for x, _ in points)
    if any(not 0 < x < PRIME for x in xs) or any(not 0 <= y < PRIME for _, y in points):
        raise ValueError("share outside the field")
    coeffs = lagrange_at_zero(xs)
    return sum(c * y for c, (_, y) in zip(coeffs, points, strict=True)) % PRIME


def _inverses(values: Sequence[int]) -> list[int]:
    """The inverses of non-zero field elements with one inversion (Montgomery's trick)."""
    prefix = [1]
    for v in values:
        prefix.append(prefix[-1] * v % PRIME)
    inv = pow(prefix[-1], -1, PRIME)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = inv * prefix[i] % PRIME
        inv = inv * values[i] % PRIME
    return out


def evaluator(points: Sequence[tuple[int, int]]) -> Callable[[int], int]:
    """``x -> f(x)`` for the polynomial ``f`` of degree below ``len(points)`` through ``points``
    (distinct ``x``; not cached: for the few subsets a robust reconstruction tries).

    Barycentric form: O(t^2) multiplications once, then O(t) and one inversion per point."""
    xs = [x % PRIME for x, _ in points]
    if len(set(xs)) != len(xs):
        raise ValueError("evaluation points must be distinct")
    dens = []
    for i, xi in enumerate(xs):
        den = 1
        for j, xj in enumerate(xs):
            if j != i:
                den = den * (xi - xj) % PRIME
        dens.append(den)
    weighted = [w * y % PRIME for w, (_, y) in zip(_inverses(dens), points, strict=True)]
    known = {x: y % PRIME for x, (_, y) in zip(xs, points, strict=True)}

    def at(x: int) -> int:
        x %= PRIME
        if x in known:
            return known[x]
        diffs = [(x - xi) % PRIME for xi in xs]
        total = sum(w * d for w, d in zip(weighted, _inverses(diffs), strict=True))
        for d in diffs:
            total = total * d % PRIME
        return total

    return at


def interpolate(points: Sequence[tuple[int, int]], at: int) -> int:
    """``f(at)`` for the polynomial of degree below ``len(points)`` through ``points``."""
    return evaluator(points)(at)


@functools.lru_cache(maxsize=64)
def lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """The Lagrange coefficients ``l_i`` with ``f(0) = sum_i l_i f(x_i)`` for every polynomial
    of degree below ``len(xs)`` (distinct non-zero points ``xs``).

    They depend on the points only, and a server reconstructs a round's secrets from the shares
    of the same responders: cached, each further reconstruction costs O(t) multiplications
    instead of O(t^2) and ``t`` inversions."""
    if len(set(xs)) != len(xs):
        raise ValueError("evaluation points must be distinct")
    out = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(out)


def to_bytes(value: int) -> bytes:
    """A field element as exactly :data:`SHARE_BYTES` big-endian bytes."""
    return value.to_bytes(SHARE_BYTES, "big")


def from_bytes(data: bytes) -> int:
    """Inverse of :func:`to_bytes`; ``ValueError`` for a wrong length or out-of-field value."""
    if len(data) != SHARE_BYTES:
        raise ValueError("share has the wrong length")
    value = int.from_bytes(data, "big")
    if value >= PRIME:
        raise ValueError("share outside the field")
    return value

