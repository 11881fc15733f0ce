"""Public, deterministic facts of a round that clients and server compute identically.

* Context strings for every derived key, signature and ciphertext (``fedforest/v1/...``), so a value
  made for one job, round, pair of clients or question is useless for any other.
* The bytes a client signs in the consistency round: job, round, task digest and the survivor set.
* The threshold ``t`` of a job (a fraction of the job's clients, rounded up, or an absolute count)
  and the per-neighbourhood threshold of the sparse graph.
* The neighbour graph: complete by default; with ``neighbours=k`` a Harary graph (SecAgg+, Bell et
  al. 2020) on the job's clients ordered by ``HMAC-SHA256(round_seed, id)``, each linked to
  ``ceil(k/2)`` clients on either side of a ring. The round seed hashes job, round, task digest
  and the job's membership (the ids of the identity directory every client pinned at join, not
  the round's roster), so the graph is public, deterministic, fresh every round and the same for
  every client whatever roster the server shows it. A round's group of ``u`` is ``u``'s job
  neighbourhood restricted to the round's roster.
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
    if not isinstance(job_id, str) or not _JOB_RE.fullmatch(job_id):
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


def share_header(job_id: str, round_id: int, sender: int, recipient: int,
                 task_digest: bytes) -> bytes:
    """Plaintext prefix of an encrypted share pair, checked by the recipient after decryption.

    It names the task too: a client shown another task in the same round (so another graph on
    the sparse graph, whose seed hashes the task) rejects the share, so every holder of a
    client's shares derived the same graph and signs the same task."""
    return _ctx("share", job_id, round_id, sender, recipient) + b"|" + task_digest + b"|"


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
    """Shamir and signature threshold inside a neighbourhood of ``group_size`` (the client and its
    neighbours on the ring of ``n`` clients).

    The complete graph uses ``t`` itself. A sparse graph scales ``t`` to the group, never goes
    below a strict majority of the group nor above its size, and is raised to the smallest value
    for which :func:`isolation_proof_holds` (threat_model.md §2.2: no server strategy isolates an
    honest client's vector on the ring when every client checks the signatures of each owner's
    group).
    """
    if group_size >= n:
        return t
    scaled = math.ceil(t * group_size / n)
    tau = min(group_size, max(group_size // 2 + 1, scaled))
    while tau < group_size and not isolation_proof_holds(tau, group_size):
        tau += 1
    return tau


def isolation_proof_holds(tau: int, group_size: int) -> bool:
    """Whether threshold ``tau`` in ring neighbourhoods of ``group_size = 2h + 1`` meets the
    counting condition of threat_model.md §2.2 (S16).

    Honest revealers of one owner's shares all use the one survivor set that ``tau`` members of
    the owner's group signed. Two neighbours ``v``, ``p`` at ring distance ``d`` can be backed by
    different sets only if ``2 tau <= g + d``, so only peers at distance at least
    ``m = 2 tau - g`` (there are ``F`` of them in a group) can be "dropped" under a set other
    than the victim's. The victim's own set then has at most ``max(g - tau + F, 1 + F)``
    possible signers in its group; below ``tau`` the server cannot isolate the victim.
    """
    g = group_size
    h = (g - 1) // 2
    m = 2 * tau - g
    far = 2 * (h - m + 1) if 1 <= m <= h else (0 if m > h else g - 1)
    return max(g - tau + far, 1 + far) < tau


def job_threshold(threshold: float | int, n_clients: int) -> int:
    """``t`` of a job of ``n_clients`` clients: a strict majority of them, or ``ValueError``.

    Every round of the job uses this ``t`` whatever its roster, so two sets that each carry ``t``
    signatures of distinct members share a member (``2t > n_clients``); that member is honest
    while fewer than ``2t - n_clients`` clients collude with the server.
    """
    if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 3:
        raise ValueError(f"secure aggregation needs a job of at least 3 clients, not {n_clients!r}")
    t = resolve_threshold(threshold, n_clients)
    if not n_clients // 2 < t <= n_clients:
        raise ValueError(f"threshold {t} of {n_clients} clients is not a strict majority")
    return t


def graph_seed(job_id: str, round_id: int, task_digest: bytes, ids: Iterable[int]) -> bytes:
    """Public seed of the round's neighbour graph: a hash of job, round, the job's clients
    ``ids`` and task."""
    roster = ",".join(str(i) for i in sorted(ids))
    return hashlib.sha256(_ctx("graph", job_id, round_id, roster) + b"|" + task_digest).digest()


def ring_order(ids: Iterable[int], seed: bytes) -> list[int]:
    """The clients ordered by ``HMAC-SHA256(seed, id)``: the ring of the sparse graph."""
    return sorted(set(ids), key=lambda u: hmac.new(seed, str(u).encode(), "sha256").digest())


def _half_width(n: int, k: int | None) -> int | None:
    """Neighbours on each side of the ring for degree ``k`` among ``n``; None: complete graph."""
    if k is None or k >= n - 1:
        return None
    if k < 2:
        raise ValueError("a sparse graph needs at least 2 neighbours per client")
    return math.ceil(k / 2)


def neighbour_groups(ids: Iterable[int], k: int | None, seed: bytes) -> dict[int, frozenset[int]]:
    """For each client, its sharing group: itself and its neighbours (all clients if complete).

    The server's view (every group, O(K k)); a client needs only its own,
    :func:`neighbourhood`.
    """
    members = sorted(set(ids))
    n = len(members)
    half = _half_width(n, k)
    if half is None:
        everyone = frozenset(members)
        return {u: everyone for u in members}
    order = ring_order(members, seed)
    return {u: frozenset(order[(pos + d) % n] for d in range(-half, half + 1))
            for pos, u in enumerate(order)}


def local_groups(ids: Iterable[int], k: int | None, seed: bytes,
                 u: int) -> dict[int, frozenset[int]] | None:
    """The groups of ``u`` and of each of ``u``'s neighbours on the ring of the clients ``ids``
    (``{v: group of v}`` for ``v`` in ``u``'s group), ``None`` on the complete graph.

    O(K) hashes of client ids (one HMAC per client and a sort) and O(k^2) set work: nothing per
    client beyond the hash.
    """
    members = set(ids)
    if u not in members:
        raise ValueError(f"client {u} is not in the job")
    n = len(members)
    half = _half_width(n, k)
    if half is None:
        return None
    order = ring_order(members, seed)
    pos = order.index(u)

    def around(p: int) -> frozenset[int]:
        return frozenset(order[(p + d) % n] for d in range(-half, half + 1))

    return {order[(pos + d) % n]: around(pos + d) for d in range(-half, half + 1)}


def neighbourhood(ids: Iterable[int], k: int | None, seed: bytes, u: int) -> frozenset[int]:
    """Client ``u``'s sharing group alone: ``neighbour_groups(ids, k, seed)[u]`` in O(K) hashes
    of client ids (see :func:`local_groups`)."""
    groups = local_groups(ids, k, seed, u)
    return frozenset(ids) if groups is None else groups[u]
