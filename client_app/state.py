"""What a client keeps on its own disk: receipts of every upload (and local secrets, mode 0600)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedforest_secure.errors import FedForestError
from fedforest_secure.files import write_atomic

__all__ = ["ClientState"]

#: the state directories this process's clients hold (to name a second one of this process)
_HELD: set[Path] = set()


class ClientState:
    """A directory of append-only receipts, one JSON object per line."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            # made here: owner only. A directory the user gave that exists keeps its mode (a
            # working directory or a shared folder); the secrets in it are 0600 each
            self.root.mkdir(parents=True, exist_ok=True)
            os.chmod(self.root, 0o700)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory for this process: a second client on the same state directory
        (a site started twice) would answer the site's rounds without its keys, and the server
        would drop the site. The lock dies with the process (a crashed client leaves none).

        Raises :class:`~fedforest_secure.errors.FedForestError` naming the process that holds
        it."""
        path = self.root / "client.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise FedForestError(f"{self._holder(fd)} is using --state-dir {self.root}: a "
                                     "site runs one client per state directory. Stop the other "
                                     "one, or give this one its own --state-dir") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            held = self.root.resolve()
            _HELD.add(held)
            try:
                yield
            finally:
                _HELD.discard(held)
        finally:
            os.close(fd)  # releases the lock

    def _holder(self, fd: int) -> str:
        """Who holds the lock: a client of this process, or the pid the holder wrote (read
        again if it is still writing it)."""
        if self.root.resolve() in _HELD:
            return "another client in this process"
        for _ in range(3):
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
            if pid:
                break
            time.sleep(0.05)
        return f"another client process (pid {pid or 'unknown'})"

    def add_receipt(self, receipt: dict[str, Any]) -> None:
        with (self.root / "receipts.jsonl").open("a") as fh:
            fh.write(json.dumps(receipt, sort_keys=True) + "\n")

    def receipts(self) -> list[dict[str, Any]]:
        path = self.root / "receipts.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def write_secret(self, name: str, data: bytes) -> None:
        write_atomic(self.root / name, data, mode=0o600)

    def read_secret(self, name: str) -> bytes | None:
        path = self.root / name
        return path.read_bytes() if path.exists() else None
