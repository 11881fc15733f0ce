"""An actively malicious server against real secure-aggregation clients (threat_model.md §2.2).

The harness plays a server that shows every client its own round: its own roster, the threshold
and graph it announces, which shares it delivers, which survivor set it asks the client to sign,
and any number of unmask requests (each carrying every signature the server holds on the set it
names). It drives real :class:`~fedforest_secure.secagg.SecAggClient` objects (and, for the HTTPS
part, real :class:`~client_app.secagg_session.SecAggSession` objects over a recording transport),
records everything they send, and then tries to unmask each client's vector on its own with
whatever it obtained: every self-mask seed and masking key it can reconstruct from the revealed
Shamir shares (checked against the advertised commitments), every pairwise mask it can derive.
A client's vector is "recovered" when the server's guess equals it exactly (vectors are uniform
64-bit words, so a chance match is out of the question).

Attack 1 (different rosters) and attack 2 (a server-chosen sparse graph, a roster beyond the
job) come from issue #12; the hypothesis test lets the server pick every choice at random.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey
from test_adversarial_server import FakeTransport

from client_app.secagg_session import SecAggSession
from fedforest_secure import load_profile
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError, ProtocolError, RefusedRequest
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind, question_key
from fedforest_secure.secagg import (
    ClientStage,
    KeyAdvert,
    RoundSetup,
    SecAggClient,
    ShareBundle,
    ShareDelivery,
    SurvivorSet,
    SurvivorSignature,
    UnmaskRequest,
    UnmaskResponse,
)
from fedforest_secure.secagg._primitives import _kdf, _prg, _shamir
from fedforest_secure.secagg._rounds import (
    job_threshold,
    mask_info,
    self_mask_commitment,
)

JOB = "job-evil"
L = 4
TASK = Task(job_id=JOB, round_id=0, kind=TaskKind.HISTOGRAM, level=0,
            params={"stats": "count"}, layout=(Block("hist", (L, 1), (StatKind.COUNT,)),))
DIGEST = TASK.digest()
Q = question_key(TASK)

Ids = frozenset[int]


@dataclass(frozen=True)
class Plan:
    """Everything a malicious server chooses for one round (``None``: the honest choice)."""

    n: int
    threshold: float = 0.67
    neighbours: int | None = None          # the clients' own profile
    min_survivors: int = 3                 # the clients' own K_min
    rosters: dict[int, Ids] = field(default_factory=dict)
    announce_t: dict[int, int] = field(default_factory=dict)
    announce_k: dict[int, int | None] = field(default_factory=dict)
    deliver: dict[int, Ids] = field(default_factory=dict)      # senders delivered to u
    sets: dict[int, Ids] = field(default_factory=dict)         # survivor set u is asked to sign
    requests: dict[int, list[tuple[Ids, Ids]]] = field(default_factory=dict)


@dataclass
class Seen:
    """What the server holds after the round."""

    adverts: dict[int, KeyAdvert] = field(default_factory=dict)
    peers: dict[int, Ids] = field(default_factory=dict)        # whose shares u masked with
    uploads: dict[int, np.ndarray] = field(default_factory=dict)
    signatures: dict[tuple[Ids, int], bytes] = field(default_factory=dict)
    self_shares: dict[int, dict[int, int]] = field(default_factory=dict)
    key_shares: dict[int, dict[int, int]] = field(default_factory=dict)
    refusals: list[FedForestError] = field(default_factory=list)

    def take(self, resp: UnmaskResponse) -> None:
        for v, sh in resp.self_mask_shares.items():
            self.self_shares.setdefault(v, {})[resp.sender + 1] = _shamir.from_bytes(sh)
        for v, sh in resp.key_shares.items():
            self.key_shares.setdefault(v, {})[resp.sender + 1] = _shamir.from_bytes(sh)

    # -- the server's best effort ------------------------------------------------------------
    def _secret(self, shares: dict[int, int]) -> bytes | None:
        if not shares:
            return None
        value = _shamir.combine(shares, len(shares))  # enough shares: any superset interpolates
        return value.to_bytes(32, "big") if value < 1 << 256 else None

    def self_seed(self, u: int) -> bytes | None:
        seed = self._secret(self.self_shares.get(u, {}))
        if seed is None or self_mask_commitment(JOB, 0, u, seed) != \
                self.adverts[u].self_mask_commit:
            return None
        return seed

    def mask_key(self, u: int) -> bytes | None:
        sk = self._secret(self.key_shares.get(u, {}))
        if sk is None or _kdf.public_key(sk) != self.adverts[u].mask_key:
            return None
        return sk

    def pair_seed(self, u: int, v: int) -> bytes | None:
        info = mask_info(JOB, 0, u, v, DIGEST)
        sk_u, sk_v = self.mask_key(u), self.mask_key(v)
        if sk_u is not None:
            return _kdf.derive_seed(sk_u, self.adverts[v].mask_key, info)
        if sk_v is not None:
            return _kdf.derive_seed(sk_v, self.adverts[u].mask_key, info)
        return None

    def unmask_set(self, members: Iterable[int]) -> np.ndarray | None:
        """The server's value of ``sum x_u`` over ``members``, or None if it cannot compute one."""
        group = set(members)
        if not group <= set(self.uploads):
            return None
        total = np.zeros(L, dtype=np.uint64)
        plus: list[bytes] = []
        minus: list[bytes] = []
        for u in group:
            total += self.uploads[u]
            b = self.self_seed(u)
            if b is None:
                return None
            minus.append(b)
            for v in self.peers[u]:
                if v in group and u in self.peers[v]:
                    continue  # u and v masked with each other: the pair cancels in the sum
                s = self.pair_seed(u, v)
                if s is None:
                    return None
                (minus if v > u else plus).append(s)  # u added +PRG if v > u
        _prg.apply_masks(total, plus, minus)
        return total


