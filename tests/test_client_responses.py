"""The client validates every JSON response it reads (``fedforest_secure.protocol.api``).

A server (or anything between it and the site) that answers with a malformed join response,
secure-aggregation step or round list gets a :class:`ProtocolError` naming the response, and
the client sends nothing further; never a ``KeyError`` or ``AttributeError`` from deep inside
the loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from client_app import runner
from client_app.context import dropped_detail
from client_app.log import SiteLog
from client_app.runner import ClientOptions
from client_app.state import ClientState
from client_app.transport import ServerUnreachable
from fedforest_secure import load_profile
from fedforest_secure.config import JobConfig
from fedforest_secure.errors import FedForestError, ProtocolError, RefusedRequest
from fedforest_secure.protocol.api import ErrorBody, JoinBody, JoinResponse, SecAggStep
from fedforest_secure.schema import Schema

JOB = "job-r"


def _config(profile: str) -> dict[str, Any]:
    cfg = JobConfig(job_id=JOB, task="regression", n_features=2, n_clients=3,
                    feature_bounds=((-1.0, 1.0),) * 2, target_bound=1.0, n_estimators=1,
                    max_depth=2, min_samples_leaf=2, max_features=2, n_bins=4,
                    profile=load_profile(profile).to_dict())
    return dict(json.loads(cfg.to_json()))


@dataclass
class ScriptedTransport:
    """Answers the offer and the join (``offer`` defaults to the join's answer), then every
    GET with the scripted JSON; records what was sent."""

    join: Any
    offer: Any = None
    gets: dict[str, Any] = field(default_factory=dict)
    sent: list[tuple[str, str]] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0
    requests: int = 0
    step_wait: float = 0.0
    refusals: list[Any] = field(default_factory=list)
    #: bodies of GET requests by path (task downloads)
    downloads: dict[str, bytes] = field(default_factory=dict)
    #: what the offer raises instead of answering
    offer_error: Exception | None = None
    #: what the join raises instead of answering
    join_error: Exception | None = None

    def post_json(self, path: str, body: Any = None) -> Any:
        self.sent.append(("POST", path))
        if path == f"/v1/jobs/{JOB}/join" and self.join_error is not None:
            raise self.join_error
        return self.join

    def get_json(self, path: str, params: Any = None) -> Any:
        self.sent.append(("GET", path))
        if path == f"/v1/jobs/{JOB}/offer":
            if self.offer_error is not None:
                raise self.offer_error
            return self.join if self.offer is None else self.offer
        return self.gets[path.rsplit("/", 1)[-1]]

    def take_next_step(self) -> None:
        return None

    def take_step_task(self) -> None:
        return None

    def brief(self, seconds: float = 5.0) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def request(self, method: str, path: str, content: bytes = b"", **_: Any) -> Any:
        self.sent.append((method, path))
        if method == "POST" and path.endswith("/secagg/refuse"):  # a refusal is recorded
            self.refusals.append(json.loads(content))
            return httpx.Response(200, json={"recorded": True})
        if method == "GET" and path in self.downloads:
            return httpx.Response(200, content=self.downloads[path])
        raise AssertionError(f"the client sent {method} {path}")


def _schema(tmp_path: Path) -> Path:
    """The site's own schema file: the facts of ``_config``'s job."""
    Schema.from_dict({
        "features": [{"name": n, "kind": "continuous", "bounds": [-1.0, 1.0]} for n in "ab"],
        "target": {"name": "y", "kind": "regression", "bounds": [-1.0, 1.0]}}
    ).dump(tmp_path / "s.toml")
    return tmp_path / "s.toml"


def _run(tr: ScriptedTransport, tmp_path: Path) -> Any:
    """The client's run against ``tr``, on a table of zeros; its result."""
    _schema(tmp_path)
    opts = ClientOptions(server="https://fedforest.example.org", token="t", job=JOB,
                         data=tmp_path / "d.csv", schema=tmp_path / "s.toml", ca=None,
                         state_dir=tmp_path / "state", quiet=True)
    return runner._run(opts, tr, ClientState(opts.state_dir),  # type: ignore[arg-type]
                       np.zeros((4, 2)), np.zeros(4), SiteLog(stream=io.StringIO()))


@pytest.mark.parametrize("join", [
    None, [], "ok", {"config": {}}, {"client_index": 0}, {"client_index": 0, "config": "x"},
    {"client_index": "first", "config": {}},
    # the site's name names its receipts file and the owner line of its table's digest
    {"client_index": 0, "config": _config("open"), "client_name": "site-a\nsite-b"},
    {"client_index": 0, "config": _config("open"), "client_name": "s" * 300},
])
def test_a_malformed_job_offer_is_a_protocol_error_and_the_site_does_not_join(
        join: Any, tmp_path: Path) -> None:
    tr = ScriptedTransport(join)
    with pytest.raises(ProtocolError, match="malformed job offer"):
        _run(tr, tmp_path)
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer")]


@pytest.mark.parametrize(("name", "most"), [("n_estimators", 10_000), ("n_bins", 4096)])
def test_a_job_of_more_trees_or_bins_than_a_job_may_have_is_declined_before_joining(
        name: str, most: int, tmp_path: Path) -> None:
    """A site holds a (tree, row) pair per tree and row, and sizes its sketches by the bins:
    a job offered with more than the server's job files allow is refused, not allocated."""
    offer = {"client_index": 0, "config": {**_config("open"), name: most + 1}}
    tr = ScriptedTransport(offer)
    with pytest.raises(RefusedRequest) as err:
        _run(tr, tmp_path)
    assert str(err.value) == (f"the job's {name} is {most + 1}, more than a job may have "
                              f"({most}): refusing to take part")
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer"), ("POST", f"/v1/jobs/{JOB}/decline")]


@pytest.mark.parametrize("change", [{"client_index": 1}, {"config": "other"},
                                    {"schema_sha256": "0" * 64}])
def test_a_join_answered_otherwise_than_the_offer_is_a_protocol_error(
        change: dict[str, Any], tmp_path: Path) -> None:
    """The site checked the offered job: the join must answer that job, in that place."""
    offer = {"client_index": 0, "config": _config("open")}
    join = {**offer, **change}
    if join["config"] == "other":
        join["config"] = {**offer["config"], "n_estimators": 2}
    tr = ScriptedTransport(join, offer=offer)
    with pytest.raises(ProtocolError, match="differs from the job the server offered"):
        _run(tr, tmp_path)
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer"), ("POST", f"/v1/jobs/{JOB}/join")]


@pytest.mark.parametrize("rounds", [{"rounds": []}, [{"round_id": 1}], ["closed"]])
def test_a_malformed_round_list_is_a_protocol_error(rounds: Any, tmp_path: Path) -> None:
    tr = ScriptedTransport({"client_index": 0, "config": _config("open")},
                           gets={"rounds": rounds})
    with pytest.raises(ProtocolError, match="malformed round list"):
        _run(tr, tmp_path)
    assert tr.sent[-1] == ("GET", f"/v1/jobs/{JOB}/rounds")


@pytest.mark.parametrize("step", [[], {"action": "share"}, {"status": "task"},
                                  {"status": "task", "round_id": "next"}])
def test_a_malformed_secure_aggregation_step_is_a_protocol_error(step: Any,
                                                                  tmp_path: Path) -> None:
    tr = ScriptedTransport({"client_index": 0, "config": _config("secure")},
                           gets={"rounds": [], "secagg": step, JOB: {"job_id": JOB,
                                                                      "status": "running"},
                                 "directory": {"complete": False, "keys": {}}})
    with pytest.raises(ProtocolError):
        _run(tr, tmp_path)
    assert ("GET", f"/v1/jobs/{JOB}/secagg") in tr.sent
    assert tr.sent[:2] == [("GET", f"/v1/jobs/{JOB}/offer"), ("POST", f"/v1/jobs/{JOB}/join")]
    assert all(method == "GET" for method, _ in tr.sent[2:])  # nothing posted after the join


def test_responses_ignore_fields_they_do_not_read_and_requests_forbid_them() -> None:
    info = JoinResponse.model_validate({"client_index": 2, "config": {}, "min_clients": 3})
    assert info.client_index == 2 and not hasattr(info, "min_clients")
    assert SecAggStep.model_validate({"status": "wait", "phase": "advert"}).status == "wait"
    with pytest.raises(ValidationError):
        JoinBody.model_validate({"identity_key": "00", "token": "x"})
    body = ErrorBody.model_validate({"error": "round_closed", "detail": "d", "counted": True})
    assert body.model_dump() == {"error": "round_closed", "detail": "d", "counted": True}


@pytest.mark.parametrize(("after", "says"), [
    ("running", "the job went on without it"),
    ("failed", "the job has failed since: there is no model"),  # too few sites were left
])
def test_a_restarted_secure_client_says_it_cannot_rejoin_the_open_round(
        tmp_path: Path, after: str, says: str) -> None:
    """A fresh process asked to share keys for a round it never advertised (its round keys
    died with the old process) refuses the round with the code "restarted", so the server
    drops it without waiting for the deadline, and stops with the operator's message, not a
    stage error: whether the job went on without it or failed for want of it (the job's
    status after the refusal)."""
    from client_app.runner import RESTARTED_SECURE
    from client_app.secagg_session import identity_key

    state = ClientState(tmp_path / "state")
    own = bytes(identity_key(state, JOB).verify_key).hex()
    keys = {"0": own, "1": "11" * 32, "2": "22" * 32}
    tr = ScriptedTransport({"client_index": 0, "config": _config("secure")},
                           gets={"rounds": [], JOB: {"job_id": JOB, "status": "running"},
                                 "secagg": {"status": "task", "action": "share", "round_id": 28,
                                            "task_digest": "00" * 32, "message": "{}"},
                                 "directory": {"complete": True, "keys": keys}})
    sent = tr.request

    def request(method: str, path: str, content: bytes = b"", **kw: Any) -> Any:
        if path.endswith("/secagg/refuse"):  # the server applies the refusal
            tr.gets[JOB] = {"job_id": JOB, "status": after}
        return sent(method, path, content, **kw)

    tr.request = request  # type: ignore[method-assign]
    out = io.StringIO()
    opts = ClientOptions(server="https://fedforest.example.org", token="t", job=JOB,
                         data=tmp_path / "d.csv", schema=_schema(tmp_path), ca=None,
                         state_dir=tmp_path / "state", quiet=True)
    res = runner._run(opts, tr, state, np.zeros((4, 2)), np.zeros(4),  # type: ignore[arg-type]
                      SiteLog(stream=out))
    assert res.status == "dropped"
    assert res.detail.startswith(f"this site was dropped from job {JOB} ({RESTARTED_SECURE}); ")
    assert says in res.detail, res.detail
    assert RESTARTED_SECURE in out.getvalue() and "stage" not in out.getvalue()
    # the site's last log line says "dropped" once (not "ended: dropped this site was dropped")
    last = out.getvalue().splitlines()[-1]
    assert last.endswith(f"warning: job {JOB} ended: {res.detail}"), last
    # after the join: GETs, and the refusal of round 28 (a code, nothing else)
    posts = [path for method, path in tr.sent[2:] if method != "GET"]
    assert posts == [f"/v1/jobs/{JOB}/rounds/28/secagg/refuse"]
    assert tr.refusals == [{"reason": "restarted"}]


def test_a_client_restarted_on_another_table_refuses_before_joining_again(
        tmp_path: Path) -> None:
    """The rows a site joined a job with are the rows it trains on to the end: a restart with
    another table (its earlier rounds rebuilt from different rows) is refused."""
    state = ClientState(tmp_path / "state")
    runner.write_atomic(state.root / f"table-{JOB}.sha256",
                        runner._table_digest(np.ones((4, 2)), np.zeros(4)).encode())
    tr = ScriptedTransport({"client_index": 0, "config": _config("open")})
    with pytest.raises(FedForestError, match=f"this site joined job {JOB} with another table"):
        _run(tr, tmp_path)  # rows of zeros
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer")]


def test_the_join_records_the_table_a_restart_must_bring_back(tmp_path: Path) -> None:
    tr = ScriptedTransport({"client_index": 0, "config": _config("open")},
                           gets={"rounds": [["closed"]]})
    with pytest.raises(ProtocolError):
        _run(tr, tmp_path)  # stops at the malformed round list, after the join
    recorded = (tmp_path / "state" / f"table-{JOB}.sha256").read_text()
    assert recorded == runner._table_digest(np.zeros((4, 2)), np.zeros(4)) + "\nclient-0\n"


@pytest.mark.parametrize("profile", ["open", "secure"])
def test_a_state_directory_copied_from_another_site_is_named_before_anything_is_sent(
        tmp_path: Path, profile: str) -> None:
    """A site started on a copy of another site's state directory finds that site's table
    record: it says whose files these are and which to delete, rather than blaming a table
    change on this site, and it neither joins nor leaves a round it never joined."""
    state = ClientState(tmp_path / "state")
    runner.write_atomic(state.root / f"table-{JOB}.sha256",
                        (runner._table_digest(np.ones((4, 2)), np.zeros(4))
                         + "\nhospital-b\n").encode())
    tr = ScriptedTransport({"client_index": 0, "client_name": "hospital-a",
                            "config": _config(profile)})
    with pytest.raises(FedForestError) as err:
        _run(tr, tmp_path)
    assert str(err.value) == (
        f"the state directory {state.root} holds the files of site 'hospital-b' for job {JOB}, "
        "not of this site ('hospital-a'): it was copied from that site's. Give each site a "
        f"state directory of its own (--state-dir), or delete table-{JOB}.sha256 and "
        f"identity-{JOB}.ed25519 from this one and start the client again")
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer")]


def test_a_secure_client_refusing_its_own_answer_tells_the_server_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A site whose worker refuses a round's question (a privacy rule of its own: here a
    disclosure its profile does not name) reports the refusal, so the server drops it now and
    names the reason, rather than every other site waiting out the step's deadline."""
    import hashlib

    from client_app.secagg_session import SecAggSession, identity_key
    from fedforest_secure.errors import RefusedRequest
    from fedforest_secure.protocol import Task, TaskKind

    class Refusing:
        n_rows = 4

        def handle(self, task: Any) -> Any:
            raise RefusedRequest("the task asks a disclosure this site does not allow",
                                 code="disclosure")

    monkeypatch.setattr(runner, "site_worker", lambda *a, **k: Refusing())
    monkeypatch.setattr(SecAggSession, "advertised", lambda self, r: True)
    body = Task(job_id=JOB, round_id=5, kind=TaskKind.SKETCH, level=0,
                params={"n_nodes": 1, "n_points": 4}, arrays={}).to_bytes()
    state = ClientState(tmp_path / "state")
    own = bytes(identity_key(state, JOB).verify_key).hex()
    tr = ScriptedTransport({"client_index": 0, "config": _config("secure")},
                           gets={"rounds": [], JOB: {"job_id": JOB, "status": "running"},
                                 "secagg": {"status": "task", "action": "upload",
                                            "round_id": 5, "message": "{}",
                                            "task_digest": hashlib.sha256(body).hexdigest()},
                                 "directory": {"complete": True,
                                               "keys": {"0": own, "1": "11" * 32,
                                                        "2": "22" * 32}}},
                           downloads={f"/v1/jobs/{JOB}/rounds/5/task": body})
    opts = ClientOptions(server="https://fedforest.example.org", token="t", job=JOB,
                         data=tmp_path / "d.csv", schema=_schema(tmp_path), ca=None,
                         state_dir=tmp_path / "state", quiet=True)
    res = runner._run(opts, tr, state, np.zeros((4, 2)), np.zeros(4),  # type: ignore[arg-type]
                      SiteLog(stream=io.StringIO()))
    assert res.status == "refused" and "disclosure this site does not allow" in res.detail
    assert tr.refusals == [{"reason": "disclosure"}]


