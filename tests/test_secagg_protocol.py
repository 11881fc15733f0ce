"""Secure aggregation rounds: exact sums under dropouts, refusals, aborts, a curious server."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fedforest_secure.secagg as secagg
from fedforest_secure.errors import AbortedRound, InvalidMessage, ProtocolError, RefusedRequest
from fedforest_secure.secagg import (
    ClientStage,
    InProcessSecureSum,
    KeyMismatch,
    SecAggServer,
    SurvivorSet,
    UnmaskRequest,
    UnmaskResponse,
    Upload,
)
from fedforest_secure.secagg._primitives import _prg, _shamir

DIGEST = hashlib.sha256(b"task").digest()
L = 257


def _vectors(ids: list[int], seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {u: rng.integers(0, 2**64, L, dtype=np.uint64) for u in ids}


def _signed_request(agg: InProcessSecureSum, server: SecAggServer) -> UnmaskRequest:
    """Run the consistency step (every survivor signs U3) and return the unmask request."""
    survivor_set = server.request_signatures()
    for u in survivor_set.survivors:
        server.receive_signature(agg.clients[u].sign_survivors(survivor_set))
    return server.request_unmask()


def _sum(vecs: dict[int, np.ndarray], ids: object) -> np.ndarray:
    total = np.zeros(L, dtype=np.uint64)
    for u in ids:  # type: ignore[attr-defined]
        total += vecs[u]
    return total


def test_exported_names() -> None:
    assert set(secagg.__all__) == {
        "ClientStage", "InProcessSecureSum", "KeyAdvert", "KeyMismatch", "MaskedUpload",
        "RingCodec", "RoundSetup", "SecAggClient", "SecAggServer", "ServerStage", "ShareBundle",
        "ShareDelivery", "SurvivorSet", "SurvivorSignature", "UnmaskRequest", "UnmaskResponse",
        "Upload", "decode", "encode", "job_threshold", "parse"}


# -- exact sums ------------------------------------------------------------------------------
def test_every_dropout_pattern_of_five_clients() -> None:
    """K=5, t=3: every way of losing up to K - t = 2 clients, at either stage."""
    ids = list(range(5))
    vecs = _vectors(ids)
    agg = InProcessSecureSum(ids, threshold=3, job_id="job-1")
    patterns = 0
    for k in range(3):
        for lost in itertools.combinations(ids, k):
            for stages in itertools.product((0, 1), repeat=k):
                d1 = {u for u, s in zip(lost, stages, strict=True) if s == 0}
                d2 = {u for u, s in zip(lost, stages, strict=True) if s == 1}
                total = agg.sum(f"q{patterns}", DIGEST, vecs, drop_after_sharing=d1,
                                drop_after_upload=d2)
                assert np.array_equal(total, _sum(vecs, set(ids) - d1))
                patterns += 1
    assert patterns == 1 + 5 * 2 + 10 * 4


@settings(max_examples=12, deadline=None)
@given(data=st.data(), k=st.integers(min_value=3, max_value=9))
def test_random_dropouts_give_exact_sums(data: st.DataObject, k: int) -> None:
    ids = list(range(10, 10 + k))
    agg = InProcessSecureSum(ids, threshold=0.67, job_id="hyp")
    t = -(-67 * k // 100)
    lost = data.draw(st.lists(st.sampled_from(ids), unique=True, max_size=k - t))
    d1 = set(data.draw(st.sets(st.sampled_from(lost))) if lost else set())
    d2 = set(lost) - d1
    vecs = _vectors(ids, seed=k)
    total = agg.sum("q", DIGEST, vecs, drop_after_sharing=d1, drop_after_upload=d2)
    assert np.array_equal(total, _sum(vecs, set(ids) - d1))


def test_sparse_graph_sum_with_dropouts() -> None:
    ids = list(range(16))
    vecs = _vectors(ids)
    agg = InProcessSecureSum(ids, threshold=0.67, job_id="plus", neighbours=6)
    total = agg.sum("q", DIGEST, vecs, drop_after_sharing={3}, drop_after_upload={8})
    assert np.array_equal(total, _sum(vecs, set(ids) - {3}))
    # Each upload is masked with its ~6 neighbours only, not all 15 peers.
    bundles = [m for m in agg.transcript if isinstance(m, secagg.ShareBundle)]
    assert all(len(b.ciphertexts) == 6 for b in bundles)


def test_many_rounds_piggyback_next_adverts() -> None:
    ids = list(range(6))
    agg = InProcessSecureSum(ids, threshold=0.67, job_id="j")
    for r in range(3):
        vecs = _vectors(ids, seed=r)
        assert np.array_equal(agg.sum(f"r{r}", DIGEST, vecs), _sum(vecs, ids))
    adverts = [m for m in agg.transcript if isinstance(m, secagg.KeyAdvert)]
    # Only round 0 used a separate advertisement; later rounds rode on unmask responses.
    assert {a.round_id for a in adverts} == {0}
    riders = [m.next_advert for m in agg.transcript
              if isinstance(m, UnmaskResponse) and m.next_advert is not None]
    assert {a.round_id for a in riders} == {1, 2, 3}


# -- aborts and refusals ---------------------------------------------------------------------
def test_fewer_than_t_uploads_aborts_without_partial_sum() -> None:
    ids = list(range(5))
    agg = InProcessSecureSum(ids, threshold=4, job_id="j")
    with pytest.raises(AbortedRound, match="masked uploads"):
        agg.sum("q", DIGEST, _vectors(ids), drop_after_sharing={0, 1})
    assert agg.last_server is not None
    assert agg.last_server.stage is secagg.ServerStage.ABORTED
    with pytest.raises(ProtocolError):
        agg.last_server.finish()


def test_fewer_than_t_unmask_responses_aborts() -> None:
    ids = list(range(5))
    agg = InProcessSecureSum(ids, threshold=4, job_id="j")
    with pytest.raises(AbortedRound, match="signed the survivor set"):
        agg.sum("q", DIGEST, _vectors(ids), drop_after_upload={0, 1})
    # survivors that signed but never answer the unmask request: no partial sum either
    server = SecAggServer("j", 1, "q", DIGEST, L, 4, agg.directory)
    vecs = _vectors(ids)
    for c in agg.clients.values():
        server.receive_advert(c.advertise(1))
    setup = server.setup()
    for c in agg.clients.values():
        server.receive_shares(c.share_keys(setup))
    deliveries = server.deliver_shares()
    for u, c in agg.clients.items():
        server.receive_upload(*c.mask(deliveries[u], vecs[u]))
    req = _signed_request(agg, server)
    for u in (0, 1, 2):
        server.receive_unmask(agg.clients[u].unmask(req))
    with pytest.raises(AbortedRound, match="unmask responses"):
        server.finish()


def test_same_question_different_set_is_refused() -> None:
    ids = list(range(5))
    agg = InProcessSecureSum(ids, threshold=3, job_id="j")
    vecs = _vectors(ids)
    agg.sum("level 3 / histogram", DIGEST, vecs)
    agg.sum("level 3 / histogram", DIGEST, vecs)  # same set again: allowed (a retry)
    with pytest.raises(RefusedRequest, match="different set"):
        agg.sum("level 3 / histogram", DIGEST, vecs, drop_after_sharing={4})
    with pytest.raises(RefusedRequest, match="different set"):
        agg.sum("level 3 / histogram", DIGEST, {u: vecs[u] for u in ids[:4]})
    agg.sum("level 4 / histogram", DIGEST, vecs, drop_after_sharing={4})


@pytest.mark.parametrize("job_id", ["job-a\n", "job|a", ""])
def test_a_job_id_with_a_trailing_newline_is_refused_as_any_bad_one(job_id: str) -> None:
    from fedforest_secure.secagg._rounds import check_job_id

    with pytest.raises(ValueError) as refused:
        check_job_id(job_id)
    assert str(refused.value) == f"job_id must match ^[A-Za-z0-9._:-]{{1,128}}$, got {job_id!r}"
    assert check_job_id("job-a") == "job-a"


def test_fewer_than_three_clients_is_refused_or_rejected() -> None:
    with pytest.raises(ValueError):
        InProcessSecureSum([0, 1], threshold=2, job_id="j")
    with pytest.raises(ValueError, match="strict majority"):
        InProcessSecureSum(range(4), threshold=2, job_id="j")
    agg = InProcessSecureSum(range(4), threshold=3, job_id="j")
    vecs = _vectors([0, 1])
    with pytest.raises(AbortedRound, match="only 2 clients advertised keys, t=3"):
        agg.sum("q", DIGEST, vecs)


def _run_to_unmask(k: int = 5, t: int = 3, drop: frozenset[int] = frozenset()):  # type: ignore[no-untyped-def]
    agg = InProcessSecureSum(range(k), threshold=t, job_id="j")
    server = SecAggServer("j", 0, "q", DIGEST, L, t, agg.directory)
    vecs = _vectors(list(range(k)))
    for c in agg.clients.values():
        server.receive_advert(c.advertise(0))
    setup = server.setup()
    for c in agg.clients.values():
        server.receive_shares(c.share_keys(setup))
    deliveries = server.deliver_shares()
    for u, c in agg.clients.items():
        if u not in drop:
            server.receive_upload(*c.mask(deliveries[u], vecs[u]))
    return agg, server, vecs


def test_client_refuses_both_kinds_for_one_peer() -> None:
    agg, server, _ = _run_to_unmask(drop=frozenset({4}))
    honest = _signed_request(agg, server)
    assert honest.dropped == (4,)
    c0 = agg.clients[0]
    evil = honest.model_copy(update={"dropped": (3, 4)})
    with pytest.raises(RefusedRequest, match="both"):
        c0.unmask(evil)
    assert c0.stage is ClientStage.SIGNED  # refusing changed nothing
    c0.unmask(honest)
    # A second request that now calls survivor 3 dropped is refused (across requests).
    evil2 = honest.model_copy(update={"survivors": (0, 1, 2), "dropped": (3, 4)})
    with pytest.raises(RefusedRequest):
        c0.unmask(evil2)
    # Repeating the honest request is fine (lost response).
    assert c0.unmask(honest).self_mask_shares.keys() == {0, 1, 2, 3}


def test_client_refuses_fewer_than_t_survivors() -> None:
    agg, server, _ = _run_to_unmask(k=7, t=5)
    small = SurvivorSet(job_id="j", round_id=0, survivors=(0, 1, 2, 3))
    with pytest.raises(RefusedRequest, match="fewer than t=5"):
        agg.clients[0].sign_survivors(small)
    assert agg.clients[0].stage is ClientStage.MASKED


def test_client_refuses_sum_over_fewer_than_three() -> None:
    agg, server, _ = _run_to_unmask(k=3, t=2)
    tiny = SurvivorSet(job_id="j", round_id=0, survivors=(0, 1))
    with pytest.raises(RefusedRequest, match="< 3"):
        agg.clients[0].sign_survivors(tiny)


def test_reconstructed_key_mismatch_is_detected() -> None:
    agg, server, _ = _run_to_unmask(k=5, t=3, drop=frozenset({4}))
    req = _signed_request(agg, server)
    for u in (0, 1, 2):
        resp = agg.clients[u].unmask(req)
        if u == 0:  # corrupt one key share of the dropped client
            bad = _shamir.to_bytes((_shamir.from_bytes(resp.key_shares[4]) + 1) % _shamir.PRIME)
            resp = resp.model_copy(update={"key_shares": {4: bad}})
        server.receive_unmask(resp)
    with pytest.raises(KeyMismatch, match="masking private key of client 4"):
        server.finish()
    assert server.stage is secagg.ServerStage.ABORTED


def test_corrupt_self_mask_share_is_detected() -> None:
    agg, server, _ = _run_to_unmask(k=4, t=3)
    req = _signed_request(agg, server)
    for u in (0, 1, 2):
        resp = agg.clients[u].unmask(req)
        if u == 1:
            shares = dict(resp.self_mask_shares)
            shares[2] = _shamir.to_bytes(7)
            resp = resp.model_copy(update={"self_mask_shares": shares})
        server.receive_unmask(resp)
    with pytest.raises(KeyMismatch, match="self-mask seed of client 2"):
        server.finish()


@pytest.mark.parametrize(("table", "drop"), [("self_mask_shares", frozenset()),
                                             ("key_shares", frozenset({4}))])
def test_a_share_outside_the_field_is_refused_on_arrival(table: str,
                                                          drop: frozenset[int]) -> None:
    """66 bytes hold values above the field prime: such a share is refused when it arrives
    (nothing kept), not found when the masks are removed, so the others still finish."""
    agg, server, vecs = _run_to_unmask(k=5, t=3, drop=drop)
    req = _signed_request(agg, server)
    resp = agg.clients[0].unmask(req)
    shares = dict(getattr(resp, table))
    shares[min(shares)] = b"\xff" * _shamir.SHARE_BYTES
    with pytest.raises(InvalidMessage, match="outside the Shamir field"):
        server.receive_unmask(resp.model_copy(update={table: shares}))
    assert server.answered == frozenset()
    for u in req.survivors:
        server.receive_unmask(resp if u == 0 else agg.clients[u].unmask(req))
    assert np.array_equal(server.finish(), _sum(vecs, req.survivors))


def _bump(share: bytes, by: int = 1) -> bytes:
    """A share moved off its polynomial (what a site that alters the share it reveals sends)."""
    return _shamir.to_bytes((_shamir.from_bytes(share) + by) % _shamir.PRIME)


def _unmask_all(agg: InProcessSecureSum, server: SecAggServer, req: UnmaskRequest,
                bad_self: dict[int, tuple[int, ...]] | None = None,
                bad_key: dict[int, tuple[int, ...]] | None = None) -> None:
    """Every survivor answers ``req``; ``bad_self[w]`` / ``bad_key[w]`` are the owners whose
    self-mask / key share survivor ``w`` alters."""
    for u in req.survivors:
        resp = agg.clients[u].unmask(req)
        selfs, keys = dict(resp.self_mask_shares), dict(resp.key_shares)
        for owner in (bad_self or {}).get(u, ()):
            selfs[owner] = _bump(selfs[owner])
        for owner in (bad_key or {}).get(u, ()):
            keys[owner] = _bump(keys[owner])
        server.receive_unmask(resp.model_copy(update={"self_mask_shares": selfs,
                                                      "key_shares": keys}))


def test_one_corrupt_self_mask_share_among_more_than_t_recovers_the_sum_and_names_it() -> None:
    """The hunt's attack (5 sites, t = 4): client 0 adds 1 to its share of client 1's self-mask
    seed. The first 4 shares by index include it, so reconstructing from them fails; the server
    holds 5 and needs 4: it finds the 4 that match client 1's commitment, releases the exact
    sum, and names client 0 (not the victim) as the sender of the corrupt share."""
    agg, server, vecs = _run_to_unmask(k=5, t=4)
    req = _signed_request(agg, server)
    _unmask_all(agg, server, req, bad_self={0: (1,)})
    assert np.array_equal(server.finish(), _sum(vecs, range(5)))
    assert server.corrupt_shares == ((0, 1, "self-mask seed"),)
    assert "client 0 sent a corrupt share of client 1's self-mask seed" in server.corrupt_report()


def test_one_corrupt_key_share_of_a_dropped_client_recovers_the_sum_and_names_it() -> None:
    agg, server, vecs = _run_to_unmask(k=6, t=4, drop=frozenset({5}))
    req = _signed_request(agg, server)
    _unmask_all(agg, server, req, bad_key={1: (5,)})
    assert np.array_equal(server.finish(), _sum(vecs, range(5)))
    assert server.corrupt_shares == ((1, 5, "masking private key"),)


def test_a_key_share_shifted_into_the_clamped_bits_is_named_too() -> None:
    """X25519 ignores the top bit of a private key (bit 7 of its last byte, which is 2^7 of the
    big-endian integer that is shared): a share moved so that the key comes out 128 higher
    still gives the advertised public key. The server accepts only the key as it was made
    (clamped), so the shifted share is found and named, not used."""
    agg, server, vecs = _run_to_unmask(k=6, t=4, drop=frozenset({5}))
    raw = agg.clients[5]._round.keys.mask_private  # type: ignore[union-attr]
    assert raw[-1] & 0xC0 == 0x40  # made clamped: top bit clear, so +128 sets it
    req = _signed_request(agg, server)
    xs = (1, 2, 3, 4)  # clients 0-3 answer first by index; client 0's x is 1
    lagrange = _shamir.lagrange_at_zero(xs)[0]
    for u in req.survivors:
        resp = agg.clients[u].unmask(req)
        if u == 0:  # f(0) moves by lagrange * delta = 128
            delta = 128 * pow(lagrange, -1, _shamir.PRIME) % _shamir.PRIME
            resp = resp.model_copy(update={"key_shares": {5: _bump(resp.key_shares[5], delta)}})
        server.receive_unmask(resp)
    assert np.array_equal(server.finish(), _sum(vecs, range(5)))
    assert server.corrupt_shares == ((0, 5, "masking private key"),)


def test_corrupt_shares_no_t_subset_survives_abort_naming_the_candidates() -> None:
    """Two corrupt shares of one seed among 5 with t = 4: every 4 of them hold a corrupt one.
    No sum is released and the reason names the senders that may have sent them."""
    agg, server, _ = _run_to_unmask(k=5, t=4)
    req = _signed_request(agg, server)
    _unmask_all(agg, server, req, bad_self={0: (2,), 3: (2,)})
    with pytest.raises(KeyMismatch, match=r"self-mask seed of client 2") as err:
        server.finish()
    assert "clients 0, 1, 2, 3 and 4" in str(err.value)
    assert "no sum is released" in str(err.value)
    assert err.value.senders == frozenset(range(5))
    assert server.stage is secagg.ServerStage.ABORTED


def test_a_named_sender_is_in_the_abort_when_another_secret_cannot_be_recovered() -> None:
    """Client 1 corrupts its share of client 0's seed (found and named); clients 0 and 3
    corrupt theirs of client 2's seed (no 4 of 5 match): the abort names both findings."""
    agg, server, _ = _run_to_unmask(k=5, t=4)
    req = _signed_request(agg, server)
    _unmask_all(agg, server, req, bad_self={1: (0,), 0: (2,), 3: (2,)})
    with pytest.raises(KeyMismatch) as err:
        server.finish()
    assert "client 1 sent a corrupt share of client 0's self-mask seed" in str(err.value)
    assert "self-mask seed of client 2" in str(err.value)