def _clients(plan: Plan) -> tuple[dict[int, SecAggClient], dict[int, np.ndarray]]:
    keys = {u: SigningKey.generate() for u in range(plan.n)}
    directory = {u: bytes(k.verify_key) for u, k in keys.items()}
    clients = {u: SecAggClient(u, JOB, keys[u], directory, n_clients=plan.n,
                               threshold=plan.threshold, neighbours=plan.neighbours,
                               min_survivors=plan.min_survivors)
               for u in range(plan.n)}
    rng = np.random.default_rng(plan.n)
    return clients, {u: rng.integers(0, 2**64, L, dtype=np.uint64) for u in range(plan.n)}


def run(plan: Plan) -> tuple[Seen, dict[int, np.ndarray], dict[int, SecAggClient]]:
    """Play ``plan`` against fresh honest clients; return what the server saw."""
    clients, x = _clients(plan)
    everyone = frozenset(range(plan.n))
    t = job_threshold(plan.threshold, plan.n)
    seen = Seen(adverts={u: c.advertise(0) for u, c in clients.items()})
    bundles: dict[int, ShareBundle] = {}
    for u, c in clients.items():
        roster = sorted(plan.rosters.get(u, everyone))
        setup = RoundSetup(job_id=JOB, round_id=0, question=Q, task_digest=DIGEST,
                           threshold=plan.announce_t.get(u, t),
                           neighbours=plan.announce_k.get(u, plan.neighbours), vector_length=L,
                           adverts=tuple(seen.adverts[v] for v in roster))
        try:
            bundles[u] = c.share_keys(setup)
        except FedForestError as exc:
            seen.refusals.append(exc)
    for u, c in clients.items():
        if u not in bundles:
            continue
        senders = plan.deliver.get(u, everyone)
        cts = {v: b.ciphertexts[u] for v, b in bundles.items()
               if v in senders and u in b.ciphertexts}
        try:
            _, seen.uploads[u] = c.mask(ShareDelivery(job_id=JOB, round_id=0, recipient=u,
                                                      ciphertexts=cts), x[u].copy())
        except FedForestError as exc:
            seen.refusals.append(exc)
            continue
        seen.peers[u] = frozenset(cts)
    honest_set = frozenset(seen.uploads)
    for u in seen.uploads:
        survivors = plan.sets.get(u, honest_set)
        try:
            sig = clients[u].sign_survivors(SurvivorSet(job_id=JOB, round_id=0,
                                                        survivors=tuple(sorted(survivors))))
        except FedForestError as exc:
            seen.refusals.append(exc)
            continue
        seen.signatures[(frozenset(survivors), u)] = sig.signature
    for u in seen.uploads:
        default = [(plan.sets.get(u, honest_set), everyone - plan.sets.get(u, honest_set))]
        for survivors, dropped in plan.requests.get(u, default):
            sigs = {s: sig for (S, s), sig in seen.signatures.items() if S == survivors}
            request = UnmaskRequest(job_id=JOB, round_id=0, question=Q,
                                    survivors=tuple(sorted(survivors)),
                                    dropped=tuple(sorted(dropped)), signatures=sigs)
            try:
                seen.take(clients[u].unmask(request))
            except FedForestError as exc:
                seen.refusals.append(exc)
    return seen, x, clients