def test_a_dropped_site_that_comes_back_is_told_what_happened_and_what_it_can_do(
        tmp_path: Path) -> None:
    """The server answers a dropped site's offer with 403 `dropped`: the client ends as
    "dropped", asks the job's status, says the job went on and how to fetch its model, and
    sends nothing else."""
    from client_app.transport import ApiRejected

    tr = ScriptedTransport({"client_index": 0, "config": _config("open")},
                           offer_error=ApiRejected(403, "dropped", "this client was dropped "
                                                   "at round 5", {}),
                           gets={JOB: {"job_id": JOB, "status": "running"}})
    res = _run(tr, tmp_path)
    assert res.status == "dropped"
    assert "dropped at round 5" in res.detail and "the job went on without it" in res.detail
    assert f"fedforest model download --job {JOB}" in res.detail
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer"), ("GET", f"/v1/jobs/{JOB}")]


_UNKNOWN = ("whether the job went on without it is not known: the server did not answer when "
            "asked (`fedforest status --job j1` asks again). Once the job is done, `fedforest "
            "model download --job j1` fetches its model")


@pytest.mark.parametrize(("job_status", "says", "download"), [
    ("failed", "the job has failed since: there is no model", False),
    ("done", "the job is done: `fedforest model download --job j1` fetches its model", True),
    ("running", "the job went on without it. Once the job is done", True),
    ("too few", "the job cannot go on: 2 sites remain, fewer than the 3 it needs", False),
    ("one left", "the job cannot go on: 1 site remains, fewer than the 3 it needs", False),
    (None, _UNKNOWN, True),  # status unreadable
    ("unreachable", _UNKNOWN, True),  # the server stopped: the job may have failed
])
def test_a_dropped_site_is_told_what_became_of_the_job(job_status: str | None, says: str,
                                                        download: bool) -> None:
    """A site dropped from a job that failed since is not sent to download a model there will
    never be; one whose job is done is told the model is there; one that cannot learn the
    job's status says it is not known."""
    def get_json(path: str, params: Any = None) -> Any:
        assert path == "/v1/jobs/j1"
        if job_status is None:
            raise ProtocolError("malformed job status")
        if job_status == "unreachable":
            raise ServerUnreachable("the server at https://127.0.0.1:1 cannot be reached",
                                    failure="connection refused")
        if job_status in ("too few", "one left"):  # running, about to fail for want of sites
            return {"job_id": "j1", "status": "running",
                    "active_clients": 2 if job_status == "too few" else 1, "min_clients": 3}
        return {"job_id": "j1", "status": job_status, "active_clients": 3, "min_clients": 3}

    detail = dropped_detail("j1", "missed the round deadline",
                            SimpleNamespace(get_json=get_json,  # type: ignore[arg-type]
                                            brief=contextlib.nullcontext))
    assert detail.startswith("this site was dropped from job j1 (missed the round deadline); ")
    assert says in detail
    assert ("model download" in detail) == download


