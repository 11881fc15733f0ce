"""An actively malicious server against the neighbourhood-local checks of the SecAgg+ graph.

On the sparse graph a client verifies the adverts of its own group only, and reveals a share of
a neighbour ``p`` (its group's shares are the only ones it holds) for the survivor set it signed
only when ``t_local`` members of ``p``'s own group signed that set too (threat_model.md §2.2,
S16-S19; Bell et al. 2020 for the sparse graph). The server here plays the harness of
``test_malicious_server`` (real ``SecAggClient`` objects; it records what they send and tries to
unmask each vector on its own).

The central attack: the server shows the victim and the peers it masked with one survivor set
and the rest of the ring another, in which those peers "dropped". If each client counted the
signatures of its *own* group, the victim's self mask and its peers' masking keys would both be
revealed: the test runs the attack once with that rule (it recovers the victim's vector, so the
attack is real) and with the client's own rule (it recovers nothing).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey
from test_malicious_server import DIGEST, JOB, L, Plan, Q, recovered, run

from fedforest_secure.errors import InvalidMessage, RefusedRequest
from fedforest_secure.secagg import (
    ClientStage,
    InProcessSecureSum,
    SecAggClient,
    SecAggServer,
    ShareDelivery,
    SurvivorSet,
    UnmaskRequest,
    _verify,
)
from fedforest_secure.secagg import client as client_module
from fedforest_secure.secagg._rounds import (
    graph_seed,
    local_threshold,
    neighbour_groups,
    ring_order,
)

Ids = frozenset[int]


def _ring(n: int) -> list[int]:
    """The clients in the order of round 0's ring (the graph the clients derive themselves)."""
    return ring_order(range(n), graph_seed(JOB, 0, DIGEST, range(n)))


