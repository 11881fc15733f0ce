"""The complete graph's bound on colluding clients against an actively malicious server:
fewer than ``2t - n`` (threat_model.md §2.2, §2.3, S15).

Colluding clients sign any survivor set the server shows them. The server splits the honest
clients into two camps and shows each its own set: the victim's camp a set that keeps the
victim (they reveal its self-mask share), the other camp a set that "drops" it (they reveal
its masking-key share). Each honest client signs one set and reveals one kind of share per
peer, as its rules say. Both sets carry ``t`` signatures once ``c + h_X >= t`` and
``c + h_Y >= t`` with ``h_X + h_Y <= n - c``, that is once ``c >= 2t - n`` (Bonawitz et al.
2017, the active-server bound); then the colluders' own shares complete both secrets.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from nacl.signing import SigningKey

from fedforest_secure.errors import RefusedRequest
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind, question_key
from fedforest_secure.secagg import (
    SecAggClient,
    SecAggServer,
    SurvivorSet,
    UnmaskRequest,
    UnmaskResponse,
)
from fedforest_secure.secagg._primitives import _kdf, _prg, _shamir
from fedforest_secure.secagg._rounds import (
    consistency_payload,
    job_threshold,
    mask_info,
    self_mask_commitment,
)
from fedforest_secure.secagg.driver import InProcessSecureSum

JOB, L, N, R = "job-collude", 8, 10, 0
TASK = Task(job_id=JOB, round_id=R, kind=TaskKind.HISTOGRAM, level=0, params={"stats": "count"},
            layout=(Block("hist", (L, 1), (StatKind.COUNT,)),))
DIGEST, Q = TASK.digest(), question_key(TASK)
T = job_threshold(0.67, N)  # the secure profile's threshold: 7 of 10
VICTIM = 0


def _masked_round() -> tuple[dict[int, SigningKey], dict[int, SecAggClient], dict, dict,
                              dict[int, np.ndarray]]:
    """Every client of the round masks its vector (the server only relays, up to here)."""
    ids = {u: SigningKey.generate() for u in range(N)}
    directory = {u: bytes(k.verify_key) for u, k in ids.items()}
    clients = {u: SecAggClient(u, JOB, ids[u], directory, n_clients=N, threshold=0.67)
               for u in range(N)}
    rng = np.random.default_rng(7)
    x = {u: rng.integers(0, 2**64, L, dtype=np.uint64) for u in range(N)}
    srv = SecAggServer(JOB, R, Q, DIGEST, L, 0.67, directory)
    adverts = {}
    for u, c in clients.items():
        adverts[u] = c.advertise(R)
        srv.receive_advert(adverts[u])
    srv.setup()
    for u, c in clients.items():
        srv.receive_shares(c.share_keys(srv.setup_for(u)))
    delivered = srv.deliver_shares()
    uploads = {u: c.mask(delivered[u], x[u].copy())[1] for u, c in clients.items()}
    return ids, clients, adverts, uploads, x


def _split(camps: tuple[list[int], list[int]], colluders: list[int]
           ) -> tuple[dict[int, int], dict[int, int], list[RefusedRequest], dict, dict]:
    """The server shows camp X (with the victim) the survivor set of every client and camp Y
    the set of every client but the victim; the colluders sign both. Returns the victim's
    self-mask and key shares the server then holds (honest reveals plus the colluders' own),
    and the refusals."""
    ids, clients, adverts, uploads, x = _masked_round()
    assert VICTIM in camps[0]
    sets = [frozenset(range(N)), frozenset(range(N)) - {VICTIM}]
    sigs: list[dict[int, bytes]] = [{}, {}]
    for i, (camp, members) in enumerate(zip(camps, sets, strict=True)):
        for u in camp:  # an honest client signs the one set it is shown
            sigs[i][u] = clients[u].sign_survivors(SurvivorSet(
                job_id=JOB, round_id=R, survivors=tuple(sorted(members)))).signature
        for u in colluders:
            sigs[i][u] = ids[u].sign(consistency_payload(JOB, R, DIGEST, members)).signature
    self_sh: dict[int, int] = {}
    key_sh: dict[int, int] = {}
    refusals: list[RefusedRequest] = []
    for i, (camp, members) in enumerate(zip(camps, sets, strict=True)):
        dropped = tuple(sorted(set(range(N)) - members))
        for u in camp:
            try:
                resp: UnmaskResponse = clients[u].unmask(UnmaskRequest(
                    job_id=JOB, round_id=R, question=Q, survivors=tuple(sorted(members)),
                    dropped=dropped, signatures=sigs[i]))
            except RefusedRequest as exc:
                refusals.append(exc)
                continue
            if VICTIM in resp.self_mask_shares:
                self_sh[u + 1] = _shamir.from_bytes(resp.self_mask_shares[VICTIM])
            if VICTIM in resp.key_shares:
                key_sh[u + 1] = _shamir.from_bytes(resp.key_shares[VICTIM])
    for u in colluders:  # what each colluder holds of the victim after the round
        rnd = clients[u]._round
        assert rnd is not None
        b_share, sk_share = rnd.held[VICTIM]
        self_sh[u + 1], key_sh[u + 1] = b_share, sk_share
    return self_sh, key_sh, refusals, {"adverts": adverts, "uploads": uploads}, x


def _unmask_victim(self_sh: dict[int, int], key_sh: dict[int, int], seen: dict
                   ) -> np.ndarray:
    adverts, uploads = seen["adverts"], seen["uploads"]
    b0 = _shamir.combine(self_sh, T).to_bytes(32, "big")
    sk0 = _shamir.combine(key_sh, T).to_bytes(32, "big")
    assert self_mask_commitment(JOB, R, VICTIM, b0) == adverts[VICTIM].self_mask_commit
    assert _kdf.public_key(sk0) == adverts[VICTIM].mask_key
    guess = uploads[VICTIM].copy()
    plus, minus = [], [b0]
    for v in range(N):
        if v != VICTIM:  # the victim added +PRG for a higher peer, -PRG for a lower one
            seed = _kdf.derive_seed(sk0, adverts[v].mask_key, mask_info(JOB, R, VICTIM, v, DIGEST))
            (minus if v > VICTIM else plus).append(seed)
    _prg.apply_masks(guess, plus, minus)
    return guess


def test_residual_2t_minus_n_colluders_split_the_honest_clients_and_unmask_a_vector() -> None:
    """RESIDUAL (documented, S15): 4 colluders of 10 at t = 7 (2t - n), far fewer than t - 1,
    give the server the victim's vector. DP (``secure-dp``) is the only guard."""
    colluders = [6, 7, 8, 9]
    assert len(colluders) == 2 * T - N
    self_sh, key_sh, refusals, seen, x = _split(([0, 1, 2], [3, 4, 5]), colluders)
    assert refusals == []
    assert len(self_sh) >= T and len(key_sh) >= T
    assert np.array_equal(_unmask_victim(self_sh, key_sh, seen), x[VICTIM])


@pytest.mark.parametrize("camps", [([0, 1, 2, 3], [4, 5, 6]), ([0, 1, 2], [3, 4, 5, 6])])
def test_fewer_than_2t_minus_n_colluders_leave_one_camp_short_of_t_signatures(
        camps: tuple[list[int], list[int]]) -> None:
    """3 colluders (2t - n - 1): seven honest clients cannot make two camps of four, so one
    set carries 6 signatures and its camp refuses to reveal (the rule "t signatures of the
    roster on the set I signed"); the server gets t shares of one of the victim's two secrets
    only."""
    colluders = [7, 8, 9]
    self_sh, key_sh, refusals, _, _ = _split(camps, colluders)
    short = min(camps, key=len)
    assert len(refusals) == len(short)
    assert {r.code for r in refusals} == {"signatures"}
    assert all(f"only {len(short) + len(colluders)} signatures" in str(r) for r in refusals)
    assert (len(self_sh) >= T) != (len(key_sh) >= T)


@pytest.mark.parametrize(("n", "threshold"), [(3, 0.67), (5, 1.0)])
def test_at_t_equal_n_t_minus_1_colluders_below_2t_minus_n_get_the_last_vector(
        n: int, threshold: float) -> None:
    """The single-vector bound is ``c < min(2t - n, t - 1)``: where ``t = n`` (3 sites at
    the secure profiles' 0.67, or any job at threshold 1.0) ``2t - n = n`` and ``t - 1``
    colluders, fewer than ``2t - n``, subtract their vectors from the one legitimate sum of a
    server that follows the protocol and hold the last site's vector."""
    t = job_threshold(threshold, n)
    assert t == n and t - 1 < 2 * t - n
    rng = np.random.default_rng(0)
    x = {u: rng.integers(0, 2**64, L, dtype=np.uint64) for u in range(n)}
    total = InProcessSecureSum(range(n), threshold, record=False).sum(
        "q", hashlib.sha256(b"q").digest(), x)
    assert np.array_equal(total - sum(x[u] for u in range(1, n)), x[0])
