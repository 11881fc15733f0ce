"""Files written whole or not at all: a crash (or a full disk) while a model, a result or a
key is written leaves the file as it was, never a part of the new one. Lines appended to a
log that several processes share (a site's receipts) are each whole and on a line of their
own. A write that fails names the file and, when the disk is full, says so
(:func:`cannot_write`, :func:`os_error_text`)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = ["append_line", "cannot_write", "disk_full", "fsync_dir", "mode_of", "open_in_place",
           "os_error_text", "readable_by", "replacing", "write_atomic"]


_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: OSError) -> bool:
    """Whether ``exc`` says the disk (or the user's quota on it) is full."""
    return exc.errno in _FULL


def _why(exc: OSError) -> str:
    said = exc.strerror or str(exc) or type(exc).__name__
    if disk_full(exc):
        return f"the disk is full ({said})"
    if exc.errno == errno.EFBIG:
        return f"the file would be larger than this process may write ({said})"
    return said


def cannot_write(exc: OSError, path: str | Path) -> OSError:
    """``exc`` (met writing ``path``) as the same kind of error, saying "cannot write
    <path>: <why>", why being "the disk is full" when it is. An error that already names its
    file ("cannot open <path>: ..." too) is returned as it is."""
    if exc.filename is not None or (exc.strerror or "").startswith(("cannot write ",
                                                                    "cannot open ")):
        return exc
    return type(exc)(exc.errno, f"cannot write {path}: {_why(exc)}")


def os_error_text(exc: OSError) -> str:
    """What an operator reads of ``exc``: its message, with the file it names and "the disk
    is full" when it is (``[Errno 28] No space left on device: 'x'`` reads
    ``x: the disk is full (No space left on device)``); an error of two files (a rename's)
    names both, ``<src> -> <dst>: <why>``."""
    if exc.strerror is None:
        return str(exc) or type(exc).__name__
    if exc.strerror.startswith("cannot "):
        return exc.strerror
    if exc.filename is None:
        return _why(exc)
    named = (f"{exc.filename} -> {exc.filename2}" if exc.filename2 is not None
             else str(exc.filename))
    return f"{named}: {_why(exc)}"


@contextlib.contextmanager
def replacing(path: str | Path, *, mode: int = 0o666, keep_mode: bool = False,
              sync_dir: bool = False) -> Iterator[Path]:
    """A new, empty temporary file beside ``path`` to write; once the block ends without an
    error it is flushed to disk, given its mode and renamed over ``path``, otherwise removed.
    It is writable by its owner while the block writes it (whatever ``mode`` says); its final
    mode is ``mode`` less the umask (a read-only ``0o444`` too), set just before the
    rename. With ``keep_mode`` a file that ``path`` names already passes its permission bits
    on instead (a file its user made 0600 or 0444 stays so, as under a shell's ``>``), and
    its group where this user may give the file that group (a group the user is in); where
    not, the new file's group (the user's) gets no permission bits, so the file is never open
    to people who could not open the one it replaces. With ``sync_dir`` the rename is flushed
    to disk too (the directory's ``fsync``): ``path`` survives a power loss once this
    returns."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
    try:
        old = os.stat(path) if keep_mode else None
    except (OSError, ValueError):
        old = None
    owned = True  # an interrupt from here on removes the temporary file, made or not yet
    try:
        try:
            # writable by its owner while written, whatever ``mode``; group and others get
            # what ``mode`` gives them, and nothing before a kept mode is set
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                             (mode | 0o600) if old is None else 0o600))
        except OSError as exc:  # named by the file asked for, not the temporary one
            owned = False  # not made here (another's, if it exists)
            raise type(exc)(exc.errno, f"cannot write {path}: {_why(exc)}"
                            + (f" (no directory {path.parent})" if not path.parent.is_dir()
                               else "")) from None
        try:
            yield tmp
            _finish(tmp, mode, old)
            os.replace(tmp, path)
        except OSError as exc:  # named by the file asked for, not the temporary one
            if exc.filename is not None and str(exc.filename) == str(tmp):
                exc.filename = None
            raise cannot_write(exc, path) from None
    except BaseException:
        if owned:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def _finish(tmp: Path, mode: int, old: os.stat_result | None) -> None:
    """Flush the written temporary file ``tmp`` to disk and give it its final mode: ``mode``
    less the umask (the mode it was made with, ``mode | 0o600`` less the umask, without the
    bits ``mode`` lacks), or the bits (and, where it may, the group) of ``old``, the file it
    replaces."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        made = os.fstat(fd)
        final = stat.S_IMODE(made.st_mode) & mode
        if old is not None:
            final = stat.S_IMODE(old.st_mode) & 0o777
            if os.name == "posix" and old.st_gid != made.st_gid:
                try:
                    os.fchown(fd, -1, old.st_gid)
                except PermissionError:  # not a group of this user's: it gets no access
                    final &= ~0o070
        if final != stat.S_IMODE(made.st_mode):
            os.chmod(tmp, final)  # by name: os.fchmod is POSIX only before Python 3.13
        os.fsync(fd)
    finally:
        os.close(fd)


def mode_of(path: str | Path) -> int | None:
    """The permission bits of the file ``path`` names (following a link), None if there is
    none (or it cannot be looked at)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except (OSError, ValueError):
        return None


def open_in_place(path: str | Path, flags: int, mode: int = 0o600) -> int:
    """``os.open(path, flags, mode)`` of a file that is written where it lies (a lock, a log
    appended to), never through another name: a symbolic link is not followed
    (``O_NOFOLLOW``), and a file that is not a regular one or has another name too (a hard
    link) is refused. Otherwise whoever could put a link in its directory would have this
    process truncate or append to any file its user can write. A file another user owns is
    refused too (on POSIX systems): that user could write it still. A refusal is an
    :class:`OSError` saying "cannot open <path>: ..." and what to do."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise OSError(exc.errno, f"cannot open {path}: it is a symbolic link, which this "
                          "file is never opened through (a link someone else put there would "
                          "send the writes to another file of this user's): put the file "
                          "itself in its place, or remove the link; and keep the directory "
                          "writable by its owner only") from None
        raise
    st = os.fstat(fd)
    foreign = os.name == "posix" and st.st_uid != os.geteuid()
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or foreign:
        os.close(fd)
        why = ("it is not a regular file: remove it" if not stat.S_ISREG(st.st_mode) else
               f"it has {st.st_nlink} names (hard links), and a write here would change the "
               f"file of every name: give it one of its own (cp -p {path} {path}.copy && "
               f"mv {path}.copy {path})" if st.st_nlink > 1 else
               f"it belongs to another user (uid {st.st_uid}), who could still change what "
               f"this process writes to it: remove it (rm {path}; it is made again, this "
               "user's)")
        raise OSError(errno.EPERM, f"cannot open {path}: {why}; and keep the directory "
                      "writable by its owner only")
    os.set_blocking(fd, True)  # O_NONBLOCK only kept a FIFO from holding up the open
    return fd


