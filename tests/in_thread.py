"""A call run in a thread and waited for a bounded time, for tests of calls that may hang."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def in_thread(fn: Callable[[], Any], limit: float) -> dict[str, Any]:
    """``fn()`` in a thread, waited for ``limit`` seconds: ``{"value": ...}`` or ``{"error":
    ...}`` (nothing if it had not returned by then), and ``took``."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:  # what the test looks at
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(limit)
    out["took"] = time.monotonic() - started
    return out