def recovered(seen: Seen, x: dict[int, np.ndarray]) -> list[int]:
    """Clients whose exact vector the server computed on its own."""
    out = []
    for u in x:
        guess = seen.unmask_set([u])
        if guess is not None and np.array_equal(guess, x[u]):
            out.append(u)
    return out


def _wrap_sum(vectors: Iterable[np.ndarray]) -> np.ndarray:
    total = np.zeros(L, dtype=np.uint64)
    for v in vectors:
        total += v
    return total


# -- the harness itself works: an honest round gives the server the sum, and only the sum -------
def test_the_harness_recovers_the_honest_sum_and_nothing_else() -> None:
    seen, x, _ = run(Plan(n=6))
    total = seen.unmask_set(range(6))
    assert total is not None and np.array_equal(total, _wrap_sum(x.values()))
    assert seen.refusals == [] and recovered(seen, x) == []
    # with the keys a dropped client reveals, the harness does unmask what those keys open
    seen2, x2, _ = run(Plan(n=6, sets={u: frozenset(range(5)) for u in range(6)},
                            requests={u: [(frozenset(range(5)), frozenset({5}))]
                                      for u in range(6)}))
    total2 = seen2.unmask_set(range(5))
    assert total2 is not None and np.array_equal(total2, _wrap_sum(x2[u] for u in range(5)))
    assert seen2.mask_key(5) is not None  # 5 "dropped": its masking key is known ...
    assert seen2.self_seed(5) is None     # ... and never its self-mask seed


# -- attack 1: a different roster for every client --------------------------------------------
ATTACK1 = Plan(
    n=8,
    rosters={0: frozenset({0, 1, 2}), 1: frozenset({0, 1, 3, 4, 5, 6, 7}),
             2: frozenset({0, 2, 3, 4, 5, 6, 7}),
             **{u: frozenset({1, 2, 3, 4, 5, 6, 7}) for u in range(3, 8)}},
    announce_t={0: 3, **{u: 5 for u in range(1, 8)}},  # ceil(0.67 n) of each roster
    sets={0: frozenset({0, 1, 2}), 1: frozenset({0, 1, 3, 4, 5}),
          2: frozenset({0, 2, 3, 4, 5}), **{u: frozenset({3, 4, 5, 6, 7}) for u in range(3, 8)}},
    requests={0: [(frozenset({0, 1, 2}), frozenset())],
              1: [(frozenset({0, 1, 3, 4, 5}), frozenset())],
              2: [(frozenset({0, 2, 3, 4, 5}), frozenset())],
              **{u: [(frozenset({3, 4, 5, 6, 7}), frozenset({1, 2}))] for u in range(3, 8)}})


def test_attack1_different_rosters_do_not_unmask_the_victim() -> None:
    seen, x, clients = run(ATTACK1)
    assert recovered(seen, x) == []
    assert seen.self_seed(0) is None
    # the victim refused its three-client roster before any share left it
    assert clients[0].stage is ClientStage.ADVERTISED
    assert any(isinstance(e, RefusedRequest) and e.code == "roster" for e in seen.refusals)


def test_attack1_with_rosters_of_t_clients_still_fails() -> None:
    """The same attack with rosters large enough for the job's t = 6 of 8: the two groups
    would have to sign different survivor sets, and 2t > n means no set gets t signatures
    from one group alone."""
    a, b = frozenset({0, 1, 2, 3, 4, 5}), frozenset({1, 2, 3, 4, 5, 6, 7})
    plan = Plan(n=8, rosters={u: (a if u == 0 else b | {0}) for u in range(8)},
                sets={u: (a if u in a else b) for u in range(8)},
                requests={u: [(a, frozenset())] if u in a else [(b, frozenset({0}))]
                          for u in range(8)})
    seen, x, _ = run(plan)
    assert recovered(seen, x) == []
    assert seen.mask_key(0) is None


# -- the consistency step on its own --------------------------------------------------------------
def _to_signed(n: int = 5) -> tuple[Seen, dict[int, SecAggClient]]:
    plan = Plan(n=n, requests={u: [] for u in range(n)})
    seen, _, clients = run(plan)
    return seen, clients