# -- state machine and message checks --------------------------------------------------------
def test_out_of_order_and_replayed_messages() -> None:
    agg = InProcessSecureSum(range(4), threshold=3, job_id="j")
    server = SecAggServer("j", 0, "q", DIGEST, L, 3, agg.directory)
    c = agg.clients[0]
    vec = np.zeros(L, dtype=np.uint64)
    with pytest.raises(ProtocolError, match="stage"):
        server.request_unmask()
    with pytest.raises(ProtocolError, match="stage"):
        server.finish()
    adverts = [cl.advertise(0) for cl in agg.clients.values()]
    for a in adverts:
        server.receive_advert(a)
    with pytest.raises(ProtocolError, match="already advertised"):
        server.receive_advert(adverts[0])
    setup = server.setup()
    with pytest.raises(ProtocolError):
        server.receive_advert(adverts[0])
    bundle = c.share_keys(setup)
    with pytest.raises(ProtocolError, match="stage"):
        c.share_keys(setup)
    server.receive_shares(bundle)
    with pytest.raises(ProtocolError, match="already sent"):
        server.receive_shares(bundle)
    for u in (1, 2, 3):
        server.receive_shares(agg.clients[u].share_keys(setup))
    deliveries = server.deliver_shares()
    with pytest.raises(ProtocolError, match="stage"):
        c.unmask(UnmaskRequest(job_id="j", round_id=0, question="q", survivors=(0, 1, 2),
                               dropped=(), signatures={}))
    header, masked = c.mask(deliveries[0], vec)
    server.receive_upload(header, masked)
    with pytest.raises(ProtocolError, match="already uploaded"):
        server.receive_upload(header, masked)
    with pytest.raises(InvalidMessage):
        server.receive_upload(header.model_copy(update={"sender": 1}), masked[:-1])
    with pytest.raises(ProtocolError, match="another job or round"):
        server.receive_upload(header.model_copy(update={"round_id": 1, "sender": 1}), masked)


