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
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from ..errors import InvalidMessage, UploadRejected
from .tasks import Task
from .wire import layout_size, pack, unpack

__all__ = [
    "SUMMABLE",
    "EntryBounds",
    "ParsedUpload",
    "allowed_disclosures",
    "check_against_task",
    "make_upload",
    "parse_upload",
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
        # unpack reads any buffer (the server hands it the bytearray it read, uncopied)
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
                       bounds: EntryBounds | None = None, words: int | None = None) -> None:
    """The upload answers exactly this task, in the round's encoding and layout: ``words``
    long (the round codec's, where it packs grid cells), else one word per layout entry.

    ``bounds`` (plaintext rounds only: the server sees each client's vector) range-checks every
    entry against the codec's public bound, so no client can push the round's sum out of range
    (float64 overflow to inf, or a wrapped ring sum); masked vectors cannot be checked."""
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