def test_a_client_signs_one_survivor_set_per_round() -> None:
    _, clients = _to_signed()
    c0 = clients[0]
    assert c0.stage is ClientStage.SIGNED
    again = c0.sign_survivors(SurvivorSet(job_id=JOB, round_id=0, survivors=(0, 1, 2, 3, 4)))
    assert isinstance(again, SurvivorSignature)  # the same set again: the same signature
    with pytest.raises(RefusedRequest, match="one set per round") as info:
        c0.sign_survivors(SurvivorSet(job_id=JOB, round_id=0, survivors=(0, 1, 2, 3)))
    assert info.value.code == "survivor_set"


@pytest.mark.parametrize("attack", ["other_set", "too_few_signatures", "forged_signature",
                                    "signer_outside_set", "replayed_round"])
def test_a_client_unmasks_only_the_set_t_members_signed(attack: str) -> None:
    seen, clients = _to_signed()
    full = frozenset(range(5))
    sigs = {s: sig for (S, s), sig in seen.signatures.items() if S == full}
    honest = UnmaskRequest(job_id=JOB, round_id=0, question=Q, survivors=tuple(sorted(full)),
                           dropped=(), signatures=sigs)
    if attack == "other_set":
        evil = honest.model_copy(update={"survivors": (0, 1, 2, 3), "dropped": (4,)})
        kind: type[Exception] = RefusedRequest
    elif attack == "too_few_signatures":  # t = 4 of 5
        evil = honest.model_copy(update={"signatures": dict(list(sigs.items())[:3])})
        kind = RefusedRequest
    elif attack == "forged_signature":
        evil = honest.model_copy(update={"signatures": {**sigs, 4: sigs[3]}})
        kind = ProtocolError
    elif attack == "signer_outside_set":
        evil = honest.model_copy(update={"survivors": (0, 1, 2, 3)})
        kind = RefusedRequest
    else:
        evil = honest.model_copy(update={"round_id": 1})
        kind = ProtocolError
    c0 = clients[0]
    with pytest.raises(kind):
        c0.unmask(evil)
    assert c0.stage is ClientStage.SIGNED  # nothing revealed; the honest request still works
    assert set(c0.unmask(honest).self_mask_shares) == set(full)


# -- attack 2: the server picks the graph and the roster size ------------------------------------
RecordingTransport = FakeTransport  # the malicious server as the session sees it


def _config(n_clients: int, profile: str = "secure") -> JobConfig:
    return JobConfig(job_id=JOB, task="regression", n_features=1, n_clients=n_clients,
                     target_bound=1.0, profile=load_profile(profile).to_dict())


def _sessions(n_keys: int, n_clients: int) -> tuple[dict[int, SecAggSession],
                                                    dict[int, RecordingTransport]]:
    keys = {u: SigningKey.generate() for u in range(n_keys)}
    dirj = {"complete": True, "keys": {str(u): bytes(k.verify_key).hex()
                                       for u, k in keys.items()}}
    sessions, trs = {}, {}
    for u in range(n_keys):
        trs[u] = RecordingTransport(dirj)
        sessions[u] = SecAggSession(_config(n_clients), trs[u], JOB, u, keys[u])  # type: ignore[arg-type]
    return sessions, trs


def share_all(sessions: dict[int, SecAggSession], trs: dict[int, RecordingTransport],
              setup: RoundSetup) -> dict[int, ShareBundle]:
    """Every session shares its keys under ``setup``; the share bundle each posted."""
    bundles = {}
    for u, s in sessions.items():
        s.share(TASK, setup.model_dump_json())
        bundles[u] = ShareBundle.model_validate_json(trs[u].sent[-1][2])
    return bundles


def delivery(bundles: dict[int, ShareBundle], u: int) -> str:
    """The share delivery of client ``u``: what every bundle holds for it, as JSON."""
    cts = {v: b.ciphertexts[u] for v, b in bundles.items() if u in b.ciphertexts}
    return ShareDelivery(job_id=JOB, round_id=0, recipient=u, ciphertexts=cts).model_dump_json()


def test_attack2_sessions_refuse_a_server_chosen_sparse_graph() -> None:
    n = 5
    sessions, trs = _sessions(n, n)
    for s in sessions.values():
        s.connect(timeout_s=1.0)
    adverts = {u: s.client.advertise(0) for u, s in sessions.items()}  # type: ignore[union-attr]
    evil = RoundSetup(job_id=JOB, round_id=0, question=Q, task_digest=DIGEST, threshold=3,
                      neighbours=2, vector_length=L, adverts=tuple(adverts[u] for u in range(n)))
    for u, s in sessions.items():
        with pytest.raises(RefusedRequest, match="threshold 3"):
            s.share(TASK, evil.model_dump_json())
        with pytest.raises(RefusedRequest, match="graph of 2 neighbours"):
            s.share(TASK, evil.model_copy(update={"threshold": 4}).model_dump_json())
        assert [p.rsplit("/", 1)[-1] for _, p, _ in trs[u].sent] == []  # no share left
    # the same roster with the job's own threshold and the complete graph is accepted
    honest = evil.model_copy(update={"neighbours": None, "threshold": 4})
    sessions[0].share(TASK, honest.model_dump_json())
    assert [p.rsplit("/", 1)[-1] for _, p, _ in trs[0].sent] == ["shares"]


