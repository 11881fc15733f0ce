"""The HTTPS client's secure-aggregation question is the task's content, not its round id.

A malicious server that re-asks an identical histogram in a later round, over the same clients
minus one, would get that client's exact histogram by subtracting the two sums. The session
keys its "one question, one set of clients" rule on :func:`question_key` (the task digest with
the round id blanked), so the repeat is the same question and the smaller set is refused at
the consistency step (the client will not sign the smaller set): it posts only a refusal code,
and no sum over the smaller set is released.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_adversarial_server import JOB, Federation, L, _session, _task

from client_app.secagg_session import SecAggSession
from fedforest_secure.errors import AbortedRound, ProtocolError, RefusedRequest
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind, question_key
from fedforest_secure.secagg import (
    MaskedUpload,
    SecAggServer,
    ShareBundle,
    SurvivorSignature,
    UnmaskResponse,
    parse,
)
from server_app.secagg_bridge import SecAggBridge


def _round(fed: Federation, session: SecAggSession, sent: list, task: Task,
           members: list[int]) -> np.ndarray:
    """One secure round over ``members``; client 0 is the HTTPS session (recording its posts).
    Returns the released sum; raises whatever a client raises."""
    server = SecAggServer(JOB, task.round_id, question_key(task), task.digest(), L,
                          fed.threshold, {u: fed.directory[u] for u in members})
    for u in members:
        c = fed.clients[u]
        server.receive_advert(c.pending_advert(task.round_id) or c.advertise(task.round_id))
    setup = server.setup()
    for u in members:
        if u == 0:
            session.share(task, setup.model_dump_json())
            server.receive_shares(parse(ShareBundle, sent[-1][2]))
        else:
            server.receive_shares(fed.clients[u].share_keys(setup))
    deliveries = server.deliver_shares()
    for u in members:
        vec = np.full(L, 10 + u, dtype=np.uint64)
        if u == 0:
            header, masked = session.mask(task, deliveries[0].model_dump_json(), vec)
            server.receive_upload(parse(MaskedUpload, header), masked)
        else:
            server.receive_upload(*fed.clients[u].mask(deliveries[u], vec))
    survivor_set = server.request_signatures()
    for u in members:
        if u == 0:
            session.sign(task, survivor_set.model_dump_json())
            server.receive_signature(parse(SurvivorSignature, sent[-1][2]))
        else:
            server.receive_signature(fed.clients[u].sign_survivors(survivor_set))
    request = server.request_unmask()
    for u in members:
        if u == 0:
            session.unmask(task, request.model_dump_json())
            server.receive_unmask(parse(UnmaskResponse, sent[-1][2]))
        else:
            c = fed.clients[u]
            nxt = c.pending_advert(task.round_id + 1) or c.advertise(task.round_id + 1)
            server.receive_unmask(c.unmask(request, next_advert=nxt))
    return server.finish()


def test_the_question_is_the_task_content_without_the_round_id() -> None:
    t0, t1 = _task(0), _task(7)
    assert t0.digest() != t1.digest()  # masks stay bound to the round
    assert question_key(t0) == question_key(t1) == t0.question_digest().hex()
    other = Task(job_id=JOB, round_id=0, kind=TaskKind.HISTOGRAM, level=0,
                 params={"stats": "count", "features": [1]},
                 layout=(Block("hist", (L, 1), (StatKind.COUNT,)),))
    assert question_key(other) != question_key(t0)
    assert len(question_key(t0)) <= 256  # fits RoundSetup.question
    # the server announces exactly the key the client recomputes
    fed = Federation()
    bridge = SecAggBridge(JOB, 0.67, directory=dict(fed.directory))
    sr = bridge.start(t1, list(range(fed.k)), L)
    assert sr.server.question == question_key(t1)


def test_the_session_refuses_the_same_question_in_a_later_round_over_a_smaller_set() -> None:
    fed = Federation(k=4, threshold=3)
    session, tr = _session(fed, 0)
    fed.clients[0] = session.client  # type: ignore[assignment]
    total = _round(fed, session, tr.sent, _task(0), [0, 1, 2, 3])
    assert np.array_equal(total, np.full(L, 10 + 11 + 12 + 13, dtype=np.uint64))
    # the same question again over the same set is no differencing: answered
    total = _round(fed, session, tr.sent, _task(1), [0, 1, 2, 3])
    assert np.array_equal(total, np.full(L, 46, dtype=np.uint64))
    # ... but over the same clients minus client 3 it would isolate client 3: refused
    n_sent = len(tr.sent)
    with pytest.raises(RefusedRequest, match="already answered for a different set"):
        _round(fed, session, tr.sent, _task(2), [0, 1, 2])
    refusal = tr.sent[-1]
    assert refusal[1].endswith("/rounds/2/secagg/refuse")
    assert json.loads(refusal[2]) == {"reason": "question_reused"}
    assert [p.rsplit("/", 1)[-1] for _, p, _ in tr.sent[n_sent:]] == ["shares", "refuse"]


def test_every_client_refuses_so_no_sum_over_the_smaller_set_is_released() -> None:
    fed = Federation(k=4, threshold=3)
    session, tr = _session(fed, 0)
    fed.clients[0] = session.client  # type: ignore[assignment]
    _round(fed, session, tr.sent, _task(0), [0, 1, 2, 3])
    task = _task(1)
    server = SecAggServer(JOB, 1, question_key(task), task.digest(), L, 3,
                          {u: fed.directory[u] for u in (0, 1, 2)})
    for u in (1, 2):
        c = fed.clients[u]
        server.receive_advert(c.pending_advert(1) or c.advertise(1))
    server.receive_advert(session.client.pending_advert(1))  # type: ignore[union-attr,arg-type]
    setup = server.setup()
    for u in (0, 1, 2):
        server.receive_shares(fed.clients[u].share_keys(setup))
    deliveries = server.deliver_shares()
    for u in (0, 1, 2):
        server.receive_upload(*fed.clients[u].mask(deliveries[u], np.zeros(L, dtype=np.uint64)))
    survivor_set = server.request_signatures()
    for u in (0, 1, 2):
        with pytest.raises(RefusedRequest, match="already answered for a different set"):
            fed.clients[u].sign_survivors(survivor_set)
    with pytest.raises(AbortedRound, match="signed the survivor set"):
        server.request_unmask()
    with pytest.raises(ProtocolError):
        server.finish()


def test_a_junk_parameter_does_not_make_the_same_histogram_a_new_question() -> None:
    from test_adversarial_server import _advance, _secure_config, _workers

    from fedforest_secure.coordinator import Coordinator
    from fedforest_secure.errors import FedForestError
    from fedforest_secure.secagg import InProcessSecureSum
    from fedforest_secure.secure_sum import encode_contribution

    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    task = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    agg = InProcessSecureSum(range(4), threshold=0.67, job_id=JOB)
    enc1 = {k: encode_contribution(cfg, task, wk.handle(task)) for k, wk in enumerate(ws)}
    total1 = agg.sum(question_key(task), task.digest(), enc1)
    again = Task(job_id=task.job_id, round_id=task.round_id + 1, kind=task.kind,
                 level=task.level, params={**task.params, "nonce": 1}, arrays=task.arrays,
                 layout=task.layout, disclose=task.disclose)
    try:
        enc2 = {k: encode_contribution(cfg, again, ws[k].handle(again)) for k in (0, 1, 2)}
        total2 = agg.sum(question_key(again), again.digest(), enc2)
    except FedForestError:
        return  # refused: the fix
    assert not np.array_equal(total1 - total2, enc1[3]), \
        "the server recovered client 3's exact histogram with a junk parameter"


def test_another_packing_does_not_make_the_same_histogram_a_new_question() -> None:
    from test_adversarial_server import _advance, _secure_config, _workers

    from fedforest_secure.coordinator import Coordinator
    from fedforest_secure.secagg import InProcessSecureSum
    from fedforest_secure.secure_sum import encode_contribution, make_codec

    cfg, clients = _secure_config("secure")
    ws = _workers(cfg, clients)
    task = _advance(Coordinator(cfg), ws, lambda t: t.kind is TaskKind.HISTOGRAM)
    assert "pack" in task.params and make_codec(cfg, task).packing is not None
    agg = InProcessSecureSum(range(4), threshold=0.67, job_id=JOB)
    enc1 = {k: encode_contribution(cfg, task, wk.handle(task)) for k, wk in enumerate(ws)}
    agg.sum(question_key(task), task.digest(), enc1)
    # the same grid re-asked with a wider count lane over clients 0-2: the same question
    again = Task(job_id=task.job_id, round_id=task.round_id + 1, kind=task.kind,
                 level=task.level, params={**task.params, "pack": task.params["pack"] + 1},
                 arrays=task.arrays, layout=task.layout, disclose=task.disclose)
    assert again.digest() != task.digest()  # the masks are bound to the packing too
    assert question_key(again) == question_key(task)
    with pytest.raises(RefusedRequest, match="already answered"):  # a worker refuses it
        enc2 = {k: encode_contribution(cfg, again, ws[k].handle(again)) for k in (0, 1, 2)}
        agg.sum(question_key(again), again.digest(), enc2)