def test_forged_advert_and_tampered_share_are_invalid() -> None:
    agg = InProcessSecureSum(range(4), threshold=3, job_id="j")
    server = SecAggServer("j", 0, "q", DIGEST, L, 3, agg.directory)
    a = agg.clients[0].advertise(0)
    with pytest.raises(InvalidMessage):
        server.receive_advert(a.model_copy(update={"mask_key": bytes(32)}))
    with pytest.raises(InvalidMessage):
        server.receive_advert(a.model_copy(update={"client_id": 1}))
    server.receive_advert(a)
    for u in (1, 2, 3):
        server.receive_advert(agg.clients[u].advertise(0))
    setup = server.setup()
    for u in range(4):
        server.receive_shares(agg.clients[u].share_keys(setup))
    deliveries = server.deliver_shares()
    d = deliveries[0]
    ct = bytearray(d.ciphertexts[1])
    ct[-1] ^= 1
    with pytest.raises(InvalidMessage):
        agg.clients[0].mask(d.model_copy(update={"ciphertexts": {**d.ciphertexts, 1: bytes(ct)}}),
                            np.zeros(L, dtype=np.uint64))
    # A ciphertext meant for client 2 relayed to client 0 does not open either.
    with pytest.raises(InvalidMessage):
        agg.clients[0].mask(deliveries[2].model_copy(update={"recipient": 0}),
                            np.zeros(L, dtype=np.uint64))
    # Failed attempts changed nothing: the genuine delivery still works.
    header, _ = agg.clients[0].mask(d, np.zeros(L, dtype=np.uint64))
    assert header.sender == 0


