"""How long one attempt of a client's request waits: for its answer, the long poll it asks for
plus :data:`ANSWER_MARGIN_S` (plus the time the end of its body may still take to leave this
machine); for each part of its body to be taken by the connection, as long. A body still
moving, however slowly, is never cut; a connection silent for longer is taken for lost."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from fedforest_secure.protocol.api import LOCK_WAIT_S, MAX_WAIT_S

__all__ = ["ANSWER_MARGIN_S", "CONNECT_S", "MIN_SEND_RATE", "attempt_timeout", "body_parts",
           "wait_of"]

#: Seconds the server may take to answer a request beyond the long poll the request asks for
#: (``?wait=`` or ``?next_wait=``, which the server ends within the seconds asked, at most
#: :data:`~fedforest_secure.protocol.api.MAX_WAIT_S`): a wait for a database lock (at most
#: :data:`~fedforest_secure.protocol.api.LOCK_WAIT_S`, then it answers with an error), its work
#: on the request, the network. A connection silent for longer has lost the request or its
#: answer (a NAT or firewall that forgot the connection, a Wi-Fi hand-over): the attempt gives
#: up and the request goes again (every request the client retries is idempotent on the
#: server).
ANSWER_MARGIN_S = LOCK_WAIT_S + 10.0
#: Seconds a connection attempt may take.
CONNECT_S = 10.0
#: Bytes of a request body handed to the connection at a time. Each part must be taken (on
#: its way, or queued in this machine's kernel) within the attempt's long poll plus the
#: margin, as the server bounds the wait for each part of a body it reads (its
#: ``body_timeout_s``, 30 s), never the whole body's: a large upload over a slow link goes on
#: as long as it moves. (One part is one TLS write, which has no partial writes: its timeout
#: bounds all of it.)
BODY_PART = 64 * 1024
#: The slowest link, in bytes a second, over which a request's body is sure to get through:
#: 32 KiB/s (256 kbit/s, below any uplink a site computes over). Once the last part is taken,
#: the kernel may still hold up to :func:`kernel_queue` bytes of the body to send; the wait for
#: the answer grows by the time they take at this rate (at most 128 s, for a queue of 4 MiB:
#: the loss of a connection right after a large upload is still noticed within minutes).
MIN_SEND_RATE = 32 * 1024


def attempt_timeout(params: dict[str, Any] | None, body: int, margin_s: float,
                    min_rate: float) -> httpx.Timeout:
    """The timeouts of one attempt of a request that asks for the long poll in ``params`` and
    sends a body of ``body`` bytes: each part of the body must be taken within the long poll
    plus ``margin_s`` (the write timeout, per :data:`BODY_PART`), and the answer must come
    within that plus the time the bytes the kernel may still queue take at ``min_rate``."""
    silent_s = wait_of(params) + margin_s
    queued_s = min(body, kernel_queue()) / min_rate
    return httpx.Timeout(silent_s, connect=CONNECT_S, read=silent_s + queued_s)


def wait_of(params: dict[str, Any] | None) -> float:
    """The long poll a request's ``params`` ask for (``wait`` or ``next_wait``), in seconds, as
    the server bounds it (at most :data:`~fedforest_secure.protocol.api.MAX_WAIT_S`)."""
    asked = 0.0
    for name in ("wait", "next_wait"):
        try:
            asked = max(asked, float((params or {}).get(name) or 0.0))
        except (TypeError, ValueError):
            continue
    return min(asked, MAX_WAIT_S)


def body_parts(content: bytes | None) -> bytes | Iterable[bytes] | None:
    """``content`` as parts of :data:`BODY_PART` bytes, each sent with its own write timeout
    (the request's ``Content-Length`` gives the whole length); a short body as it is."""
    if content is None or len(content) <= BODY_PART:
        return content
    view = memoryview(content)
    return (bytes(view[i:i + BODY_PART]) for i in range(0, len(content), BODY_PART))


@functools.cache
def kernel_queue() -> int:
    """The most bytes of a connection's data this machine's kernel may hold unsent (or sent
    and not yet acknowledged): Linux's ``tcp_wmem`` maximum, else 4 MiB (its default, and
    macOS's)."""
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20