def test_attack2_the_harness_server_gains_nothing_from_a_sparse_graph() -> None:
    """The library clients of attack 2 (threshold 3, two neighbours, for five clients) with the
    server's best per-client survivor sets: refused at the roster, nothing recovered."""
    n = 5
    plan = Plan(n=n, announce_t={u: 3 for u in range(n)}, announce_k={u: 2 for u in range(n)},
                sets={u: frozenset({u, (u + 1) % n, (u + 2) % n}) for u in range(n)})
    seen, x, _ = run(plan)
    assert recovered(seen, x) == [] and seen.uploads == {}
    assert {e.code for e in seen.refusals if isinstance(e, RefusedRequest)} == {"roster"}


def test_attack2_a_session_refuses_a_directory_larger_than_its_job() -> None:
    sessions, trs = _sessions(5, 4)  # the server registered a fifth identity in a 4-client job
    with pytest.raises(ProtocolError, match="this job has 4 clients"):
        sessions[0].connect(timeout_s=1.0)
    assert sessions[0].client is None and trs[0].sent == []


def test_attack2_a_refusal_tells_the_server_only_a_code() -> None:
    sessions, trs = _sessions(4, 4)
    for s in sessions.values():
        s.connect(timeout_s=1.0)
    adverts = {u: s.client.advertise(0) for u, s in sessions.items()}  # type: ignore[union-attr]
    setup = RoundSetup(job_id=JOB, round_id=0, question=Q, task_digest=DIGEST, threshold=3,
                       vector_length=L, adverts=tuple(adverts[u] for u in range(4)))
    bundles = share_all(sessions, trs, setup)
    for u, s in sessions.items():
        s.mask(TASK, delivery(bundles, u), np.zeros(L, np.uint64))
    small = SurvivorSet(job_id=JOB, round_id=0, survivors=(0, 1))
    with pytest.raises(RefusedRequest):
        sessions[0].sign(TASK, small.model_dump_json())
    method, path, body = trs[0].sent[-1]
    assert path.endswith("/secagg/refuse") and json.loads(body) == {"reason": "too_few_survivors"}


def test_a_session_takes_its_threshold_from_the_profiles_default_when_the_server_omits_it(
        ) -> None:
    """A site pins a secure profile with the documented default threshold 1.0 (t = n); the
    server leaves ``threshold`` out of the job's profile. The pin check reads the default and
    passes, so the session must read it too: t = 4 of 4, a round announcing t = 3 is refused,
    and so is a survivor set of 3 (the sum over fewer than t is never unmasked)."""
    from client_app.runner import check_job_profile

    pinned = load_profile("secure", threshold=1.0).to_dict()
    served = {k: v for k, v in pinned.items() if k != "threshold"}
    check_job_profile(pinned, served)  # the same settings, as PrivacyProfile reads them
    cfg = JobConfig(job_id=JOB, task="regression", n_features=1, n_clients=4, target_bound=1.0,
                    profile=served)
    keys = {u: SigningKey.generate() for u in range(4)}
    dirj = {"complete": True, "keys": {str(u): bytes(k.verify_key).hex()
                                       for u, k in keys.items()}}
    trs = {u: RecordingTransport(dirj) for u in range(4)}
    sessions = {u: SecAggSession(cfg, trs[u], JOB, u, keys[u]) for u in range(4)}  # type: ignore[arg-type]
    for s in sessions.values():
        s.connect(timeout_s=1.0)
        assert s.client is not None and s.client.t == 4
    adverts = {u: s.client.advertise(0) for u, s in sessions.items()}  # type: ignore[union-attr]
    setup = RoundSetup(job_id=JOB, round_id=0, question=Q, task_digest=DIGEST, threshold=3,
                       vector_length=L, adverts=tuple(adverts[u] for u in range(4)))
    with pytest.raises(RefusedRequest, match="threshold 3"):
        sessions[0].share(TASK, setup.model_dump_json())
    setup = setup.model_copy(update={"threshold": 4})
    bundles = share_all(sessions, trs, setup)
    for u, s in sessions.items():
        s.mask(TASK, delivery(bundles, u), np.zeros(L, np.uint64))
    three = SurvivorSet(job_id=JOB, round_id=0, survivors=(0, 1, 2))
    with pytest.raises(RefusedRequest, match="fewer than t=4"):
        sessions[0].sign(TASK, three.model_dump_json())