def test_a_peer_share_that_does_not_authenticate_names_its_sender() -> None:
    """A malicious site sends correctly addressed share ciphertexts that are all zeros: the
    honest recipient cannot mask, and its error names the sender (``peer``), not just "a
    share", so the round's refusal can accuse it (threat_model.md §2.4)."""
    agg = InProcessSecureSum(range(4), threshold=3, job_id="j")
    server = SecAggServer("j", 0, "q", DIGEST, L, 3, agg.directory)
    for u in range(4):
        server.receive_advert(agg.clients[u].advertise(0))
    setup = server.setup()
    for u in range(4):
        bundle = agg.clients[u].share_keys(setup)
        if u == 2:  # the malicious site
            bundle = bundle.model_copy(update={"ciphertexts": {
                v: bytes(len(ct)) for v, ct in bundle.ciphertexts.items()}})
        server.receive_shares(bundle)
    deliveries = server.deliver_shares()
    for u in (0, 1, 3):
        with pytest.raises(InvalidMessage,
                           match="the share ciphertext of client 2 does not authenticate") as e:
            agg.clients[u].mask(deliveries[u], np.zeros(L, dtype=np.uint64))
        assert e.value.peer == 2
        assert agg.clients[u].stage is ClientStage.SHARED  # nothing masked, nothing burnt
    # an error of the server's own message accuses no peer
    with pytest.raises(InvalidMessage) as e:
        agg.clients[0].mask(deliveries[1], np.zeros(L, dtype=np.uint64))
    assert e.value.peer is None


