"""AuditLog: appending, reading, the hash format, validation and concurrent writers."""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from fedforest_secure.audit import GENESIS, AuditLog, EntryKind, verify_log
from fedforest_secure.audit.entry import canonical_json, jsonable
from fedforest_secure.errors import AuditError

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def fixed_clock() -> datetime:
    return T0


def test_append_chains_entries_per_job() -> None:
    with AuditLog.in_memory(clock=fixed_clock) as log:
        assert log.head("j") == GENESIS
        h1 = log.append("j", EntryKind.CLIENT_JOINED, {"client": "a"})
        h2 = log.append("j", "client_joined", {"client": "b"})
        other = log.append("k", EntryKind.CLIENT_JOINED, {"client": "a"})
        entries = log.entries(job_id="j")
        assert [e.seq for e in entries] == [1, 2]
        assert [e.hash for e in entries] == [h1, h2]
        assert entries[0].prev_hash == GENESIS and entries[1].prev_hash == h1
        assert log.head("j") == h2 and log.head("k") == other
        assert log.tip("j") == (2, h2) and log.tip("none") == (0, GENESIS)
        assert log.entries(job_id="k")[0].prev_hash == GENESIS
        assert log.jobs() == ["j", "k"]
        assert h1 != other  # same content, different job: different hash


def test_hash_matches_the_documented_format_computed_independently() -> None:
    with AuditLog.in_memory(clock=fixed_clock) as log:
        arr = np.array([[1.5, -2.0], [0.0, 3.25]])
        log.append("job-1", EntryKind.CLIENT_JOINED, {"client": "é"})
        head = log.append("job-1", EntryKind.DISCLOSURE,
                          {"client": "alice", "item": "sketch", "round_id": 2, "x": 0.1},
                          {"data": arr})
        prev = log.entries(job_id="job-1")[0].hash
        blob = log.stored_arrays("job-1", 2)["data"]
    # .npy bytes of the array, and the body exactly as the entry module's docstring says
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, version=(1, 0), allow_pickle=False)
    assert blob == buf.getvalue()
    body = json.dumps({
        "arrays": {"data": {"dtype": "<f8", "encoding": "npy",
                            "sha256": hashlib.sha256(blob).hexdigest(), "shape": [2, 2]}},
        "job_id": "job-1", "kind": "disclosure",
        "payload": {"client": "alice", "item": "sketch", "round_id": 2, "x": 0.1},
        "seq": 2, "timestamp": "2024-05-01T12:00:00.000000+00:00", "version": 1,
    }, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    expected = hashlib.sha256(bytes.fromhex(prev) + body.encode()).hexdigest()
    assert head == expected
    # the genesis entry too, with a non-ASCII payload
    body1 = ('{"arrays":{},"job_id":"job-1","kind":"client_joined","payload":{"client":"é"},'
             '"seq":1,"timestamp":"2024-05-01T12:00:00.000000+00:00","version":1}')
    assert prev == hashlib.sha256(bytes(32) + body1.encode("utf-8")).hexdigest()


def test_known_answer_vector_is_stable() -> None:
    with AuditLog.in_memory(clock=fixed_clock) as log:
        head = log.append("kat", EntryKind.MODEL, {"digest": "ab" * 32})
    assert head == KAT_MODEL_HEAD


KAT_MODEL_HEAD = hashlib.sha256(bytes(32) + (
    '{"arrays":{},"job_id":"kat","kind":"model","payload":{"digest":"' + "ab" * 32 + '"},'
    '"seq":1,"timestamp":"2024-05-01T12:00:00.000000+00:00","version":1}').encode()).hexdigest()


def test_injected_clock_is_stamped_in_utc() -> None:
    ticks = iter([T0, T0 + timedelta(hours=1, microseconds=5)])
    with AuditLog.in_memory(clock=lambda: next(ticks)) as log:
        log.append("j", EntryKind.CLIENT_JOINED, {"client": "a"})
        e = log.entries()[0]
    assert e.timestamp == "2024-05-01T13:00:00.000005+00:00"


@pytest.mark.parametrize(("kind", "payload", "arrays", "error"), [
    ("round", {"round_id": 1, "clients": ["a"], "uploads": {"a": "0" * 64}, "masked": True},
     None, ValueError),  # no aggregate
    ("round", {"round_id": 1, "clients": ["a", "b"], "uploads": {"a": "0" * 64},
               "masked": True}, {"aggregate": np.zeros(2)}, ValueError),
    ("round", {"round_id": "1", "clients": ["a"], "uploads": {"a": "0" * 64}, "masked": True},
     {"aggregate": np.zeros(2)}, ValueError),
    ("client_joined", {}, None, ValueError),
    ("client_joined", {"client": "a", "x": float("nan")}, None, ValueError),
    ("client_joined", {"client": "a", "x": np.zeros(3)}, None, TypeError),
    ("client_joined", {"client": "a", "x": b"raw"}, None, TypeError),
    ("client_joined", {"client": "a", (1, 2): 3}, None, TypeError),
    ("abstained", {"count": -1}, None, ValueError),
    ("client_dropped", {"client": "a", "reason": "refused: invalid_message", "accused": 0},
     None, ValueError),  # the accused site by its client id, never an index
    ("no_such_kind", {"client": "a"}, None, ValueError),
    ("disclosure", {"client": "a", "item": "s"}, {"data": np.array(["x"])}, TypeError),
    ("disclosure", {"client": "a", "item": "s"}, {"data": np.array([object()])}, TypeError),
])
def test_bad_input_is_refused_and_writes_nothing(kind: str, payload: dict[str, Any],
                                                 arrays: dict[str, np.ndarray] | None,
                                                 error: type[Exception]) -> None:
    with AuditLog.in_memory() as log:
        with pytest.raises(error):
            log.append("j", kind, payload, arrays)
        assert log.entries() == []


def test_a_client_dropped_entry_may_name_the_site_it_accused() -> None:
    """``accused`` is optional: entries without it (every log written before it existed)
    append and verify as before."""
    with AuditLog.in_memory() as log:
        log.append("j", "client_dropped", {"client": "a", "round_id": 1,
                                           "reason": "missed the round deadline"})
        log.append("j", "client_dropped", {"client": "b", "round_id": 1, "accused": "c",
                                           "reason": "refused: invalid_message (c's message "
                                                     "did not authenticate)"})
        assert [e.payload.get("accused") for e in log.entries()] == [None, "c"]
        report = verify_log(log)
    assert report.ok, report.problems


@pytest.mark.parametrize("job_id", ["", "x" * 201, "a\nb", 3])
def test_bad_job_ids_are_refused(job_id: Any) -> None:
    with AuditLog.in_memory() as log, pytest.raises(ValueError):
        log.append(job_id, EntryKind.CLIENT_JOINED, {"client": "a"})


def test_naive_clock_is_refused() -> None:
    with AuditLog.in_memory(clock=lambda: datetime(2024, 1, 1)) as log, \
            pytest.raises(ValueError, match="timezone"):
        log.append("j", EntryKind.CLIENT_JOINED, {"client": "a"})


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float64).reshape(3, 4),
    np.arange(5, dtype=">i4"),  # big-endian input is stored little-endian
    np.array([True, False]),
    np.arange(20, dtype=np.uint8)[::3],  # not contiguous
    np.zeros((0, 3)),
    np.array(7.5),
])
def test_arrays_are_stored_and_read_back(array: np.ndarray, db_url: str) -> None:
    with AuditLog(db_url) as log:
        log.append("j", EntryKind.DISCLOSURE, {"client": "a", "item": "x"}, {"data": array})
        entry = log.entries()[0]
        back = log.array(entry, "data")
        assert entry.arrays["data"].shape == array.shape
    np.testing.assert_array_equal(back, array)
    assert back.dtype.newbyteorder("=") == array.dtype.newbyteorder("=")


