"""Robust reconstruction of a committed secret (``secagg._recover``): corrupt shares among more
than ``t`` are routed around and located within the unique-decoding radius, a bounded search;
beyond the radius, colluders can get honest senders named (a documented residual)."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from fedforest_secure.secagg._primitives import _shamir
from fedforest_secure.secagg._recover import MAX_TRIES, recover

SECRET = int.from_bytes(hashlib.sha256(b"the owner's seed").digest(), "big")


def _deal(t: int, n: int) -> dict[int, int]:
    return _shamir.split(SECRET, t, list(range(1, n + 1)))


class _Check:
    """``matches`` for :func:`recover` that counts its calls (each one is a reconstruction)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, secret: int) -> bool:
        self.calls += 1
        return secret == SECRET


def test_honest_shares_cost_one_reconstruction() -> None:
    check = _Check()
    found = recover(_deal(4, 7), 4, check)
    assert (found.secret, found.corrupt, found.tries, check.calls) == (SECRET, frozenset(), 1, 1)


@pytest.mark.parametrize(("t", "n"), [(3, 4), (4, 5), (3, 5), (5, 9)])
def test_any_one_corrupt_share_among_more_than_t_is_routed_around_and_named(t: int,
                                                                             n: int) -> None:
    for bad in range(1, t + 1):  # a corrupt share beyond the first t is never used
        shares = _deal(t, n)
        shares[bad] = (shares[bad] + 1) % _shamir.PRIME
        found = recover(shares, t, _Check())
        assert found.secret == SECRET
        assert found.corrupt == {bad}
        assert not found.disputed


def test_two_corrupt_shares_are_found_by_leaving_two_out() -> None:
    t, n = 5, 9  # up to (n + 1 - t) // 2 = 2 corrupt shares are attributed
    for bad in itertools.combinations(range(1, t + 2), 2):
        shares = _deal(t, n)
        for x, by in zip(bad, (7, 11), strict=True):  # (equal errors at 1 and 4 would cancel)
            shares[x] = (shares[x] + by) % _shamir.PRIME
        found = recover(shares, t, _Check())
        assert (found.secret, found.corrupt) == (SECRET, frozenset(bad))


def test_more_corrupt_shares_than_spares_find_nothing_after_every_subset() -> None:
    t, n = 4, 5
    shares = _deal(t, n)
    for x in (1, 4):
        shares[x] = (shares[x] + 1) % _shamir.PRIME
    check = _Check()
    found = recover(shares, t, check)
    assert found.secret is None and found.exhausted
    assert check.calls == found.tries == 5  # C(5, 4): each 4-subset once


def test_the_search_stops_at_max_tries() -> None:
    """60 shares, t = 40, corrupt shares at 1, 2 and 3: the matching subsets leave out three of
    the first 42, beyond the cap. The search gives up after MAX_TRIES reconstructions (not the
    C(60, 40) subsets) and reports that it was not exhaustive."""
    t, n = 40, 60
    shares = _deal(t, n)
    for x in (1, 2, 3):
        shares[x] = (shares[x] + 1) % _shamir.PRIME
    check = _Check()
    found = recover(shares, t, check)
    assert found.secret is None and not found.exhausted
    assert check.calls == found.tries == MAX_TRIES
    check = _Check()
    assert recover(shares, t, check, max_tries=10).tries == check.calls == 10


def test_known_corrupt_senders_are_left_out_first() -> None:
    t, n = 40, 60
    shares = _deal(t, n)
    for x in (1, 2, 3):
        shares[x] = (shares[x] + 1) % _shamir.PRIME
    check = _Check()
    found = recover(shares, t, check, suspects={1, 2, 3})
    assert (found.secret, found.corrupt, check.calls) == (SECRET, {1, 2, 3}, 2)


def test_a_match_leaving_more_shares_off_than_the_radius_names_no_one() -> None:
    """x=1 is corrupt, so the first subset (1, 2, 3) fails; x=2 and x=3 collude so that the next
    subset tried, (2, 3, 4), still gives the secret, on a polynomial other than the dealt one.
    The honest share at x=5 is off that polynomial; with more shares off it than can be
    attributed ((n + 1 - t) // 2 = 1), nobody is named: they are reported as disputed."""
    t, n = 3, 5
    shares = _deal(t, n)
    shares[1] = (shares[1] + 1) % _shamir.PRIME
    l2, l3, _ = _shamir.lagrange_at_zero((2, 3, 4))
    shares[2] = (shares[2] + l3) % _shamir.PRIME  # l2 * l3 - l3 * l2 = 0 at x = 0
    shares[3] = (shares[3] - l2) % _shamir.PRIME
    found = recover(shares, t, _Check())
    assert found.secret == SECRET and found.tries == 10  # every 3-subset: none attributes
    assert found.corrupt == frozenset()
    assert found.disputed == {1, 5}


def test_recover_rejects_too_few_shares() -> None:
    with pytest.raises(ValueError, match="at least t=4"):
        recover(dict(list(_deal(3, 5).items())[:3]), 4, _Check())


def test_colluders_beyond_the_radius_can_get_honest_senders_named() -> None:
    """RESIDUAL: 3 colluding senders of 10 (t = 7: fewer than t), more than the radius
    ``(n + 1 - t) // 2 = 2``, add to their shares a polynomial of degree t - 1 that is zero at 0
    and at t - 2 honest ``x``: the secret still reconstructs, but the polynomial closest to the
    shares the server holds is the shifted one, and the two honest senders left off it are
    named. Names are evidence of which shares disagree, not proof of who altered them."""
    t, n = 7, 10
    shares = _deal(t, n)
    colluders, framed = (1, 2, 3), (4, 5)
    roots = [x for x in range(1, n + 1) if x not in colluders + framed]

    def delta(x: int) -> int:
        v = x
        for r in roots:
            v = v * (x - r) % _shamir.PRIME
        return v

    for x in colluders:
        shares[x] = (shares[x] + delta(x)) % _shamir.PRIME
    found = recover(shares, t, _Check())
    assert found.secret == SECRET
    assert found.corrupt == frozenset(framed)