def two_neighbourhoods(n: int = 12) -> tuple[Plan, int]:
    """The server's two-set attack on the ring of ``n`` clients, 4 neighbours each, threshold
    0.51 (t = 7 of 12; a majority of each group of 5 is 3).

    With ring positions relative to the victim ``v`` (``v+1`` is its right-hand neighbour):

    * the victim is delivered the shares of ``v-2`` and ``v+2`` only, so it masks with those two
      alone;
    * ``A = {v-2, v, v+2}`` are shown ``S_A`` = everyone but ``v-1`` and ``v+1``;
    * everyone else (``B``) is shown ``S_B`` = everyone but ``v-2`` and ``v+2``, "dropped":
      ``v+1, v+3, v+4`` hold 3 shares of ``v+2``'s masking key, ``v-1, v-3, v-4`` of
      ``v-2``'s, and ``v-1, v+1`` (with ``v`` itself, in A) 3 shares of the victim's self mask.

    A client that counted the signatures of its *own* group would reveal all of these with a
    majority threshold: ``v`` sees 3 of its group sign ``S_A``, each revealer of B 3 of its group
    sign ``S_B``.
    """
    ring = _ring(n)
    at = {d: ring[d % n] for d in range(-n // 2, n // 2 + 1)}  # offset from the victim -> id
    v = at[0]
    everyone = frozenset(range(n))
    a = frozenset({at[-2], v, at[2]})
    s_a = everyone - {at[-1], at[1]}
    s_b = everyone - {at[-2], at[2]}
    requests: dict[int, list[tuple[Ids, Ids]]] = {}
    sets: dict[int, Ids] = {}
    for u in range(n):
        sets[u] = s_a if u in a else s_b
        requests[u] = [(sets[u], everyone - sets[u])]
    plan = Plan(n=n, threshold=0.51, neighbours=4,
                deliver={v: frozenset({v, at[-2], at[2]})}, sets=sets, requests=requests)
    return plan, v


def _majority_threshold(t: int, n: int, group_size: int) -> int:
    """A group threshold of ``t`` scaled to the group, at least a strict majority of it (what
    the isolation proof of threat_model.md §2.2 needs more than, at threshold 0.51)."""
    if group_size >= n:
        return t
    return min(group_size, max(group_size // 2 + 1, math.ceil(t * group_size / n)))


def _own_group(rnd: Any, owner: int) -> frozenset[int]:
    """The rule this test shows unsafe: every share a client reveals is backed by signatures
    of the revealing client's own group."""
    return frozenset(rnd.group)


@pytest.fixture()
def majority_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "local_threshold", _majority_threshold)


@pytest.mark.usefixtures("majority_threshold")
def test_two_neighbourhoods_would_unmask_the_victim_if_each_client_counted_its_own_group(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plan, victim = two_neighbourhoods()
    monkeypatch.setattr(SecAggClient, "_backers", staticmethod(_own_group))
    seen, x, _ = run(plan)
    assert recovered(seen, x) == [victim]


@pytest.mark.usefixtures("majority_threshold")
def test_two_neighbourhoods_do_not_unmask_the_victim_when_each_owners_group_backs_its_shares(
        ) -> None:
    """The client's rule (a share of ``p`` needs ``t_local`` signatures of ``p``'s group), even
    with a bare majority as ``t_local``: every revealer of the attack lacks the backing of one
    of its owners' groups and refuses."""
    plan, victim = two_neighbourhoods()
    seen, x, _ = run(plan)
    assert recovered(seen, x) == []
    assert seen.self_seed(victim) is None
    assert {getattr(e, "code", "") for e in seen.refusals} == {"signatures"}


def test_two_neighbourhoods_do_not_unmask_the_victim() -> None:
    """As the client runs: at threshold 0.51 its group threshold is raised to 4 of 5
    (``isolation_proof_holds``), so two peers are too few to mask with."""
    plan, victim = two_neighbourhoods()
    seen, x, clients = run(plan)
    assert recovered(seen, x) == []
    assert victim not in seen.uploads
    assert "too_few_peers" in {getattr(e, "code", "") for e in seen.refusals}


@st.composite
def camp_plans(draw: st.DrawFn) -> Plan:
    """A server that splits the ring into camps, each shown its own survivor set (the dropped
    are everyone else), aimed at one victim: the victim gets the shares of a few of its
    neighbours only (``P``); the victim's camp calls its other neighbours dropped, the other
    camps call (some of) ``P`` dropped."""
    n = draw(st.integers(min_value=7, max_value=14))
    k = draw(st.sampled_from([2, 4, 6]))
    threshold = draw(st.sampled_from([0.51, 0.67, 0.8]))
    ring = _ring(n)
    everyone = frozenset(range(n))
    pos = draw(st.integers(min_value=0, max_value=n - 1))
    v = ring[pos]
    half = math.ceil(k / 2)
    near = [ring[(pos + d) % n] for d in range(-half, half + 1) if d != 0]
    if draw(st.booleans()):  # the farthest neighbour on each side: the fewest shared holders
        peers = frozenset({ring[(pos - half) % n], ring[(pos + half) % n]})
    else:
        peers = frozenset(draw(st.permutations(near))[:draw(st.integers(1, len(near)))])
    camps = draw(st.integers(min_value=2, max_value=3))
    # the victim and its peers form camp 0; everyone else is in another camp, or any camp
    spread = draw(st.booleans())
    camp_of = {u: (0 if u in peers or u == v
                   else draw(st.integers(0, camps - 1)) if spread else 1)
               for u in range(n)}
    sets = {0: everyone - (frozenset(near) - peers)}
    for c in range(1, camps):
        cut = (peers if draw(st.booleans()) else frozenset(
            draw(st.permutations(sorted(peers)))[:draw(st.integers(1, len(peers)))]))
        sets[c] = everyone - cut
    plan_sets = {u: sets[camp_of[u]] for u in range(n)}
    return Plan(n=n, threshold=threshold, neighbours=k, deliver={v: peers | {v}},
                sets=plan_sets,
                requests={u: [(plan_sets[u], everyone - plan_sets[u])] for u in range(n)})


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(plan=two_neighbourhoods()[0])
@given(plan=camp_plans())
def test_no_camp_strategy_on_the_sparse_graph_unmasks_an_individual_vector(plan: Plan) -> None:
    seen, x, _ = run(plan)
    assert recovered(seen, x) == []
    for u in seen.uploads:
        assert not (seen.self_seed(u) is not None and seen.mask_key(u) is not None)


# -- what a client verifies and uses: its own group's adverts and signatures -------------------
class _CountingChecks:
    """Wraps the secure-aggregation checks' signature test: counts the signatures checked
    (each one asked for, whether its verdict is computed or was kept from an earlier ask)."""

    calls = 0

    def __init__(self, signed: Any) -> None:
        self._signed = signed

    def __call__(self, identity: bytes, payload: bytes, signature: bytes) -> bool:
        type(self).calls += 1
        return bool(self._signed(identity, payload, signature))


@pytest.mark.parametrize("sites", [40, 80])
def test_a_client_verifies_as_many_adverts_and_signatures_at_80_sites_as_at_40(
        monkeypatch: pytest.MonkeyPatch, sites: int) -> None:
    """Per round a SecAgg+ client of degree ``k`` verifies the ``k + 1`` adverts of its group
    and the ``2k + 1`` survivor-set signatures of its neighbours' groups, at 40 sites as at 80:
    the count does not grow with the number of sites."""
    neighbours = 6
    monkeypatch.setattr(_verify, "_signed", _CountingChecks(_verify._signed))
    ss = InProcessSecureSum(range(sites), 0.67, "job-k", neighbours=neighbours, record=False)
    vectors = {u: np.full(L, u, dtype=np.uint64) for u in range(sites)}
    ss.sum("q0", b"\x00" * 32, vectors)  # round 0 (adverts made and checked)
    client = ss.clients[0]
    calls: dict[str, int] = {}
    for name in ("share_keys", "unmask"):
        original = getattr(client, name)

        def counted(*args: Any, _name: str = name, _f: Any = original, **kw: Any) -> Any:
            before = _CountingChecks.calls
            out = _f(*args, **kw)
            calls[_name] = _CountingChecks.calls - before
            return out

        monkeypatch.setattr(client, name, counted)
    total = ss.sum("q1", b"\x01" * 32, vectors)
    assert np.array_equal(total, np.full(L, sum(range(sites)), dtype=np.uint64))
    assert calls == {"share_keys": neighbours + 1, "unmask": 2 * neighbours + 1}


def _sparse_round(n: int = 12, k: int = 4) -> tuple[SecAggServer, dict[int, SecAggClient]]:
    keys = {u: SigningKey.generate() for u in range(n)}
    directory = {u: bytes(keys[u].verify_key) for u in range(n)}
    clients = {u: SecAggClient(u, JOB, keys[u], directory, n_clients=n, threshold=0.67,
                               neighbours=k) for u in range(n)}
    server = SecAggServer(JOB, 0, Q, DIGEST, L, 0.67, directory, k)
    for c in clients.values():
        server.receive_advert(c.advertise(0))
    server.setup()
    return server, clients


def test_the_server_sends_each_client_the_roster_and_its_groups_adverts() -> None:
    server, clients = _sparse_round()
    groups = neighbour_groups(range(12), 4, graph_seed(JOB, 0, DIGEST, range(12)))
    for u, c in clients.items():
        setup = server.setup_for(u)
        assert setup.roster == tuple(range(12))
        assert {a.client_id for a in setup.adverts} == groups[u]
        bundle = c.share_keys(setup)
        assert set(bundle.ciphertexts) == groups[u] - {u}


@pytest.mark.parametrize("attack", ["forged_non_neighbour", "forged_neighbour",
                                    "missing_neighbour", "server_chosen_group",
                                    "advert_outside_roster", "roster_without_client"])
def test_a_client_checks_its_neighbours_adverts_and_ignores_the_others(attack: str) -> None:
    """Adverts of non-neighbours are not verified (a forged one changes nothing: no share is
    encrypted to it); a forged, missing or server-chosen neighbour is refused before any share
    leaves."""
    server, clients = _sparse_round()
    u = 0
    honest = server._broadcast_setup()  # every advert, as the complete graph's setup has them
    group = neighbour_groups(range(12), 4, graph_seed(JOB, 0, DIGEST, range(12)))[u]
    outsider = min(set(range(12)) - group)
    neighbour = min(group - {u})
    adverts = list(honest.adverts)

    def forge(v: int) -> None:
        adverts[v] = adverts[v].model_copy(update={"signature": b"\x01" * 64})

    roster: tuple[int, ...] | None = None
    if attack == "forged_non_neighbour":
        forge(outsider)
    elif attack == "forged_neighbour":
        forge(neighbour)
    elif attack == "missing_neighbour":
        roster = tuple(range(12))
        adverts = [a for a in adverts if a.client_id != neighbour]
    elif attack == "server_chosen_group":  # the server's own pick of neighbours for u
        roster = tuple(range(12))
        chosen = {u, *sorted(set(range(12)) - group)[:4]}
        adverts = [a for a in adverts if a.client_id in chosen]
    elif attack == "advert_outside_roster":
        roster = tuple(v for v in range(12) if v != outsider)
    else:
        roster = tuple(range(1, 12))
    setup = honest.model_copy(update={"adverts": tuple(adverts), "roster": roster})
    c = clients[u]
    if attack == "forged_non_neighbour":
        bundle = c.share_keys(setup)
        assert set(bundle.ciphertexts) == group - {u}
        return
    with pytest.raises(InvalidMessage):
        c.share_keys(setup)
    assert c.stage is ClientStage.ADVERTISED  # no share left


def _to_unmask(n: int = 12, k: int = 4
               ) -> tuple[SecAggServer, dict[int, SecAggClient], UnmaskRequest]:
    server, clients = _sparse_round(n, k)
    for u, c in clients.items():
        server.receive_shares(c.share_keys(server.setup_for(u)))
    deliveries = server.deliver_shares()
    for u, c in clients.items():
        header, masked = c.mask(deliveries[u], np.zeros(L, dtype=np.uint64))
        server.receive_upload(header, masked)
    survivor_set = server.request_signatures()
    for c in clients.values():
        server.receive_signature(c.sign_survivors(survivor_set))
    return server, clients, server.request_unmask()  # the broadcast: every signature


@pytest.mark.parametrize("attack", ["non_neighbours_only", "forged_non_neighbours",
                                    "forged_neighbour"])
def test_a_client_counts_only_the_signatures_of_its_neighbours_groups(attack: str) -> None:
    server, clients, full = _to_unmask()
    u = 0
    group = neighbour_groups(range(12), 4, graph_seed(JOB, 0, DIGEST, range(12)))[u]
    t_local = local_threshold(clients[u].t, 12, len(group))
    sigs = dict(full.signatures)
    if attack == "non_neighbours_only":  # every outsider's genuine signature, no neighbour's
        request = full.model_copy(update={"signatures": {s: g for s, g in sigs.items()
                                                         if s not in group}})
        assert len(request.signatures) >= t_local
        with pytest.raises(RefusedRequest) as info:
            clients[u].unmask(request)
        assert info.value.code == "signatures"
        assert clients[u].stage is ClientStage.SIGNED
        return
    if attack == "forged_non_neighbours":  # outside the neighbours' groups: never verified
        groups = neighbour_groups(range(12), 4, graph_seed(JOB, 0, DIGEST, range(12)))
        needed = set().union(*(groups[p] for p in group))
        forged = {s: b"\x02" * 64 for s in sigs if s not in needed}
        assert forged
        response = clients[u].unmask(full.model_copy(update={"signatures": {**sigs, **forged}}))
        assert set(response.self_mask_shares) == group
        return
    forged_one = {**sigs, min(group - {u}): b"\x02" * 64}
    with pytest.raises(InvalidMessage):
        clients[u].unmask(full.model_copy(update={"signatures": forged_one}))
    assert clients[u].stage is ClientStage.SIGNED


def test_each_client_gets_its_neighbours_groups_signatures_and_the_round_sums() -> None:
    server, clients, _ = _to_unmask()
    groups = neighbour_groups(range(12), 4, graph_seed(JOB, 0, DIGEST, range(12)))
    for u, c in clients.items():
        request = server.unmask_request_for(u)
        assert set(request.signatures) == set().union(*(groups[p] for p in groups[u]))
        server.receive_unmask(c.unmask(request))
    assert np.array_equal(server.finish(), np.zeros(L, dtype=np.uint64))


def test_a_survivor_set_shown_to_one_client_is_checked_against_the_whole_roster() -> None:
    """The survivor set a client signs is the whole round's (its count against ``t`` and
    ``K_min`` is global), even though the client checks only its group's signatures."""
    server, clients = _sparse_round()
    for u, c in clients.items():
        server.receive_shares(c.share_keys(server.setup_for(u)))
    deliveries = server.deliver_shares()
    for u, c in clients.items():
        c.mask(deliveries[u], np.zeros(L, dtype=np.uint64))
    c0 = clients[0]
    group = neighbour_groups(range(12), 4, graph_seed(JOB, 0, DIGEST, range(12)))[0]
    with pytest.raises(RefusedRequest) as info:  # only the group: 5 < t = 9 of the job
        c0.sign_survivors(SurvivorSet(job_id=JOB, round_id=0, survivors=tuple(sorted(group))))
    assert info.value.code == "too_few_survivors"
    with pytest.raises(InvalidMessage):  # a client outside the roster
        c0.sign_survivors(SurvivorSet(job_id=JOB, round_id=0, survivors=tuple(range(13))))



# -- residual risk: colluding clients count per neighbourhood ------------------------------------
def test_residual_t_local_colluding_neighbours_unmask_a_vector_on_the_sparse_graph() -> None:
    """RESIDUAL (documented): on the sparse graph Shamir's threshold is the group's. The
    ``t_local`` neighbours that hold a victim's shares (5 of its group of 7 here, where the
    job's ``t`` is 21 of 30) hand them to the server and it has the victim's vector."""
    n, k = 30, 6
    seen, x, clients = run(Plan(n=n, neighbours=k))
    ring = _ring(n)
    victim = ring[0]
    group = neighbour_groups(range(n), k, graph_seed(JOB, 0, DIGEST, range(n)))[victim]
    t_local = local_threshold(clients[victim].t, n, len(group))
    assert (t_local, clients[victim].t) == (5, 21)
    colluders = sorted(group - {victim})[:t_local]
    for u in colluders:
        rnd = clients[u]._round
        assert rnd is not None
        b_share, sk_share = rnd.held[victim]
        seen.self_shares.setdefault(victim, {})[u + 1] = b_share
        seen.key_shares.setdefault(victim, {})[u + 1] = sk_share
    assert victim in recovered(seen, x)


def test_a_share_made_for_another_task_of_the_round_is_rejected() -> None:
    """The graph's seed hashes the task, so a server showing two clients different tasks in one
    round would have them derive different graphs: a share carries its task digest, and a
    client shown another task rejects it before masking (here on the complete graph, where
    both would address each other whatever the task)."""
    keys = {u: SigningKey.generate() for u in range(4)}
    directory = {u: bytes(keys[u].verify_key) for u in range(4)}
    clients = {u: SecAggClient(u, JOB, keys[u], directory, n_clients=4, threshold=0.67)
               for u in range(4)}
    server = SecAggServer(JOB, 0, Q, DIGEST, L, 0.67, directory)
    for c in clients.values():
        server.receive_advert(c.advertise(0))
    setup = server.setup()
    bundles = {u: c.share_keys(setup if u != 3 else setup.model_copy(
        update={"task_digest": bytes(32)})) for u, c in clients.items()}
    cts = {v: bundles[v].ciphertexts[0] for v in (1, 2, 3)}
    delivery = ShareDelivery(job_id=JOB, round_id=0, recipient=0, ciphertexts=cts)
    with pytest.raises(InvalidMessage, match="does not authenticate"):
        clients[0].mask(delivery, np.zeros(L, dtype=np.uint64))
    honest = delivery.model_copy(update={"ciphertexts": {v: cts[v] for v in (1, 2)}})
    clients[0].mask(honest, np.zeros(L, dtype=np.uint64))  # the same task's shares: accepted
