"""Where the masked vectors of an open secure round wait for its close.

A restarted server adds every masked upload of the open round into the rebuilt running sum
again, so each is kept until the round closes: one file ``<root>/<job>/<round>/<client>.u64``
each, or, without a spool directory, the ``uploads.summable`` column. A file is written once
and unlinked, where a database blob is written and then freed page by page: with vectors of
tens of MB that difference is the upload step's latency.

A file is on disk (``fsync``, its name too) before the upload's database row commits, so a
server that lost power finds every upload its database counted. A write that fails (a full
disk) raises :class:`SpoolError` and leaves no file: the upload is not counted, the site gets a
503 and sends it again.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedforest_secure.files import disk_full, fsync_dir, write_atomic

from .logs import event
from .phases import JobStatus

__all__ = ["Spool", "SpoolError", "words"]


class SpoolError(Exception):
    """A masked upload could not be written to the spool (its disk is full, or the write
    failed otherwise): the message names the file and the cause, for the server's log."""


class Spool:
    """The spool directory (``root``), or None: vectors stay in the database."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        #: the entries of the spool root that are not job folders, each logged once
        self._strays: set[str] = set()

    def path(self, job_id: str, round_id: int, idx: int) -> Path | None:
        if self.root is None:
            return None
        return self.root / job_id / str(round_id) / f"{idx}.u64"

    def write(self, job_id: str, round_id: int, idx: int, vec: np.ndarray) -> None:
        path = self.path(job_id, round_id, idx)
        if path is None or self.root is None:
            raise RuntimeError("no spool directory")
        data = np.ascontiguousarray(vec, dtype="<u8").data  # its bytes, not a copy
        try:
            # the uploads are the server's to read: a spool directory it makes is its user's
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            _make_dirs(path.parent, self.root)
            # whole or absent, never half a vector; on disk before the upload's row commits
            write_atomic(path, data, sync_dir=True)
        except OSError as exc:
            cause = os.strerror(exc.errno) if exc.errno else str(exc)
            full = disk_full(exc)
            if full:
                cause = f"disk full ({cause})"
            todo = "free space on the spool's disk" if full else (
                f"check the spool directory {self.root} (its disk, permissions and limits)")
            raise SpoolError(f"cannot write the masked upload {path} to the spool: {cause}; "
                             f"the upload was not counted (the site sends it again): {todo}"
                             ) from exc

    def read(self, job_id: str, round_id: int, idx: int) -> np.ndarray | None:
        """The spooled vector, or None if it has no file; a file that is not whole 8-byte words
        (damaged) is a RuntimeError naming it."""
        path = self.path(job_id, round_id, idx)
        if path is None or not path.is_file():
            return None
        return words(path.read_bytes(), "<u8",
                     f"the masked upload of client {idx} in round {round_id}",
                     f"{path} holds ")

    def sweep(self, position: Callable[[str], tuple[str, int] | None]) -> None:
        """Remove the spooled uploads of every round that is no longer open, and the folder
        of every job that is not running once it is empty (a running job's empty folder is
        kept for its next round).

        ``position(job_id)`` gives the job's ``(status, current round)`` or None. Call it after
        the commit that closed a round, under the server's lock (no upload of the open round is
        being written meanwhile)."""
        if self.root is None or not self.root.is_dir():
            return
        for job_dir in self.root.iterdir():
            if not job_dir.is_dir():  # not the spool's: left alone, and said once
                if job_dir.name not in self._strays:
                    self._strays.add(job_dir.name)
                    event("spool_stray", logging.WARNING, path=job_dir,
                          detail="not a job's folder of the spool: left alone")
                continue
            entries = list(job_dir.iterdir())
            rounds = [d for d in entries if d.name.isdigit() and d.is_dir()]
            if entries and not rounds:
                continue  # something not the spool's in a job's folder: left alone
            pos = position(job_dir.name)
            open_round = pos[1] if pos is not None and pos[0] == JobStatus.RUNNING else None
            for d in rounds:
                if open_round is None or int(d.name) < open_round:
                    shutil.rmtree(d, ignore_errors=True)
            if open_round is None:  # the job ended (or is gone): its folder goes once empty
                try:
                    job_dir.rmdir()
                except OSError:
                    pass  # something not the spool's in it: left alone


def _make_dirs(folder: Path, root: Path) -> None:
    """Make ``folder`` and its parents up to ``root``, each new one's name on disk."""
    if folder == root or folder.is_dir():
        return
    _make_dirs(folder.parent, root)
    folder.mkdir(exist_ok=True)
    fsync_dir(folder.parent)


def words(blob: bytes, dtype: str, what: str, where: str = "") -> np.ndarray:
    """``blob`` (a stored vector: a spooled upload, or a database row's) read as 64-bit words
    of ``dtype``; a length that is not a whole number of words is a damaged vector, a
    RuntimeError naming it (``what``; ``where`` its file, if it has one)."""
    if len(blob) % 8:
        raise RuntimeError(f"{what} is damaged: {where}{len(blob)} bytes, not a whole number "
                           "of 8-byte words")
    return np.frombuffer(blob, dtype=dtype)
