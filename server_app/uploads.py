"""Parsing and checking one client's upload for one round (binary, :func:`protocol.pack`).

An upload is ``pack(header, arrays)`` with::

    header = {"type": "upload", "job_id": ..., "round_id": ..., "task_digest": <hex>,
              "encoding": "uint64" | "float64",
              "secagg": <MaskedUpload JSON>}     # only under secure aggregation
    arrays = {"__summable__": <flat vector laid out as the task says>, <disclosed item>: ...}
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import cast

import numpy as np

from fedforest_secure.errors import InvalidMessage
from fedforest_secure.protocol import Task, layout_size, pack, unpack

from .engine import PlainBounds
from .errors import ApiError

__all__ = ["ParsedUpload", "make_upload", "parse_upload"]

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
    """Decode an upload body; any defect is a 400 that says no more than necessary."""
    try:
        # unpack reads any buffer (the server hands it the bytearray it read, uncopied)
        header, arrays = unpack(cast(bytes, body))
    except InvalidMessage as exc:
        raise ApiError(400, "malformed_upload", "the body is not a valid upload message") from exc
    if header.get("type") != "upload" or SUMMABLE not in arrays:
        raise ApiError(400, "malformed_upload", "the body is not an upload message")
    try:
        job_id = str(header["job_id"])
        round_id = int(header["round_id"])
        task_digest = str(header["task_digest"])
        encoding = str(header["encoding"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ApiError(400, "malformed_upload", "the upload header is incomplete") from exc
    if encoding not in ("uint64", "float64"):
        raise ApiError(400, "malformed_upload", "encoding must be 'uint64' or 'float64'")
    secagg = header.get("secagg")
    if secagg is not None and (not isinstance(secagg, str) or len(secagg) > 4096):
        raise ApiError(400, "malformed_upload", "the secagg header must be a short JSON string")
    summable = arrays.pop(SUMMABLE)
    return ParsedUpload(job_id, round_id, task_digest, encoding, summable, arrays,
                        hashlib.sha256(body).hexdigest(), secagg)


def allowed_disclosures(task: Task) -> set[str]:
    """Names a client may disclose for ``task`` (the coordinator's own rule when available)."""
    try:
        from fedforest_secure.coordinator import Coordinator
    except ImportError:
        return set(task.disclose)
    return set(Coordinator._allowed_disclosures(task))


def check_against_task(up: ParsedUpload, task: Task, task_digest: str, encoding: str,
                       bounds: PlainBounds | None = None) -> None:
    """The upload answers exactly this task, in the round's encoding and layout.

    ``bounds`` (plaintext rounds only: the server sees each client's vector) range-checks every
    entry against the codec's public bound, so no client can push the round's sum out of range
    (float64 overflow to inf, or a wrapped ring sum); masked vectors cannot be checked."""
    if up.task_digest != task_digest:
        raise ApiError(409, "wrong_task", "the upload answers a different task than this round's")
    if up.encoding != encoding:
        raise ApiError(400, "wrong_encoding", f"this round expects {encoding} vectors")
    want = np.dtype(np.uint64) if encoding == "uint64" else np.dtype(np.float64)
    n = layout_size(task.layout)
    if up.summable.dtype != want or up.summable.shape != (n,):
        raise ApiError(400, "wrong_layout",
                       f"the summable vector must be {encoding} of length {n}")
    if encoding == "float64" and not np.isfinite(up.summable).all():
        raise ApiError(400, "non_finite", "the summable vector holds NaN or infinity")
    if bounds is not None:
        bad = bounds.first_violation(up.summable)
        if bad is not None:
            if encoding == "uint64":
                shown = f"{int(up.summable.view(np.int64)[bad])} ring units"
                limit = f"{int(bounds.ring[bad])}"
            else:
                shown, limit = f"{float(up.summable[bad])!r}", f"{float(bounds.value[bad]):.6g}"
            raise ApiError(400, "out_of_range",
                           f"summable[{bad}] = {shown} is outside the public bound "
                           f"[-{limit}, {limit}] of this entry (max_abs x scale of the round's "
                           "codec); the upload was not stored")
    extra = sorted(set(up.disclosed) - allowed_disclosures(task))
    if extra:
        raise ApiError(400, "undisclosable",
                       f"items not requested for disclosure in this round: {extra}")
