"""The SecAgg+ graph's bound on colluding clients against an actively malicious server:
``2 t_local - g`` in the victim's group (threat_model.md §2.2, §10, S19).

The complete graph's camp split (``test_colluder_bound``) played inside one neighbourhood, with
the real clients' rules: a share of owner ``p`` is revealed only for the set the revealer
signed, and only when ``t_local`` members of ``p``'s group signed that set. At ``k = 14``
(groups of ``g = 15``, ``t_local = 11`` at threshold 0.67) the 7 colluders sit next to the
victim ``v`` and sign both sets; ``v`` and its 3 honest right-hand group members sign ``S_X``
(which keeps ``v``: they reveal its self-mask share), its 4 honest left-hand members sign
``S_Y`` (which drops ``v``: they reveal its masking-key share). Every revealer also asks for
the backing of each owner in its group that the set names (itself, the colluders, the other
signers), so the server has the honest clients around the group sign the set whose owners
need them, and leaves out of each set the group members whose backing it cannot gather. With
offsets on the ring relative to ``v`` (``+1`` its right-hand neighbour):

* colluders ``-3..-1`` and ``1..4``;
* ``S_X`` signed by ``0, 5..7`` (revealers), ``-10..-8`` and ``12..21``; it names everyone but
  ``-7..-4`` and ``8..11``;
* ``S_Y`` signed by ``-7..-4`` (revealers), ``8..11`` and ``-21..-11``; it names everyone but
  ``v`` and ``-10..-8``.

The ring has 43 clients (offsets -21..21) so the helpers on both sides are distinct clients.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_malicious_server import DIGEST, JOB, Plan, Q, Seen, recovered, run
from test_malicious_server_secagg_plus import _ring

from fedforest_secure.errors import RefusedRequest
from fedforest_secure.secagg import UnmaskRequest
from fedforest_secure.secagg._rounds import (
    consistency_payload,
    graph_seed,
    job_threshold,
    local_threshold,
    neighbour_groups,
)

N, K, THRESHOLD = 43, 14, 0.67
COLLUDERS = (-3, -2, -1, 1, 2, 3, 4)
REVEAL_X, REVEAL_Y = (0, 5, 6, 7), (-7, -6, -5, -4)
SIGN_X = (*REVEAL_X, -10, -9, -8, *range(12, 22))
SIGN_Y = (*REVEAL_Y, 8, 9, 10, 11, *range(-21, -10))
LEFT_OUT_X = (-7, -6, -5, -4, 8, 9, 10, 11)
LEFT_OUT_Y = (0, -10, -9, -8)


def _attack(colluders: tuple[int, ...], sign_x: tuple[int, ...], sign_y: tuple[int, ...],
            reveal_x: tuple[int, ...], reveal_y: tuple[int, ...]
            ) -> tuple[Seen, dict[int, np.ndarray], int, dict[int, RefusedRequest]]:
    """Plays the split against real clients (revealers named by offset); returns what the
    server saw with the colluders' shares of the victim, the vectors, the victim and each
    refusing revealer's refusal."""
    ring = _ring(N)
    at = {d: ring[d % N] for d in range(-(N // 2), N // 2 + 1)}
    v = at[0]
    everyone = frozenset(range(N))
    s_x = everyone - {at[d] for d in LEFT_OUT_X}
    s_y = everyone - {at[d] for d in LEFT_OUT_Y}
    # each honest client signs one set; the colluders are asked for S_X here, S_Y below
    sets = {at[d]: s_x for d in (*sign_x, *colluders)} | {at[d]: s_y for d in sign_y}
    seen, x, clients = run(Plan(n=N, threshold=THRESHOLD, neighbours=K, sets=sets,
                                requests={u: [] for u in range(N)}))
    assert seen.refusals == [] and set(seen.uploads) == everyone  # every client masked
    for d in colluders:
        c = at[d]
        seen.signatures[(s_y, c)] = clients[c].identity.sign(
            consistency_payload(JOB, 0, DIGEST, s_y)).signature
    refusals: dict[int, RefusedRequest] = {}
    for offsets, survivors, dropped in ((reveal_x, s_x, frozenset()),
                                        (reveal_y, s_y, frozenset({v}))):
        sigs = {s: sig for (members, s), sig in seen.signatures.items() if members == survivors}
        for d in offsets:
            try:
                seen.take(clients[at[d]].unmask(UnmaskRequest(
                    job_id=JOB, round_id=0, question=Q, survivors=tuple(sorted(survivors)),
                    dropped=tuple(sorted(dropped)), signatures=sigs)))
            except RefusedRequest as exc:
                refusals[d] = exc
    for d in colluders:  # what each colluder holds of the victim after the round
        rnd = clients[at[d]]._round
        assert rnd is not None
        b_share, sk_share = rnd.held[v]
        seen.self_shares.setdefault(v, {})[at[d] + 1] = b_share
        seen.key_shares.setdefault(v, {})[at[d] + 1] = sk_share
    return seen, x, v, refusals


def test_the_split_is_the_one_the_clients_derive() -> None:
    """Offsets -7..7 are the victim's group of 15, with t_local = 11 of the job's t = 29, and
    the colluders are 2 t_local - g of it."""
    ring = _ring(N)
    groups = neighbour_groups(range(N), K, graph_seed(JOB, 0, DIGEST, range(N)))
    v = ring[0]
    assert groups[v] == {ring[d % N] for d in range(-7, 8)}
    t = job_threshold(THRESHOLD, N)
    t_local = local_threshold(t, N, len(groups[v]))
    assert (t, t_local, len(COLLUDERS)) == (29, 11, 2 * t_local - len(groups[v]))
    offsets = [*COLLUDERS, *SIGN_X, *SIGN_Y]
    assert sorted(offsets) == list(range(-21, 22))  # every client plays one part


def test_residual_2_t_local_minus_g_colluders_split_a_group_and_unmask_a_vector() -> None:
    """RESIDUAL (documented, S19): 7 colluders of the victim's group of 15 at t_local = 11
    (2 t_local - g), far fewer than t_local, give the server the victim's vector: every
    revealer finds t_local signatures of each owner's group on the set it signed."""
    seen, x, v, refusals = _attack(COLLUDERS, SIGN_X, SIGN_Y, REVEAL_X, REVEAL_Y)
    assert refusals == {}
    assert recovered(seen, x) == [v]


@pytest.mark.parametrize("camp", ["X", "Y"])
def test_one_colluder_fewer_leaves_a_camp_short_of_the_victims_group(camp: str) -> None:
    """6 colluders (2 t_local - g - 1): the colluder at offset 4 turns honest and signs one
    set (and reveals for it). The victim's group's 9 honest members sign one set each, so one
    set carries at most 10 signatures of the group; that camp's revealers refuse, and the
    server holds only one of the victim's two secrets."""
    colluders = COLLUDERS[:-1]
    sign_x, sign_y = SIGN_X, SIGN_Y
    reveal_x, reveal_y = REVEAL_X, REVEAL_Y
    if camp == "X":
        sign_x, reveal_x = (*SIGN_X, 4), (*REVEAL_X, 4)
    else:
        sign_y, reveal_y = (*SIGN_Y, 4), (*REVEAL_Y, 4)
    seen, x, v, refusals = _attack(colluders, sign_x, sign_y, reveal_x, reveal_y)
    group = {_ring(N)[d % N] for d in range(-7, 8)}
    signed = {camp_set: sum(1 for (members, s) in seen.signatures
                            if members == camp_set and s in group)
              for camp_set in {members for members, _ in seen.signatures}}
    assert sorted(signed.values()) == [10, 11]  # the victim's group on S_X and S_Y
    short = REVEAL_Y if camp == "X" else REVEAL_X
    assert set(short) <= set(refusals)
    assert {r.code for r in refusals.values()} == {"signatures"}
    assert all("signatures of client" in str(r) and "11 needed" in str(r)
               for r in refusals.values())
    assert recovered(seen, x) == []
    assert (seen.self_seed(v) is None) or (seen.mask_key(v) is None)