def readable_by(path: str | Path) -> tuple[str, int] | None:
    """``("others", mode)`` if users other than the owner and its group may read ``path``,
    ``("group", mode)`` if its group may, else None (and on systems without POSIX modes): for
    the warnings about private keys."""
    if os.name != "posix":
        return None
    mode = stat.S_IMODE(Path(path).stat().st_mode)
    if mode & 0o007:
        return "others", mode
    if mode & 0o070:
        return "group", mode
    return None


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")  # counted in bytes, whatever the buffer's item size
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: str | Path, data: bytes | bytearray | memoryview | str, *,
                 mode: int = 0o666, sync_dir: bool = False) -> None:
    """Write ``data`` (text as UTF-8; a buffer, e.g. an array's ``memoryview``, as its bytes,
    not copied) to ``path`` through :func:`replacing`. A write that fails (a full disk:
    ``ENOSPC``) raises, and ``path`` is left as it was; so does a file that ends up shorter
    than ``data``."""
    raw = data.encode("utf-8") if isinstance(data, str) else memoryview(data).cast("B")
    with replacing(path, mode=mode, sync_dir=sync_dir) as tmp:
        fd = os.open(tmp, os.O_WRONLY)
        try:
            _write_all(fd, raw)
            size = os.fstat(fd).st_size
            if size != len(raw):
                raise OSError(errno.EIO, f"cannot write {path}: {size} of {len(raw)} bytes "
                              "were written")
        finally:
            os.close(fd)


def append_line(path: str | Path, line: str, *, sync: bool = False,
                drop_torn: bool = False) -> None:
    """Append ``line`` and a newline to ``path`` (made if missing) as one write, under an
    exclusive lock of the file: lines from processes appending at once never interleave
    (nor on a file system where ``O_APPEND`` alone does not keep them apart). After a torn
    last line (a writer that died mid-line, leaving no newline) the new line starts a line of
    its own; with ``drop_torn`` (JSON lines) it takes the torn line's place unless that line
    is whole JSON (cut just before its newline): a record cut short holds nothing, as if the
    writer had died before it. With ``sync`` the line is on disk when this returns
    (``fsync``; and the file's name, where this made the file). A symbolic link, or a file
    that is not a regular one of one name, is refused (:func:`open_in_place`)."""
    raw = line.encode("utf-8") + b"\n"
    new = sync and not os.path.exists(path)
    try:
        _append(path, raw, sync=sync, drop_torn=drop_torn)
    except OSError as exc:
        raise cannot_write(exc, path) from None
    if new:
        fsync_dir(Path(path).parent)


def _append(path: str | Path, raw: bytes, *, sync: bool, drop_torn: bool) -> None:
    import fcntl  # POSIX: the site's client; the estimators import this module everywhere

    fd = open_in_place(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            start = _last_line_start(fd, size)
            if drop_torn and not _is_json(os.pread(fd, size - start, start)):
                os.ftruncate(fd, start)
            else:
                raw = b"\n" + raw
        _write_all(fd, raw)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    return True


def _last_line_start(fd: int, size: int) -> int:
    """The offset just after the last newline of the file's first ``size`` bytes (0 if none):
    where its last line starts."""
    end = size
    while end > 0:
        start = max(0, end - 65536)
        chunk = os.pread(fd, end - start, start)
        at = chunk.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def fsync_dir(folder: Path) -> None:
    """Make a new file's name durable (where the platform can open a directory)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
