"""A restarted client of a secure job (threat_model.md C8, C9, S9, D9 across a restart).

What a client answered (its question ledger, the DP releases it made) and its round keys live
in the memory of its process. A restarted client whose receipts record an upload of the job
answers none of the job's rounds again, whatever step the server names (an honest server
never asks it for keys: they rode on its last unmask); a client that never uploaded in the
job takes part from the advert on.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from test_client_responses import JOB, ScriptedTransport, _config, _schema

from client_app import runner
from client_app.log import SiteLog
from client_app.runner import ClientOptions, ClientResult
from client_app.secagg_session import identity_key
from client_app.state import ClientState
from fedforest_secure.audit import (
    FailedReceipt,
    ModelReceipt,
    Receipt,
    RefusedReceipt,
    SentReceipt,
    write_receipt,
)
from fedforest_secure.errors import FedForestError
from fedforest_secure.protocol import Block, StatKind, Task, TaskKind

HEAD = "ab" * 32


def _histogram(round_id: int) -> Task:
    layout = (Block("totals", (2, 3), (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)),)
    return Task(job_id=JOB, round_id=round_id, kind=TaskKind.HISTOGRAM, level=0,
                params={"nodes": [0, 1]}, arrays={"thresholds": np.linspace(-1, 1, 4)},
                layout=layout)


def _uploaded(state: ClientState, task: Task, name: str = "client-0", job: str = JOB) -> None:
    """The records a client keeps of its upload of ``task`` (a sent record, then the upload's
    receipt), as :class:`client_app.context.RunContext` writes them."""
    digest = hashlib.sha256(b"upload").hexdigest()
    write_receipt(state.root / "receipts",
                  SentReceipt(job, task.round_id, name, task.digest().hex(), digest, HEAD, 7))
    write_receipt(state.root / "receipts", Receipt(job, task.round_id, name, digest, HEAD, 7))


def _restarted(tmp_path: Path, profile: str, action: str, task: Task, *,
               config: dict[str, Any] | None = None,
               held: tuple[np.ndarray, np.ndarray] | None = None,
               evaluate_again: bool = False
               ) -> tuple[ClientResult, ScriptedTransport, list[str], str]:
    """A client started on the state directory of a site that joined the job (its identity
    key is there), told to take step ``action`` of round ``task.round_id`` whose task is
    ``task``: its result, its transport, the secure-aggregation messages it posted but
    refusals, and its log. The job is ``_config(profile)`` unless ``config`` is given (an
    evaluation job's, scored on the held-out rows ``held``; ``evaluate_again``: the site's
    ``--evaluate-again``)."""
    state = ClientState(tmp_path / "state")
    own = bytes(identity_key(state, JOB).verify_key).hex()
    body = task.to_bytes()
    r = task.round_id
    tr = ScriptedTransport({"client_index": 0, "config": config or _config(profile)},
                           gets={"rounds": [], JOB: {"job_id": JOB, "status": "running"},
                                 "secagg": {"status": "task", "action": action, "round_id": r,
                                            "task_digest": hashlib.sha256(body).hexdigest(),
                                            "message": "{}"},
                                 "directory": {"complete": True,
                                               "keys": {"0": own, "1": "11" * 32,
                                                        "2": "22" * 32}}},
                           downloads={f"/v1/jobs/{JOB}/rounds/{r}/task": body})
    scripted = tr.request
    posted: list[str] = []

    def request(method: str, path: str, content: bytes = b"", **kw: Any) -> Any:
        if method == "POST" and "/secagg/" in path and not path.endswith("/refuse"):
            tr.sent.append((method, path))
            posted.append(path.rsplit("/", 1)[-1])  # the script ends after the step's answer
            tr.gets["secagg"] = {"status": "failed", "detail": "end of script"}
            return httpx.Response(200, json={})
        return scripted(method, path, content, **kw)

    tr.request = request  # type: ignore[method-assign]
    out = io.StringIO()
    opts = ClientOptions(server="https://fedforest.example.org", token="t", job=JOB,
                         data=tmp_path / "d.csv" if held is None else None,
                         eval_data=None if held is None else tmp_path / "held.csv",
                         schema=_schema(tmp_path), ca=None, state_dir=tmp_path / "state",
                         quiet=True, evaluate_again=evaluate_again)
    X, y = (np.zeros((4, 2)), np.zeros(4)) if held is None else (None, None)
    res = runner._run(opts, tr, state, X, y, SiteLog(stream=out),  # type: ignore[arg-type]
                      None, held)
    return res, tr, posted, out.getvalue()


@pytest.mark.parametrize("profile", ["secure", "secure-dp"])
@pytest.mark.parametrize("action", ["advert", "share", "upload", "sign", "unmask"])
def test_a_restarted_secure_site_that_uploaded_in_the_job_answers_no_round_of_it_again(
        tmp_path: Path, profile: str, action: str) -> None:
    """The site uploaded its answer to round 5's histogram, then restarted. A server that
    asks the same histogram again in round 6 (over fewer sites: the difference of the two
    sums is one site's histogram; under secure-dp a second release of the level) gets the
    refusal "restarted" and nothing else: no advert, no task fetched, no earlier round
    replayed, whatever step of round 6 it names."""
    state = ClientState(tmp_path / "state")
    _uploaded(state, _histogram(5))
    res, tr, posted, log = _restarted(tmp_path, profile, action, _histogram(6))
    assert posted == [] and tr.refusals == [{"reason": "restarted"}]
    after_join = tr.sent[tr.sent.index(("POST", f"/v1/jobs/{JOB}/join")) + 1:]
    assert [p for p in after_join if p[0] != "GET"] == \
        [("POST", f"/v1/jobs/{JOB}/rounds/6/secagg/refuse")]
    assert ("GET", f"/v1/jobs/{JOB}/rounds/6/task") not in tr.sent
    assert ("GET", f"/v1/jobs/{JOB}/rounds") not in tr.sent  # nothing to rebuild
    assert res.status == "dropped"
    said = (f"this site's receipts in {tmp_path / 'state' / 'receipts'} record an upload in "
            f"job {JOB}, and a site answers no round of a secure job it uploaded in: its "
            "client was restarted in this job, or took part in an earlier job of that name, "
            "and every job needs a name of its own")
    assert res.detail.startswith(f"this site was dropped from job {JOB} ({said}); ")
    assert f"warning: job {JOB}: {said}\n" in log
    assert "a restarted site" not in log


def test_a_restarted_secure_site_named_otherwise_by_the_server_still_finds_its_upload(
        tmp_path: Path) -> None:
    """The receipts file is named after the site's name the server gives at join: a server
    that names the restarted site otherwise does not hide its earlier upload."""
    state = ClientState(tmp_path / "state")
    _uploaded(state, _histogram(5), name="hospital-a")
    res, tr, posted, _ = _restarted(tmp_path, "secure", "advert", _histogram(6))
    assert posted == [] and tr.refusals == [{"reason": "restarted"}]
    assert res.status == "dropped"


def test_a_restarted_secure_site_that_never_uploaded_in_the_job_takes_part_from_the_advert(
        tmp_path: Path) -> None:
    """A site stopped before it uploaded anything in the job (here: it uploaded in another
    job with the same state directory) answered no question of it: it sends its round keys
    when asked and goes on."""
    state = ClientState(tmp_path / "state")
    _uploaded(state, _histogram(5), job="job-other")
    res, tr, posted, _ = _restarted(tmp_path, "secure", "advert", _histogram(0))
    assert posted == ["advert"] and tr.refusals == []
    assert ("GET", f"/v1/jobs/{JOB}/rounds") in tr.sent  # the job's earlier rounds replayed
    assert res.status == "failed" and res.detail == "end of script"


def test_the_state_directory_says_whether_the_site_uploaded_in_a_job(tmp_path: Path) -> None:
    """Any sent record or upload receipt of the job counts, in whichever receipts file; a
    line damaged past parsing that names the job counts too (it may be one). The job's end
    or a refusal is no upload, nor is another job's upload."""
    state = ClientState(tmp_path / "state")
    folder = state.root / "receipts"
    assert not state.uploaded_in(JOB)
    write_receipt(folder, ModelReceipt("job-other", "a", "cd" * 32, HEAD, 3))
    write_receipt(folder, ModelReceipt(JOB, "a", "cd" * 32, HEAD, 3))
    write_receipt(folder, FailedReceipt(JOB, "a", HEAD, 3))
    write_receipt(folder, RefusedReceipt(JOB, 2, "a", HEAD, 3))
    write_receipt(folder, Receipt("job-other", 2, "a", "cd" * 32, HEAD, 3))
    with (folder / "a.jsonl").open("ab") as fp:
        fp.write(b'{"job_id": "job-other", "round_id": \xff\n')  # damaged: another job
    assert not state.uploaded_in(JOB)
    for record in (Receipt(JOB, 2, "b", "cd" * 32, HEAD, 3),
                   SentReceipt(JOB, 2, "b", "ef" * 32, "cd" * 32, HEAD, 3)):
        other = ClientState(tmp_path / record.__class__.__name__)
        write_receipt(other.root / "receipts", record)
        assert other.uploaded_in(JOB), record
    damaged = ClientState(tmp_path / "damaged")
    (damaged.root / "receipts").mkdir()
    line = json.dumps({"kind": "sent", "job_id": JOB, "round_id": 2}).encode()
    (damaged.root / "receipts" / "b.jsonl").write_bytes(line[:-3] + b"\xff\n")
    assert damaged.uploaded_in(JOB)


def test_a_secure_evaluation_under_the_name_of_a_job_this_site_uploaded_in_is_refused_joined(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never restarted: this site's state directory holds an upload of an earlier job of the
    same name (the server's database made afresh). The job scores another model and the site
    allows another evaluation of its rows (--evaluate-again): the evaluation ledger checks it
    like another job and lets it join; once joined, the site
    answers none of its rounds, since its receipts know a job by its name, and says so (not
    that it was restarted)."""
    from client_app.evaluation import EvalLedger, table_digest
    from fedforest_secure import FedForestClassifier, load_profile
    from fedforest_secure.evaluation import EvalSpec
    from fedforest_secure.evaluation.inprocess import eval_config

    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(40, 2))
    y = (X[:, 0] > 0).astype(int)
    model = FedForestClassifier(n_estimators=2, max_depth=2, random_state=0).fit(
        X, y, client=np.arange(40) % 3).model_
    config = eval_config(JOB, EvalSpec(models=(model.to_json(),)), task="classification",
                         n_features=2, n_clients=3, n_classes=2,
                         profile=load_profile("secure").to_dict())
    monkeypatch.setattr(runner, "_check_job", lambda *a: None)  # the schema: not this test's
    state = ClientState(tmp_path / "state")
    EvalLedger(state.root).check_and_record(JOB, ("an earlier model",), table_digest(X, y),
                                            evaluation="an earlier configuration",
                                            resumed=False)
    _uploaded(state, _histogram(0))
    res, tr, posted, log = _restarted(tmp_path, "secure", "advert", _histogram(0),
                                      config=json.loads(config.to_json()), held=(X, y),
                                      evaluate_again=True)
    assert ("POST", f"/v1/jobs/{JOB}/join") in tr.sent  # the ledger let it join
    assert posted == [] and tr.refusals == [{"reason": "restarted"}]
    said = (f"this site's receipts in {state.root / 'receipts'} record an upload in job {JOB}, "
            "and a site answers no round of a secure job it uploaded in: its client was "
            "restarted in this job, or took part in an earlier job of that name, and every job "
            "needs a name of its own")
    assert res.status == "dropped"
    assert res.detail.startswith(f"this site was dropped from job {JOB} ({said}); ")
    assert f"warning: job {JOB}: {said}\n" in log
    assert "a restarted site" not in log


def test_a_damaged_identity_key_file_is_refused_not_replaced(tmp_path: Path) -> None:
    """The site's identity in a job is the key it first joined with: a file that holds no
    Ed25519 key is named, and kept as it is (a new key would be refused by the server as
    another site's)."""
    state = ClientState(tmp_path / "state")
    key = bytes(identity_key(state, JOB))
    assert bytes(identity_key(state, JOB)) == key  # read back, not made again
    path = state.root / f"identity-{JOB}.ed25519"
    path.write_bytes(key[:5])
    with pytest.raises(FedForestError, match=re.escape(
            f"{path} holds 5 bytes, not an Ed25519 key of 32: the state directory is "
            f"damaged. This site's identity in job {JOB} is the key it first joined with")):
        identity_key(state, JOB)
    assert path.read_bytes() == key[:5]
