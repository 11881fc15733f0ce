"""A fault-injecting HTTPS proxy on 127.0.0.1 for the integration tests: it stands between one
site's client and the real server and loses the answers of chosen requests, as a network does.

It terminates the client's TLS with the federation's server certificate (the client checks it
against its CA, for the host 127.0.0.1, as it checks the server's) and relays each request, one
at a time per connection, over a mutual-TLS connection of its own to the server with the site's
certificate, so the server sees the site as usual. A :class:`Fault` whose pattern matches a
request line acts once the server has answered it:

- ``blackhole``: the answer is never sent and the connection stays open, silent (a NAT or a
  firewall that forgot the connection, a Wi-Fi hand-over);
- ``reset``: the client's connection is reset before a byte of the answer (a connection cut).

The proxy runs its own event loop in a thread of the test process.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Fault", "FaultProxy"]


@dataclass
class Fault:
    """Lose the answer of the first ``count`` requests whose request line (``POST /v1/...
    HTTP/1.1``) matches ``pattern`` (and that the server answered with ``status``, if given),
    by ``action`` (``blackhole`` or ``reset``)."""

    pattern: str
    action: str
    count: int = 1
    status: int | None = None
    #: the request lines it acted on
    hits: list[str] = field(default_factory=list)


class FaultProxy:
    """The proxy of one site (``site``: its certificate's file name in ``certs``) to the
    server on ``upstream_port``; :attr:`url` is the address its client is given."""

    def __init__(self, upstream_port: int, certs: Path, site: str, faults: list[Fault]) -> None:
        self.upstream_port, self.faults = upstream_port, faults
        self._tls_in = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._tls_in.load_cert_chain(certs / "server.pem", certs / "server.key")
        self._tls_out = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                                   cafile=str(certs / "ca.pem"))
        self._tls_out.load_cert_chain(certs / f"{site}.pem", certs / f"{site}.key")
        self._loop = asyncio.new_event_loop()
        self._closing: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0
        #: one line per request relayed: its request line, the server's status, the fault
        self.log: list[str] = []

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def close(self) -> None:
        if self._closing is not None:
            self._loop.call_soon_threadsafe(self._closing.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._closing = asyncio.Event()
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0, ssl=self._tls_in)
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        await self._closing.wait()
        server.close()

    def _fault_for(self, line: str, status: int) -> Fault | None:
        for fault in self.faults:
            if len(fault.hits) < fault.count and re.search(fault.pattern, line) \
                    and fault.status in (None, status):
                fault.hits.append(line)
                return fault
        return None

    async def _relay(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                try:
                    head = await cr.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                    return
                body = await _body(cr, head, response=False)
                line = head.split(b"\r\n", 1)[0].decode()
                if up is None:
                    up = await asyncio.open_connection("127.0.0.1", self.upstream_port,
                                                       ssl=self._tls_out,
                                                       server_hostname="127.0.0.1")
                up[1].write(head + body)
                await up[1].drain()
                rhead = await up[0].readuntil(b"\r\n\r\n")
                rbody = await _body(up[0], rhead, response=True,
                                    head_request=line.startswith("HEAD "))
                status = int(rhead.split(b" ", 2)[1])
                fault = self._fault_for(line, status)
                self.log.append(f"{line} -> {status}"
                                f"{f' ({fault.action})' if fault is not None else ''}")
                if fault is not None and fault.action == "reset":
                    sock = cw.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    cw.transport.abort()
                    return
                if fault is not None:  # blackhole: silent until the proxy closes
                    assert self._closing is not None
                    await self._closing.wait()
                    return
                cw.write(rhead + rbody)
                await cw.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, OSError) as exc:
            self.log.append(f"relay error: {exc!r}")
            return
        finally:
            for writer in (cw, up[1] if up is not None else None):
                if writer is not None:
                    writer.close()


def _headers(head: bytes) -> dict[str, str]:
    out = {}
    for raw in head.split(b"\r\n")[1:]:
        name, sep, value = raw.partition(b":")
        if sep:
            out[name.strip().lower().decode()] = value.strip().decode()
    return out


async def _body(reader: asyncio.StreamReader, head: bytes, *, response: bool,
                head_request: bool = False) -> bytes:
    """The body that follows ``head`` (by its Content-Length, or chunked), as it came."""
    if response:
        status = int(head.split(b" ", 2)[1])
        if status in (204, 304) or status < 200 or head_request:
            return b""
    headers = _headers(head)
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() != "chunked":
        return b""
    out = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        out += size_line
        size = int(size_line.split(b";")[0].strip(), 16)
        if size == 0:
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                out += trailer
            return bytes(out + b"\r\n")
        out += await reader.readexactly(size + 2)
