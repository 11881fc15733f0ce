"""Files written whole or not at all: a crash (or a full disk) while a model, a result or a
key is written leaves the file as it was, never a part of the new one."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["write_atomic"]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: str | Path, data: bytes | str, *, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it (created with ``mode``,
    less the umask; flushed to disk), renamed over ``path`` at the end."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            _write_all(fd, raw)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
