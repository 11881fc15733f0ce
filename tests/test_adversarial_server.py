"""An actively malicious server against the client side of secure aggregation.

The harness plays the server: it builds honest messages with the real
:class:`~fedforest_secure.secagg.SecAggServer`, then tampers with them before they reach a real
:class:`~fedforest_secure.secagg.SecAggClient` (or the HTTPS client's
:class:`~client_app.secagg_session.SecAggSession`, through a recording fake transport). For every
attack the client must refuse with a clear error, stay where it was (a later honest message
still works), and reveal nothing: no share it holds appears in anything it sent or raised.

Attacks the client does *not* stop today are strict xfails marked ``VULN`` (see threat_model.md).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
from nacl.signing import SigningKey

from client_app.secagg_session import SecAggSession
from fedforest_secure import load_profile
from fedforest_secure._layouts import hist_block
from fedforest_secure.config import JobConfig
from fedforest_secure.coordinator import Coordinator
from fedforest_secure.errors import FedForestError, InvalidMessage, ProtocolError, RefusedRequest
from fedforest_secure.federation import client_seed
from fedforest_secure.protocol import Block, SealedTask, StatKind, Task, TaskKind, question_key
from fedforest_secure.secagg import (
    ClientStage,
    InProcessSecureSum,
    RoundSetup,
    SecAggClient,
    SecAggServer,
    SurvivorSet,
    UnmaskRequest,
)
from fedforest_secure.secagg._primitives import _shamir
from fedforest_secure.secure_sum import encode_contribution, make_codec
from fedforest_secure.worker import Worker

JOB = "job-m"
L = 16


def _task(round_id: int, length: int = L) -> Task:
    return Task(job_id=JOB, round_id=round_id, kind=TaskKind.HISTOGRAM, level=0,
                params={"stats": "count"},
                layout=(Block("hist", (length, 1), (StatKind.COUNT,)),))


@dataclass
class FakeTransport:
    """Records every request a SecAggSession makes; serves a fixed identity directory."""

    directory: dict[str, Any]
    sent: list[tuple[str, str, bytes]] = field(default_factory=list)

    def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self.directory

    def request(self, method: str, path: str, *, content: bytes | None = None,
                content_type: str = "application/octet-stream", **_: Any) -> Any:
        self.sent.append((method, path, content or b""))
        return httpx.Response(200, json={"recorded": True})


class Federation:
    """K real clients with Ed25519 identities, and an honest server state machine per round."""

    def __init__(self, k: int = 4, threshold: int = 3) -> None:
        self.k, self.threshold = k, threshold
        self.keys = {u: SigningKey.generate() for u in range(k)}
        self.directory = {u: bytes(s.verify_key) for u, s in self.keys.items()}
        self.clients = {u: SecAggClient(u, JOB, self.keys[u], self.directory, n_clients=k,
                                        threshold=threshold) for u in range(k)}

    def server(self, task: Task) -> SecAggServer:
        return SecAggServer(JOB, task.round_id, question_key(task), task.digest(), L,
                            self.threshold, self.directory)

    def setup(self, task: Task) -> tuple[SecAggServer, RoundSetup]:
        server = self.server(task)
        for c in self.clients.values():
            server.receive_advert(c.pending_advert(task.round_id) or c.advertise(task.round_id))
        return server, server.setup()

    def to_uploaded(self, task: Task, drop: frozenset[int] = frozenset()) -> SecAggServer:
        server, setup = self.setup(task)
        for c in self.clients.values():
            server.receive_shares(c.share_keys(setup))
        deliveries = server.deliver_shares()
        for u, c in self.clients.items():
            if u not in drop:
                server.receive_upload(*c.mask(deliveries[u], np.full(L, u, dtype=np.uint64)))
        return server

    def to_unmask(self, task: Task, drop: frozenset[int] = frozenset()
                  ) -> tuple[SecAggServer, UnmaskRequest]:
        server = self.to_uploaded(task, drop)
        survivor_set = server.request_signatures()
        for u in survivor_set.survivors:
            server.receive_signature(self.clients[u].sign_survivors(survivor_set))
        return server, server.request_unmask()


def held_share_strings(client: SecAggClient) -> list[str]:
    """Every encoding of every share the client holds (hex, base64, decimal)."""
    rnd = client._round
    assert rnd is not None and rnd.held
    out = []
    for pair in rnd.held.values():
        for share in pair:
            raw = _shamir.to_bytes(share)
            out += [raw.hex(), base64.b64encode(raw).decode(), str(share)]
    return out


def assert_reveals_nothing(client: SecAggClient, exc: BaseException,
                           sent: list[tuple[str, str, bytes]] = ()) -> None:  # type: ignore[assignment]
    text = str(exc) + repr(exc.args) + "".join(body.decode("latin-1") for _, _, body in sent)
    for s in held_share_strings(client):
        assert s not in text


def _session(fed: Federation, u: int) -> tuple[SecAggSession, FakeTransport]:
    tr = FakeTransport({"complete": True,
                        "keys": {str(v): k.hex() for v, k in fed.directory.items()}})
    config = dataclasses.replace(_secure_config()[0], n_clients=fed.k)
    session = SecAggSession(config, tr, JOB, u, fed.keys[u])  # type: ignore[arg-type]
    session.connect(timeout_s=1.0)
    return session, tr


# -- both shares of one peer -----------------------------------------------------------------
def test_client_refuses_both_shares_of_one_peer_and_sends_only_its_refusal() -> None:
    fed = Federation(k=5, threshold=4)
    task = _task(0)
    session, tr = _session(fed, 0)
    fed.clients[0] = session.client  # type: ignore[assignment]
    _, honest = fed.to_unmask(task, drop=frozenset({4}))
    assert honest.dropped == (4,)
    # the server calls survivor 1 dropped as well: that would unmask client 1's vector
    evil = honest.model_copy(update={"dropped": (1, 4)})
    with pytest.raises(RefusedRequest, match="both a self-mask and a key share of client 1") \
            as info:
        session.unmask(task, evil.model_dump_json())
    assert [(m, p.rsplit("/", 1)[-1]) for m, p, _ in tr.sent] == [("POST", "refuse")]
    assert json.loads(tr.sent[0][2]) == {"reason": "both_shares"}  # a code, no share material
    assert_reveals_nothing(session.client, info.value, tr.sent)  # type: ignore[arg-type]
    assert session.client.stage is ClientStage.SIGNED  # type: ignore[union-attr]
    # asking again later, after an honest answer, is refused too (across requests)
    resp = session.client.unmask(honest)  # type: ignore[union-attr]
    assert set(resp.self_mask_shares) == {0, 1, 2, 3} and set(resp.key_shares) == {4}
    with pytest.raises(RefusedRequest, match="already (answered|revealed)|differ from the set") \
            as info2:
        session.client.unmask(honest.model_copy(update={  # type: ignore[union-attr]
            "survivors": (0, 2, 3), "dropped": (1, 4)}))
    assert_reveals_nothing(session.client, info2.value)  # type: ignore[arg-type]


# -- a roster or survivor set below the threshold --------------------------------------------
@pytest.mark.parametrize("attack", ["two_clients", "two_clients_t2", "minority_threshold",
                                    "threshold_above_n"])
def test_client_refuses_a_roster_below_threshold(attack: str) -> None:
    fed = Federation(k=4, threshold=3)
    task = _task(0)
    _, setup = fed.setup(task)
    if attack == "two_clients":  # a "sum" over the target and one other client
        evil = setup.model_copy(update={"adverts": setup.adverts[:2]})
        match = "roster of 2 clients"
    elif attack == "two_clients_t2":  # ... with a threshold that such a roster would allow
        evil = setup.model_copy(update={"adverts": setup.adverts[:2], "threshold": 2})
        match = "announces threshold 2"
    elif attack == "minority_threshold":  # t = 2 of 4: two colluders could unmask anyone
        evil = setup.model_copy(update={"threshold": 2})
        match = "announces threshold 2; this client's profile gives t=3"
    else:
        evil = setup.model_copy(update={"threshold": 5})
        match = "announces threshold 5"
    c0 = fed.clients[0]
    with pytest.raises(RefusedRequest, match=match) as info:
        c0.share_keys(evil)
    assert info.value.code == "roster"
    assert c0.stage is ClientStage.ADVERTISED  # nothing happened: the honest setup still works
    assert set(c0.share_keys(setup).ciphertexts) == {1, 2, 3}


def test_client_refuses_to_unmask_for_fewer_than_t_survivors() -> None:
    fed = Federation(k=5, threshold=4)
    task = _task(0)
    fed.to_uploaded(task)
    evil = SurvivorSet(job_id=JOB, round_id=0, survivors=(0, 1, 2))
    c0 = fed.clients[0]
    with pytest.raises(RefusedRequest, match="fewer than t=4") as info:
        c0.sign_survivors(evil)
    assert_reveals_nothing(c0, info.value)
    assert c0.stage is ClientStage.MASKED


# -- replays of an old round ------------------------------------------------------------------
def test_client_rejects_every_message_replayed_from_an_old_round() -> None:
    fed = Federation()
    t0, t1 = _task(0), _task(1)
    server0, setup0 = fed.setup(t0)
    for c in fed.clients.values():
        server0.receive_shares(c.share_keys(setup0))
    deliveries0 = server0.deliver_shares()
    for u, c in fed.clients.items():
        server0.receive_upload(*c.mask(deliveries0[u], np.zeros(L, dtype=np.uint64)))
    survivors0 = server0.request_signatures()
    for c in fed.clients.values():
        server0.receive_signature(c.sign_survivors(survivors0))
    request0 = server0.request_unmask()
    for c in fed.clients.values():
        server0.receive_unmask(c.unmask(request0))
    server0.finish()
    # round 1 starts; the server replays round 0's messages to client 0 at each step
    c0 = fed.clients[0]
    c0.advertise(1)
    with pytest.raises(ProtocolError):
        c0.share_keys(setup0)  # round 0's roster: keys of round 0 are gone
    _, setup1 = fed.setup(t1)
    c0.share_keys(setup1)
    # the delivery arrives in the stage that takes one: refused as another round's, and
    # accusing no peer (an InvalidMessage naming a peer would have the site blame an honest one)
    with pytest.raises(ProtocolError, match="round") as replayed:
        c0.mask(deliveries0[0], np.zeros(L, dtype=np.uint64))
    assert getattr(replayed.value, "peer", None) is None, replayed.value
    with pytest.raises(ProtocolError):
        c0.sign_survivors(survivors0)
    with pytest.raises(ProtocolError):
        c0.unmask(request0)
    assert c0.round_id == 1 and c0.stage is ClientStage.SHARED
    # a round-0 advert cannot be slipped into round 1's roster either
    stale = setup0.adverts[1]
    with pytest.raises(InvalidMessage, match="another job or round"):
        fed.clients[2].share_keys(setup1.model_copy(update={
            "adverts": (setup1.adverts[0], stale, *setup1.adverts[2:])}))


# -- swapped or forged keys -------------------------------------------------------------------
@pytest.mark.parametrize("attack", ["swap_mask_key", "swap_enc_key", "relabel", "foreign_key",
                                    "drop_own_advert"])
def test_client_rejects_swapped_or_forged_public_keys(attack: str) -> None:
    fed = Federation()
    task = _task(0)
    _, setup = fed.setup(task)
    adverts = list(setup.adverts)
    a1, a2 = adverts[1], adverts[2]
    if attack == "swap_mask_key":  # the server's own masking key in place of client 1's
        adverts[1] = a1.model_copy(update={"mask_key": a2.mask_key})
    elif attack == "swap_enc_key":  # shares for client 1 would be encrypted to the server
        adverts[1] = a1.model_copy(update={"enc_key": a2.enc_key})
    elif attack == "relabel":  # client 2's signed advert presented as client 1's
        adverts[1] = a2.model_copy(update={"client_id": 1})
    elif attack == "foreign_key":  # an advert signed by a key the directory does not hold
        rogue = SigningKey.generate()
        evil_dir = {**fed.directory, 1: bytes(rogue.verify_key)}
        mallory = SecAggClient(1, JOB, rogue, evil_dir, n_clients=4, threshold=3)
        adverts[1] = mallory.advertise(0)
    else:
        adverts = adverts[1:]
    c0 = fed.clients[0]
    with pytest.raises(InvalidMessage):
        c0.share_keys(setup.model_copy(update={"adverts": tuple(adverts)}))
    assert c0.stage is ClientStage.ADVERTISED
    c0.share_keys(setup)


def test_session_refuses_a_directory_without_its_own_identity() -> None:
    fed = Federation()
    keys = {str(v): k.hex() for v, k in fed.directory.items()}
    keys["0"] = bytes(SigningKey.generate().verify_key).hex()  # the server substitutes a key
    tr = FakeTransport({"complete": True, "keys": keys})
    config, _ = _secure_config()
    session = SecAggSession(config, tr, JOB, 0, fed.keys[0])  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="substituting keys"):
        session.connect(timeout_s=1.0)
    assert session.client is None and tr.sent == []


# -- a round setup for another task -----------------------------------------------------------
@pytest.mark.parametrize("field_", ["task_digest", "question", "vector_length", "round_id"])
def test_session_refuses_a_setup_whose_task_differs_from_the_task_it_received(
        field_: str) -> None:
    fed = Federation()
    task = _task(0)
    session, tr = _session(fed, 0)
    fed.clients[0] = session.client  # type: ignore[assignment]
    _, setup = fed.setup(task)
    other = {"task_digest": hashlib.sha256(b"another task").digest(),
             "question": "level 0/histogram/round 7", "vector_length": L + 1,
             "round_id": 5}[field_]
    evil = setup.model_copy(update={field_: other})
    # the same task under another question key: what a server of another version sends too
    said = "another question key for it: the server may run another version" \
        if field_ == "question" else "does not describe the task"
    with pytest.raises(ProtocolError, match=said):
        session.share(task, evil.model_dump_json())
    assert tr.sent == []  # no share left the client
    assert session.client.stage is ClientStage.ADVERTISED  # type: ignore[union-attr]
    session.share(task, setup.model_dump_json())
    assert [p.rsplit("/", 1)[-1] for _, p, _ in tr.sent] == ["shares"]


# -- residual risk: the server controls the directory (Sybils) ---------------------------------
def test_residual_a_server_that_registers_sybil_clients_learns_a_lone_honest_vector() -> None:
    """RESIDUAL (documented): identities are registered through the server. A server that
    invents K-1 clients of a job and plays them itself learns the one honest client's vector
    from the "sum". Out-of-band checks of the directory (the audit log's ``client_joined``
    identity keys, compared between institutions) are the only defence."""
    agg = InProcessSecureSum(range(4), threshold=3, job_id=JOB)
    rng = np.random.default_rng(0)
    vecs = {u: rng.integers(0, 2**64, L, dtype=np.uint64) for u in range(4)}
    total = agg.sum("q", hashlib.sha256(b"t").digest(), vecs)
    sybils = np.zeros(L, dtype=np.uint64)
    for u in (1, 2, 3):  # the server knows what its own puppets uploaded
        sybils += vecs[u]
    assert np.array_equal(total - sybils, vecs[0])


# -- a server that changes the task itself ----------------------------------------------------
def _secure_config(profile: str = "secure", split_on_client: bool = False,
                   **kw: Any) -> tuple[JobConfig, list]:
    rng = np.random.default_rng(3)
    K, n = 4, 160
    X = rng.uniform(-2, 2, size=(n, 3))
    h = np.arange(n) % K
    y = X[:, 0] + 0.3 * rng.normal(size=n)
    cfg = JobConfig(job_id=JOB, task="regression", n_features=3, n_clients=K,
                    feature_bounds=((-2.0, 2.0),) * 3, target_bound=float(np.abs(y).max()),
                    n_estimators=2, max_depth=3, min_samples_leaf=3, max_features=2, n_bins=8,
                    split_on_client=split_on_client, profile=load_profile(profile, **kw).to_dict())
    return cfg, [(X[h == k], y[h == k]) for k in range(K)]


def _workers(cfg: JobConfig, clients: list) -> list[Worker]:
    return [Worker(cfg, X, y, client_index=k, seed=client_seed(cfg, k))
            for k, (X, y) in enumerate(clients)]


def test_secure_worker_refuses_to_disclose_what_its_profile_forbids() -> None:
    cfg, clients = _secure_config("secure")
    assert load_profile("secure").disclosures == []
    w = _workers(cfg, clients)[0]
    honest = Coordinator(cfg).next_task()
    assert honest is not None and honest.disclose == ()
    evil = Task(job_id=honest.job_id, round_id=honest.round_id, kind=honest.kind,
                level=honest.level, params={**honest.params, "n_points": 8},
                arrays=honest.arrays, layout=honest.layout,
                disclose=("unique", "minmax", "node_stats", "sketch_points"))
    try:
        reply = w.handle(evil)
    except FedForestError:
        return  # refused: the fix
    assert reply.disclosed == {}, f"plaintext disclosed under 'secure': {sorted(reply.disclosed)}"


def _omitting(profile: dict[str, Any], key: str) -> dict[str, Any]:
    """The job profile of a server that leaves ``key`` out of the profile it states."""
    return {k: v for k, v in profile.items() if k != key}


def test_a_worker_reads_a_left_out_h_splits_as_off_and_discloses_no_node_summaries() -> None:
    """A site pins an open profile with ``h_splits = "off"``; the server leaves the key out of the
    job's profile. The pin check reads the documented default ("off") and passes, so the worker
    must read the same default: node summaries are refused, not disclosed."""
    from client_app.runner import check_job_profile

    pinned = load_profile("open", h_splits="off").to_dict()
    served = _omitting(pinned, "h_splits")
    check_job_profile(pinned, served)  # the same settings, as PrivacyProfile reads them
    cfg, clients = _secure_config("open")
    cfg = dataclasses.replace(cfg, profile=served)
    w = _workers(cfg, clients)[0]
    assert "node_stats" not in w.allowed_disclosures()
    t = Coordinator(cfg).next_task()
    assert t is not None
    evil = Task(job_id=t.job_id, round_id=t.round_id, kind=t.kind, level=t.level,
                params=t.params, arrays=t.arrays, layout=t.layout, disclose=("node_stats",))
    with pytest.raises(RefusedRequest, match=r"forbids disclosing \['node_stats'\]") as info:
        w.handle(evil)
    assert info.value.code == "disclosure"  # the refusal's reason, as the server is told


def test_a_worker_reads_a_left_out_rows_per_sketch_point_as_the_profiles_default() -> None:
    """The server leaves ``rows_per_sketch_point`` out of an open job's profile: the worker
    applies the profile's default (1: a sketch point per row at most, the paper's rule), not
    "no rule" (every node's sketch with all its points, more than it has rows)."""
    cfg, clients = _secure_config("open")
    assert cfg.profile["rows_per_sketch_point"] == 1
    served = dataclasses.replace(cfg, profile=_omitting(cfg.profile, "rows_per_sketch_point"))
    X, y = clients[0]
    few = (X[:5], y[:5])  # fewer rows than the sketch has points
    task = Coordinator(cfg).next_task()
    assert task is not None and "sketch_points" in task.disclose
    assert int(task.params["n_points"]) > 5
    stated, left_out = (_workers(c, [few])[0].handle(task).disclosed["sketch_points"]
                        for c in (cfg, served))
    np.testing.assert_array_equal(left_out, stated)
    # at most one point per row: no node's sketch has more distinct points than rows
    assert (np.sum(~np.isnan(stated), axis=-1) <= 5 + 1).all()


def _advance(coord: Coordinator, ws: list[Worker], stop: Any) -> Task:
    """Run honest rounds (plain sums) until the coordinator issues a task with ``stop(task)``."""
    task = coord.next_task()
    while task is not None and not stop(task):
        rep = {k: wk.handle(task) for k, wk in enumerate(ws)}
        coord.submit(task.round_id, sum(r.summable for r in rep.values()),
                     participants=sorted(rep))
        task = coord.next_task()
    assert task is not None
    return task


@pytest.mark.parametrize("tamper", ["sigma_zero", "dp_removed"])
def test_secure_dp_client_does_not_let_the_server_turn_its_noise_off(tamper: str) -> None:
    cfg, clients = _secure_config("secure-dp")
    ws = _workers(cfg, clients)
    task = _advance(Coordinator(cfg), ws, lambda t: bool(t.layout))
    assert float(min(task.params["dp"]["sigma"].values())) > 0
    params = dict(task.params)
    if tamper == "sigma_zero":
        params["dp"] = {**params["dp"], "sigma": {k: 0.0 for k in params["dp"]["sigma"]}}
    else:
        params.pop("dp")
    evil = Task(job_id=task.job_id, round_id=task.round_id, kind=task.kind, level=task.level,
                params=params, arrays=task.arrays, layout=task.layout, disclose=task.disclose)
    reply = ws[0].handle(evil)
    noiseless = make_codec(cfg, evil).encode(reply.summable)
    try:
        sent = encode_contribution(cfg, evil, reply)
    except FedForestError:
        return  # refused: the fix
    assert not np.array_equal(sent, noiseless), "the client uploaded its exact statistics"


def test_a_greedy_dp_client_makes_each_level_s_release_once_and_no_other() -> None:
    """Greedy splits under secure-dp: the plan has one histogram release per splitting level.
    A server asking level 0's histogram again (other thresholds: a new question) instead of a
    later level's, or node totals in a sketch round (a release the plan does not have), is
    refused."""
    from fedforest_secure._layouts import totals_block

    cfg, clients = _secure_config("secure-dp")
    ws = _workers(cfg, clients)
    task = _advance(Coordinator(cfg), ws, lambda t: bool(t.layout))
    assert task.kind is TaskKind.HISTOGRAM and task.level == 0
    ws[0].handle(task)
    again = dataclasses.replace(task, round_id=task.round_id + 1, arrays={
        **task.arrays, "thresholds": task.arrays["thresholds"] * 0.5})
    with pytest.raises(RefusedRequest, match="level-0 histogram release .*already"):
        ws[0].handle(again)
    fresh = _workers(cfg, clients)[1]  # a client at its first round
    sketch = Task(job_id=task.job_id, round_id=1, kind=TaskKind.SKETCH, level=0,
                  params={"n_nodes": cfg.n_estimators, "totals": True}, arrays={},
                  layout=(totals_block(cfg, cfg.n_estimators),))
    with pytest.raises(RefusedRequest, match="no level-0 sketch release"):
        fresh.handle(sketch)


def test_clients_refuse_the_same_histogram_over_a_smaller_set() -> None:
    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    task = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    agg = InProcessSecureSum(range(4), threshold=0.67, job_id=JOB)
    agg.round_id = task.round_id
    enc1 = {k: encode_contribution(cfg, task, wk.handle(task)) for k, wk in enumerate(ws)}
    total1 = agg.sum(question_key(task), task.digest(), enc1)
    again = Task(job_id=task.job_id, round_id=task.round_id + 1, kind=task.kind,
                 level=task.level, params=task.params, arrays=task.arrays, layout=task.layout,
                 disclose=task.disclose)
    try:
        enc2 = {k: encode_contribution(cfg, again, ws[k].handle(again)) for k in (0, 1, 2)}
        total2 = agg.sum(question_key(again), again.digest(), enc2)
    except (RefusedRequest, ProtocolError):
        return  # refused: the fix
    assert not np.array_equal(total1 - total2, enc1[3]), \
        "the server recovered client 3's exact histogram by differencing two rounds"


def test_the_servers_round_threshold_of_a_profile_without_one_is_the_sites_reading() -> None:
    """A stored job profile that leaves out ``threshold``: the server's secure rounds announce
    t = n, PrivacyProfile's default 1.0, as the sites read the same profile (a lower t would be
    refused by every site, and a server reading its own default would fail the job)."""
    from server_app.jobs import new_runtime

    cfg, _ = _secure_config("secure")
    partial = {k: v for k, v in cfg.profile.items() if k != "threshold"}
    rt = new_runtime(JOB, dataclasses.replace(cfg, profile=partial),
                     {k: f"client-{k}" for k in range(4)}, 3, 60.0)
    assert rt.secure is not None and rt.secure.threshold == 1.0


# -- the same question dressed up as a new one ---------------------------------------------------
def _reask(task: Task, round_id: int, **changes: Any) -> Task:
    """``task`` in round ``round_id`` with some fields replaced."""
    return dataclasses.replace(task, round_id=round_id, **changes)


def _dressed_up(variant: str, cfg: JobConfig, ws: list[Worker]) -> tuple[Task, Task]:
    """An honest question (answered by every client) and the same statistics re-asked in the
    next round with a cosmetic change (``variant``) the clients' computation ignores."""
    if variant.startswith("totals") or variant in ("n_points_added", "top_l_added"):
        first = Coordinator(cfg).next_task()  # the level-0 sketch: the roots' node totals
        assert first is not None and first.kind is TaskKind.SKETCH and first.params["totals"]
    elif variant == "level_resketched_without_routing":
        first = _advance(Coordinator(cfg), ws,
                         lambda t: t.kind is TaskKind.SKETCH and t.level == 1)
    else:
        first = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    r = first.round_id + 1
    a, p, (block,) = first.arrays, first.params, first.layout[:1]
    if variant == "stats_left_to_its_default":
        # "full" spelled out in one round, left to its default in the other
        n_nodes, m = a["features"].shape
        layout = (hist_block(cfg, n_nodes, m, block.shape[2]),)
        first = _reask(first, first.round_id, params={**p, "stats": "full"}, layout=layout)
        return first, _reask(first, r, params={k: v for k, v in p.items() if k != "stats"})
    make: dict[str, Callable[[], dict[str, Any]]] = {
        "nodes_as_int32": lambda: {"arrays": {**a, "nodes": a["nodes"].astype(np.int32)}},
        "features_as_int32": lambda: {
            "arrays": {**a, "features": a["features"].astype(np.int32)}},
        "thresholds_as_integers": lambda: {"arrays": {**a, "thresholds": np.floor(
            np.nan_to_num(a["thresholds"], posinf=9.0)).astype(np.int64)}},
        "block_renamed": lambda: {"layout": (Block("renamed", block.shape, block.kinds),)},
        "block_reshaped": lambda: {"layout": (Block(block.name, (block.size // len(block.kinds),
                                                                  len(block.kinds)),
                                                    block.kinds),)},
        "block_kinds_changed": lambda: {"layout": (Block(block.name, block.shape,
                                                         (StatKind.SUM,) * len(block.kinds)),)},
        "totals_left_to_its_default": lambda: {
            "params": {k: v for k, v in p.items() if k != "totals"}},
        "totals_as_the_number_1": lambda: {"params": {**p, "totals": 1}},
        "n_points_added": lambda: {"params": {**p, "n_points": 7}},
        "top_l_added": lambda: {"params": {**p, "top_l": 3}},
        "level_resketched_without_routing": lambda: {"arrays": {
            k: v for k, v in a.items() if not k.startswith("route_")}},
    }
    return first, _reask(first, r, **make[variant]())


#: Variants whose question key is the first question's (a client refuses the question it already
#: answered: RefusedRequest), a second sketch of a level (the node totals again: refused as the
#: same question too), and forms a client refuses as malformed (ProtocolError: the coordinator
#: never sends them).
_SAME_QUESTION = ["nodes_as_int32", "features_as_int32", "stats_left_to_its_default",
                  "block_renamed", "block_reshaped", "block_kinds_changed",
                  "totals_left_to_its_default"]
_RESKETCH = ["level_resketched_without_routing"]
_MALFORMED = ["thresholds_as_integers", "totals_as_the_number_1", "n_points_added",
              "top_l_added"]


@pytest.mark.parametrize("variant", _SAME_QUESTION + _RESKETCH + _MALFORMED)
def test_clients_refuse_a_repeated_question_dressed_up_as_new(variant: str) -> None:
    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    first, second = _dressed_up(variant, cfg, ws)
    assert second.digest() != first.digest()
    agg = InProcessSecureSum(range(4), threshold=0.67, job_id=JOB)
    agg.round_id = first.round_id
    enc1 = {k: encode_contribution(cfg, first, wk.handle(first)) for k, wk in enumerate(ws)}
    agg.sum(question_key(first), first.digest(), enc1)  # over clients 0-3
    if variant in _SAME_QUESTION:
        # the key is what the client computes: the same question, on the wire too
        wired = SealedTask.from_wire(second.to_bytes())
        assert question_key(second) == question_key(wired) == question_key(first)
    # ... so no client answers it again (over clients 0-2: client 3's vector by subtraction)
    for k in (0, 1, 2):
        with pytest.raises(ProtocolError) as caught:
            ws[k].handle(second)
        if variant in _SAME_QUESTION + _RESKETCH:
            assert isinstance(caught.value, RefusedRequest)
            assert caught.value.code == "question_reused"
        else:
            assert not isinstance(caught.value, RefusedRequest)


def _bins(block: Block, n_bins: int) -> tuple[Block, ...]:
    """A histogram layout of ``block``'s kind with ``n_bins`` bins per slot."""
    return (Block(block.name, block.shape[:2] + (n_bins,) + block.shape[3:], block.kinds),)


def _answered_histogram(cfg: JobConfig, ws: list[Worker]) -> Task:
    """The level-0 histogram of an honest run, answered by every client (after its sketch)."""
    task = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    for wk in ws:
        wk.handle(task)
    return task


#: A level's node totals (answered in its sketch round) asked again in another form: as a
#: histogram with no thresholds (one bin per feature slot: the node's total), or in a node
#: group's sketch.
_TOTALS_REASKED = ["histogram_without_thresholds", "group_sketch_with_totals"]


@pytest.mark.parametrize("variant", _TOTALS_REASKED)
def test_clients_refuse_the_node_totals_reasked_in_another_form(variant: str) -> None:
    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    hist = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    nodes, feats = hist.arrays["nodes"], hist.arrays["features"]
    n, m = feats.shape
    if variant == "histogram_without_thresholds":
        again = _reask(hist, hist.round_id,
                       arrays={**hist.arrays, "thresholds": np.zeros((n, m, 0))},
                       layout=_bins(hist.layout[0], 1))
    else:
        again = Task(job_id=JOB, round_id=hist.round_id, kind=TaskKind.SKETCH, level=0,
                     params={"n_nodes": int(cfg.n_estimators), "totals": True},
                     arrays={"nodes": nodes, "features": feats},
                     layout=(Block("totals", (n, cfg.n_stats), (StatKind.SUM,) * cfg.n_stats),))
    # the sketch round gave every client's node totals; over clients 0-2 the difference would
    # be client 3's exact node totals
    for k in (0, 1, 2):
        with pytest.raises(ProtocolError, match="node totals"):
            ws[k].handle(again)


#: The same histogram re-asked with thresholds that cut nothing (the same non-empty bins): one
#: beyond every value, at the feature's public upper bound or below its lower bound, +inf
#: padding appended, a threshold repeated.
_CUTS_NOTHING = ["threshold_1e300_appended", "upper_bound_appended", "below_lower_bound",
                 "inf_appended", "threshold_repeated"]


@pytest.mark.parametrize("variant", _CUTS_NOTHING)
def test_clients_refuse_a_histogram_reasked_with_thresholds_that_cut_nothing(
        variant: str) -> None:
    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    first = _answered_histogram(cfg, ws)
    thr = first.arrays["thresholds"]
    n, m, w = thr.shape
    col = {"threshold_1e300_appended": 1e300, "upper_bound_appended": 2.0,
           "below_lower_bound": -2.5, "inf_appended": np.inf}.get(variant)
    if variant == "threshold_repeated":
        more = np.concatenate([thr[:, :, :1], thr], axis=2)
    elif variant == "below_lower_bound":
        more = np.concatenate([np.full((n, m, 1), col), thr], axis=2)
    else:
        more = np.concatenate([thr, np.full((n, m, 1), col)], axis=2)
    assert (np.diff(more, axis=2) >= 0).all() and not np.array_equal(more, thr)
    second = _reask(first, first.round_id + 1, arrays={**first.arrays, "thresholds": more},
                    layout=_bins(first.layout[0], first.layout[0].shape[2] + 1))
    if variant in ("inf_appended", "threshold_repeated"):
        # the same cuts whatever the bounds: the same secure-sum question, on the wire too
        wired = SealedTask.from_wire(second.to_bytes())
        assert question_key(second) == question_key(wired) == question_key(first)
    # over clients 0-2, the difference of the two sums would be client 3's exact histogram
    for k in (0, 1, 2):
        with pytest.raises(RefusedRequest) as caught:
            ws[k].handle(second)
        assert caught.value.code == "question_reused"


def test_the_question_key_of_a_histogram_is_the_cuts_its_thresholds_make() -> None:
    def key(*thr: float) -> str:
        t = Task(job_id=JOB, round_id=3, kind=TaskKind.HISTOGRAM, level=0,
                 arrays={"nodes": np.zeros(1, dtype=np.int64),
                         "features": np.zeros((1, 1), dtype=np.int64),
                         "thresholds": np.array(thr, dtype=np.float64).reshape(1, 1, -1)})
        assert question_key(SealedTask.from_wire(t.to_bytes())) == question_key(t)
        return question_key(t)

    same = key(0.0, 1.0)
    # -0.0 for 0.0, a repeated threshold, +inf padding or -inf: the same bins that hold rows
    assert key(-0.0, 1.0) == key(0.0, 0.0, 1.0, np.inf) == key(-np.inf, 0.0, 1.0) == same
    assert key(0.0, 1.5) != same and key(0.0) != same and key(np.inf) == key()


@pytest.mark.parametrize("variant", ["block_renamed", "block_reshaped"])
def test_the_session_refuses_a_repeated_question_dressed_up_as_new(variant: str) -> None:
    from test_client_secagg_question import _round

    fed = Federation(k=4, threshold=3)
    session, tr = _session(fed, 0)
    fed.clients[0] = session.client  # type: ignore[assignment]
    t0 = _task(0)
    total0 = _round(fed, session, tr.sent, t0, [0, 1, 2, 3])
    block = t0.layout[0]
    layout = (Block("renamed", block.shape, block.kinds) if variant == "block_renamed"
              else Block(block.name, (2, L // 2, 1), block.kinds),)
    t1 = _reask(t0, 1, layout=layout)
    assert question_key(t1) == question_key(t0)
    with pytest.raises(RefusedRequest, match="already answered for a different set"):
        total0 = total0 - _round(fed, session, tr.sent, t1, [0, 1, 2])
    assert json.loads(tr.sent[-1][2]) == {"reason": "question_reused"}
    assert not np.array_equal(total0, np.full(L, 13, dtype=np.uint64))
