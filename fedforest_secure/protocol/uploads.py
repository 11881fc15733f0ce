"""One client's upload for one round: the body it sends and the checks the body must pass.

An upload is :func:`~.wire.pack` of::

    header = {"type": "upload", "job_id": ..., "round_id": ..., "task_digest": <hex>,
              "encoding": "uint64" | "float64",
              "secagg": <MaskedUpload JSON>}     # only under secure aggregation
    arrays = {"__summable__": <flat vector laid out as the task says>, <disclosed item>: ...}

Every defect raises :class:`~fedforest_secure.errors.UploadRejected` whose ``code`` names it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from ..errors import InvalidMessage, UploadRejected
from .tasks import Task
from .wire import _MAX_HEADER, HEAD_SIZE, StatKind, layout_size, pack, split_blocks, unpack

if TYPE_CHECKING:
    from ..config import JobConfig

__all__ = [
    "SUMMABLE",
    "EntryBounds",
    "ParsedUpload",
    "allowed_disclosures",
    "check_against_task",
    "check_disclosures",
    "make_upload",
    "node_rows",
    "parse_upload",
    "spread_node_counts",
    "upload_size_bound",
]

#: The array name of the summable vector in an upload (no disclosed item may take it).
SUMMABLE = "__summable__"


@dataclass(frozen=True)
class ParsedUpload:
    job_id: str
    round_id: int
    task_digest: str
    encoding: str
    summable: np.ndarray
    disclosed: dict[str, np.ndarray]
    digest: str  # SHA-256 of the exact body
    secagg: str | None = None  # the MaskedUpload header (JSON) of a masked vector


def allowed_disclosures(task: Task) -> set[str]:
    """The array names a client may disclose in answer to ``task``.

    The names the task lists in ``disclose``, with ``sketch_points`` bringing its
    ``sketch_counts`` and ``unique`` standing for its two arrays ``unique_ptr`` and
    ``unique_vals``.
    """
    names = set(task.disclose)
    if "sketch_points" in names:
        names.add("sketch_counts")
    if "unique" in names:
        names |= {"unique_ptr", "unique_vals"}
    names.discard("unique")
    return names


def make_upload(task: Task, summable: np.ndarray, disclosed: dict[str, np.ndarray], *,
                secagg: str | None = None) -> bytes:
    """The body a client sends for ``task`` (``summable`` already encoded/masked if uint64;
    ``secagg`` the :class:`~fedforest_secure.secagg.MaskedUpload` header as JSON)."""
    encoding = "uint64" if summable.dtype == np.uint64 else "float64"
    header: dict[str, object] = {"type": "upload", "job_id": task.job_id,
                                 "round_id": task.round_id,
                                 "task_digest": task.digest().hex(), "encoding": encoding}
    if secagg is not None:
        header["secagg"] = secagg
    if SUMMABLE in disclosed:
        raise ValueError(f"{SUMMABLE!r} is reserved")
    return pack(header, {SUMMABLE: summable, **disclosed})


def parse_upload(body: bytes | bytearray) -> ParsedUpload:
    """Decode an upload body; any defect says no more than necessary."""
    try:
        # unpack reads any buffer (the server hands it the body it read, uncopied)
        header, arrays = unpack(cast(bytes, body))
    except InvalidMessage as exc:
        raise UploadRejected("malformed_upload",
                             "the body is not a valid upload message") from exc
    if header.get("type") != "upload" or SUMMABLE not in arrays:
        raise UploadRejected("malformed_upload", "the body is not an upload message")
    try:
        job_id = str(header["job_id"])
        round_id = int(header["round_id"])
        task_digest = str(header["task_digest"])
        encoding = str(header["encoding"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UploadRejected("malformed_upload", "the upload header is incomplete") from exc
    if encoding not in ("uint64", "float64"):
        raise UploadRejected("malformed_upload", "encoding must be 'uint64' or 'float64'")
    secagg = header.get("secagg")
    if secagg is not None and (not isinstance(secagg, str) or len(secagg) > 4096):
        raise UploadRejected("malformed_upload",
                             "the secagg header must be a short JSON string")
    summable = arrays.pop(SUMMABLE)
    return ParsedUpload(job_id, round_id, task_digest, encoding, summable, arrays,
                        hashlib.sha256(body).hexdigest(), secagg)


class EntryBounds(Protocol):
    """The public bound of every entry of a round's plaintext vector
    (:class:`~fedforest_secure.plain_bounds.PlainBounds`)."""

    #: |v| <= value[i] for a float64 vector
    value: np.ndarray
    #: |signed(v)| <= ring[i] ring units for a uint64 vector
    ring: np.ndarray
    #: entries that are never negative
    nonneg: np.ndarray

    def first_violation(self, vec: np.ndarray) -> int | None: ...


def check_against_task(up: ParsedUpload, task: Task, task_digest: str, encoding: str,
                       bounds: EntryBounds | None = None, words: int | None = None, *,
                       config: JobConfig | None = None,
                       plain_values: Callable[[], np.ndarray] | None = None) -> None:
    """The upload answers exactly this task, in the round's encoding and layout: ``words``
    long (the round codec's, where it packs grid cells), else one word per layout entry, with
    every item the task asks disclosed, as :func:`check_disclosures` (with ``config``) says.

    ``bounds`` (plaintext rounds only: the server sees each client's vector) range-checks every
    entry against the codec's public bound, so no client can push the round's sum out of range
    (float64 overflow to inf, or a wrapped ring sum); masked vectors cannot be checked.
    ``plain_values`` gives such an upload's statistics in the clear (a fixed-point vector
    decoded by the round's codec, which sits above the protocol): its node totals bound the
    distinct values it lists (:func:`check_disclosures`)."""
    if up.task_digest != task_digest:
        raise UploadRejected("wrong_task",
                             "the upload answers a different task than this round's")
    if up.encoding != encoding:
        raise UploadRejected("wrong_encoding", f"this round expects {encoding} vectors")
    want = np.dtype(np.uint64) if encoding == "uint64" else np.dtype(np.float64)
    n = layout_size(task.layout) if words is None else words
    if up.summable.dtype != want or up.summable.shape != (n,):
        raise UploadRejected("wrong_layout",
                             f"the summable vector must be {encoding} of length {n}")
    if encoding == "float64" and not np.isfinite(up.summable).all():
        raise UploadRejected("non_finite", "the summable vector holds NaN or infinity")
    if bounds is not None:
        bad = bounds.first_violation(up.summable)
        if bad is not None:
            if encoding == "uint64":
                shown = f"{int(up.summable.view(np.int64)[bad])} ring units"
                limit = f"{int(bounds.ring[bad])}"
            else:
                shown, limit = f"{float(up.summable[bad])!r}", f"{float(bounds.value[bad]):.6g}"
            low = "0" if bounds.nonneg[bad] else f"-{limit}"
            raise UploadRejected("out_of_range",
                                 f"summable[{bad}] = {shown} is outside the public bound "
                                 f"[{low}, {limit}] of this entry (max_abs x scale of the "
                                 "round's codec; counts and sums of squares are never "
                                 "negative); the upload was not stored")
    extra = sorted(set(up.disclosed) - allowed_disclosures(task))
    if extra:
        raise UploadRejected("undisclosable",
                             f"items not requested for disclosure in this round: {extra}")
    counts = None
    if bounds is not None and plain_values is not None and "unique" in task.disclose:
        counts = node_rows(plain_values(), task)  # the site's own counts
    try:
        check_disclosures(up.disclosed, task, config, node_counts=counts)
    except InvalidMessage as exc:
        raise UploadRejected("malformed_upload", f"{exc}; the upload was not stored (disclose "
                             "what the task asks, as it asks)") from None


#: the dtypes of disclosed numbers (a count may come as an integer) and of indices
_NUMBERS = (np.dtype(np.float64), np.dtype(np.int64))
_INDICES = (np.dtype(np.int64), np.dtype(np.int32))

#: the disclosed items a sketch of the level's nodes brings (none without ``features``)
_SKETCH_ITEMS = frozenset({"sketch_points", "sketch_counts", "top_l", "unique_ptr",
                           "unique_vals"})


def node_rows(values: np.ndarray, task: Task) -> np.ndarray | None:
    """The weighted rows at each node of a sketch ``task`` (each row of its ``features``),
    from a vector of its statistics (``values``: one site's, or the sum of every site's): the
    count columns of its ``totals`` block summed per node. None when the task sums no node
    totals (a node group's sketch, or under DP)."""
    block = next((b for b in task.layout if b.name == "totals"), None)
    if block is None or values.shape != (layout_size(task.layout),):
        return None
    totals = split_blocks(np.asarray(values, dtype=np.float64), task.layout)["totals"]
    counts = np.array([k is StatKind.COUNT for k in block.kinds])
    return np.asarray(totals[:, counts].sum(axis=1))


def check_disclosures(disclosed: dict[str, np.ndarray], task: Task,
                      config: JobConfig | None = None, *,
                      node_counts: np.ndarray | None = None) -> None:
    """The disclosed items answer ``task``: every item it asks, together, and each of the
    shape, dtype and values the task defines (``config`` gives the job's feature and
    statistic counts; without it those two sizes are not checked). Raises
    :class:`~fedforest_secure.errors.InvalidMessage` naming the item.

    ``node_counts`` (one per row of the task's ``features``: :func:`node_rows`) bounds the
    distinct values a client lists per (node, feature slot): it has no more than its rows at
    the node, and every value it lists becomes a candidate threshold that every site's next
    histogram carries, so an unbounded list would inflate every later round.

    A sketch's items (``sketch_points`` with ``sketch_counts``, ``top_l``, ``unique_ptr``
    with ``unique_vals``) come for the task's ``features`` (rows x slots), and none without
    them; ``minmax`` is one (lo, hi) row per feature, ``node_stats`` one statistics row per
    node, ``site_stats`` one statistic per entry of the evaluation's layout.
    """
    def bad(name: str, what: str) -> InvalidMessage:
        return InvalidMessage(f"disclosed item {name!r} {what}")

    def want(name: str, dtypes: tuple[np.dtype[Any], ...], shape: tuple[int | None, ...]
             ) -> np.ndarray:
        arr = disclosed[name]
        if arr.dtype not in dtypes or arr.ndim != len(shape) or any(
                n is not None and n != got for n, got in zip(shape, arr.shape, strict=True)):
            shown = tuple("any" if n is None else n for n in shape)
            raise bad(name, f"must be {' or '.join(d.name for d in dtypes)} of shape {shown}, "
                      f"not {arr.dtype.name} of shape {arr.shape}")
        return arr

    def finite(name: str, arr: np.ndarray) -> None:
        if not np.isfinite(arr).all():
            raise bad(name, "holds NaN or infinity")

    feats = task.arrays.get("features")
    if feats is not None and feats.ndim != 2:
        feats = None  # no client answers such a task (it refuses the task)
    asked = allowed_disclosures(task)
    if feats is None:
        asked -= _SKETCH_ITEMS
    missing = sorted(asked - set(disclosed))
    extra = sorted(set(disclosed) - asked)
    if missing or extra:
        raise InvalidMessage(
            f"the task asks disclosed items {sorted(asked)}, together"
            + (f"; missing {missing}" if missing else "")
            + (f"; not asked without the task's features {extra}" if extra else ""))
    rows, m = (int(feats.shape[0]), int(feats.shape[1])) if feats is not None else (0, 0)
    params = task.params
    n_nodes = int(params["n_nodes"]) if "n_nodes" in params else None
    if "sketch_points" in asked:
        n_points = int(params["n_points"]) + 1 if "n_points" in params else None
        pts = want("sketch_points", _NUMBERS[:1], (rows, m, n_points))
        if np.isinf(pts).any() or _point_after_padding(np.isnan(pts)):
            raise bad("sketch_points", "holds infinity, or a point after its NaN padding")
        if disclosed["sketch_counts"].shape == (rows,):
            raise bad("sketch_counts", f"holds one count per node, as clients of fedforest "
                      f"versions before per-slot sketch counts send; it must be one per node "
                      f"and slot, of shape {(rows, m)}: upgrade the site's fedforest to the "
                      "server's version")
        cnt = want("sketch_counts", _NUMBERS, (rows, m))
        finite("sketch_counts", cnt)
        if (cnt < 0).any():
            raise bad("sketch_counts", "holds a negative count")
    if "top_l" in asked:
        width = min(int(params["top_l"]), m) if "top_l" in params else None
        top = want("top_l", _INDICES, (rows, width))
        if top.size and (top.min() < 0 or top.max() >= m):
            raise bad("top_l", f"holds a slot outside [0, {m})")
    if "unique_ptr" in asked:
        ptr = want("unique_ptr", _INDICES, (rows * m + 1,))
        vals = want("unique_vals", _NUMBERS, (None,))
        finite("unique_vals", vals)
        if ptr[0] != 0 or ptr[-1] != vals.size or (np.diff(ptr) < 0).any():
            raise bad("unique_ptr", f"must rise from 0 to the {vals.size} unique_vals")
        if node_counts is not None:
            if node_counts.shape != (rows,):
                raise ValueError("node_counts must hold one count per row of the features")
            lengths = np.diff(ptr).reshape(rows, m)
            over = lengths > np.floor(node_counts + 1e-6)[:, None]
            if over.any():
                r, slot = (int(i) for i in np.argwhere(over)[0])
                raise bad("unique_vals", f"lists {int(lengths[r, slot])} distinct values at "
                          f"the node of the task's features row {r} (slot {slot}), more "
                          f"than its {max(float(node_counts[r]), 0.0):g} rows there: a site "
                          "has no more distinct values at a node than rows")
    if "minmax" in asked:
        mm = want("minmax", _NUMBERS,
                  (config.n_features if config is not None else None, 2))
        empty = (mm[:, 0] == np.inf) & (mm[:, 1] == -np.inf)  # a feature without values
        if not (empty | (np.isfinite(mm).all(axis=1) & (mm[:, 0] <= mm[:, 1]))).all():
            raise bad("minmax", "must hold finite (lo, hi) rows with lo <= hi, or (inf, -inf)")
    if "node_stats" in asked:
        ns = want("node_stats", _NUMBERS,
                  (n_nodes, config.n_stats if config is not None else None))
        finite("node_stats", ns)
    if "site_stats" in asked:
        size = sum(int(np.prod(b.shape[:-1], dtype=np.int64)) for b in task.layout)
        finite("site_stats", want("site_stats", _NUMBERS, (size,)))
    for name in sorted(asked - _KNOWN_ITEMS):  # an item without a rule: numbers, finite
        arr = disclosed[name]
        if arr.dtype.kind not in "iuf":
            raise bad(name, f"must hold numbers, not {arr.dtype.name}")
        finite(name, arr)


_KNOWN_ITEMS = _SKETCH_ITEMS | {"minmax", "node_stats", "site_stats"}


def _point_after_padding(nan: np.ndarray) -> bool:
    """Whether a list (the last axis of ``nan``, where a list's points are NaN) has a point
    after a NaN: the flat array's NaN-to-point steps (one contiguous pass) less those from
    one list's last slot to the next list's first."""
    P = nan.shape[-1] if nan.ndim else 0
    if nan.size == 0 or P < 2:
        return False
    flat = nan.reshape(-1)
    steps = np.count_nonzero(flat[:-1] > flat[1:])
    if not steps:
        return False
    lists = nan.reshape(-1, P)
    return bool(steps > np.count_nonzero(lists[:-1, -1] > lists[1:, 0]))


def spread_node_counts(disclosed: dict[str, np.ndarray], task: Task) -> dict[str, np.ndarray]:
    """``disclosed`` with a ``sketch_counts`` of one count per node (rows,), as servers before
    per-slot sketch counts stored and logged it, spread across the node's slots (rows, m):
    each slot weighted by its node's rows, the weighting those servers' pooled sketch used, so
    a stored or logged round of theirs gives the forest it gave then. Anything else is
    returned as it is. For rounds read back (the audit replay, a restarted server's stored
    rounds); an upload is checked by :func:`check_against_task`, which refuses the old shape."""
    cnt = disclosed.get("sketch_counts")
    feats = task.arrays.get("features")
    if cnt is None or feats is None or feats.ndim != 2 or cnt.shape != (feats.shape[0],):
        return disclosed
    spread = np.repeat(cnt.reshape(-1, 1), feats.shape[1], axis=1)
    return {**disclosed, "sketch_counts": spread}


def upload_size_bound(task: Task, words: int, config: JobConfig | None = None) -> int | None:
    """The most bytes a body that passes :func:`check_against_task` for ``task`` can hold:
    the largest meta :func:`~.wire.unpack` reads, ``words`` 8-byte words of the summable
    vector, and every disclosed item the task asks at the largest shape and dtype
    :func:`check_disclosures` accepts (8 bytes an entry). None when the task asks an item
    whose size it does not fix: ``unique_vals`` (a site's distinct values, bounded by its
    rows at each node, which only the body's own vector tells) or an item without a rule,
    and sizes that need ``config`` without it.

    The server caps an upload's body at this before it reads a byte of it."""
    feats = task.arrays.get("features")
    if feats is not None and feats.ndim != 2:
        feats = None
    asked = allowed_disclosures(task)
    if feats is None:
        asked -= _SKETCH_ITEMS
    rows, m = (int(feats.shape[0]), int(feats.shape[1])) if feats is not None else (0, 0)
    params = task.params

    def param(name: str) -> int | None:
        return int(params[name]) if name in params else None

    n_points, top_l, n_nodes = param("n_points"), param("top_l"), param("n_nodes")
    entries: dict[str, int | None] = {
        "sketch_points": None if n_points is None else rows * m * (n_points + 1),
        "sketch_counts": rows * m,
        "top_l": None if top_l is None else rows * min(top_l, m),
        "unique_ptr": rows * m + 1,
        "minmax": None if config is None else config.n_features * 2,
        "node_stats": None if config is None or n_nodes is None else n_nodes * config.n_stats,
        "site_stats": sum(int(np.prod(b.shape[:-1], dtype=np.int64)) for b in task.layout),
    }
    total = HEAD_SIZE + _MAX_HEADER + 8 * words
    for name in asked:
        n = entries.get(name)  # unique_vals and items without a rule: no size
        if n is None:
            return None
        total += 8 * n
    return total
