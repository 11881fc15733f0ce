"""Where the masked vectors of an open secure round wait for its close.

A restarted server adds every masked upload of the open round into the rebuilt running sum
again, so each is kept until the round closes: one file ``<root>/<job>/<round>/<client>.u64``
each, or, without a spool directory, the ``uploads.summable`` column. A file is written once
and unlinked, where a database blob is written and then freed page by page: with vectors of
tens of MB that difference is the upload step's latency.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .phases import JobStatus

__all__ = ["Spool"]


class Spool:
    """The spool directory (``root``), or None: vectors stay in the database."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    def path(self, job_id: str, round_id: int, idx: int) -> Path | None:
        if self.root is None:
            return None
        return self.root / job_id / str(round_id) / f"{idx}.u64"

    def write(self, job_id: str, round_id: int, idx: int, vec: np.ndarray) -> None:
        path = self.path(job_id, round_id, idx)
        if path is None or self.root is None:
            raise RuntimeError("no spool directory")
        # the uploads are the server's to read: a spool directory it makes is its user's only
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            np.ascontiguousarray(vec, dtype="<u8").tofile(fh)
        os.replace(tmp, path)  # whole or absent, never half a vector

    def read(self, job_id: str, round_id: int, idx: int) -> np.ndarray | None:
        """The spooled vector, or None if it has no file."""
        path = self.path(job_id, round_id, idx)
        if path is None or not path.is_file():
            return None
        return np.fromfile(path, dtype="<u8")

    def sweep(self, position: Callable[[str], tuple[str, int] | None]) -> None:
        """Remove the spooled uploads of every round that is no longer open.

        ``position(job_id)`` gives the job's ``(status, current round)`` or None. Call it after
        the commit that closed a round, under the server's lock (no upload of the open round is
        being written meanwhile)."""
        if self.root is None or not self.root.is_dir():
            return
        for job_dir in self.root.iterdir():
            rounds = [d for d in job_dir.iterdir() if d.name.isdigit()]
            if not rounds:
                continue
            pos = position(job_dir.name)
            for d in rounds:
                if pos is None or pos[0] != JobStatus.RUNNING or int(d.name) < pos[1]:
                    shutil.rmtree(d, ignore_errors=True)
