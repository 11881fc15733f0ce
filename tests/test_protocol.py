"""Tests for fedforest_secure.protocol: the binary message format and Task / Reply objects."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedforest_secure.errors import InvalidMessage, ProtocolError, UploadRejected
from fedforest_secure.protocol import (
    Block,
    Reply,
    StatKind,
    Task,
    TaskKind,
    check_against_task,
    check_disclosures,
    layout_size,
    make_upload,
    pack,
    parse_upload,
    split_blocks,
    unpack,
)

_ALLOWED = ["<f8", "<i8", "<i4", "<u8", "u1", "?"]


def _frame(head: bytes, body: bytes = b"") -> bytes:
    return b"FFS1" + struct.pack("<I", len(head)) + head + body


def _arrays() -> st.SearchStrategy[dict[str, np.ndarray]]:
    arr = st.sampled_from(_ALLOWED).flatmap(
        lambda dt: hnp.arrays(np.dtype(dt), hnp.array_shapes(min_dims=0, max_dims=3,
                                                             min_side=0, max_side=5)))
    return st.dictionaries(st.text(min_size=1, max_size=8), arr, max_size=4)


_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10))
_json = st.recursive(_json_scalar, lambda c: st.one_of(
    st.lists(c, max_size=3), st.dictionaries(st.text(max_size=5), c, max_size=3)), max_leaves=10)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=st.dictionaries(st.text(max_size=6), _json, max_size=4), arrays=_arrays())
def test_pack_unpack_round_trip(header: dict, arrays: dict[str, np.ndarray]) -> None:
    data = pack(header, arrays)
    h2, a2 = unpack(data)
    assert h2 == header
    assert set(a2) == set(arrays)
    for name, arr in arrays.items():
        got = a2[name]
        assert got.shape == arr.shape
        assert got.dtype.kind == arr.dtype.kind and got.dtype.itemsize == arr.dtype.itemsize
        # bit-for-bit (NaN payloads included)
        assert got.tobytes() == np.ascontiguousarray(arr).tobytes()
    # canonical: packing what was unpacked gives the same bytes
    assert pack(h2, a2) == data


def _task() -> Task:
    rng = np.random.default_rng(1)
    return Task(job_id="job-x", round_id=7, kind=TaskKind.HISTOGRAM, level=2,
                params={"stats": "full", "n": 3},
                arrays={"nodes": np.array([0, 2], dtype=np.int64),
                        "features": rng.integers(0, 4, (2, 3)),
                        "thresholds": np.sort(rng.normal(size=(2, 3, 4)), axis=2)},
                layout=(Block("hist", (2, 3, 5, 3), (StatKind.COUNT, StatKind.SUM,
                                                     StatKind.SUMSQ)),),
                disclose=("sketch_points",))


def test_task_and_reply_round_trip() -> None:
    task = _task()
    back = Task.from_bytes(task.to_bytes())
    assert back.header() == task.header()
    assert back.digest() == task.digest()
    for k, v in task.arrays.items():
        np.testing.assert_array_equal(back.arrays[k], v)
    reply = Reply(round_id=7, summable=np.arange(6, dtype=np.float64) / 3,
                  disclosed={"sketch_points": np.full((2, 2), np.nan)})
    r2 = Reply.from_bytes(reply.to_bytes())
    assert r2.round_id == 7
    assert r2.summable.tobytes() == reply.summable.tobytes()
    assert set(r2.disclosed) == {"sketch_points"}
    # a changed parameter changes the digest masks are bound to
    task.params["n"] = 4
    assert Task.from_bytes(task.to_bytes()).digest() != back.digest()


def test_task_reply_type_confusion() -> None:
    reply = Reply(round_id=1, summable=np.zeros(2))
    with pytest.raises(InvalidMessage):
        Task.from_bytes(reply.to_bytes())
    with pytest.raises(InvalidMessage):
        Reply.from_bytes(_task().to_bytes())
    assert issubclass(InvalidMessage, ProtocolError)


def test_layout_helpers() -> None:
    layout = (Block("a", (2, 3), (StatKind.COUNT,) * 3), Block("b", (4, 1), (StatKind.GAIN,)))
    assert layout_size(layout) == 10
    parts = split_blocks(np.arange(10.0), layout)
    np.testing.assert_array_equal(parts["a"], np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(parts["b"], np.arange(6.0, 10.0).reshape(4, 1))
    with pytest.raises(InvalidMessage):
        split_blocks(np.arange(9.0), layout)
    with pytest.raises(ValueError):
        Block("bad", (2, 3), (StatKind.COUNT,))
    with pytest.raises(ValueError):
        Block("neg", (-1, 1), (StatKind.COUNT,))


def test_pack_rejects_unsupported_dtype() -> None:
    with pytest.raises(TypeError):
        pack({}, {"x": np.zeros(2, dtype=np.float32)})
    with pytest.raises(TypeError):
        pack({}, {"x": np.array(["a"])})


# ---------------------------------------------------------------------------- malformed input
def _valid() -> bytes:
    return pack({"type": "reply", "round_id": 3},
                {"__summable__": np.arange(4.0), "b": np.arange(3, dtype=np.int32)})


def test_every_truncation_is_invalid() -> None:
    data = _valid()
    for cut in range(len(data)):
        with pytest.raises(InvalidMessage):
            unpack(data[:cut])


@pytest.mark.parametrize("data", [
    b"",
    b"XXXX" + _valid()[4:],  # bad magic
    _valid() + b"\x00",  # trailing byte
    b"FFS1" + struct.pack("<I", 10**6) + b"{}",  # header length beyond the data
    b"FFS1" + struct.pack("<I", (1 << 20) + 1) + b"{" * ((1 << 20) + 1),  # header too long
    _frame(b"{not json"),
    _frame(b"\xff\xfe garbage"),
    _frame(b"[]"),
    _frame(b'{"header": {}}'),
    _frame(b'{"header": [], "arrays": []}'),
    _frame(b'{"header": {}, "arrays": [], "extra": 1}'),
    _frame(b'{"header": {}, "arrays": 5}'),
    _frame(b'{"header": {}, "arrays": ["x"]}'),
    _frame(json.dumps({"header": {}, "arrays": [{"name": "x", "dtype": "float32", "shape": [1],
                                                  "offset": 0, "nbytes": 4}]}).encode(),
           b"\x00" * 4),  # unsupported dtype
    _frame(json.dumps({"header": {}, "arrays": [{"name": "x", "dtype": "float64", "shape": [2],
                                                  "offset": 0, "nbytes": 8}]}).encode(),
           b"\x00" * 8),  # nbytes does not match the shape
    _frame(json.dumps({"header": {}, "arrays": [{"name": "x", "dtype": "float64", "shape": [2],
                                                  "offset": 0, "nbytes": 16}]}).encode(),
           b"\x00" * 8),  # array runs past the body
    _frame(json.dumps({"header": {}, "arrays": [{"name": "x", "dtype": "float64", "shape": [1],
                                                  "offset": 8, "nbytes": 8}]}).encode(),
           b"\x00" * 16),  # gap before the array
    _frame(json.dumps({"header": {}, "arrays": [{"name": "x", "dtype": "uint8", "shape": [-1],
                                                  "offset": 0, "nbytes": 0}]}).encode()),
    _frame(json.dumps({"header": {}, "arrays": [{"name": "x", "dtype": "uint8",
                                                  "shape": [2**62, 2**62],
                                                  "offset": 0, "nbytes": 0}]}).encode()),
    _frame(b'{"header": {}, "arrays": [{"name": "x", "dtype": "uint8", "shape": [Infinity],'
           b' "offset": 0, "nbytes": 0}]}'),
])
def test_malformed_messages_raise_invalid_message(data: bytes) -> None:
    with pytest.raises(InvalidMessage):
        unpack(data)
    with pytest.raises(InvalidMessage):
        Task.from_bytes(data)
    with pytest.raises(InvalidMessage):
        Reply.from_bytes(data)


def test_not_bytes_is_invalid() -> None:
    with pytest.raises(InvalidMessage):
        unpack("FFS1 text")  # type: ignore[arg-type]


@pytest.mark.parametrize("header", [
    {"type": "task"},
    {"type": "task", "job_id": "j", "round_id": "x", "kind": "sketch", "level": 0,
     "params": {}, "layout": [], "disclose": []},
    {"type": "task", "job_id": "j", "round_id": 1, "kind": "nope", "level": 0,
     "params": {}, "layout": [], "disclose": []},
    {"type": "task", "job_id": "j", "round_id": 1, "kind": "sketch", "level": 0,
     "params": 3, "layout": [], "disclose": []},
    {"type": "task", "job_id": "j", "round_id": 1, "kind": "sketch", "level": 0,
     "params": {}, "layout": [{"name": "a", "shape": [2], "kinds": ["bogus"]}], "disclose": []},
    {"type": "task", "job_id": "j", "round_id": 1, "kind": "sketch", "level": 0,
     "params": {}, "layout": [{"name": "a", "shape": [2, 2], "kinds": ["count"]}],
     "disclose": []},
    {"type": "task", "job_id": "j", "round_id": 1, "kind": "sketch", "level": 0,
     "params": {}, "layout": ["a"], "disclose": []},
])
def test_malformed_task_headers(header: dict) -> None:
    with pytest.raises(InvalidMessage):
        Task.from_bytes(pack(header, {}))


def test_malformed_reply_headers() -> None:
    with pytest.raises(InvalidMessage):
        Reply.from_bytes(pack({"type": "reply", "round_id": 1}, {}))  # no summable vector
    with pytest.raises(InvalidMessage):
        Reply.from_bytes(pack({"type": "reply", "round_id": "x"}, {"__summable__": np.zeros(1)}))
    with pytest.raises(InvalidMessage):
        Reply.from_bytes(pack({"type": "reply"}, {"__summable__": np.zeros(1)}))


def test_infinite_round_id_in_task_is_invalid() -> None:
    head = (b'{"arrays":[],"header":{"disclose":[],"job_id":"j","kind":"sketch","layout":[],'
            b'"level":0,"params":{},"round_id":Infinity,"type":"task"}}')
    with pytest.raises(InvalidMessage):
        Task.from_bytes(_frame(head))


def test_infinite_round_id_in_reply_is_invalid() -> None:
    good = pack({"type": "reply", "round_id": 0}, {"__summable__": np.zeros(1)})
    hlen = struct.unpack("<I", good[4:8])[0]
    head = good[8:8 + hlen].replace(b'"round_id":0', b'"round_id":Infinity')
    with pytest.raises(InvalidMessage):
        Reply.from_bytes(_frame(head, good[8 + hlen:]))


def test_deeply_nested_header_is_invalid() -> None:
    with pytest.raises(InvalidMessage):
        unpack(_frame(b"[" * 100_000))


def _only_invalid(fn, data: bytes) -> None:  # type: ignore[no-untyped-def]
    try:
        fn(data)
    except InvalidMessage:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data: bytes) -> None:
    for fn in (unpack, Task.from_bytes, Reply.from_bytes):
        _only_invalid(fn, data)
        _only_invalid(fn, b"FFS1" + data)


@settings(max_examples=300, deadline=None)
@given(pos=st.integers(0, 10_000), byte=st.integers(0, 255), cut=st.integers(0, 10_000))
def test_fuzz_mutated_valid_messages(pos: int, byte: int, cut: int) -> None:
    for base in (_valid(), _task().to_bytes()):
        data = bytearray(base)
        data[pos % len(data)] = byte
        mutated = bytes(data)
        for fn in (unpack, Task.from_bytes, Reply.from_bytes):
            _only_invalid(fn, mutated)
            _only_invalid(fn, mutated[: cut % (len(mutated) + 1)])


# ---------------------------------------------------------------- disclosed items of an upload
def _sketch_task(disclose: tuple[str, ...], *, features: bool = True) -> Task:
    """A sketch round of 2 nodes and 3 feature slots, 4-point sketches, Top-2 features."""
    arrays = {"features": np.array([[0, 1, 2], [1, 2, 3]])} if features else {}
    return Task(job_id="j", round_id=1, kind=TaskKind.SKETCH, level=0,
                params={"n_nodes": 2, "n_points": 4, "top_l": 2}, arrays=arrays,
                layout=(), disclose=disclose)


def _honest_items() -> dict[str, np.ndarray]:
    pts = np.tile(np.array([0.0, 1.0, 2.0, np.nan, np.nan]), (2, 3, 1))
    return {"sketch_points": pts, "sketch_counts": np.array([[5.0, 4.0, 5.0], [0.0, 0.0, 0.0]]),
            "top_l": np.array([[0, 2], [1, 0]]),
            "unique_ptr": np.array([0, 1, 1, 3, 3, 3, 4]),
            "unique_vals": np.array([0.5, 1.0, 2.0, 3.0]),
            "minmax": np.array([[0.0, 1.0], [np.inf, -np.inf], [-2.0, -2.0], [1.0, 4.0]]),
            "node_stats": np.array([[3.0, 2.0], [0.0, 0.0]])}


class _Sizes:
    n_features, n_stats = 4, 2


_ALL = ("sketch_points", "top_l", "unique", "minmax", "node_stats")

# (what is wrong, items changed (None: dropped), the item the error names)
_BAD_DISCLOSURES = [
    ("points without counts", {"sketch_counts": None}, "sketch_counts"),
    ("counts without points", {"sketch_points": None}, "sketch_points"),
    ("a CSR half alone", {"unique_vals": None}, "unique_vals"),
    ("no node summaries", {"node_stats": None}, "node_stats"),
    ("points of other nodes", {"sketch_points": np.zeros((3, 3, 5))}, "sketch_points"),
    ("points of another sketch size", {"sketch_points": np.zeros((2, 3, 4))}, "sketch_points"),
    ("integer points", {"sketch_points": np.zeros((2, 3, 5), dtype=np.int32)},
     "sketch_points"),
    ("a point after the padding", {"sketch_points": np.where(
        np.arange(5) == 0, np.nan, np.zeros((2, 3, 5)))}, "sketch_points"),
    ("an infinite point", {"sketch_points": np.full((2, 3, 5), np.inf)}, "sketch_points"),
    ("counts of other nodes", {"sketch_counts": np.zeros((3, 3))}, "sketch_counts"),
    ("one count per node", {"sketch_counts": np.zeros(2)}, "sketch_counts"),
    ("a negative count", {"sketch_counts": np.array([[1.0] * 3, [1.0, -1.0, 1.0]])},
     "sketch_counts"),
    ("a NaN count", {"sketch_counts": np.array([[1.0] * 3, [1.0, np.nan, 1.0]])},
     "sketch_counts"),
    ("a Top-L of 3", {"top_l": np.zeros((2, 3), dtype=np.int64)}, "top_l"),
    ("a Top-L slot out of range", {"top_l": np.array([[0, 3], [1, 0]])}, "top_l"),
    ("float Top-L slots", {"top_l": np.zeros((2, 2))}, "top_l"),
    ("a short CSR index", {"unique_ptr": np.array([0, 1, 4])}, "unique_ptr"),
    ("a CSR index past its values", {"unique_ptr": np.array([0, 1, 1, 3, 3, 3, 9])},
     "unique_ptr"),
    ("a falling CSR index", {"unique_ptr": np.array([0, 2, 1, 3, 3, 3, 4])}, "unique_ptr"),
    ("an infinite distinct value", {"unique_vals": np.array([0.5, 1.0, np.inf, 3.0])},
     "unique_vals"),
    ("a range per other features", {"minmax": np.zeros((3, 2))}, "minmax"),
    ("a range with lo > hi", {"minmax": np.array([[1.0, 0.0]] * 4)}, "minmax"),
    ("a NaN range", {"minmax": np.full((4, 2), np.nan)}, "minmax"),
    ("summaries of other statistics", {"node_stats": np.zeros((2, 3))}, "node_stats"),
    ("infinite summaries", {"node_stats": np.full((2, 2), np.inf)}, "node_stats"),
]


def test_honest_disclosed_items_pass_the_checks_of_their_task() -> None:
    items = _honest_items()
    check_disclosures(items, _sketch_task(_ALL), _Sizes())  # type: ignore[arg-type]
    check_disclosures({k: items[k] for k in ("sketch_points", "sketch_counts")},
                      _sketch_task(("sketch_points",)))
    # the last level's sketch round lists no features: the node items only
    check_disclosures({"node_stats": items["node_stats"]},
                      _sketch_task(("sketch_points", "node_stats"), features=False))
    # a count may come as an integer (a node group without rows)
    check_disclosures({"sketch_points": items["sketch_points"],
                       "sketch_counts": np.zeros((2, 3), dtype=np.int64)},
                      _sketch_task(("sketch_points",)))


@pytest.mark.parametrize(("what", "change", "named"), _BAD_DISCLOSURES,
                         ids=[c[0] for c in _BAD_DISCLOSURES])
def test_malformed_disclosed_items_are_invalid_naming_the_item(
        what: str, change: dict, named: str) -> None:
    items = _honest_items()
    for name, arr in change.items():
        if arr is None:
            del items[name]
        else:
            items[name] = arr
    with pytest.raises(InvalidMessage, match=named):
        check_disclosures(items, _sketch_task(_ALL), _Sizes())  # type: ignore[arg-type]


@pytest.mark.parametrize("node,slot", [(0, 0), (0, 2), (1, 1), (1, 2)])
def test_one_list_with_a_point_after_its_padding_is_invalid_wherever_it_is(
        node: int, slot: int) -> None:
    """Lists that end in padding beside lists that start with a point are honest (every
    list: its own padding at its end); one list with a point after a NaN is not."""
    items = _honest_items()
    pts = np.tile(np.array([0.0, 1.0, np.nan, np.nan, np.nan]), (2, 3, 1))
    pts[1, 0] = np.nan  # an empty list
    pts[0, 1] = [0.0, 1.0, 2.0, 3.0, 4.0]  # a full one
    items["sketch_points"] = pts.copy()
    check_disclosures(items, _sketch_task(_ALL), _Sizes())  # type: ignore[arg-type]
    pts[node, slot] = [np.nan, np.nan, np.nan, np.nan, 7.0]
    items["sketch_points"] = pts
    with pytest.raises(InvalidMessage, match="a point after its NaN padding"):
        check_disclosures(items, _sketch_task(_ALL), _Sizes())  # type: ignore[arg-type]


def test_sketch_items_without_the_tasks_features_are_invalid() -> None:
    items = _honest_items()
    with pytest.raises(InvalidMessage, match="not asked without the task's features"):
        check_disclosures({"sketch_points": items["sketch_points"],
                           "sketch_counts": items["sketch_counts"]},
                          _sketch_task(("sketch_points",), features=False))


def test_site_statistics_have_one_entry_per_statistic_of_the_evaluation_layout() -> None:
    layout = (Block("counts", (2, 3, 1), (StatKind.COUNT,)),
              Block("sums", (2, 1, 4), (StatKind.COUNT,) * 4))  # 4 limbs: one statistic
    task = Task(job_id="j", round_id=0, kind=TaskKind.EVALUATE, level=0, params={},
                arrays={}, layout=layout, disclose=("site_stats",))
    check_disclosures({"site_stats": np.arange(8.0)}, task)
    for bad in (np.arange(14.0), np.full(8, np.nan), np.arange(8.0).reshape(2, 4)):
        with pytest.raises(InvalidMessage, match="site_stats"):
            check_disclosures({"site_stats": bad}, task)
    with pytest.raises(InvalidMessage, match="missing"):
        check_disclosures({}, task)


def test_an_upload_with_a_malformed_disclosure_is_rejected_as_malformed_and_not_stored() -> None:
    task = _sketch_task(("sketch_points",))
    body = make_upload(task, np.zeros(0), {"sketch_points": np.zeros(4)})
    with pytest.raises(UploadRejected, match="sketch_counts") as err:
        check_against_task(parse_upload(body), task, task.digest().hex(), "float64")
    assert err.value.code == "malformed_upload" and "not stored" in err.value.detail


def _bounded_run(profile: str, **kw: Any) -> list[tuple[Task, int, int | None]]:
    """``(task, largest honest upload body, upload_size_bound)`` of every round of a whole
    in-process job (4 sites, regression; ``kw``: the job's settings): each site's body as it
    would send it."""
    from fedforest_secure import load_profile
    from fedforest_secure.config import JobConfig
    from fedforest_secure.federation import run_in_process
    from fedforest_secure.protocol import upload_size_bound
    from fedforest_secure.secure_sum import make_codec

    rng = np.random.default_rng(0)
    X = rng.normal(size=(160, 3)).round(2)
    y = X[:, 0] + np.sin(2 * X[:, 1]) + 0.2 * rng.normal(size=160)
    settings: dict[str, Any] = {"feature_bounds": ((-5.0, 5.0),) * 3, **kw}
    cfg = JobConfig(job_id="fed", task="regression", n_features=3, n_clients=4,
                    target_bound=float(np.abs(y).max()), n_estimators=2, max_depth=3,
                    min_samples_leaf=3, max_features=2, n_bins=8,
                    profile=load_profile(profile).to_dict(), **settings)
    secure = profile != "open"
    out = []

    def seen(record: Any) -> None:
        task = record.task
        words = make_codec(cfg, task).words if secure else layout_size(task.layout)
        summable = np.zeros(words, dtype=np.uint64 if secure else np.float64)
        biggest = max(len(make_upload(task, summable, record.disclosed.get(k, {}),
                                      secagg="x" * 4096 if secure else None))
                      for k in range(4))
        out.append((task, biggest, upload_size_bound(task, words, cfg)))

    run_in_process(cfg, [(X[k::4], y[k::4]) for k in range(4)], on_round=seen)
    return out


@pytest.mark.parametrize(("profile", "settings", "items"), [
    ("open", {"method": "quantiles", "split_on_client": True},
     {"sketch_points", "node_stats"}),
    ("open", {"method": "avgimp", "top_l": 2}, {"sketch_points", "top_l"}),
    ("open", {"method": "histogram", "feature_bounds": None}, {"minmax"}),
    ("open", {"method": "avgimp"}, set()),
    ("open", {"method": "random"}, set()),
    ("secure", {"method": "quantiles"}, set()),
    ("secure", {"method": "histogram"}, set())])
def test_every_honest_upload_fits_its_rounds_size_bound(profile: str, settings: dict[str, Any],
                                                        items: set[str]) -> None:
    """The server caps an upload's body at ``upload_size_bound`` before reading it: every
    body an honest site sends in a whole job fits (the disclosures ``items`` among them),
    and the bound exceeds it by at most the largest meta (1 MiB)."""
    from fedforest_secure.protocol.wire import HEAD_SIZE

    rounds = _bounded_run(profile, **settings)
    assert rounds
    for task, biggest, bound in rounds:
        assert bound is not None, (task.round_id, task.disclose)
        assert biggest <= bound <= biggest + HEAD_SIZE + (1 << 20), (task.round_id, biggest,
                                                                     bound)
    assert items <= {name for task, _, _ in rounds for name in task.disclose}


def test_an_upload_of_distinct_values_has_no_size_bound_from_its_task() -> None:
    """``method = "exact"``: a site discloses its distinct values, as many as its rows: the
    task does not fix their number, so the bound is None (the server's
    ``max_upload_bytes`` caps it)."""
    rounds = _bounded_run("open", method="exact")
    asks = [bound for task, _, bound in rounds if "unique" in task.disclose]
    assert asks and all(b is None for b in asks)
    assert all(b is not None for task, _, b in rounds if "unique" not in task.disclose)