def _secure_restart(status: str = "task") -> ScriptedTransport:
    """A secure job whose round 4 is open and asks this site to share its keys ("task"), or
    waits for the other sites' answers to a step this site answered before its restart."""
    return ScriptedTransport(
        {"client_index": 0, "config": _config("secure")},
        gets={"secagg": {"status": status, "action": "share" if status == "task" else "wait",
                         "round_id": 4}})


@pytest.mark.parametrize("status", ["task", "wait"])
def test_a_secure_site_restarted_on_another_table_leaves_the_open_round_at_once(
        tmp_path: Path, status: str) -> None:
    """Under a secure profile a restarted site cannot answer the open round (its round keys
    died with the old process): brought back with another table, it refuses that round
    (code "restarted") before it stops, so the other sites do not wait for its deadline."""
    state = ClientState(tmp_path / "state")
    runner.write_atomic(state.root / f"table-{JOB}.sha256",
                        runner._table_digest(np.ones((4, 2)), np.zeros(4)).encode())
    tr = _secure_restart(status)
    with pytest.raises(FedForestError, match=f"this site joined job {JOB} with another table.*"
                                             r"leaves the job's open round \(the server was "
                                             r"told\)"):
        _run(tr, tmp_path)  # rows of zeros
    assert tr.refusals == [{"reason": "restarted"}]
    assert ("POST", f"/v1/jobs/{JOB}/rounds/4/secagg/refuse") in tr.sent
    assert ("POST", f"/v1/jobs/{JOB}/join") not in tr.sent


