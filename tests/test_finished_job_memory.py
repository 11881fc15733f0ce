"""What a server that runs for weeks keeps of the jobs that ended: no runtime, no
secure-aggregation index entry and no spool folder, while every reader of a finished job (its
status, its model, its tasks, its audit chain) and every late request that builds its runtime
again (an upload retried and its size check, a secure-aggregation message, a refusal) gets the
answers it got before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nacl.signing import SigningKey
from sqlalchemy import select
from state_driver import answer_until_done, join_sites

from fedforest_secure.config import JobConfig
from fedforest_secure.federation import client_seed
from fedforest_secure.protocol import Task, make_upload
from fedforest_secure.secagg import (
    RoundSetup,
    SecAggClient,
    ShareDelivery,
    SurvivorSet,
    UnmaskRequest,
    parse,
)
from fedforest_secure.secure_sum import encode_contribution, unmask_floor
from fedforest_secure.worker import Worker
from server_app.audit_hook import open_audit
from server_app.auth import add_client
from server_app.db import ClientRow, Database
from server_app.errors import ApiError
from server_app.jobspec import load_job_spec
from server_app.runtime import ServerState

K = 4


def _rows(db: Database) -> list[ClientRow]:
    with db.session() as s:
        return [s.scalar(select(ClientRow).where(ClientRow.name == f"client-{k}"))
                for k in range(K)]


def run_secure_job(state: ServerState, db: Database, job: str,
                   parts: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Every site joins the secure job ``job`` and answers each step the server asks of it
    (advert, shares, masked upload, signature, unmask) until the job is done."""
    rows = _rows(db)
    keys = {k: SigningKey.generate() for k in range(K)}
    infos = [state.join(rows[k], job, bytes(keys[k].verify_key)) for k in range(K)]
    config = JobConfig.from_json(json.dumps(infos[0]["config"]))
    directory = {int(i): bytes.fromhex(v)
                 for i, v in state.directory(rows[0], job)["keys"].items()}
    sa = {k: SecAggClient(k, job, keys[k], directory, n_clients=K,
                          threshold=config.profile["threshold"],
                          neighbours=config.profile.get("neighbours"),
                          min_survivors=unmask_floor(config)) for k in range(K)}
    workers = {k: Worker(config, *parts[k], client_index=k, seed=client_seed(config, k))
               for k in range(K)}
    for _ in range(2000):
        offers = [state.secagg_offer(rows[k], job) for k in range(K)]
        if all(o["status"] == "done" for o in offers):
            return
        assert any(o["status"] == "task" for o in offers), offers
        for k, o in enumerate(offers):
            if o["status"] != "task":
                continue
            r, action = o["round_id"], o["action"]
            if action == "upload":
                task = Task.from_bytes(state.task_bytes(rows[k], job, r))
                vec = encode_contribution(config, task, workers[k].handle(task))
                header, masked = sa[k].mask(parse(ShareDelivery, o["message"]), vec)
                state.upload(rows[k], job, r, make_upload(task, masked, {},
                                                          secagg=header.model_dump_json()))
                continue
            if action == "advert":
                msg = sa[k].advertise(r)
            elif action == "share":
                msg = sa[k].share_keys(parse(RoundSetup, o["message"]))
            elif action == "sign":
                msg = sa[k].sign_survivors(parse(SurvivorSet, o["message"]))
            else:
                assert action == "unmask", o
                msg = sa[k].unmask(parse(UnmaskRequest, o["message"]),
                                   next_advert=sa[k].advertise(r + 1))
            kind = {"share": "shares", "sign": "signature"}.get(action, action)
            state.secagg_message(rows[k], job, r, kind, msg.model_dump_json().encode())
    raise AssertionError(f"the job {job} did not finish")


def _answers(state: ServerState, row: ClientRow, job: str) -> dict[str, Any]:
    """What a member reads of a finished job."""
    return {"status": state.status(row, job), "model": state.model_and_tip(row, job),
            "rounds": state.rounds(row, job),
            "task0": state.task_bytes(row, job, state.rounds(row, job)[0]["round_id"]),
            "audit": state.audit_log(row, job),
            "chain": state.core.audit.verify_chain(job),
            "directory": state.directory(row, job)}


