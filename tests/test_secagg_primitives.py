"""Secure-aggregation primitives: Shamir, PRG, HKDF (cross-checked known answers), uniformity."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from Crypto.Cipher import AES
from nacl.bindings import crypto_scalarmult, crypto_scalarmult_base

from fedforest_secure.secagg._primitives import _kdf, _prg, _shamir
from fedforest_secure.secagg._rounds import mask_info, neighbour_groups, resolve_threshold

VECTORS = Path(__file__).parent / "vectors"


# -- Shamir ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("t", "n"), [(1, 3), (2, 3), (3, 5), (4, 6)])
def test_shamir_every_t_subset_reconstructs(t: int, n: int) -> None:
    secret = int.from_bytes(hashlib.sha256(b"secret %d %d" % (t, n)).digest(), "big")
    xs = list(range(1, n + 1))
    shares = _shamir.split(secret, t, xs)
    for subset in itertools.combinations(xs, t):
        assert _shamir.combine({x: shares[x] for x in subset}, t) == secret
    if t > 1:
        for subset in itertools.combinations(xs, t - 1):
            part = {x: shares[x] for x in subset}
            with pytest.raises(ValueError, match="need"):
                _shamir.combine(part, t)
            # Interpolating t-1 points of a degree t-1 polynomial gives a wrong secret.
            assert _shamir.combine(part, t - 1) != secret


def test_shamir_split_from_parts_known_answer() -> None:
    # f(x) = 42 + 7x + 11x^2
    assert _shamir._split_from_parts(42, 3, [1, 2, 3], [7, 11]) == {1: 60, 2: 100, 3: 162}
    assert _shamir.combine({1: 60, 2: 100, 3: 162}, 3) == 42


def test_shamir_interpolate_evaluates_the_dealt_polynomial_anywhere() -> None:
    # f(x) = 42 + 7x + 11x^2 from any 3 of its points, at 0, at a share's x and elsewhere
    shares = _shamir._split_from_parts(42, 3, [1, 2, 3, 4, 9], [7, 11])
    for subset in itertools.combinations(sorted(shares), 3):
        points = [(x, shares[x]) for x in subset]
        assert _shamir.interpolate(points, 0) == 42
        assert all(_shamir.interpolate(points, x) == y for x, y in shares.items())
        assert _shamir.interpolate(points, 5) == 42 + 35 + 275
    with pytest.raises(ValueError, match="distinct"):
        _shamir.interpolate([(1, 60), (1, 60)], 0)


def test_x25519_keys_are_made_clamped() -> None:
    for _ in range(8):
        key = _kdf.generate_private_key()
        assert _kdf.is_clamped(key)
        bumped = key[:31] + bytes([key[31] | 0x80])  # the top bit, which X25519 ignores
        assert _kdf.public_key(bumped) == _kdf.public_key(key)
        assert not _kdf.is_clamped(bumped)


def test_shamir_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        _shamir.split(_shamir.PRIME, 2, [1, 2])
    with pytest.raises(ValueError):
        _shamir.split(1, 3, [1, 2])
    with pytest.raises(ValueError):
        _shamir.split(1, 2, [1, 1])
    with pytest.raises(ValueError):
        _shamir.split(1, 2, [0, 1])
    with pytest.raises(ValueError):
        _shamir.from_bytes(b"\x00" * 65)
    with pytest.raises(ValueError):
        _shamir.from_bytes(b"\xff" * 66)
    assert _shamir.from_bytes(_shamir.to_bytes(12345)) == 12345


# -- PRG -------------------------------------------------------------------------------------
def test_prg_known_answers_cross_checked_with_pycryptodome() -> None:
    data = json.loads((VECTORS / "secagg_prg.json").read_text())
    assert len(data["vectors"]) >= 4
    for vec in data["vectors"]:
        seed, n = bytes.fromhex(vec["seed"]), vec["length"]
        expected = np.array([int(w) for w in vec["words"]], dtype=np.uint64)
        assert np.array_equal(_prg.expand(seed, n), expected)
        independent = AES.new(seed[:16], AES.MODE_CTR, nonce=b"",
                              initial_value=seed[16:]).encrypt(bytes(8 * n))
        assert np.array_equal(np.frombuffer(independent, dtype="<u8"), expected)


def test_prg_keystream_depends_on_both_halves_of_the_seed() -> None:
    seed = bytes(range(32))
    base = _prg.expand(seed, 8)
    for flip in (0, 15, 16, 31):  # a bit of the AES key, a bit of the initial counter block
        other = bytearray(seed)
        other[flip] ^= 1
        assert np.count_nonzero(_prg.expand(bytes(other), 8) == base) == 0


def test_prg_add_subtract_in_place_wraps() -> None:
    seed = bytes(range(32))
    exp = _prg.Expander(1000)
    acc = np.full(1000, 2**64 - 1, dtype=np.uint64)
    exp.add(seed, acc)
    assert np.array_equal(acc, _prg.expand(seed, 1000) - np.uint64(1))
    exp.subtract(seed, acc)
    assert (acc == np.uint64(2**64 - 1)).all()
    with pytest.raises(ValueError):
        exp.add(bytes(16), acc)
    with pytest.raises(ValueError):
        exp.add(seed, np.zeros(999, dtype=np.uint64))


# -- HKDF ------------------------------------------------------------------------------------
def _manual_hkdf(ikm: bytes, info: bytes, length: int) -> bytes:
    prk = hmac.new(bytes(32), ikm, hashlib.sha256).digest()  # salt absent = HashLen zeros
    okm, block = b"", b""
    for i in range(1, math.ceil(length / 32) + 1):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        okm += block
    return okm[:length]


def test_hkdf_known_answers_cross_checked() -> None:
    data = json.loads((VECTORS / "secagg_hkdf.json").read_text())
    assert len(data["vectors"]) >= 3
    for vec in data["vectors"]:
        a, b = bytes.fromhex(vec["private_a"]), bytes.fromhex(vec["private_b"])
        digest = bytes.fromhex(vec["task_digest"])
        info = mask_info(vec["job_id"], vec["round_id"], vec["a"], vec["b"], digest)
        assert info.hex() == vec["info"]
        assert info.startswith(b"fedforest/v1/mask|" + vec["job_id"].encode() + b"|")
        # Independent X25519 (libsodium through pynacl) and HKDF (hmac by hand).
        assert crypto_scalarmult_base(a).hex() == vec["public_a"]
        assert crypto_scalarmult(a, bytes.fromhex(vec["public_b"])).hex() == vec["shared"]
        assert _manual_hkdf(bytes.fromhex(vec["shared"]), info, 32).hex() == vec["seed"]
        # Ours, both directions of the ordered pair.
        assert _kdf.derive_seed(a, _kdf.public_key(b), info).hex() == vec["seed"]
        assert _kdf.derive_seed(b, _kdf.public_key(a), info).hex() == vec["seed"]


def test_mask_info_is_ordered_and_bound_to_context() -> None:
    d = bytes(32)
    assert mask_info("j", 1, 2, 5, d) == mask_info("j", 1, 5, 2, d)
    assert mask_info("j", 1, 2, 5, d) != mask_info("j", 2, 2, 5, d)
    assert mask_info("j", 1, 2, 5, d) != mask_info("j", 1, 2, 5, b"\x01" * 32)
    with pytest.raises(ValueError):
        mask_info("j", 1, 3, 3, d)


def test_low_order_point_is_rejected() -> None:
    with pytest.raises(ValueError):
        _kdf.derive_seed(bytes(range(32)), bytes(32), b"info")


# -- uniformity ------------------------------------------------------------------------------
def test_masked_upload_bytes_look_uniform() -> None:
    """Chi-square over byte values of one masked vector of constant input (fixed seed).

    255 degrees of freedom; the 1e-6 upper quantile is about 393, so a failure of a correct
    implementation has probability ~1e-6 (and the seed is fixed, so the test is deterministic).
    A non-uniform vector (e.g. the plaintext, or a mask of small integers) fails by a wide margin.
    """
    n = 1 << 16
    x = np.full(n, 1234, dtype=np.uint64)
    seed = hashlib.sha256(b"chi-square").digest()
    masked = x.copy()
    _prg.Expander(n).add(seed, masked)

    def chi2(arr: np.ndarray) -> float:
        counts = np.bincount(arr.view(np.uint8), minlength=256).astype(float)
        expected = counts.sum() / 256
        return float(((counts - expected) ** 2 / expected).sum())

    assert chi2(masked) < 393.0
    bits = np.unpackbits(masked.view(np.uint8)).reshape(-1, 64).mean(axis=0)
    assert np.abs(bits - 0.5).max() < 0.02  # sd per bit is 0.002: 10 sigma
    assert chi2(x) > 10_000
    assert chi2(x + np.arange(n, dtype=np.uint64)) > 10_000


# -- graph and threshold ---------------------------------------------------------------------
def test_neighbour_graph_is_symmetric_deterministic_and_seeded() -> None:
    ids = list(range(30))
    g1 = neighbour_groups(ids, 6, b"a" * 32)
    assert g1 == neighbour_groups(ids, 6, b"a" * 32)
    assert g1 != neighbour_groups(ids, 6, b"b" * 32)
    assert all(len(g) == 7 and u in g for u, g in g1.items())
    assert all(u in g1[v] for u, g in g1.items() for v in g)
    full = neighbour_groups(ids, None, b"a" * 32)
    assert all(g == frozenset(ids) for g in full.values())


def test_resolve_threshold() -> None:
    assert resolve_threshold(0.67, 10) == 7
    assert resolve_threshold(0.7, 10) == 7
    assert resolve_threshold(4, 10) == 4
    for bad in (0.0, 1.5, 0, True, "2"):
        with pytest.raises((TypeError, ValueError)):
            resolve_threshold(bad, 10)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [0, 1, 1 << 14, (1 << 15) + 5])
def test_blocked_apply_masks_matches_full_expansion(n: int) -> None:
    seeds = [hashlib.sha256(b"s%d" % i).digest() for i in range(4)]
    acc = np.arange(n, dtype=np.uint64)
    want = acc.copy()
    for s in seeds[:3]:
        want += _prg.expand(s, n)
    want -= _prg.expand(seeds[3], n)
    src = acc.copy()
    _prg.apply_masks(acc, seeds[:3], seeds[3:])
    assert np.array_equal(acc, want)
    out = np.zeros(n, dtype=np.uint64)
    _prg.apply_masks(out, seeds[:3], seeds[3:], src=src)
    assert np.array_equal(out, want)
    assert np.array_equal(src, np.arange(n, dtype=np.uint64))  # input untouched


@pytest.mark.parametrize("n", [1, 1 << 14, (1 << 15) + 5])
def test_apply_masks_with_a_block_fill_masks_the_filled_input(n: int) -> None:
    seeds = [hashlib.sha256(b"f%d" % i).digest() for i in range(5)]
    plain = np.random.default_rng(n).integers(0, 2**64, n, dtype=np.uint64)
    want = plain.copy()
    _prg.apply_masks(want, seeds[:2], seeds[2:])
    calls: list[tuple[int, int]] = []

    def fill(start: int, stop: int, block: np.ndarray) -> None:
        calls.append((start, stop))
        block[:] = plain[start:stop]

    acc = np.zeros(n, dtype=np.uint64)
    _prg.apply_masks(acc, seeds[:2], seeds[2:], fill=fill)
    assert np.array_equal(acc, want)
    assert calls[0][0] == 0 and calls[-1][1] == n  # every entry filled, in order, once
    assert all(a[1] == b[0] for a, b in itertools.pairwise(calls))
    with pytest.raises(ValueError, match="src or fill"):
        _prg.apply_masks(acc, seeds[:1], [], src=plain, fill=fill)


def test_derive_seeds_matches_one_by_one_derivation() -> None:
    me = _kdf.generate_private_key()
    peers = [(_kdf.public_key(_kdf.generate_private_key()), b"info-%d" % i) for i in range(4)]
    assert _kdf.derive_seeds(me, peers) == [_kdf.derive_seed(me, p, i) for p, i in peers]
    with pytest.raises(ValueError, match="agreement"):
        _kdf.derive_seeds(me, [*peers, (bytes(32), b"x")])  # low-order point
