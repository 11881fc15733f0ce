"""Public, deterministic facts of a round that clients and server compute identically.

* Context strings for every derived key, signature and ciphertext (``fedforest/v1/...``), so a value
  made for one job, round, pair of clients or question is useless for any other.
* The bytes a client signs in the consistency round: job, round, task digest and the survivor set.
* The threshold ``t`` of a job (a fraction of the job's clients, rounded up, or an absolute count)
  and the per-neighbourhood threshold of the sparse graph.
* The neighbour graph: complete by default; with ``neighbours=k`` a Harary graph (SecAgg+, Bell et
  al. 2020) on the clients ordered by ``HMAC-SHA256(round_seed, id)``, each linked to ``ceil(k/2)``
  clients on either side of a ring. The round seed hashes job, round, task digest and the roster,
  so the graph is public, deterministic and fresh every round.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Iterable

_JOB_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
PREFIX = b"fedforest/v1/"


def check_job_id(job_id: str) -> str:
    """``job_id`` if it is 1-128 characters of ``[A-Za-z0-9._:-]`` (no ``|``), else ValueError."""
    if not isinstance(job_id, str) or not _JOB_RE.match(job_id):
        raise ValueError(f"job_id must match {_JOB_RE.pattern}, got {job_id!r}")
    return job_id


def _ctx(label: str, *parts: object) -> bytes:
    return PREFIX + label.encode() + b"|" + b"|".join(str(p).encode() for p in parts)


def mask_info(job_id: str, round_id: int, a: int, b: int, task_digest: bytes) -> bytes:
    """HKDF ``info`` of the pairwise seed of clients ``a`` and ``b`` (ordered: ``min|max``)."""
    i, j = min(a, b), max(a, b)
    if i == j:
        raise ValueError("a pairwise seed needs two different clients")
    return _ctx("mask", job_id, round_id, i, j) + b"|" + task_digest


def advert_payload(job_id: str, round_id: int, client_id: int, enc_key: bytes,
                   mask_key: bytes, commit: bytes) -> bytes:
    """The bytes a client signs with its Ed25519 identity to advertise its round keys."""
    return _ctx("advert", job_id, round_id, client_id) + b"|" + enc_key + mask_key + commit


def consistency_payload(job_id: str, round_id: int, task_digest: bytes,
                        survivors: Iterable[int]) -> bytes:
    """The bytes a client signs to say "round ``round_id`` of this task sums over ``survivors``"."""
    members = ",".join(str(i) for i in sorted(survivors))
    return _ctx("consistency", job_id, round_id, members) + b"|" + task_digest


def self_mask_commitment(job_id: str, round_id: int, client_id: int, seed: bytes) -> bytes:
    """SHA-256 commitment to a self-mask seed, advertised so a reconstruction can be checked."""
    return hashlib.sha256(_ctx("selfmask", job_id, round_id, client_id) + b"|" + seed).digest()


def share_header(job_id: str, round_id: int, sender: int, recipient: int) -> bytes:
    """Plaintext prefix of an encrypted share pair, checked by the recipient after decryption."""
    return _ctx("share", job_id, round_id, sender, recipient) + b"|"


def resolve_threshold(threshold: float | int, n: int) -> int:
    """``t`` for ``n`` clients: ``ceil(threshold * n)`` for a fraction in (0, 1], else the int."""
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise TypeError("threshold must be a fraction in (0, 1] or a positive int")
    if isinstance(threshold, float):
        if not 0.0 < threshold <= 1.0:
            raise ValueError("a fractional threshold must lie in (0, 1]")
        return max(1, math.ceil(threshold * n - 1e-9))
    if threshold < 1:
        raise ValueError("an integer threshold must be at least 1")
    return threshold


def local_threshold(t: int, n: int, group_size: int) -> int:
    """Shamir threshold inside a neighbourhood of ``group_size`` (the client and its neighbours).

    The complete graph uses ``t`` itself. A sparse graph scales ``t`` to the group, and never
    goes below a strict majority of the group nor above its size.
    """
    if group_size >= n:
        return t
    scaled = math.ceil(t * group_size / n)
    return min(group_size, max(group_size // 2 + 1, scaled))


def job_threshold(threshold: float | int, n_clients: int) -> int:
    """``t`` of a job of ``n_clients`` clients: a strict majority of them, or ``ValueError``.

    Every round of the job uses this ``t`` whatever its roster, so two sets that each carry ``t``
    signatures of distinct members share a member (``2t > n_clients``).
    """
    if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 3:
        raise ValueError(f"secure aggregation needs a job of at least 3 clients, not {n_clients!r}")
    t = resolve_threshold(threshold, n_clients)
    if not n_clients // 2 < t <= n_clients:
        raise ValueError(f"threshold {t} of {n_clients} clients is not a strict majority")
    return t


def graph_seed(job_id: str, round_id: int, task_digest: bytes, ids: Iterable[int]) -> bytes:
    """Public seed of the round's neighbour graph: a hash of job, round, roster and task."""
    roster = ",".join(str(i) for i in sorted(ids))
    return hashlib.sha256(_ctx("graph", job_id, round_id, roster) + b"|" + task_digest).digest()


def neighbour_groups(ids: Iterable[int], k: int | None, seed: bytes) -> dict[int, frozenset[int]]:
    """For each client, its sharing group: itself and its neighbours (all clients if complete)."""
    members = sorted(set(ids))
    n = len(members)
    if k is None or k >= n - 1:
        everyone = frozenset(members)
        return {u: everyone for u in members}
    if k < 2:
        raise ValueError("a sparse graph needs at least 2 neighbours per client")
    half = math.ceil(k / 2)
    order = sorted(members, key=lambda u: hmac.new(seed, str(u).encode(), "sha256").digest())
    groups: dict[int, frozenset[int]] = {}
    for pos, u in enumerate(order):
        near = {order[(pos + d) % n] for d in range(-half, half + 1)}
        groups[u] = frozenset(near)
    return groups

