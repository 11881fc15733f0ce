"""Benchmark of secure aggregation: one client's masking and the server's unmasking.

Runs the real protocol (``SecAggClient`` / ``SecAggServer``) for each vector length and number of
clients K, with one client dropping after sharing (so the server reconstructs a masking key too),
and times:

* client: range-checked fixed-point encoding of a float64 vector + ``mask`` (self mask and K-1
  pairwise masks, AES-128-CTR), fused in one pass over cache-sized blocks
  (``mask(delivery, values, codec=codec)``); "2-pass" is ``codec.encode`` then
  ``mask(..., inplace=True)`` (client 1 of the same round, for comparison);
* server: ``finish`` (sum of uploads, Shamir reconstruction, removal of every mask).

If Flower (``flwr``) is importable, its SecAgg+ primitives are timed on the same sizes: client =
``quantize`` + ``pseudo_rand_gen`` for the self mask and K-1 pairwise masks +
``parameters_addition`` + ``parameters_mod``; server = ``combine_shares`` per survivor + one
dropped key, ``pseudo_rand_gen`` per mask removed, ``parameters_subtraction`` + mod. The ratio is
Flower's time over ours (higher is better for us). Flower is imported lazily and skipped if absent.

    python benchmarks/secagg.py                      # 10^4..10^6 entries, K = 5, 10, 50
    python benchmarks/secagg.py --big                # also 10^7 entries
    python benchmarks/secagg.py --sizes 1e6 --clients 10
    python benchmarks/secagg.py --clock cpu          # CPU time instead of wall time
    python benchmarks/secagg.py --prg --repeat 15    # the masks' keystream: AES-128 vs AES-256

``--prg`` times only the keystream expansion: ms per 10^6 uint64 words of AES-CTR written into
a buffer in 16k-word blocks (as ``apply_masks`` does), the masks' AES-128 (``_prg._encryptor``)
and AES-256 keyed by the full 32-byte seed, alternating within each repetition; best of
``--repeat``.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _cli import at_least

from fedforest_secure.secagg import RingCodec, SecAggServer
from fedforest_secure.secagg.driver import InProcessSecureSum

_CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = _CLOCKS["wall"]


def _now() -> float:
    return _clock()


def _best(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = _now()
        fn()
        best = min(best, _now() - t0)
    return best


def ours(n: int, k: int, repeat: int) -> tuple[float, float, float, float]:
    """(client masking s, server unmasking s, client share_keys s, 2-pass masking s)."""
    agg = InProcessSecureSum(range(k), threshold=0.67, job_id="bench")
    codec = RingCodec(np.full(n, 20), np.full(n, 1e3), k)
    rng = np.random.default_rng(0)
    values = rng.uniform(-1, 1, n)
    digest = hashlib.sha256(b"bench").digest()
    client_t, server_t, share_t, twopass_t = [], [], [], []
    for r in range(repeat):
        server = SecAggServer("bench", r, "q", digest, n, 0.67, agg.directory)
        for c in agg.clients.values():
            server.receive_advert(c.advertise(r))
        setup = server.setup()
        for u, c in agg.clients.items():
            t0 = _now()
            bundle = c.share_keys(setup)
            if u == 0:
                share_t.append(_now() - t0)
            server.receive_shares(bundle)
        deliveries = server.deliver_shares()
        for u, c in agg.clients.items():
            if u == k - 1:
                continue  # drops after sharing
            t0 = _now()
            if u == 0:  # encode + mask fused, block by block
                header, masked = c.mask(deliveries[u], values, codec=codec)
                client_t.append(_now() - t0)
            else:  # encode, then mask in place (client 1 is timed)
                x = codec.encode(values)
                header, masked = c.mask(deliveries[u], x, inplace=True)
                if u == 1:
                    twopass_t.append(_now() - t0)
            server.receive_upload(header, masked)
        survivor_set = server.request_signatures()
        for u in survivor_set.survivors:
            server.receive_signature(agg.clients[u].sign_survivors(survivor_set))
        req = server.request_unmask()
        for u in req.survivors:
            server.receive_unmask(agg.clients[u].unmask(req))
        t0 = _now()
        server.finish()
        server_t.append(_now() - t0)
    return min(client_t), min(server_t), min(share_t), min(twopass_t)


def flower(n: int, k: int, repeat: int) -> tuple[float, float, float] | None:
    """The same work with Flower's SecAgg+ primitives, or ``None`` if flwr is not installed."""
    try:
        from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
        from flwr.common.secure_aggregation.ndarrays_arithmetic import (
            parameters_addition,
            parameters_mod,
            parameters_subtraction,
        )
        from flwr.common.secure_aggregation.quantization import quantize
        from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
    except ImportError:
        return None
    mod_range = 1 << 32
    rng = np.random.default_rng(0)
    params = [rng.uniform(-1, 1, n)]
    dims = [(n,)]
    seeds = [hashlib.sha256(b"%d" % i).digest() for i in range(k)]
    t = -(-67 * k // 100)

    def client() -> None:
        q = quantize(params, 3.0, 1 << 22)
        masked = parameters_addition(q, pseudo_rand_gen(seeds[0], mod_range, dims))
        for j in range(1, k):
            masked = parameters_addition(masked, pseudo_rand_gen(seeds[j], mod_range, dims))
        parameters_mod(masked, mod_range)

    def share() -> None:
        create_shares(seeds[0], t, k)
        create_shares(seeds[1], t, k)

    shares = [create_shares(s, t, k) for s in seeds]
    upload_sum = [rng.integers(0, mod_range, n, dtype=np.int64)]

    def server() -> None:
        total = upload_sum
        for u in range(k - 1):  # self masks of the survivors
            combine_shares(shares[u][:t])
            total = parameters_subtraction(total, pseudo_rand_gen(seeds[u], mod_range, dims))
        combine_shares(shares[k - 1][:t])  # the dropped client's key
        for u in range(k - 1):  # its pairwise masks with every survivor
            total = parameters_subtraction(total, pseudo_rand_gen(seeds[u], mod_range, dims))
        parameters_mod(total, mod_range)

    return _best(client, repeat), _best(server, repeat), _best(share, repeat)


def prg_table(n: int, repeat: int) -> None:
    """ms per 10^6 keystream words: the masks' AES-128-CTR against AES-256-CTR, alternating."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from fedforest_secure.secagg._primitives import _prg

    block = 1 << 14
    zeros = memoryview(bytes(8 * block))
    out = bytearray(8 * block)
    seed = hashlib.sha256(b"prg bench").digest()

    def run(enc: Any) -> None:
        for _ in range(0, n, block):
            enc.update_into(zeros, out)

    best = {"AES-128-CTR (masks)": float("inf"), "AES-256-CTR": float("inf")}
    for _ in range(repeat):
        t0 = _now()
        run(_prg._encryptor(seed))
        best["AES-128-CTR (masks)"] = min(best["AES-128-CTR (masks)"], _now() - t0)
        t0 = _now()
        run(Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor())
        best["AES-256-CTR"] = min(best["AES-256-CTR"], _now() - t0)
    base = best["AES-128-CTR (masks)"]
    print(f"{'keystream':>20} | {'ms per 10^6 words':>17} | {'time x':>6}")
    for name, t in best.items():
        print(f"{name:>20} | {t / n * 1e9:>17.3f} | {t / base:>6.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e4, 1e5, 1e6])
    ap.add_argument("--clients", type=int, nargs="+", default=[5, 10, 50],
                    help="K per run, at least 4: one client drops after sharing and the "
                         "other K - 1 must still reach t = ceil(0.67 K)")
    ap.add_argument("--big", action="store_true", help="also run 10^7 entries")
    ap.add_argument("--repeat", type=at_least(1), default=2)
    ap.add_argument("--no-flower", action="store_true")
    ap.add_argument("--prg", action="store_true",
                    help="only the masks' keystream: AES-128-CTR against AES-256-CTR over "
                         "the largest --sizes entries")
    ap.add_argument("--clock", choices=tuple(_CLOCKS), default="wall",
                    help="wall time (default) or this process's CPU time, which a loaded "
                         "machine's time slicing does not inflate (everything is one thread)")
    args = ap.parse_args(argv)
    if min(args.clients) < 4:
        ap.error(f"--clients {min(args.clients)}: at least 4 (one client drops after sharing, "
                 "and the others must reach the threshold)")
    global _clock
    _clock = _CLOCKS[args.clock]
    sizes = [int(s) for s in args.sizes] + ([10**7] if args.big else [])
    if args.prg:
        prg_table(max(sizes), args.repeat)
        return
    head = (f"{'entries':>9} {'K':>3} | {'client ms':>9} {'2-pass':>6} {'Mentry/s':>8} "
            f"{'server ms':>9} "
            f"{'share ms':>8} | {'flwr cli ms':>11} {'flwr srv ms':>11} {'flwr shr':>8} | "
            f"{'cli x':>6} {'srv x':>6}")
    print(head)
    print("-" * len(head))
    for n in sizes:
        for k in args.clients:
            c, s, sh, c2 = ours(n, k, args.repeat)
            fl = None if args.no_flower else flower(n, k, args.repeat)
            line = (f"{n:>9} {k:>3} | {c * 1e3:>9.1f} {c2 * 1e3:>6.1f} {n / c / 1e6:>8.1f} "
                    f"{s * 1e3:>9.1f} {sh * 1e3:>8.2f} | ")
            if fl is None:
                line += f"{'n/a':>11} {'n/a':>11} {'n/a':>8} | {'-':>6} {'-':>6}"
            else:
                line += (f"{fl[0] * 1e3:>11.1f} {fl[1] * 1e3:>11.1f} {fl[2] * 1e3:>8.2f} | "
                         f"{fl[0] / c:>6.1f} {fl[1] / s:>6.1f}")
            print(line, flush=True)
    if not args.no_flower and flower(10, 3, 1) is None:
        print("flwr not installed: Flower comparison skipped (pip install flwr)")


if __name__ == "__main__":
    main()