def test_a_site_joining_with_another_identity_key_says_which_file_and_refuses_nothing(
        tmp_path: Path) -> None:
    """A client started with a lost or another --state-dir joins with a new identity key,
    which the server refuses (409 identity_mismatch). The site's client that holds the key it
    joined with may still be running (from another directory): this one says which file it
    lacks and sends no refusal, which would drop the running site."""
    from client_app.transport import ApiRejected

    tr = _secure_restart()
    mismatch = ApiRejected(409, "identity_mismatch", "this client joined with another "
                           "identity key; it cannot change mid-job", {})

    def refuse_join(path: str, body: Any = None) -> Any:
        tr.sent.append(("POST", path))
        raise mismatch

    tr.post_json = refuse_join  # type: ignore[method-assign]
    with pytest.raises(FedForestError, match=rf"another identity key than the one in "
                                             rf"--state-dir .*identity-{JOB}\.ed25519"):
        _run(tr, tmp_path)
    assert tr.refusals == []
    assert not any(path.endswith("/secagg/refuse") or path.endswith("/secagg")
                   for _, path in tr.sent)


def test_a_restart_on_a_finished_pruned_job_replays_nothing_and_goes_on() -> None:
    """After `fedforest server prune` a finished job's round list stays but its tasks answer
    410 "pruned": the replay stops there (the client then learns the job is done and fetches
    its model); another refusal still stops the client."""
    from client_app.loops import replay
    from client_app.transport import ApiRejected

    listed = [{"round_id": r, "kind": "sketch", "level": 0, "status": "closed",
               "task_digest": "00" * 32} for r in (1, 2)]
    asked: list[str] = []

    def transport(code: str) -> Any:
        def request(method: str, path: str, **_: Any) -> Any:
            asked.append(path)
            raise ApiRejected(410 if code == "pruned" else 403, code, "no", {})
        return SimpleNamespace(get_json=lambda path: listed, request=request)

    replay(transport("pruned"), JOB, worker=None)  # type: ignore[arg-type]
    assert asked == [f"/v1/jobs/{JOB}/rounds/1/task"]
    with pytest.raises(ApiRejected, match="403 forbidden"):
        replay(transport("forbidden"), JOB, worker=None)  # type: ignore[arg-type]