@pytest.mark.parametrize("key", ["enc_key", "mask_key"])
def test_a_peer_advertising_an_unusable_key_is_named(key: str) -> None:
    """A malicious site signs an advert whose encryption or masking key is a low-order point
    (the all-zero key). The server refuses the advert, so the site stays out of the round's
    roster; a server that relays it anyway: the honest sites cannot encrypt their shares to it,
    or derive its pairwise mask, and each one's error names it (``peer``), the only one that
    could have signed that key, instead of a bare "bad masking key" or a library error."""
    from fedforest_secure.secagg._rounds import advert_payload

    agg = InProcessSecureSum(range(4), threshold=3, job_id="j")
    server = SecAggServer("j", 0, "q", DIGEST, L, 3, agg.directory)
    for u in range(4):
        advert = agg.clients[u].advertise(0)
        if u == 2:
            advert = advert.model_copy(update={key: bytes(32)})
            payload = advert_payload("j", 0, 2, advert.enc_key, advert.mask_key,
                                     advert.self_mask_commit)
            advert = advert.model_copy(update={
                "signature": agg.clients[2].identity.sign(payload).signature})
            agg.clients[2]._keys[0].advert = advert  # the attacker shares under this advert
            what = "encryption" if key == "enc_key" else "masking"
            with pytest.raises(InvalidMessage, match=f"client 2 advertised a {what} key no "
                               "key agreement accepts"):
                server.receive_advert(advert)
            server._adverts[2] = advert  # a malicious server relays it all the same
            continue
        server.receive_advert(advert)
    setup = server.setup()
    what = "encryption" if key == "enc_key" else "masking"
    match = f"the {what} key client 2 advertised is not a usable X25519 key"
    if key == "enc_key":
        for u in (0, 1, 3):
            with pytest.raises(InvalidMessage, match=match) as e:
                agg.clients[u].share_keys(setup)
            assert e.value.peer == 2
        return
    for u in range(4):
        server.receive_shares(agg.clients[u].share_keys(setup))
    deliveries = server.deliver_shares()
    for u in (0, 1, 3):
        with pytest.raises(InvalidMessage, match=match) as e:
            agg.clients[u].mask(deliveries[u], np.zeros(L, dtype=np.uint64))
        assert e.value.peer == 2


