"""Free ports on 127.0.0.1 for the servers the tests start, never the same one twice in a run.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` is free only until its socket
closes: a second pick, in this process or in another pytest-xdist worker, can get the same port
before the first server binds it (on Linux a pick is one of about 14,000 odd ports at random:
about one pick in 15,000 repeats a given port released just before). Here each worker keeps
only the kernel's picks in its own share of the ports (``(port // 2) % workers == worker``) and
never hands out a port twice, so the servers of one test run cannot be given one port.
Outgoing connections do not take these ports either: the kernel gives ``bind(..., 0)`` odd
ports and ``connect`` even ones while it can.
"""

from __future__ import annotations

import os
import socket

__all__ = ["free_port"]

_given: set[int] = set()


def _worker() -> tuple[int, int]:
    """(this worker's index, the number of workers); (0, 1) without pytest-xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if name.startswith("gw") and name[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(name[2:]) % int(count), int(count)
    return 0, 1


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, in this worker's share, not handed
    out before in this process."""
    index, workers = _worker()
    for _ in range(100_000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if (port // 2) % workers == index and port not in _given:
            _given.add(port)
            return port
    raise RuntimeError("no free port in this test worker's share of the ephemeral range")