def test_read_filters_and_round_ids(db_url: str) -> None:
    with AuditLog(db_url) as log:
        rec = log.job("j")
        rec.client_joined("a")
        rec.abstained(count=2, round_id=3)
        rec.dp_spend(epsilon=0.5, delta=0.0, mechanism="laplace", total_epsilon=0.5,
                     total_delta=0.0, round_id=3)
        rec.abstained(count=1, round_id=4)
        assert [e.seq for e in log.entries(round_id=3)] == [2, 3]
        assert [e.seq for e in log.entries(kind=EntryKind.ABSTAINED)] == [2, 4]
        assert log.entries(job_id="other") == []
        assert log.entries()[1].round_id == 3 and log.entries()[0].round_id is None


def test_expected_head_is_a_compare_and_swap(db_url: str) -> None:
    with AuditLog(db_url) as log:
        h1 = log.append("j", EntryKind.CLIENT_JOINED, {"client": "a"}, expected_head=GENESIS)
        with pytest.raises(AuditError, match="head"):
            log.append("j", EntryKind.CLIENT_JOINED, {"client": "b"}, expected_head=GENESIS)
        log.append("j", EntryKind.CLIENT_JOINED, {"client": "b"}, expected_head=h1)
        assert len(log.entries()) == 2


def test_api_offers_no_update_or_delete() -> None:
    names = {n.lower() for n in dir(AuditLog) if not n.startswith("_")}
    banned = ("update", "delete", "remove", "set", "pop", "clear", "truncate", "replace")
    assert not [n for n in names if any(b in n for b in banned)]