def test_json_round_trip_and_parse_errors() -> None:
    agg = InProcessSecureSum(range(3), threshold=2, job_id="j")
    a = agg.clients[0].advertise(0)
    assert secagg.parse(secagg.KeyAdvert, a.model_dump_json()) == a
    for bad in (b"{}", b"not json", a.model_dump_json().replace('"j"', '"j|x"'),
                a.model_dump_json()[:-1] + ',"extra":1}'):
        with pytest.raises(InvalidMessage):
            secagg.parse(secagg.KeyAdvert, bad)


# -- what a curious server learns ------------------------------------------------------------
def test_curious_server_cannot_recover_any_vector() -> None:
    ids = list(range(6))
    vecs = _vectors(ids, seed=5)
    agg = InProcessSecureSum(ids, threshold=4, job_id="curious")
    total = agg.sum("q", DIGEST, vecs, drop_after_sharing={5})
    survivors = [0, 1, 2, 3, 4]
    uploads = {m.header.sender: m.vector for m in agg.transcript if isinstance(m, Upload)}
    responses = [m for m in agg.transcript if isinstance(m, UnmaskResponse)]
    assert set(uploads) == set(survivors)
    # Everything revealed: self-mask seeds of survivors (reconstructed from shares).
    self_masks = {}
    for u in survivors:
        shares = {r.sender + 1: _shamir.from_bytes(r.self_mask_shares[u]) for r in responses}
        seed = _shamir.combine(shares, 4).to_bytes(32, "big")
        self_masks[u] = _prg.expand(seed, L)
    for u in survivors:
        assert not np.array_equal(uploads[u], vecs[u])
        assert not np.array_equal(uploads[u] - self_masks[u], vecs[u])
        # Nothing of the plaintext survives, entry by entry.
        assert np.count_nonzero(uploads[u] - self_masks[u] == vecs[u]) == 0
    # Any proper subset (>= 1 client) of uploads, minus its self-masks, is not its sum.
    for k in range(1, len(survivors)):
        for subset in itertools.combinations(survivors, k):
            partial = np.zeros(L, dtype=np.uint64)
            for u in subset:
                partial += uploads[u] - self_masks[u]
            assert not np.array_equal(partial, _sum(vecs, subset))
    assert np.array_equal(total, _sum(vecs, survivors))