def _answer(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except ApiError as exc:
        return (exc.status, exc.code, exc.detail)


#: the bodies each site sent, by (job, site, round[, kind])
Sent = dict[tuple[Any, ...], bytes]


def _late(state: ServerState, rows: list[ClientRow], job: str, uploads: Sent,
          messages: Sent) -> dict[str, Any]:
    """The answers to the late requests that build a finished job's runtime: the size check of
    each of client-1's uploads sent again (each round's bound, from the job's configuration),
    its last upload sent again, its last unmask message of a secure job with another body (not
    a duplicate of the stored one) and client-2 refusing that round."""
    counted = sorted(r for (j, name, r) in uploads if j == job and name == "client-1")
    last = counted[-1]
    body = uploads[(job, "client-1", last)]
    out = {"limits": [_answer(state.upload_limit, rows[1], job, r, 10**9) for r in counted],
           "upload": _answer(state.upload, rows[1], job, last, body),
           "round": last, "bodies": [len(uploads[(job, "client-1", r)]) for r in counted]}
    sent = [(r, b) for (j, name, r, kind), b in messages.items()
            if j == job and name == "client-1" and kind == "unmask"]
    if sent:
        r, unmask = max(sent)
        other = unmask.replace(b'"', b' "', 1)  # the same message, another digest
        out |= {"unmask_round": r,
                "message": _answer(state.secagg_message, rows[1], job, r, "unmask", other),
                "refuse": _answer(state.secagg_refuse, rows[2], job, r, "invalid_message")}
    else:
        out["refuse"] = _answer(state.secagg_refuse, rows[2], job, last, "invalid_message")
    return out


def test_jobs_run_to_the_end_leave_no_runtime_or_relay_entry_and_read_the_same(
        tmp_path: Path, tiny_parts: Any, job_dir: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    parts, feat = tiny_parts
    db = Database(f"sqlite:///{tmp_path / 's.db'}")
    for k in range(K):
        add_client(db, f"client-{k}")
    state = ServerState(db, open_audit(str(tmp_path / "audit.db")),
                        spool=tmp_path / "spool")
    uploads: Sent = {}
    messages: Sent = {}
    upload, message = state.upload, state.secagg_message

    def keep_upload(row: ClientRow, job: str, r: int, body: bytes) -> dict[str, Any]:
        uploads[(job, row.name, r)] = body
        return upload(row, job, r, body)

    def keep_message(row: ClientRow, job: str, r: int, kind: str, body: bytes
                     ) -> dict[str, Any]:
        messages[(job, row.name, r, kind)] = body
        return message(row, job, r, kind, body)

    monkeypatch.setattr(state, "upload", keep_upload)  # the bodies the sites send, kept
    monkeypatch.setattr(state, "secagg_message", keep_message)
    jobs = {"open-0": "open", "open-1": "open", "secure-0": "secure", "secure-1": "secure"}
    for job, profile in jobs.items():
        state.create_job(load_job_spec(job_dir(tmp_path / job, parts[:K], feat, n_clients=K,
                                               job_id=job, trees=1, depth=2,
                                               profile=profile)))
    for job, profile in jobs.items():
        if profile == "open":
            rows, workers = join_sites(db, state, job, parts[:K])
            assert answer_until_done(state, job, rows, workers)
        else:
            run_secure_job(state, db, job, parts[:K])
    monkeypatch.undo()
    rows = _rows(db)
    row = rows[0]
    before = {job: _answers(state, row, job) for job in jobs}
    assert all(a["status"]["status"] == "done" and a["chain"][0] for a in before.values())
    late = {job: _late(state, rows, job, uploads, messages) for job in jobs}

    state.tick(full_every=1)  # between steps, as the server's periodic tick

    assert state.runtimes.loaded() == {}
    assert state._relay._index == {}
    assert list((tmp_path / "spool").iterdir()) == []  # the secure jobs' folders went too
    # every reader gets what it got while the runtimes were loaded, and keeps nothing
    assert {job: _answers(state, row, job) for job in jobs} == before
    assert {job: _late(state, rows, job, uploads, messages) for job in jobs} == late
    for job, a in late.items():
        # each counted round's bound, which its upload sent again fits
        assert all(n <= limit < 10**9 for n, limit in zip(a["bodies"], a["limits"],
                                                          strict=True))
        assert a["upload"] == (409, "round_closed", f"round {a['round']} is closed")
        if jobs[job] == "secure":
            r = a["unmask_round"]
            assert a["message"] == (409, "round_closed", f"round {r} is not open")
            assert a["refuse"] == (409, "round_closed", f"round {r} is not the open round")
        else:
            assert a["refuse"] == (409, "not_secure", "this job does not use secure "
                                   "aggregation: there is nothing to refuse")
    for job in ("secure-0", "secure-1"):
        assert state.secagg_offer(row, job) == {"status": "done",
                                                "detail": before[job]["status"]["reason"]}
    assert state.runtimes.loaded() == {}
    db.dispose()


def test_a_job_stopping_releases_its_key_directory_and_next_adverts() -> None:
    """The runtime a step still holds when its job stops keeps no key of the job's sites."""
    from server_app.jobs import JobRuntime
    from server_app.secagg_bridge import SecAggBridge

    bridge = SecAggBridge("job-a", 3, neighbours=None)
    bridge.directory = {0: b"k" * 32}
    bridge.pending = {0: object()}  # type: ignore[dict-item]
    rt = JobRuntime("job-a", None, {}, 3, 30.0, secure=bridge)  # type: ignore[arg-type]
    rt.release()
    assert (bridge.directory, bridge.pending, bridge.current) == ({}, {}, None)
    assert rt.stopped
