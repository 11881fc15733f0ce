"""How a client reads the server's answers: as they are sent (never compressed), each route's
body at most a number of bytes, and within a time that grows with its size.

The client asks for ``Accept-Encoding: identity`` and refuses an answer with any other
``Content-Encoding`` (a compressed answer would cost this machine a thousand times its bytes
once decoded). A body is read as a stream, under the byte limit of its route:

- :data:`JSON_MAX` (16 MiB) for every JSON answer (an offer, a join, a job's status, a
  secure-aggregation step, a receipt): the largest of them, a share delivery or a directory of
  a job of thousands of sites, takes a few MiB;
- :data:`TASK_MAX` for a task: what the wire format holds (1 MiB of header and 2 GiB of
  arrays, :mod:`fedforest_secure.protocol.wire`), which a task's thresholds fill only in jobs
  far beyond any a site answers (the largest measured task takes a few MiB);
- :data:`FILE_MAX` (2 GiB) for a job's model, evaluation result or audit log.

Past its limit, an answer is refused (:class:`AnswerTooLarge`), not sent for again. Once its
head has arrived, a body must keep coming at :data:`~.waits.MIN_SEND_RATE` on average after
the attempt's silent time (:func:`read_body`): an answer whose bytes trickle in is taken for
lost (:class:`SlowAnswer`), as a silent one is, and the request is sent again within the retry
budget.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from fedforest_secure.errors import ProtocolError

__all__ = ["ERROR_MAX", "FILE_MAX", "JSON_MAX", "TASK_MAX", "AnswerTooLarge", "SlowAnswer",
           "answer_json", "read_body"]

#: bytes of a JSON answer, at most
JSON_MAX = 16 << 20
#: bytes of a task, at most: the wire format's magic and length (8), header (1 MiB) and arrays
#: (2 GiB), :func:`fedforest_secure.protocol.wire.unpack`'s own limits
TASK_MAX = 8 + (1 << 20) + (1 << 31)
#: bytes of a job's model, evaluation result or audit log, at most
FILE_MAX = 1 << 31
#: bytes of an error answer (4xx, 5xx) read, at most: its code and detail are in the first ones
ERROR_MAX = 64 << 10


class AnswerTooLarge(ProtocolError):
    """The server's answer is longer than its route's limit (or compressed): refused."""


class SlowAnswer(httpx.TransportError):
    """An answer's body came in slower than the client waits for: its attempt is lost."""


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def read_body(resp: httpx.Response, what: str, *, limit: int, silent_s: float,
              min_rate: float, truncate: bool = False) -> bytes:
    """The body of the streamed answer ``resp`` (to the request ``what``: ``GET /v1/...``).

    Reads at most ``limit`` bytes: past them :class:`AnswerTooLarge` (``truncate``: the first
    ``limit`` bytes, for an error answer). The body must have come, at any moment, at
    ``min_rate`` bytes a second on average after ``silent_s`` seconds from its head:
    :class:`SlowAnswer` otherwise (checked as each part arrives; a part never waits longer
    than the attempt's read timeout).

    Raises
    ------
    AnswerTooLarge
        The answer is compressed (``Content-Encoding`` other than identity), or longer than
        ``limit`` (without ``truncate``).
    SlowAnswer
        The body comes in slower than that.
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
    # an answer read already (a transport answering from memory, as tests' mocks do): whole
    parts = (resp.content,) if resp.is_stream_consumed else resp.iter_raw()
    for part in parts:
        body += part
        if len(body) > limit:
            if truncate:
                return bytes(body[:limit])
            raise AnswerTooLarge(_too_large(what, limit, "goes on past it"))
        took = time.monotonic() - head
        if took > silent_s + len(body) / min_rate:
            raise SlowAnswer(f"the answer came too slowly: {len(body)} bytes in {took:.0f}s")
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