def test_masks_are_fresh_each_round_and_bound_to_the_task() -> None:
    ids = list(range(4))
    vecs = {u: np.zeros(L, dtype=np.uint64) for u in ids}
    agg = InProcessSecureSum(ids, threshold=3, job_id="fresh")
    agg.sum("a", DIGEST, vecs)
    agg.sum("b", DIGEST, vecs)
    agg.sum("c", hashlib.sha256(b"other task").digest(), vecs)
    ups = [m for m in agg.transcript if isinstance(m, Upload) and m.header.sender == 0]
    assert len(ups) == 3
    for x, y in itertools.combinations(ups, 2):
        assert np.count_nonzero(x.vector == y.vector) == 0
        assert not np.array_equal(x.vector - y.vector, (x.vector - y.vector)[0])


def test_task_digest_changes_the_pairwise_masks() -> None:
    """Same round keys, only the task digest differs: every pairwise mask changes."""
    from fedforest_secure.secagg._primitives import _kdf
    from fedforest_secure.secagg._rounds import mask_info

    a, b = _kdf.generate_private_key(), _kdf.generate_private_key()
    s1 = _kdf.derive_seed(a, _kdf.public_key(b), mask_info("j", 0, 0, 1, DIGEST))
    s2 = _kdf.derive_seed(a, _kdf.public_key(b), mask_info("j", 0, 0, 1, bytes(32)))
    assert s1 != s2
    assert np.count_nonzero(_prg.expand(s1, L) == _prg.expand(s2, L)) == 0


def _round_to_masking(k: int, n: int, job: str):  # type: ignore[no-untyped-def]
    agg = InProcessSecureSum(range(k), threshold=0.67, job_id=job)
    server = SecAggServer(job, 0, "q", DIGEST, n, 0.67, agg.directory)
    for c in agg.clients.values():
        server.receive_advert(c.advertise(0))
    setup = server.setup()
    for c in agg.clients.values():
        server.receive_shares(c.share_keys(setup))
    return agg, server, server.deliver_shares()


def test_inplace_masking_gives_the_same_exact_sum() -> None:
    """``mask(..., inplace=True)`` overwrites the caller's vector with its masked value and the
    unmasked sum is still exact (the client runner masks its fresh encoding in place)."""
    k, n = 4, 1000
    agg, server, deliveries = _round_to_masking(k, n, "inplace")
    rng = np.random.default_rng(7)
    plain = {u: rng.integers(0, 2**63, n, dtype=np.uint64) for u in range(k)}
    for u, c in agg.clients.items():
        vec = plain[u].copy()
        header, masked = c.mask(deliveries[u], vec, inplace=True)
        assert masked is vec and not np.array_equal(vec, plain[u])
        server.receive_upload(header, masked)
    req = _signed_request(agg, server)
    for u in req.survivors:
        server.receive_unmask(agg.clients[u].unmask(req))
    expected = np.zeros(n, dtype=np.uint64)
    for v in plain.values():
        expected += v
    np.testing.assert_array_equal(server.finish(), expected)


