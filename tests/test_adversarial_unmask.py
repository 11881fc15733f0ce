"""A malicious site's unmask response, and a secure round whose last phase fails to close.

The server reads every revealed share as an element of the Shamir field when it removes the
masks. A share outside the field (66 bytes above the prime) is refused when it arrives (400,
nothing stored), so the honest sites finish the round. Were any other exception to escape
while a phase closes, the job fails once with the reason (the round is aborted and audited),
and later requests and deadline ticks see a failed job: never a 5xx on every request.
"""

# ruff: noqa: F811  (the fixtures are imported from test_server_secagg_api and used as parameters)
from __future__ import annotations

import base64
import json
import logging

import numpy as np
import pytest
from test_fuzz_api import db_snapshot, secagg_snapshot
from test_server_secagg_api import (
    K,
    aggregate,
    all_uploaded,
    env,  # noqa: F401 - the secure-job fixture (K=4, t=3, manual clock), reused
    env_all_audited,  # noqa: F401 - the same with min_clients=K and an audit log
    first_round,
    h,
    join_all,
    offer,
    post,
    run_until_upload,
    sign,
    unmask,
    upload,
)

from fedforest_secure.secagg import SecAggServer, UnmaskRequest, parse
from fedforest_secure.secagg._primitives import _shamir
from fedforest_secure.secure_sum import make_codec
from server_app.logs import LOGGER

OUTSIDE = base64.b64encode(b"\xff" * _shamir.SHARE_BYTES).decode()  # > 2^521 - 1


def _tampered_unmask(env: dict, sa: dict, k: int, r: int, table: str) -> tuple[str, str]:
    """Site ``k``'s unmask response, as made and with its first share in ``table`` outside
    the field."""
    o = offer(env, k)
    assert o["action"] == "unmask", o
    resp = sa[k].unmask(parse(UnmaskRequest, o["message"]), next_advert=sa[k].advertise(r + 1))
    body = json.loads(resp.model_dump_json())
    body[table][sorted(body[table])[0]] = OUTSIDE
    return resp.model_dump_json(), json.dumps(body)


def test_a_share_outside_the_field_is_refused_and_the_honest_sites_finish_the_round(
        env: dict) -> None:
    config, sa, task, vecs = all_uploaded(env)
    r = task.round_id
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200
    before = (db_snapshot(env["db"]), secagg_snapshot(env["state"]))
    bad = post(env, 3, r, "unmask", _tampered_unmask(env, sa, 3, r, "self_mask_shares")[1])
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"] == "invalid_message"
    assert "outside the Shamir field" in bad.json()["detail"]
    assert (db_snapshot(env["db"]), secagg_snapshot(env["state"])) == before
    for k in range(K - 1):
        assert unmask(env, sa, k, r).status_code == 200
    # site 3 never sent a valid response: dropped at the deadline; the 3 others (t = 3) unmask
    env["clock"].now += 31
    env["state"].tick(full_every=1)
    want = make_codec(config, task).decode(sum(vecs.values(), np.zeros_like(vecs[0])))
    assert np.array_equal(aggregate(env, r), want)  # site 3 had uploaded: its vector counts
    o = offer(env, 0)
    assert o["status"] == "task" and o["round_id"] == r + 1, o


def test_a_key_share_outside_the_field_is_refused(env: dict) -> None:
    """A dropped site's masking-key share takes the same path."""
    config, sa = join_all(env)
    task, vecs, _ = first_round(env, config)
    r = task.round_id
    run_until_upload(env, sa, r)
    for k in range(K - 1):
        assert upload(env, sa, k, task, vecs[k]).status_code == 200
    env["clock"].now += 31  # site 3 misses the upload deadline: its key shares are asked
    env["state"].tick(full_every=1)
    for k in range(K - 1):
        assert sign(env, sa, k, r).status_code == 200
    before = (db_snapshot(env["db"]), secagg_snapshot(env["state"]))
    honest, tampered = _tampered_unmask(env, sa, 2, r, "key_shares")
    bad = post(env, 2, r, "unmask", tampered)
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_message", bad.text
    assert "client 3's masking private key outside the Shamir field" in bad.json()["detail"]
    assert (db_snapshot(env["db"]), secagg_snapshot(env["state"])) == before
    for k in range(K - 2):
        assert unmask(env, sa, k, r).status_code == 200
    assert post(env, 2, r, "unmask", honest).status_code == 200  # its own, sent again
    want = make_codec(config, task).decode(sum((vecs[k] for k in range(K - 1)),
                                               np.zeros_like(vecs[0])))
    assert np.array_equal(aggregate(env, r), want)


