"""A secure-aggregation step answered together with its round's task.

A client's step POST (key advert, share bundle, masked upload, survivor signature, unmask
response) may ask for the next step (``?next_wait=``) and, with ``?with_task=true``, for the
task of that step's round as well, when the step is for another round than the POST's (the
unmask response of round r is answered with round r + 1's first step): one request less per
round and client. Such an answer is the step's JSON followed by the task's wire bytes; the
header :data:`STEP_JSON_BYTES` says how many bytes of the body are the JSON. An answer
without the header is JSON alone, as every answer without ``with_task`` is.

The client trusts the attached bytes no more than a task it fetched itself: it checks them
against the step's ``task_digest`` (and their job and round) before answering anything.
"""

from __future__ import annotations

from fedforest_secure.errors import ProtocolError

__all__ = ["STEP_JSON_BYTES", "WITH_TASK", "join_step", "split_step"]

#: the answer's header holding how many bytes of its body are the step's JSON
STEP_JSON_BYTES = "X-FedForest-Step-Json-Bytes"
#: the query parameter by which a step POST asks for the next step's task too
WITH_TASK = "with_task"


def join_step(step_json: bytes, task: bytes) -> tuple[bytes, dict[str, str]]:
    """The body and header of an answer carrying ``step_json`` and then ``task``."""
    return step_json + task, {STEP_JSON_BYTES: str(len(step_json))}


def split_step(body: bytes, json_bytes: str | None) -> tuple[bytes, bytes | None]:
    """``(step JSON, task bytes or None)`` of an answer's ``body``; ``json_bytes`` is its
    :data:`STEP_JSON_BYTES` header (None: the body is JSON alone). A header that is not a
    decimal count within the body, or leaves no task after the JSON, is a
    :class:`ProtocolError`."""
    if json_bytes is None:
        return body, None
    if not (json_bytes.isascii() and json_bytes.isdigit()) or len(json_bytes) > 20:
        raise ProtocolError(f"a step answer's {STEP_JSON_BYTES} header is not a byte count")
    n = int(json_bytes)
    if not 0 < n < len(body):
        raise ProtocolError(f"a step answer's {STEP_JSON_BYTES} header ({n}) does not leave "
                            f"a task within its {len(body)} bytes")
    view = memoryview(body)
    return bytes(view[:n]), bytes(view[n:])
