"""The server reads an upload's body into one buffer: a client that sends it a few bytes at a
time makes the server hold about what it sent, not one object per chunk."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator

from server_app.app import _read_body_chunks


class _Trickle:
    """A request whose body arrives ``size`` bytes in chunks of ``step`` bytes."""

    def __init__(self, size: int, step: int) -> None:
        self.size, self.step = size, step

    async def stream(self) -> AsyncIterator[bytes]:
        for start in range(0, self.size, self.step):
            yield bytes([start % 251]) * min(self.step, self.size - start)


def _peak_while_reading(size: int, step: int) -> tuple[bytes, int]:
    """The body read, and the most memory held while reading it (the event loop made
    before)."""
    request = _Trickle(size, step)
    loop = asyncio.new_event_loop()
    try:
        tracemalloc.start()
        try:
            body = loop.run_until_complete(
                _read_body_chunks(request, size, size))  # type: ignore[arg-type]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        loop.close()
    return bytes(body), peak


def test_a_body_sent_two_bytes_at_a_time_is_held_in_about_its_own_size() -> None:
    size = 200_000
    body, peak = _peak_while_reading(size, 2)
    assert len(body) == size and body[:4] == b"\x00\x00\x02\x02"
    assert peak < 3 * size  # one object per 2-byte chunk would hold ~20x


def test_a_body_in_64_kib_chunks_is_read_whole() -> None:
    size = 800_000
    body, _ = _peak_while_reading(size, 65536)
    assert len(body) == size and body[65536] == 65536 % 251
