"""Reconstructing a committed secret from more shares than its threshold: :func:`recover`.

Shamir shares carry no integrity, but every secret the server reconstructs has a public check: a
survivor's self-mask seed its advertised SHA-256 commitment, a dropped client's masking key its
advertised X25519 public key. The first ``t`` shares by ``x`` are tried first (the cached
Lagrange coefficients: the honest path costs what it always did; shares beyond them are not
checked, as they change nothing). If they fail the check and the server holds more than ``t``
shares, other ``t``-subsets are tried until one reconstructs a secret that passes; every share
off that subset's polynomial (evaluated at the share's ``x``) is corrupt, and its sender is
named.

Safety. The server holds all these shares anyway and is entitled to the secret they share (the
survivors revealed them so that it reconstructs exactly this secret): what any subset gives is a
function of data it already holds, so trying several reveals nothing beyond the secret.

Bound. Subsets are tried by how many shares they leave out (leave-one-out, then leave-two-out,
...; each ``t``-subset once: at level ``e`` those holding the ``(t + e)``-th share and ``t - 1`` of
the ``t + e - 1`` before it), the senders already found corrupt in the round left out first.
At most ``max_tries`` reconstructions of O(t^2) each per secret (:data:`MAX_TRIES`): one corrupt
share is always found when ``t < MAX_TRIES``, two when ``t`` is at most about 20; beyond, the
round aborts as it would without the search.

Attribution. A matching subset fixes the secret for sure (SHA-256, or a clamped X25519 key),
but not the polynomial: colluding senders could cancel their errors inside one subset. With at
most ``r = (n + 1 - t) // 2`` corrupt shares of one secret (the unique-decoding radius of ``n``
shares plus the known point ``(0, secret)``), the polynomial of any matching subset that leaves
at most ``r`` shares off is the dealt one, so exactly those senders are named. A matching subset
with more shares off is remembered and the search goes on (within the bound) for one that
leaves at most ``r`` off; failing that, the secret is used and the shares off the first match
are reported as disputed, not named. The attribution holds only while at most ``r`` shares are
corrupt: more colluders than that (still fewer than ``t``) can shift their shares by a
polynomial that vanishes at 0 and at chosen honest ``x``, so that the closest polynomial leaves
honest senders off it, and those are named. A share a sender reveals is the one its owner
dealt it, so a wrong one may also come from an owner that dealt it wrong (Shamir is not
verifiable). Names say which shares disagree with the secret's commitment, not who altered
them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from ._primitives import _shamir

MAX_TRIES = 256  # reconstructions of one secret, the first included


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover` found. ``secret`` is None when no subset tried passed the check."""

    secret: int | None
    corrupt: frozenset[int]  # x of the shares off the matching polynomial (at most r of them)
    disputed: frozenset[int]  # x of the shares off it when more than r are: not attributed
    tries: int  # reconstructions made
    exhausted: bool  # every t-subset was tried (no secret then: more than n - t are corrupt)


def _subsets(xs: Sequence[int], t: int, suspects: Collection[int]) -> Iterator[tuple[int, ...]]:
    """The ``t``-subsets of ``xs`` (sorted) other than the first ``t``, fewest left out first;
    the first ``t`` without ``suspects`` leads."""
    first = tuple(xs[:t])
    clean = tuple(x for x in xs if x not in suspects)[:t]
    if len(clean) == t and clean != first:
        yield clean
    for e in range(1, len(xs) - t + 1):
        last, head = xs[t + e - 1], xs[:t + e - 1]
        for left_out in itertools.combinations(head, e):
            gone = set(left_out)
            subset = tuple(x for x in head if x not in gone) + (last,)
            if subset != clean:
                yield subset


def recover(shares: Mapping[int, int], t: int, matches: Callable[[int], bool], *,
            suspects: Collection[int] = (), max_tries: int = MAX_TRIES) -> Recovery:
    """The secret of ``shares`` (``{x: y}``, at least ``t``) that passes ``matches``.

    ``suspects`` are ``x`` to leave out first (senders found corrupt for another secret);
    ``max_tries`` (at least 1) bounds the reconstructions.
    """
    if len(shares) < t or t < 1 or max_tries < 1:
        raise ValueError(f"need at least t={t} >= 1 shares and max_tries >= 1")
    xs = sorted(shares)
    n = len(xs)
    secret = _shamir.combine(shares, t)
    if matches(secret):
        return Recovery(secret, frozenset(), frozenset(), 1, n == t)
    tries = 1
    fallback: Recovery | None = None  # a match with more shares off it than attributable
    for subset in _subsets(xs, t, frozenset(suspects)):
        if tries >= max_tries:
            return fallback or Recovery(None, frozenset(), frozenset(), tries, False)
        tries += 1
        poly = _shamir.evaluator([(x, shares[x]) for x in subset])
        value = poly(0)
        if not matches(value):
            continue
        inside = set(subset)
        off = frozenset(x for x in xs if x not in inside and poly(x) != shares[x])
        if len(off) <= (n + 1 - t) // 2:
            return Recovery(value, off, frozenset(), tries, False)
        if fallback is None:  # the secret is right; look on for a polynomial to attribute by
            fallback = Recovery(value, frozenset(), off, tries, False)
    if fallback is not None:
        return Recovery(fallback.secret, frozenset(), fallback.disputed, tries, True)
    return Recovery(None, frozenset(), frozenset(), tries, True)
