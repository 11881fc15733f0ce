"""A finished job's result as a site fetches it (``fedforest model download``, and the client at
the end of its job): the model (or an evaluation job's result), checked against the SHA-256 the
job's status records and parsed, before anything is written."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import httpx

from fedforest_secure.errors import ProtocolError
from fedforest_secure.protocol.api import JobStatus

from .answers import FILE_MAX
from .context import parse_as
from .transport import Transport

__all__ = ["JobResult", "check_result", "fetch_result"]


@dataclass(frozen=True)
class JobResult:
    """A job's result as fetched: its bytes, the answer's headers (the audit-chain tip),
    ``kind`` (``"model"`` or ``"evaluation"``) and SHA-256 (hex)."""

    body: bytes
    headers: httpx.Headers
    kind: str
    digest: str


def fetch_result(tr: Transport, job: str) -> JobResult:
    """The result of the finished ``job``: ``GET /v1/jobs/{job}/model``, checked
    (:func:`check_result`) against the digest the job's status records.

    Raises
    ------
    ProtocolError
        The job's status is malformed, or the result is not the job's (:func:`check_result`).
    """
    resp = tr.request("GET", f"/v1/jobs/{job}/model", limit=FILE_MAX)
    st = parse_as(JobStatus, tr.get_json(f"/v1/jobs/{job}"), "job status from the server")
    kind, digest = check_result(resp.content, st.model_digest)
    return JobResult(resp.content, resp.headers, kind, digest)


def is_evaluation(body: bytes) -> bool:
    """Whether a job's result ``body`` names itself an evaluation job's scores (not a
    model); it is not checked further."""
    from fedforest_secure.evaluation.result import FORMAT

    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def check_result(body: bytes, recorded: str | None) -> tuple[str, str]:
    """``(kind, digest)`` of a job's result ``body``: ``"evaluation"`` (an evaluation job's
    scores) or ``"model"``, and its SHA-256 (hex), which must be ``recorded`` (the job status's
    ``model_digest``) where the job records one.

    Raises
    ------
    ProtocolError
        The digest is not the one the job records, or the body is neither a model nor an
        evaluation result; the message ends in ``not written``.
    """
    from fedforest_secure.evaluation.result import FORMAT, EvalResult
    from fedforest_secure.model import ForestModel

    digest = hashlib.sha256(body).hexdigest()
    if recorded and recorded != digest:
        raise ProtocolError(f"the model's SHA-256 {digest} is not the one the job records "
                            f"({recorded}); not written")
    try:
        text = body.decode("utf-8")
        doc = json.loads(text)
        if isinstance(doc, dict) and doc.get("format") == FORMAT:
            EvalResult.from_json(text)
            return "evaluation", digest
        ForestModel.from_json(text)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise ProtocolError(f"the server's answer is not a model nor an evaluation result "
                            f"({why}); not written") from None
    return "model", digest
