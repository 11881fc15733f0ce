"""What a client keeps on its own disk: receipts of every upload (and local secrets, mode 0600),
and the locks that keep two clients of one job, or two clients of one model file, apart."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fedforest_secure.errors import FedForestError
from fedforest_secure.files import append_line, write_atomic
from fedforest_secure.protocol.api import NAME_PATTERN

__all__ = ["ClientState", "check_job_name", "holding_output", "make_state_dir"]

#: the locks this process's clients hold: (state directory, job) and output files (to say
#: that the holder is a client of this process)
_HELD: set[tuple[Path, str]] = set()
_HELD_OUT: set[Path] = set()


def check_job_name(job: str) -> None:
    """The job names files in the state directory (its lock, table digest, key and model):
    a name no job can have is a slip of the site's, said before anything is sent."""
    if not re.fullmatch(NAME_PATTERN, job):
        raise FedForestError(f"--job {job!r} is not a job name (up to 64 letters, digits, "
                             "'_', '.' and '-', starting with a letter or digit): nothing was "
                             "sent to the server")


@contextlib.contextmanager
def _flocked(path: Path, stamp: str, busy: Callable[[str], FedForestError]) -> Iterator[None]:
    """Hold ``path`` (made if missing) with an exclusive lock that dies with the process,
    writing ``stamp`` into it; ``busy(what the holder wrote)`` is raised if another holds it
    (the same process included: each open of the file is its own lock)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy(_stamp_of(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{stamp}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _stamp_of(fd: int) -> str:
    """What the holder of a lock wrote into it (read again if it is still writing it)."""
    for _ in range(3):
        stamp = os.pread(fd, 200, 0).decode(errors="replace").strip()
        if stamp:
            return stamp
        time.sleep(0.05)
    return ""


@contextlib.contextmanager
def holding_output(out: Path, job: str) -> Iterator[None]:
    """Hold the model file ``out`` (``--out``) for a client of ``job`` while it runs: a
    second client naming the same file (another spelling of its path included) would save
    its model over this one's, and both would say they saved theirs. The lock is the file
    ``.<name>.lock`` beside it; it dies with the process, and a rerun once this client has
    ended may overwrite the file.

    Raises :class:`~fedforest_secure.errors.FedForestError` naming the job and the process
    that holds it."""
    target = out.parent.resolve() / out.name

    def busy(stamp: str) -> FedForestError:
        pid, _, other = stamp.partition(" ")
        who = (f"another client in this process (job {other or 'unknown'})"
               if target in _HELD_OUT else
               f"another client process (pid {pid or 'unknown'}, job {other or 'unknown'})")
        return FedForestError(f"--out {out} is being written by {who}: two clients saving to "
                              "one file would overwrite each other's model. Give this one "
                              "another --out, or start it again once the other has ended")

    with _flocked(target.with_name(f".{target.name}.lock"), f"{os.getpid()} {job}", busy):
        _HELD_OUT.add(target)
        try:
            yield
        finally:
            _HELD_OUT.discard(target)


def make_state_dir(root: Path) -> Path:
    """``root``, made owner-only (0700) if it does not exist. A directory the user gave that
    exists keeps its mode (a working directory or a shared folder); the secrets in it are 0600
    each."""
    if not root.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
    return root


class ClientState:
    """A directory of append-only receipts, one JSON object per line, and the secrets and
    records of each job the site takes part in. Clients of different jobs may share it (a
    site in two jobs at once); each job has one client at a time."""

    def __init__(self, root: Path) -> None:
        self.root = make_state_dir(Path(root))

    @contextlib.contextmanager
    def locked(self, job: str) -> Iterator[None]:
        """Hold ``job`` in this directory for this process (the lock file
        ``client-<job>.lock``): a second client of the same job on the same state directory
        (a site started twice) would answer the site's rounds without its round keys, and
        the server would drop the site. Clients of other jobs share the directory. The lock
        dies with the process (a crashed client leaves none).

        Raises :class:`~fedforest_secure.errors.FedForestError` naming the job and the
        process that holds it."""
        check_job_name(job)
        held = (self.root.resolve(), job)

        def busy(stamp: str) -> FedForestError:
            who = ("another client in this process" if held in _HELD
                   else f"another client process (pid {stamp or 'unknown'})")
            return FedForestError(
                f"{who} is running job {job} with --state-dir {self.root}: a site runs one "
                "client per job (a second one would answer the site's rounds without its "
                "round keys). This one stops here and sent nothing; clients of other jobs "
                "may share the directory")

        with _flocked(self.root / f"client-{job}.lock", str(os.getpid()), busy):
            _HELD.add(held)
            try:
                yield
            finally:
                _HELD.discard(held)

    def add_receipt(self, receipt: dict[str, Any]) -> None:
        # one file for all the jobs whose clients share the directory, appended at once
        append_line(self.root / "receipts.jsonl", json.dumps(receipt, sort_keys=True))

    def receipts(self) -> list[dict[str, Any]]:
        path = self.root / "receipts.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def uploaded_in(self, job: str) -> bool:
        """Whether this site's receipts record an upload of ``job``: a sent record (written
        and synced before every upload goes) or an upload's receipt of the job, in any file
        of ``receipts/`` (the server names the file's site, and may name it otherwise at a
        later join). A line damaged past parsing that names the job counts too: it may be
        such a record. A refusal, a model or a failure of the job is no upload."""
        folder = self.root / "receipts"
        if not folder.is_dir():
            return False
        named = json.dumps(job).encode()
        for path in sorted(folder.glob("*.jsonl")):
            if not path.is_file():
                continue
            with path.open("rb") as fp:
                for raw in fp:
                    try:
                        rec = json.loads(raw)
                    except ValueError:  # not UTF-8 or not JSON: read as bytes
                        if named in raw:
                            return True
                        continue
                    # an upload's receipt has no kind; a sent record's is "sent"
                    if isinstance(rec, dict) and rec.get("job_id") == job \
                            and rec.get("kind") in (None, "sent"):
                        return True
        return False

    def write_secret(self, name: str, data: bytes) -> None:
        write_atomic(self.root / name, data, mode=0o600)

    def read_secret(self, name: str) -> bytes | None:
        path = self.root / name
        return path.read_bytes() if path.exists() else None