# -- any strategy at all ---------------------------------------------------------------------------
@st.composite
def plans(draw: st.DrawFn) -> Plan:
    """A server strategy. Half of them aim at one victim: each client is shown a survivor set
    that makes it reveal the victim's self-mask share, or one that calls the victim's peers
    dropped (so it reveals their masking keys), with rosters and announced thresholds chosen to
    let each client's own checks pass if the client trusted them."""
    n = draw(st.integers(min_value=3, max_value=12))
    everyone = list(range(n))
    threshold = draw(st.sampled_from([0.67, 0.51, 0.8, 1.0]))
    neighbours = draw(st.sampled_from([None, None, 2, 4]))

    def subset(must: Iterable[int], of: Iterable[int] = everyone) -> Ids:
        fixed = set(must)
        others = [v for v in of if v not in fixed]
        size = draw(st.integers(min_value=0, max_value=len(others)))
        picked = draw(st.permutations(others))[:size]
        return frozenset({*fixed, *picked})

    rosters: dict[int, Ids] = {}
    announce_t: dict[int, int] = {}
    announce_k: dict[int, int | None] = {}
    deliver: dict[int, Ids] = {}
    sets: dict[int, Ids] = {}
    requests: dict[int, list[tuple[Ids, Ids]]] = {}
    if n >= 6 and draw(st.booleans()):  # aimed at a victim, issue #12's attack 1 and kin
        victim = draw(st.sampled_from(everyone))
        rest = [v for v in everyone if v != victim]
        helpers = frozenset(draw(st.permutations(rest))[:draw(st.integers(2, (n - 2) // 2))])
        crowd = frozenset(rest) - helpers
        group = helpers | {victim}  # the victim's roster: its shares go to the helpers only
        rosters[victim] = group
        announce_t[victim] = len(group) // 2 + 1  # the smallest t each roster allows

        sets[victim] = group
        requests[victim] = [(group, frozenset())]
        for h in helpers:  # helpers reveal the victim's self-mask share ...
            rosters[h] = frozenset({h, victim}) | crowd
            announce_t[h] = len(rosters[h]) // 2 + 1
            sets[h] = rosters[h]
            requests[h] = [(sets[h], frozenset())]
        for c in crowd:  # ... the crowd is told the helpers dropped: their masking keys
            rosters[c] = helpers | crowd
            announce_t[c] = len(rosters[c]) // 2 + 1
            sets[c] = crowd
            requests[c] = [(sets[c], helpers)]
    else:
        rosters = {u: subset([u]) for u in everyone if draw(st.booleans())}
        announce_t = {u: draw(st.integers(min_value=1, max_value=n)) for u in everyone
                      if draw(st.integers(0, 4)) == 0}
        deliver = {u: subset([u]) for u in everyone if draw(st.integers(0, 3)) == 0}
        sets = {u: subset([u]) for u in everyone if draw(st.booleans())}
        for u in everyone:
            reqs = []
            for _ in range(draw(st.integers(min_value=0, max_value=2))):
                shown = sets.get(u)
                surv = shown if shown is not None and draw(st.booleans()) else subset([u])
                reqs.append((surv, frozenset(draw(st.sets(st.sampled_from(everyone))))))
            if reqs or draw(st.booleans()):
                requests[u] = reqs
    if draw(st.integers(0, 3)) == 0:
        announce_k = {u: draw(st.sampled_from([None, 2, 4])) for u in everyone}
    return Plan(n=n, threshold=threshold, neighbours=neighbours, rosters=rosters,
                announce_t=announce_t, announce_k=announce_k, deliver=deliver, sets=sets,
                requests=requests)


# -- withheld shares: a client masked with too few peers, or asked to sign survivors it never
# -- masked with, would let the server strip every pairwise mask of its vector -----------------
WITHHELD_SHARES = Plan(n=3, deliver={0: frozenset({0})})  # client 0 gets no peer's shares
OUTSIDE_SURVIVORS = Plan(  # t = 3 of 5: 0 masks with 1 and 2 only, who "drop" for the others
    n=5, threshold=0.51,
    deliver={0: frozenset({0, 1, 2}), **{u: frozenset({0, 1, 2, 3, 4}) - {0} | {u}
                                          for u in (1, 2)},
             **{u: frozenset({1, 2, 3, 4}) for u in (3, 4)}},
    sets={u: frozenset({0, 3, 4}) for u in range(5)},
    requests={u: [(frozenset({0, 3, 4}), frozenset({1, 2}))] for u in range(5)})


def test_a_client_given_fewer_than_t_peer_shares_refuses_to_mask() -> None:
    seen, x, _ = run(WITHHELD_SHARES)
    assert 0 not in seen.uploads
    assert any(getattr(e, "code", "") == "too_few_peers" for e in seen.refusals)
    assert recovered(seen, x) == []


def test_a_client_refuses_to_sign_survivors_it_did_not_mask_with() -> None:
    seen, x, _ = run(OUTSIDE_SURVIVORS)
    assert 0 in seen.uploads and seen.peers[0] == frozenset({1, 2})
    assert (frozenset({0, 3, 4}), 0) not in seen.signatures
    assert any(getattr(e, "code", "") == "survivor_set" for e in seen.refusals)
    assert recovered(seen, x) == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(plan=ATTACK1)
@example(plan=WITHHELD_SHARES)
@example(plan=OUTSIDE_SURVIVORS)
@given(plan=plans())
def test_no_server_strategy_unmasks_an_individual_vector(plan: Plan) -> None:
    seen, x, _ = run(plan)
    assert recovered(seen, x) == []
    # the server gets the sum of the survivors, or nothing it can open
    for u in seen.uploads:
        assert not (seen.self_seed(u) is not None and seen.mask_key(u) is not None)


# -- attack 3: DP parameters from the server ------------------------------------------------------
def _dp_config(n_clients: int, target_bound: float = 1.0, **profile: Any) -> JobConfig:
    return JobConfig(job_id=JOB, task="regression", n_features=2, n_clients=n_clients,
                     feature_bounds=((-1.0, 1.0),) * 2, target_bound=target_bound,
                     n_estimators=2, max_depth=3, min_samples_leaf=1, max_features=2, n_bins=4,
                     profile=load_profile("secure-dp", **profile).to_dict())


def test_attack3_the_worker_clips_y_to_the_calibrated_bound() -> None:
    from fedforest_secure.coordinator import Coordinator
    from fedforest_secure.federation import client_seed
    from fedforest_secure.protocol import kind_code, kinds_vector
    from fedforest_secure.worker import Worker

    rng = np.random.default_rng(0)
    cfg = _dp_config(3, target_bound=0.03)  # the server's bound; the data reach 3.0
    X = rng.uniform(-1, 1, size=(30, 2))
    y = np.full(30, 3.0)
    workers = [Worker(cfg, X, y, client_index=k, seed=client_seed(cfg, k)) for k in range(3)]
    coord = Coordinator(cfg)
    task = coord.next_task()
    while task is not None and not any(StatKind.SUM in b.kinds for b in task.layout):
        coord.submit(task.round_id, sum(w.handle(task).summable for w in workers),
                     participants=[0, 1, 2])
        task = coord.next_task()
    assert task is not None
    reply = workers[0].handle(task)
    kinds = kinds_vector(task.layout)
    sums = reply.summable[kinds == kind_code(StatKind.SUM)]
    counts = reply.summable[kinds == kind_code(StatKind.COUNT)]
    assert counts.max() > 0
    assert np.abs(sums).max() <= counts.max() * 0.03 * (1 + 1e-9), \
        "one record moved a sum by more than the calibrated bound"


def test_attack3_a_session_refuses_a_job_of_1000_clients_it_has_3_identities_for() -> None:
    keys = {u: SigningKey.generate() for u in range(3)}
    dirj = {"complete": True, "keys": {str(u): bytes(k.verify_key).hex()
                                       for u, k in keys.items()}}
    tr = RecordingTransport(dirj)
    session = SecAggSession(_dp_config(1000), tr, JOB, 0, keys[0])  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="this job has 1000 clients"):
        session.connect(timeout_s=1.0)
    assert tr.sent == []


def test_attack3_a_client_refuses_to_unmask_fewer_survivors_than_its_k_min() -> None:
    from fedforest_secure.secure_sum import unmask_floor

    assert unmask_floor(_dp_config(10)) == 7 and unmask_floor(_dp_config(1000)) == 670
    # ten clients, t = 7, noise calibrated for K_min = 9 survivors; clients 8 and 9 are shown
    # rosters too small to join, so eight upload: enough for t, not for K_min
    plan = Plan(n=10, min_survivors=9, rosters={8: frozenset({8}), 9: frozenset({9})})
    seen, x, clients = run(plan)
    assert set(seen.uploads) == set(range(8)) and recovered(seen, x) == []
    assert not seen.signatures and not seen.self_shares and not seen.key_shares
    dp = [e for e in seen.refusals if "calibrated for that many" in str(e)]
    assert len(dp) == 8 and {e.code for e in dp} == {"too_few_survivors"}  # type: ignore[attr-defined]
    assert all(clients[u].stage is ClientStage.MASKED for u in range(8))


def test_attack3_a_job_config_that_disagrees_with_the_site_is_refused() -> None:
    from fedforest_secure.privacy.pinning import check_job_config
    from fedforest_secure.schema import Schema

    schema = Schema.from_dict({
        "features": [{"name": "a", "kind": "continuous", "bounds": [-1.0, 1.0]},
                     {"name": "b", "kind": "continuous", "bounds": [-1.0, 1.0]}],
        "target": {"name": "y", "kind": "regression", "bounds": [-3.0, 3.0]}})
    honest = _dp_config(3, target_bound=3.0)
    check_job_config(honest, profile=load_profile("secure-dp"), schema=schema, n_clients=3)
    cases = {
        "n_clients": _dp_config(1000, target_bound=3.0),
        "target_bound": _dp_config(3, target_bound=0.03),
        "profile.dp": _dp_config(3, target_bound=3.0, epsilon=17.4),
    }
    for field_, evil in cases.items():
        with pytest.raises(RefusedRequest, match=field_) as info:
            check_job_config(evil, profile=load_profile("secure-dp"), schema=schema,
                             n_clients=3)
        assert info.value.code == "job_config"


# -- residual risk: colluding clients ------------------------------------------------------------
def test_residual_t_colluding_clients_with_the_server_unmask_a_vector() -> None:
    """RESIDUAL (documented): Shamir's threshold is the limit. ``t`` clients that hand the
    server the shares they hold of a victim's self-mask seed and masking key give it the
    victim's vector, however consistent the round. DP (``secure-dp``) is the only guard."""
    n, victim = 5, 0
    seen, x, clients = run(Plan(n=n))
    t = job_threshold(0.67, n)
    colluders = [u for u in range(n) if u != victim][:t]
    for u in colluders:  # what each colluder still holds after the round
        rnd = clients[u]._round
        assert rnd is not None
        b_share, sk_share = rnd.held[victim]
        seen.self_shares.setdefault(victim, {})[u + 1] = b_share
        seen.key_shares.setdefault(victim, {})[u + 1] = sk_share
    assert recovered(seen, x) == [victim]


def test_a_directory_giving_two_clients_one_identity_key_is_refused() -> None:
    """The server lists client 0's identity key again for client 3 (a fourth identity it
    plays without a key of its own): client 0's signature of a survivor set would then count
    as client 3's too, t signatures of the consistency step from fewer than t sites. Every
    session refuses such a directory before it sends anything, and so does the library
    client."""
    from fedforest_secure.secagg import SecAggClient
    from fedforest_secure.secagg._rounds import consistency_payload
    from fedforest_secure.secagg._verify import survivor_signature_ok

    keys = {u: SigningKey.generate() for u in range(4)}
    directory = {u: bytes(k.verify_key) for u, k in keys.items()}
    directory[3] = directory[0]
    payload = consistency_payload(JOB, 0, DIGEST, (0, 1, 2, 3))
    sig = keys[0].sign(payload).signature
    assert survivor_signature_ok(directory, 0, sig, payload)  # the attack: one signature, two
    assert survivor_signature_ok(directory, 3, sig, payload)  # signers
    dirj = {"complete": True, "keys": {str(u): k.hex() for u, k in directory.items()}}
    for u in (0, 1):
        tr = RecordingTransport(dirj)
        session = SecAggSession(_config(4), tr, JOB, u, keys[u])  # type: ignore[arg-type]
        with pytest.raises(ProtocolError, match=r"gives clients \[0, 3\] the same identity key"):
            session.connect(timeout_s=1.0)
        assert session.client is None and tr.sent == []
    with pytest.raises(ValueError, match="two entries of the identity directory hold the same"):
        SecAggClient(1, JOB, keys[1], directory, n_clients=4, threshold=0.75)