def test_a_job_that_fails_while_the_site_is_in_a_step_ends_with_its_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job fails (a round aborted) while this site sends a step: the server answers 409
    `job_finished`. The site ends "failed" with the reason the job status gives, as any site
    told at its next step; not an error about an HTTP status."""
    from client_app.transport import ApiRejected

    def finished(ctx: Any) -> None:
        raise ApiRejected(409, "job_finished", "the job is failed", {})

    monkeypatch.setattr(runner, "run_open", finished)
    reason = "round 4: only 2 masked uploads, fewer than the 3 required"
    tr = ScriptedTransport({"client_index": 0, "config": _config("open")},
                           gets={"rounds": [], JOB: {"job_id": JOB, "status": "failed",
                                                     "reason": reason}})
    res = _run(tr, tmp_path)
    assert (res.status, res.detail) == ("failed", reason)


def test_a_site_joining_a_job_that_failed_before_it_joined_is_told_why(tmp_path: Path) -> None:
    """The job was cancelled (or failed) before this site joined: the join's 409 says so, and
    the site ends as the sites that had joined do, with the job's reason, not with an HTTP
    error that says the job started without it."""
    from client_app.transport import ApiRejected

    tr = ScriptedTransport({"client_index": 0, "config": _config("open")}, join_error=(
        ApiRejected(409, "job_failed", "cancelled by the operator",
                    {"error": "job_failed", "detail": "cancelled by the operator"})))
    result = _run(tr, tmp_path)
    assert (result.status, result.detail) == ("failed", "cancelled by the operator")
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer"), ("POST", f"/v1/jobs/{JOB}/join")]


@pytest.mark.parametrize("status", ["open", "closed"])
def test_a_refused_task_met_while_replaying_is_left_to_the_loop_if_its_round_is_open(
        status: str) -> None:
    """A restart replays the job's sketch rounds. One the site's profile refuses: the open
    round's is left to the job's loop, which refuses it telling the server; a closed round's
    (answered before, refused now) stops the client."""
    import hashlib

    from client_app.loops import replay
    from fedforest_secure.errors import RefusedRequest
    from fedforest_secure.protocol import Task, TaskKind

    body = Task(job_id=JOB, round_id=1, kind=TaskKind.SKETCH, level=0).to_bytes()
    listed = [{"round_id": 1, "kind": "sketch", "level": 0, "status": status,
               "task_digest": hashlib.sha256(body).hexdigest()}]
    tr = SimpleNamespace(get_json=lambda path: listed,
                         request=lambda *a, **k: SimpleNamespace(content=body))

    asked: list[int] = []

    def refusing(task: Any) -> None:
        asked.append(task.round_id)
        raise RefusedRequest("the privacy profile 'secure' forbids disclosing ['node_stats']")

    worker = SimpleNamespace(handle=refusing)
    if status == "open":
        replay(tr, JOB, worker)  # type: ignore[arg-type]
        assert asked == [1]  # the open round's task was answered, and its refusal left
    else:
        with pytest.raises(RefusedRequest, match="forbids disclosing"):
            replay(tr, JOB, worker)  # type: ignore[arg-type]


@pytest.mark.parametrize(("recorded", "says"), [
    ("0" * 64, "the model's SHA-256 {digest} is not the one the job records ({recorded}); not "
               "written"),
    (None, "the server's answer is not a model nor an evaluation result (not a model file "
           "(fedforest-secure/model/v1 or fedforest-secure/model/v2 or "
           "fedforest-secure/model/v3)); not written"),
])
def test_the_model_a_site_saves_at_the_end_of_its_job_is_the_jobs(
        recorded: str | None, says: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At the end of its job the client fetches the model as `fedforest model download` does:
    one whose SHA-256 is not the one the job's status records, or that is no model, is
    refused and not written."""
    def done(ctx: Any) -> None:
        ctx.result.status = "done"

    monkeypatch.setattr(runner, "run_open", done)
    body = b'{"format": "fedforest-secure/model"}'
    status = {"job_id": JOB, "status": "done", "model_digest": recorded}
    tr = ScriptedTransport({"client_index": 0, "config": _config("open")},
                           gets={"rounds": [], JOB: status},
                           downloads={f"/v1/jobs/{JOB}/model": body})
    with pytest.raises(ProtocolError) as err:
        _run(tr, tmp_path)
    assert str(err.value) == says.format(digest=hashlib.sha256(body).hexdigest(),
                                         recorded=recorded)
    assert not (tmp_path / "state" / f"{JOB}.model.json").exists()
