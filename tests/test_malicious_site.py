"""A malicious site against the honest sites of its secure job (threat_model.md §2.4).

One site sends correctly addressed share ciphertexts that are all zeros. An honest site
cannot mask without its shares, so it refuses the round (code ``invalid_message``); what it
must not do is refuse without saying whom it accuses, which left the job status and the audit
log naming the honest sites as the ones that refused and the attacker as the one well-behaved
site. The session names the accused peer (index and, where it knows it, the site name) in its
error and tells the server its index in the refusal; the server's side is in
``test_server_secagg_api.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from nacl.signing import SigningKey
from test_malicious_server import (
    DIGEST,
    JOB,
    TASK,
    L,
    Q,
    RecordingTransport,
    _config,
    delivery,
    share_all,
)

from client_app.secagg_session import SecAggSession
from fedforest_secure.errors import InvalidMessage
from fedforest_secure.secagg import RoundSetup


def _sessions(n: int) -> tuple[dict[int, SecAggSession], dict[int, RecordingTransport]]:
    keys = {u: SigningKey.generate() for u in range(n)}
    dirj = {"complete": True, "keys": {str(u): bytes(k.verify_key).hex()
                                       for u, k in keys.items()}}
    trs = {u: RecordingTransport(dirj) for u in range(n)}
    sessions = {u: SecAggSession(_config(n), trs[u], JOB, u, keys[u])  # type: ignore[arg-type]
                for u in range(n)}
    for s in sessions.values():
        s.connect(timeout_s=1.0)
    return sessions, trs


def test_a_session_whose_peer_sends_garbage_shares_refuses_naming_that_peer() -> None:
    sessions, trs = _sessions(4)
    sessions[0].names = {0: "site-a", 1: "site-b", 2: "site-c", 3: "site-d"}  # certified names
    adverts = {u: s.client.advertise(0) for u, s in sessions.items()}  # type: ignore[union-attr]
    setup = RoundSetup(job_id=JOB, round_id=0, question=Q, task_digest=DIGEST, threshold=3,
                       vector_length=L, adverts=tuple(adverts[u] for u in range(4)))
    bundles = share_all(sessions, trs, setup)
    evil = 3
    bundles[evil] = bundles[evil].model_copy(update={"ciphertexts": {
        v: bytes(len(ct)) for v, ct in bundles[evil].ciphertexts.items()}})

    with pytest.raises(InvalidMessage, match="^the share ciphertext of client 3 does not "
                                             "authenticate; client 3 is site-d$") as e:
        sessions[0].mask(TASK, delivery(bundles, 0), np.zeros(L, np.uint64))
    assert e.value.peer == evil
    # a session without certified names names the peer by index
    with pytest.raises(InvalidMessage, match="of client 3 does not authenticate$") as e:
        sessions[1].mask(TASK, delivery(bundles, 1), np.zeros(L, np.uint64))
    assert e.value.peer == evil
    # what the server is told: the code and the accused peer's index, no free text
    sessions[0].refuse_round(0, "invalid_message", accused=evil)
    method, path, body = trs[0].sent[-1]
    assert path.endswith("/secagg/refuse")
    assert json.loads(body) == {"reason": "invalid_message", "accused": evil}
    # the attacker's own session masks: its peers' shares are genuine
    header, _ = sessions[evil].mask(TASK, delivery(bundles, evil), np.zeros(L, np.uint64))
    assert json.loads(header)["sender"] == evil
