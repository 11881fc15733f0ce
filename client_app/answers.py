"""How a client reads the server's answers: as they are sent (never compressed), each route's
body at most a number of bytes, and only while it keeps coming.

The client asks for ``Accept-Encoding: identity`` and refuses an answer with any other
``Content-Encoding`` (a compressed answer would cost this machine a thousand times its bytes
once decoded). A body is read as a stream, under the byte limit of its route
(:func:`json_limit` for JSON answers):

- :data:`OFFER_MAX` for a job's offer and its join's answer, which carry the job's
  configuration: an evaluation job's holds the text of every model it scores (at most
  :data:`~fedforest_secure.evaluation.spec.MAX_MODELS`, each at most :data:`FILE_MAX`, the
  limit of a model's download, and at most twice that as a JSON string);
- :data:`JSON_MAX` (16 MiB) for every other JSON answer (a job's status, a secure-aggregation
  step, a receipt): the largest of them, a share delivery or a directory of a job of
  thousands of sites, takes a few MiB;
- :data:`TASK_MAX` for a task: what the wire format holds (1 MiB of header and 2 GiB of
  arrays, :mod:`fedforest_secure.protocol.wire`), which a task's thresholds fill only in jobs
  far beyond any a site answers (the largest measured task takes a few MiB);
- :data:`FILE_MAX` (2 GiB) for a job's model, evaluation result or audit log.

Past its limit, an answer is refused (:class:`AnswerTooLarge`), not sent for again. Once its
head has arrived, a body must keep moving: fewer than :data:`WINDOW_BYTES` in any
:data:`WINDOW_S` seconds (1 KiB/s, far below a site's share of a congested server uplink) and
it is taken for lost (:class:`SlowAnswer`), as a silent one is, and the request is sent again
within the retry budget (:func:`read_body`). An answer that drips a byte at a time ends
within a window; a slow but steady one is read to its end however long it takes.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from typing import Any

import httpx

from fedforest_secure.errors import ProtocolError
from fedforest_secure.evaluation.spec import MAX_MODELS

__all__ = ["ERROR_MAX", "FILE_MAX", "JSON_MAX", "OFFER_MAX", "TASK_MAX", "WINDOW_BYTES",
           "WINDOW_S", "AnswerTooLarge", "SlowAnswer", "answer_json", "json_limit",
           "read_body"]

#: bytes of a JSON answer, at most
JSON_MAX = 16 << 20
#: bytes of a task, at most: the wire format's magic and length (8), header (1 MiB) and arrays
#: (2 GiB), :func:`fedforest_secure.protocol.wire.unpack`'s own limits
TASK_MAX = 8 + (1 << 20) + (1 << 31)
#: bytes of a job's model, evaluation result or audit log, at most
FILE_MAX = 1 << 31
#: bytes of a job's offer or join answer, at most: its configuration (:data:`JSON_MAX`) and
#: the text of each model an evaluation job scores, each at most :data:`FILE_MAX` and as a
#: JSON string at most twice that (a quote, backslash or line end takes two bytes)
OFFER_MAX = JSON_MAX + MAX_MODELS * 2 * FILE_MAX
#: bytes of an error answer (4xx, 5xx) read, at most: its code and detail are in the first ones
ERROR_MAX = 64 << 10
#: seconds of the window over which a body must bring :data:`WINDOW_BYTES`
WINDOW_S = 60.0
#: bytes a body must bring in every :data:`WINDOW_S` seconds (1 KiB/s on average): fewer, and
#: it has stopped moving
WINDOW_BYTES = 60 << 10

_CONFIG_ROUTE = re.compile(r"^/v1/jobs/[^/]+/(offer|join)$")


class AnswerTooLarge(ProtocolError):
    """The server's answer is longer than its route's limit (or compressed): refused."""


class SlowAnswer(httpx.TransportError):
    """An answer's body stopped moving (:func:`read_body`): its attempt is lost."""


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def json_limit(path: str) -> int:
    """The byte limit of the JSON answer to a request for ``path``: :data:`OFFER_MAX` for a
    job's offer and join (which carry an evaluation job's models), :data:`JSON_MAX` else."""
    return OFFER_MAX if _CONFIG_ROUTE.match(path) else JSON_MAX


def read_body(resp: httpx.Response, what: str, *, limit: int, window_s: float,
              window_bytes: float, truncate: bool = False) -> bytes:
    """The body of the streamed answer ``resp`` (to the request ``what``: ``GET /v1/...``).

    Reads at most ``limit`` bytes: past them :class:`AnswerTooLarge` (``truncate``: the first
    ``limit`` bytes, for an error answer). From ``window_s`` seconds after its head, the body
    must have brought at least ``window_bytes`` in the last ``window_s`` seconds:
    :class:`SlowAnswer` otherwise (checked as each part arrives; a part never waits longer
    than the attempt's read timeout). ``window_bytes`` infinite: the whole body within
    ``window_s``.

    Raises
    ------
    AnswerTooLarge
        The answer is compressed (``Content-Encoding`` other than identity), or longer than
        ``limit`` (without ``truncate``).
    SlowAnswer
        The body has stopped moving.
    """
    enc = resp.headers.get("content-encoding", "").strip().lower()
    if enc not in ("", "identity"):
        raise AnswerTooLarge(f"{what}: the server answered with Content-Encoding {enc[:40]!r}, "
                             "which this client does not accept (it asks for identity): "
                             "refused, not decoded; the server, or a proxy on the way, "
                             "compresses answers it was asked not to")
    length = resp.headers.get("content-length", "")
    if not truncate and length.isdigit() and int(length) > limit:
        raise AnswerTooLarge(_too_large(what, limit, f"announces {int(length)} bytes"))
    body = bytearray()
    head = time.monotonic()
    # (time, bytes read by then): the last mark at least a window old, and those after it;
    # the bytes since the first are at least those of the last window
    marks: deque[tuple[float, int]] = deque([(head, 0)])
    # an answer read already (a transport answering from memory, as tests' mocks do): whole
    parts = (resp.content,) if resp.is_stream_consumed else resp.iter_raw()
    for part in parts:
        body += part
        if len(body) > limit:
            if truncate:
                return bytes(body[:limit])
            raise AnswerTooLarge(_too_large(what, limit, "goes on past it"))
        now = time.monotonic()
        if now - marks[-1][0] >= window_s / 16:  # a few marks a window, however many parts
            marks.append((now, len(body)))
        while len(marks) > 1 and marks[1][0] <= now - window_s:
            marks.popleft()
        if marks[0][0] <= now - window_s and len(body) - marks[0][1] < window_bytes:
            raise SlowAnswer(f"the answer stopped moving: {len(body) - marks[0][1]} bytes "
                             f"in the last {window_s:.0f}s ({len(body)} bytes in "
                             f"{now - head:.0f}s)")
    return bytes(body)


def _too_large(what: str, limit: int, how: str) -> str:
    return (f"{what}: the server's answer {how}; this client reads at most {_size(limit)} of "
            "it: refused (a server that sends more is broken or hostile; its operator can "
            "tell which)")


def answer_json(resp: httpx.Response, what: str) -> Any:
    """The JSON of the answer ``resp`` to ``what``.

    Raises
    ------
    ProtocolError
        It is not JSON, or nested too deeply to parse.
    """
    try:
        return json.loads(resp.content)
    except (ValueError, RecursionError) as exc:
        kind = "nested too deeply" if isinstance(exc, RecursionError) else "not JSON"
        raise ProtocolError(f"malformed answer to {what}: {kind}") from None