def test_fused_encode_and_mask_gives_the_exact_sum_of_encodings() -> None:
    """``mask(delivery, floats, codec=codec)`` uploads what ``mask(delivery, codec.encode(x))``
    would: the unmasked sum equals the sum of the clients' encodings, bit for bit."""
    k, n = 5, (1 << 14) + 123  # more than one block
    codec = secagg.RingCodec(np.full(n, 20), np.full(n, 100.0), k)
    agg, server, deliveries = _round_to_masking(k, n, "fused")
    rng = np.random.default_rng(11)
    plain = {u: rng.uniform(-100, 100, n) for u in range(k)}
    for u, c in agg.clients.items():
        if u % 2:
            header, masked = c.mask(deliveries[u], plain[u], codec=codec)
        else:
            header, masked = c.mask(deliveries[u], codec.encode(plain[u]))
        assert not np.array_equal(masked, codec.encode(plain[u]))
        server.receive_upload(header, masked)
    req = _signed_request(agg, server)
    for u in req.survivors:
        server.receive_unmask(agg.clients[u].unmask(req))
    expected = np.zeros(n, dtype=np.uint64)
    for x in plain.values():
        expected += codec.encode(x)
    total = server.finish()
    np.testing.assert_array_equal(total, expected)
    exact = np.sum(list(plain.values()), axis=0)
    assert (np.abs(codec.decode(total) - exact) <= codec.error_bound() + 1e-9).all()


def test_fused_masking_of_an_out_of_range_value_burns_the_round_keys() -> None:
    from fedforest_secure.errors import OverflowRisk

    k, n = 3, 3 * (1 << 14)
    codec = secagg.RingCodec(np.full(n, 8), np.full(n, 1.0), k)
    agg, _, deliveries = _round_to_masking(k, n, "burn")
    bad = np.zeros(n)
    bad[-1] = 2.0  # in the last block: earlier blocks were already masked
    with pytest.raises(OverflowRisk, match=rf"value\[{n - 1}\]"):
        agg.clients[0].mask(deliveries[0], bad, codec=codec)
    # no second vector under the same masks: the client can no longer upload this round
    with pytest.raises(ProtocolError, match="consumed"):
        agg.clients[0].mask(deliveries[0], np.zeros(n), codec=codec)
    with pytest.raises(ValueError, match="codec encodes"):
        agg.clients[1].mask(deliveries[1], np.zeros(n),
                            codec=secagg.RingCodec(np.full(4, 8), np.full(4, 1.0), k))


@pytest.mark.parametrize("carrier", ["upload", "unmask response"])
def test_a_next_advert_riding_on_another_clients_message_is_refused(carrier: str) -> None:
    """A client's upload or unmask response carries its own next-round advert only: one that
    carries a peer's advert is refused, and the server files no advert for that peer."""
    agg, server, delivered = _round_to_masking(4, 3, "j")
    peer_advert = agg.clients[2].advertise(1)  # client 2's own advert for the next round
    refused = "client 1's message carries the next advert of client 2"
    if carrier == "upload":
        header, masked = agg.clients[1].mask(delivered[1], np.arange(3, dtype=np.uint64),
                                             next_advert=peer_advert)
        with pytest.raises(InvalidMessage, match=refused):
            server.receive_upload(header, masked)
    else:
        for u, c in agg.clients.items():
            server.receive_upload(*c.mask(delivered[u], np.arange(3, dtype=np.uint64)))
        response = agg.clients[1].unmask(_signed_request(agg, server), next_advert=peer_advert)
        with pytest.raises(InvalidMessage, match=refused):
            server.receive_unmask(response)
    assert 2 not in server.next_adverts


def test_a_kept_signature_verdict_holds_only_for_the_same_key_payload_and_signature() -> None:
    """Verdicts of Ed25519 checks are kept for repeats (several clients in one process check
    the same adverts), keyed by all three byte strings: a signature checked good for one
    payload, key or form is refused for another, and a bad one stays bad when asked again."""
    from nacl.signing import SigningKey

    from fedforest_secure.secagg._verify import survivor_signature_ok

    key, other = SigningKey.generate(), SigningKey.generate()
    directory = {0: bytes(key.verify_key), 1: bytes(other.verify_key)}
    payload = b"survivors of round 3: 0, 1, 2"
    sig = key.sign(payload).signature
    assert survivor_signature_ok(directory, 0, sig, payload)
    assert survivor_signature_ok(directory, 0, sig, payload)  # kept: the same verdict
    assert not survivor_signature_ok(directory, 0, sig, payload + b", 3")
    assert not survivor_signature_ok(directory, 1, sig, payload)
    flipped = bytes([sig[0] ^ 1]) + sig[1:]
    for _ in range(2):
        assert not survivor_signature_ok(directory, 0, flipped, payload)
    assert not survivor_signature_ok(directory, 0, bytearray(flipped), payload)
    assert survivor_signature_ok(directory, 0, sig, payload)