def test_unique_job_seq_makes_a_racing_insert_fail(db_url: str) -> None:
    with AuditLog(db_url) as log:
        log.append("j", EntryKind.CLIENT_JOINED, {"client": "a"})
        e = log.entries()[0]
        with pytest.raises(IntegrityError), log.engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO audit_entries (job_id, seq, kind, timestamp, payload, arrays, "
                "prev_hash, hash) VALUES ('j', 1, 'client_joined', :t, '{}', '{}', :p, :h)"),
                {"t": e.timestamp, "p": GENESIS, "h": "f" * 64})


def _hammer(log: AuditLog, who: str, n: int, errors: list[BaseException]) -> None:
    try:
        for i in range(n):
            log.append("j", EntryKind.CLIENT_JOINED, {"client": f"{who}-{i}"})
    except BaseException as exc:  # surfaced by the test below
        errors.append(exc)


@pytest.mark.parametrize("shared", [True, False])
def test_concurrent_appends_make_one_chain(db_url: str, shared: bool) -> None:
    logs = [AuditLog(db_url)] * 2 if shared else [AuditLog(db_url), AuditLog(db_url)]
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_hammer, args=(log, who, 40, errors))
               for log, who in zip(logs, ("x", "y"), strict=True)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    entries = logs[0].entries(job_id="j")
    assert [e.seq for e in entries] == list(range(1, 81))
    clients = {e.payload["client"] for e in entries}
    assert clients == {f"{w}-{i}" for w in "xy" for i in range(40)}
    report = verify_log(logs[0])
    assert report.ok, report.problems
    for log in logs:
        log.close()


def test_concurrent_appends_in_memory() -> None:
    with AuditLog.in_memory() as log:
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_hammer, args=(log, w, 30, errors)) for w in "xy"]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        assert [e.seq for e in log.entries()] == list(range(1, 61))
        assert verify_log(log).ok


def test_path_and_url_open_the_same_log_and_missing_logs_are_not_created(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    with AuditLog(str(path)) as log:
        head = log.append("j", EntryKind.CLIENT_JOINED, {"client": "a"})
    with AuditLog(f"sqlite:///{path}", create=False) as log:
        assert log.head("j") == head
    missing = tmp_path / "missing.db"
    with pytest.raises(AuditError):
        AuditLog(missing, create=False)
    with pytest.raises(AuditError):
        AuditLog(f"sqlite:///{missing}", create=False)
    with pytest.raises(AuditError, match="no audit log at"):
        AuditLog(f"sqlite:///file:{missing}?uri=true", create=False)
    assert not missing.exists()


def test_exactly_one_of_url_and_engine() -> None:
    with pytest.raises(TypeError):
        AuditLog()


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=12,
)
_shared = AuditLog.in_memory()


@settings(max_examples=60, deadline=None)
@given(extra=st.dictionaries(st.text(min_size=1, max_size=6), _json, max_size=5))
def test_any_json_payload_round_trips_and_verifies(extra: dict[str, Any]) -> None:
    payload = {**extra, "client": "c"}
    _shared.append("hyp", EntryKind.CLIENT_JOINED, payload)
    entry = _shared.entries(job_id="hyp")[-1]
    assert entry.payload == json.loads(canonical_json(payload))
    assert entry.computed_hash() == entry.hash == _shared.head("hyp")


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5),
                     st.floats(allow_nan=False, allow_infinity=False),
                     st.integers(-5, 5).map(np.int64), st.floats(-1, 1).map(np.float64))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 9)), inner, max_size=3)),
    max_leaves=20)


@given(_VALUES)
@settings(max_examples=200, deadline=None)
def test_jsonable_matches_its_json_round_trip(value: Any) -> None:
    plain = jsonable(value)
    text_ = canonical_json(plain)
    assert json.loads(text_) == plain  # plain JSON types only: the text parses back equal
    assert canonical_json(jsonable(plain)) == text_


@pytest.mark.parametrize(("payload", "where"), [
    ({"splits": [{"gain": 1.0}, {"gain": float("nan")}]}, "payload.splits[1].gain"),
    ({"a": [1, (2, np.zeros(2))]}, "payload.a[1][1]"),
    ({"a": {True: 1}}, "payload.a"),
    ({"a": [object()]}, "payload.a[0]"),
])
def test_jsonable_names_where_a_deep_value_fails(payload: Any, where: str) -> None:
    with pytest.raises((TypeError, ValueError), match=re.escape(where)):
        jsonable(payload)
