"""A sealed task packs and hashes once, and its digests are exactly :class:`Task`'s."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest

from fedforest_secure.errors import InvalidMessage
from fedforest_secure.protocol import Block, SealedTask, StatKind, Task, TaskKind, seal


def _task() -> Task:
    return Task(job_id="j", round_id=7, kind=TaskKind.HISTOGRAM, level=2,
                params={"stats": ["count"], "purpose": "gain"},
                arrays={"nodes": np.arange(4), "features": np.array([0, 2]),
                        "thresholds": np.linspace(0.0, 1.0, 24).reshape(4, 2, 3)},
                layout=(Block("hist", (4, 2, 4, 1), (StatKind.COUNT,)),))


def test_sealed_digests_are_the_tasks() -> None:
    task = _task()
    sealed = seal(task)
    assert isinstance(sealed, SealedTask) and seal(sealed) is sealed
    assert sealed.to_bytes() == task.to_bytes()
    assert sealed.to_bytes() is sealed.to_bytes()  # packed once
    assert sealed.digest() == task.digest()
    assert sealed.question_digest() == task.question_digest()
    assert sealed.arrays["thresholds"] is task.arrays["thresholds"]  # fields shared, not copied


def test_from_wire_reuses_the_body_and_its_hash() -> None:
    task = _task()
    body = task.to_bytes()
    digest = hashlib.sha256(body).digest()
    got = SealedTask.from_wire(body, digest)
    assert got.to_bytes() is body
    assert got.digest() == digest == task.digest()
    assert got.question_digest() == task.question_digest()
    assert got.round_id == 7 and np.array_equal(got.arrays["thresholds"],
                                                task.arrays["thresholds"])
    assert SealedTask.from_wire(body).digest() == digest  # hashed here when not given


def test_a_non_canonical_body_gets_the_canonical_digest() -> None:
    """Bytes that parse to the task but are not its canonical encoding (here: a header with
    spaces) do not get the body's hash as the task digest: a client comparing the round
    setup's digest with the task's sees the same value as with :meth:`Task.digest`."""
    task = _task()
    canonical = task.to_bytes()
    hlen = struct.unpack("<I", canonical[4:8])[0]
    meta = json.loads(canonical[8:8 + hlen])
    head = json.dumps(meta, indent=1).encode()
    body = canonical[:4] + struct.pack("<I", len(head)) + head + canonical[8 + hlen:]
    assert Task.from_bytes(body).digest() == task.digest()  # it parses to the same task
    got = SealedTask.from_wire(body)
    assert got.digest() == task.digest() != hashlib.sha256(body).digest()
    assert got.to_bytes() == canonical


def test_garbage_is_still_an_invalid_message() -> None:
    with pytest.raises(InvalidMessage):
        SealedTask.from_wire(b"FFS1garbage")


def _repack(body: bytes, meta: dict) -> bytes:
    hlen = struct.unpack("<I", body[4:8])[0]
    head = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    return body[:4] + struct.pack("<I", len(head)) + head + body[8 + hlen:]


@pytest.mark.parametrize("variant", ["junk key", "float shape", "extra header key"])
def test_bodies_that_only_look_canonical_take_the_slow_path(variant: str) -> None:
    task = _task()
    canonical = task.to_bytes()
    meta = json.loads(canonical[8:8 + struct.unpack("<I", canonical[4:8])[0]])
    if variant == "junk key":
        meta["arrays"][0]["junk"] = 1
    elif variant == "float shape":
        meta["arrays"][0]["shape"] = [float(s) for s in meta["arrays"][0]["shape"]]
    else:
        meta["header"]["extra"] = "ignored by the parser"
    body = _repack(canonical, meta)
    assert Task.from_bytes(body).digest() == task.digest()  # parses to the same task
    got = SealedTask.from_wire(body)
    assert got.digest() == task.digest() != hashlib.sha256(body).digest()
    assert got.question_digest() == task.question_digest()


@pytest.mark.parametrize("arrays", [
    {},
    {"b": np.array([True, False]), "a": np.zeros((0, 3)), "u": np.arange(5, dtype=np.uint8)},
    {"x": np.arange(6, dtype=np.int32).reshape(2, 3), "y": np.arange(3, dtype=np.uint64)},
])
def test_fast_question_digest_equals_the_tasks(arrays: dict) -> None:
    """Both digests, for tasks with informational parameters (left out of the question),
    several dtypes, empty arrays and a non-ASCII job id."""
    task = Task(job_id="hôpital-é", round_id=3, kind=TaskKind.SKETCH, level=1,
                params={"n_nodes": 2, "dp": {"sigma": 1.5}, "purpose": "x", "totals": True},
                arrays=arrays, layout=(Block("t", (2, 3), (StatKind.COUNT, StatKind.SUM,
                                                           StatKind.SUMSQ)),),
                disclose=("sketch_points",))
    body = task.to_bytes()
    for got in (seal(task), SealedTask.from_wire(body)):
        assert got._fast_question() == task.question_digest()  # no second pack of the arrays
        assert got.question_digest() == task.question_digest()
        assert got.digest() == task.digest()
    assert SealedTask.from_wire(body).to_bytes() is body


def test_arrays_a_client_casts_take_the_slow_path_to_the_same_question() -> None:
    """A task whose arrays are not in the dtypes a client reads them as (int32 indices) is
    the same question as the canonical one; its digest is computed by casting them."""
    task = _task()
    assert seal(task)._fast_question() == task.question_digest()  # int64 / float64 already
    a = task.arrays
    narrow = Task(**{**vars(task), "arrays": {**a, "nodes": a["nodes"].astype(np.int32),
                                              "features": a["features"].astype(np.uint8)}})
    for got in (seal(narrow), SealedTask.from_wire(narrow.to_bytes())):
        assert got._fast_question() is None
        assert got.question_digest() == narrow.question_digest() == task.question_digest()
    assert narrow.digest() != task.digest()


@pytest.mark.parametrize("profile", ["secure", "open"])
def test_an_honest_coordinator_sends_tasks_in_the_form_a_client_accepts(profile: str) -> None:
    """Every task of a job passes the client's form check, and its question digest from the
    wire is the task's (from the bytes, or casting the routing's int32 arrays)."""
    from test_adversarial_server import _secure_config, _workers

    from fedforest_secure.coordinator import Coordinator
    from fedforest_secure.protocol import TASK_ARRAY_DTYPES, check_task_form

    cfg, clients = _secure_config(profile)
    ws, coord = _workers(cfg, clients), Coordinator(cfg)
    seen: set[str] = set()
    task = coord.next_task()
    while task is not None:
        check_task_form(task)
        sealed = SealedTask.from_wire(task.to_bytes())
        assert sealed.question_digest() == task.question_digest()
        if all(a.dtype == TASK_ARRAY_DTYPES[k] for k, a in task.arrays.items()):
            assert sealed._fast_question() == task.question_digest()
        seen |= set(task.arrays) | set(task.params)
        rep = [w.handle(task) for w in ws]
        coord.submit(task.round_id, np.sum([r.summable for r in rep], axis=0),
                     participants=list(range(len(ws))),
                     disclosed={k: r.disclosed for k, r in enumerate(rep) if r.disclosed})
        task = coord.next_task()
    assert {"route_kind", "route_threshold", "nodes", "features", "totals"} <= seen
    assert ("n_points" in seen) == (profile == "open")


def test_a_sealed_tasks_histogram_arrays_are_checked_once_for_every_reader() -> None:
    """Every client of an in-process federation reads the one sealed task: its arrays are
    converted and checked once, shared read-only, and a task that fails the checks is
    refused by every reader (nothing is kept of it)."""
    from fedforest_secure._task_checks import check_feature_slots, histogram_arrays
    from fedforest_secure.config import JobConfig
    from fedforest_secure.errors import ProtocolError

    feats = np.array([[0, 2], [1, 3], [2, 0], [3, 1]])
    thr = np.sort(np.random.default_rng(0).normal(size=(4, 2, 3)), axis=2)
    good = seal(Task(job_id="j", round_id=7, kind=TaskKind.HISTOGRAM, level=2,
                     params={"stats": "full"},
                     arrays={"nodes": np.arange(4), "features": feats, "thresholds": thr},
                     layout=(Block("hist", (4, 2, 4, 1), (StatKind.COUNT,)),)))
    first = histogram_arrays(good, 4, 4)
    again = histogram_arrays(good, 4, 4)
    assert all(a is b for a, b in zip(first[:3], again[:3], strict=True))
    assert not any(a.flags.writeable for a in first[:3])
    np.testing.assert_array_equal(first[2], thr)
    # float64 thresholds are read where they are (a level's grid is as large as its
    # histogram): a read-only view, the task's own array left as it was
    assert np.shares_memory(first[2], thr) and thr.flags.writeable
    with pytest.raises(ProtocolError, match="inconsistent"):  # another level's size
        histogram_arrays(good, 3, 4)
    bad = seal(Task(job_id="j", round_id=8, kind=TaskKind.HISTOGRAM, level=2,
                    params={"stats": "full"},
                    arrays={"nodes": np.arange(4), "features": feats,
                            "thresholds": thr[:, :, ::-1].copy()},
                    layout=(Block("hist", (4, 2, 4, 1), (StatKind.COUNT,)),)))
    cfg = JobConfig(job_id="j", task="regression", n_features=4, n_clients=2, n_estimators=4,
                    max_features=2, n_bins=4, profile={"name": "open"})
    twice = feats.copy()
    twice[1] = [3, 3]
    repeat = seal(Task(job_id="j", round_id=9, kind=TaskKind.HISTOGRAM, level=2,
                       params={"stats": "full"},
                       arrays={"nodes": np.arange(4), "features": twice, "thresholds": thr},
                       layout=(Block("hist", (4, 2, 4, 1), (StatKind.COUNT,)),)))
    for _ in range(2):  # each reader refuses
        with pytest.raises(ProtocolError, match="sorted"):
            histogram_arrays(bad, 4, 4)
        with pytest.raises(ProtocolError, match="node 1 repeats feature 3"):
            check_feature_slots(cfg, repeat)
    check_feature_slots(cfg, good)
    assert ("feature_slots", 2) in good.derived


def test_a_sealed_tasks_form_is_checked_once_and_a_bad_one_refused_by_every_reader() -> None:
    from fedforest_secure.errors import ProtocolError
    from fedforest_secure.protocol import check_task_form

    good = seal(_task())
    good.params.pop("purpose")
    good.params["stats"] = "full"
    check_task_form(good)
    assert "task_form" in good.derived
    bad = seal(_task())
    for _ in range(2):
        with pytest.raises(ProtocolError, match="of the wrong type"):
            check_task_form(bad)
    assert "task_form" not in bad.derived
