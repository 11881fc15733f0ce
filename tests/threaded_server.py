"""A uvicorn server on 127.0.0.1 in a thread of the test process, for tests of the HTTP layer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serving(config: Any, timeout: float = 10.0) -> Iterator[Any]:
    """Run ``uvicorn.Server(config)`` in a daemon thread until the block ends; the block starts
    once the server listens (an assertion fails if it does not within ``timeout`` seconds)."""
    import uvicorn

    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not server.started:
            assert time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.02)
        yield server
    finally:
        server.should_exit = True
        thread.join(10)