def test_an_exception_while_a_round_closes_fails_the_job_once_with_the_reason(
        env_all_audited: dict, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Defence in depth: the step that removes the masks raises something the protocol does
    not raise by design. The request that completed the phase gets its 200; the job fails once
    (round aborted, audited) with the reason; later offers, messages and deadline ticks see a
    failed job, never a 5xx."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    env = env_all_audited

    def broken(self: SecAggServer) -> np.ndarray:
        raise KeyError("defect")

    config, sa, task, vecs = all_uploaded(env)
    r = task.round_id
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200
    bodies = {}
    for k in range(K):
        o = offer(env, k)
        resp = sa[k].unmask(parse(UnmaskRequest, o["message"]),
                            next_advert=sa[k].advertise(r + 1))
        bodies[k] = resp.model_dump_json()
    monkeypatch.setattr(SecAggServer, "finish", broken)
    for k in range(K):
        assert post(env, k, r, "unmask", bodies[k]).status_code == 200
    reason = (f"round {r}: secure aggregation aborted in phase unmask: the server failed to "
              "close the phase (KeyError: 'defect'); no partial sum was released")
    st = env["http"].get("/v1/jobs/job-a", headers=h(env, 0)).json()
    assert (st["status"], st["reason"]) == ("failed", reason)
    for _ in range(3):  # deadline ticks: nothing happens again
        env["clock"].now += 31
        env["state"].tick(full_every=1)
    for k in range(K):
        assert offer(env, k) == {"status": "failed", "detail": reason}
    again = post(env, 0, r, "unmask", bodies[0])
    assert again.status_code < 500, again.text
    entries = [json.loads(line) for line in env["audit"].export("job-a").splitlines()]
    assert [e["kind"] for e in entries][-1] == "round_aborted"
    assert entries[-1]["payload"] == {"round_id": r, "reason": reason}
    assert [e["kind"] for e in entries].count("round_aborted") == 1
    assert "client_dropped" not in [e["kind"] for e in entries]
    logged = [rec.getMessage() for rec in caplog.records]
    assert sum("event=close_error" in m for m in logged) == 1
    assert sum("event=job_failed" in m for m in logged) == 1
    assert not any("event=drop" in m or "event=resume" in m for m in logged)


@pytest.mark.parametrize("how", ["missing", "extra"])
def test_an_unmask_response_without_exactly_the_requested_shares_is_refused(
        env: dict, how: str) -> None:
    """An unmask response that leaves out a requested self-mask share, or adds a key share of
    a survivor (both shares of one client), is a 400 and changes nothing."""
    _, sa, task, _ = all_uploaded(env)
    r = task.round_id
    for k in range(K):
        assert sign(env, sa, k, r).status_code == 200
    before = (db_snapshot(env["db"]), secagg_snapshot(env["state"]))
    honest = json.loads(_tampered_unmask(env, sa, 3, r, "self_mask_shares")[0])
    shares = honest["self_mask_shares"]
    first = sorted(shares)[0]
    if how == "missing":
        shares.pop(first)
    else:
        honest["key_shares"] = {first: shares[first]}
    bad = post(env, 3, r, "unmask", json.dumps(honest))
    assert bad.status_code == 400, bad.text
    assert (db_snapshot(env["db"]), secagg_snapshot(env["state"])) == before
