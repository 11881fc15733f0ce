"""Files written whole or not at all: a crash (or a full disk) while a model, a result or a
key is written leaves the file as it was, never a part of the new one."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

__all__ = ["replacing", "write_atomic"]


@contextlib.contextmanager
def replacing(path: str | Path, *, mode: int = 0o666) -> Iterator[Path]:
    """A new, empty temporary file beside ``path`` (created with ``mode``, less the umask) to
    write; once the block ends without an error it is flushed to disk and renamed over
    ``path``, otherwise removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
    except OSError as exc:  # named by the file asked for, not the temporary one
        raise type(exc)(exc.errno, f"cannot write {path}: {exc.strerror}"
                        + (f" (no directory {path.parent})" if not path.parent.is_dir()
                           else "")) from None
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: str | Path, data: bytes | str, *, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` through :func:`replacing`."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    with replacing(path, mode=mode) as tmp:
        fd = os.open(tmp, os.O_WRONLY)
        try:
            _write_all(fd, raw)
        finally:
            os.close(fd)
