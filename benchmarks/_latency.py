"""A TCP proxy on 127.0.0.1 that adds latency: a wide-area link for the transport benchmarks.

Every byte is delivered ``rtt / 2`` seconds after the proxy read it, in each direction, in
order; a new connection waits one ``rtt`` before its first byte moves (the TCP handshake). With
``window`` set, at most that many bytes per direction are in flight at once, a byte counting
until one ``rtt`` after it was read (delivered after ``rtt / 2``, acknowledged ``rtt / 2``
later): the throughput of a TCP connection whose window is ``window``, at most ``window / rtt``.
TLS passes through untouched (the proxy sees ciphertext only).

It runs its own event loop in a background thread: ``with LatencyProxy(port, rtt) as proxy:``
clients connect to ``proxy.port`` instead of ``port``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import threading
from types import TracebackType

__all__ = ["LatencyProxy"]

_READ = 1 << 20


class _Pipe(asyncio.Protocol):
    """One direction's sender side: what it reads goes to ``peer`` ``delay`` seconds later."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float, window: int | None
                 ) -> None:
        self.loop = loop
        self.delay = delay
        self.window = window
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.timer: asyncio.TimerHandle | None = None
        self.in_flight = 0
        self.paused_window = False
        self.paused_peer = False  # the peer's socket buffer is full
        self.closing = False
        self.ready = asyncio.Event()

    # -- this side's socket
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        due = self.loop.time() + self.delay
        self.queue.append((due, data))
        self.in_flight += len(data)
        if self.window is not None and self.in_flight >= self.window and not self.paused_window:
            self.paused_window = True
            self._update_reading()
        if self.timer is None:
            self.timer = self.loop.call_at(due, self._deliver)

    def eof_received(self) -> bool:
        self.queue.append((self.loop.time() + self.delay, b""))
        if self.timer is None:
            self.timer = self.loop.call_at(self.queue[0][0], self._deliver)
        return True  # keep our side open until the peer has been told

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self.peer is not None and self.peer.transport is not None and not self.queue:
            self.peer.transport.close()

    # -- delivery to the peer
    def _deliver(self) -> None:
        self.timer = None
        now = self.loop.time()
        peer = self.peer.transport if self.peer is not None else None
        if peer is None:  # the upstream connection is not open yet: it calls kick() once open
            return
        while self.queue and self.queue[0][0] <= now:
            _, data = self.queue.popleft()
            if peer is None or peer.is_closing():
                continue
            if data:
                peer.write(data)
                self.loop.call_at(now + self.delay, self._acked, len(data))
            elif peer.can_write_eof():
                peer.write_eof()
        if self.queue:
            self.timer = self.loop.call_at(self.queue[0][0], self._deliver)
        elif self.closing and peer is not None:
            peer.close()

    def kick(self) -> None:
        """Deliver what waited for the peer's connection (each byte at its due time)."""
        if self.queue and self.timer is None:
            self.timer = self.loop.call_at(self.queue[0][0], self._deliver)

    def _acked(self, n: int) -> None:
        self.in_flight -= n
        if self.paused_window and self.window is not None and self.in_flight < self.window:
            self.paused_window = False
            self._update_reading()

    # -- backpressure from the peer's socket (called by the peer's transport)
    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.paused_peer = True
            self.peer._update_reading()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.paused_peer = False
            self.peer._update_reading()

    def _update_reading(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.paused_window or self.paused_peer:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()


class LatencyProxy:
    """Forward ``127.0.0.1:<port>`` (the proxy's) to ``127.0.0.1:target`` with added latency."""

    def __init__(self, target: int, rtt: float, window: int | None = None) -> None:
        self.target = target
        self.rtt = rtt
        self.window = window
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self.connections = 0

    def __enter__(self) -> LatencyProxy:
        self._thread = threading.Thread(target=self._run, name="latency-proxy", daemon=True)
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("the latency proxy did not start")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        self._loop = loop
        with contextlib.closing(loop):
            loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        server = await loop.create_server(lambda: self._accept(loop), sock=sock,
                                          backlog=1024)
        self._started.set()
        async with server:
            await self._stop.wait()

    def _accept(self, loop: asyncio.AbstractEventLoop) -> _Pipe:
        self.connections += 1
        half = self.rtt / 2
        down = _Pipe(loop, half, self.window)  # client -> server bytes are read here
        up = _Pipe(loop, half, self.window)    # server -> client bytes are read there
        down.peer, up.peer = up, down

        async def connect() -> None:
            if self.rtt > 0:
                await asyncio.sleep(self.rtt)  # the handshake's round trip
            try:
                await loop.create_connection(lambda: up, "127.0.0.1", self.target)
            except OSError:
                if down.transport is not None:
                    down.transport.close()
                return
            down.kick()
            if down.transport is not None:
                down.transport.resume_reading()

        def made(transport: asyncio.BaseTransport) -> None:
            _Pipe.connection_made(down, transport)
            transport.pause_reading()  # until the upstream connection is open  # type: ignore[attr-defined]
            loop.create_task(connect())

        down.connection_made = made  # type: ignore[method-assign]
        return down
