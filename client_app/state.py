"""What a client keeps on its own disk: receipts of every upload (and local secrets, mode 0600),
and the locks that keep two clients of one job, or two clients of one model file, apart."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fedforest_secure.errors import FedForestError
from fedforest_secure.files import append_line, open_in_place, os_error_text, write_atomic
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
    (the same process included: each open of the file is its own lock). A symbolic link,
    or a file that is not a regular one of one name, is refused (:func:`open_in_place`):
    this truncates the file."""
    try:
        fd = open_in_place(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise FedForestError(f"{os_error_text(exc)}. Nothing was sent to the server") from None
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
    """``root``, made owner-only (0700) if it does not exist. One that exists must be this
    user's and writable by no one else (it keeps its mode otherwise: a working directory
    may be readable); the secrets in it are 0600 each. So must its ``receipts`` folder, and
    every file in that folder must be this user's (the client reads them to know whether it
    uploaded in a job).

    Raises :class:`~fedforest_secure.errors.FedForestError` for a directory another user
    owns or that group or others can write, or reached through a symbolic link another user
    made: they could plant the site's identity key or receipts, or links that turn the
    client's writes onto other files of this user's."""
    try:
        root.mkdir(mode=0o700, parents=True)  # never open to others, whatever the umask
    except FileExistsError:
        pass
    else:
        os.chmod(root, 0o700)  # a umask that takes the owner's own bits
    if os.name == "posix":  # no POSIX owners and modes elsewhere
        _check_private_dir(root)
        _check_receipts(root / "receipts")
    return root


def _check_private_dir(path: Path, *, receipts: bool = False) -> None:
    """Refuse the directory ``path`` (the state directory, or its ``receipts`` folder) unless
    it is this user's, writable by no one else, and not reached through a symbolic link of
    another user's."""
    named = f"the receipts folder {path}" if receipts else f"--state-dir {path}"
    planted = ("receipts of uploads this site never made, or links to this user's files"
               if receipts else "this site's identity key or links to this user's files")
    link = path.lstat()
    if stat.S_ISLNK(link.st_mode) and link.st_uid != os.geteuid():
        raise FedForestError(
            f"{named} is a symbolic link another user (uid {link.st_uid}) made, who can point "
            "it at another directory at any time. "
            + (f"Remove the link (rm {path}; the folder is made again)" if receipts else
               "Name the directory itself (its real path), one of this user's own"))
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise FedForestError(f"{named} is not a directory: name a directory (one "
                             "that does not exist is made, for this user only)")
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid():
        raise FedForestError(
            f"{named} belongs to another user (uid {st.st_uid}), who could put {planted} in "
            "it. " + ("" if receipts else "Give the client a directory of this user's own "
                      "(one that does not exist is made, for this user only), or ")
            + ("M" if receipts else "m") + f"ake this one this user's: chown {_user()} {path}")
    if mode & 0o022:
        whom = "other users of this machine" if mode & 0o002 else "its group"
        raise FedForestError(
            f"{named}: {whom} can write it (mode {mode:04o}), and could put {planted} in "
            f"it. Make it writable by this user only: chmod go-w {path} (chmod 700 {path} "
            "keeps its receipts private too), and remove the files in it this user did not "
            "put there")


def _check_receipts(folder: Path) -> None:
    """The state directory's ``receipts`` folder, if it is one, as the directory itself; and
    each file in it this user's: a receipt another user wrote (a forged record of an upload)
    would make a restarted site answer no rounds."""
    try:
        link = folder.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(link.st_mode) and not stat.S_ISLNK(link.st_mode):
        return  # a file in its place: the receipts cannot be written, which is said then
    _check_private_dir(folder, receipts=True)
    for path in sorted(folder.iterdir()):
        owner = path.lstat().st_uid
        if owner != os.geteuid():
            raise FedForestError(
                f"{path} belongs to another user (uid {owner}), who could have written "
                "receipts of uploads this site never made: the client reads them to know "
                f"whether it uploaded in a job. Remove it (rm {path}) if this site did not "
                "write it, or make it this user's if it did (chown "
                f"{_user()} {path})")


def _user() -> str:
    """The name of the user this process runs as (its uid if it has none)."""
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


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
        """Write the secret ``name`` of the directory, 0600, and check that it is: a file
        system without POSIX permissions (vfat, exFAT, an SMB share) gives every file the
        mode its mount options say, and the secret could be read by others.

        Raises :class:`~fedforest_secure.errors.FedForestError` (the file removed) where the
        file system did not keep it this user's only."""
        path = self.root / name
        write_atomic(path, data, mode=0o600)
        if os.name != "posix":
            return
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            raise FedForestError(
                f"{path} was written for this user only (mode 0600), but its file system "
                f"shows it as mode {mode:04o}: one that keeps no permissions of its own (a "
                "vfat or exFAT drive, an SMB share), where others may read this site's secret "
                "key and chmod cannot help. The file was removed. Give --state-dir a "
                "directory on another file system, or mount this one so that its files are "
                "this user's only (the mount options fmask=077 for vfat or exFAT, "
                "file_mode=0600 for an SMB share)")

    def read_secret(self, name: str) -> bytes | None:
        """The secret ``name`` of the directory, None if there is none. It is a regular file,
        not a link, this user's and readable and writable by it alone: whoever else wrote it
        may know it, and whoever else reads it learns it.

        Raises :class:`~fedforest_secure.errors.FedForestError` otherwise, naming the file
        and what to do."""
        path = self.root / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if os.path.islink(path):
                raise FedForestError(
                    f"{path} is a symbolic link: this site's secret key is read from a file "
                    "of the state directory only, never through a link (whoever made the "
                    "link may know the key it points to). Put the file itself in its place "
                    f"(owned by this user, chmod 600 {path})") from None
            raise FedForestError(f"cannot read {path}: {os_error_text(exc)}") from None
        with os.fdopen(fd, "rb") as fp:
            st = os.fstat(fd)
            problem = _secret_problem(path, st)
            if problem is not None:
                raise FedForestError(problem)
            return fp.read()


def _secret_problem(path: Path, st: os.stat_result) -> str | None:
    """What is wrong with the secret key file ``path`` (``st``: its status), if anything."""
    if not stat.S_ISREG(st.st_mode):
        return (f"{path} is not a regular file, so not this site's secret key: remove it, or "
                "put the key file itself in its place")
    if os.name != "posix":
        return None
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid():
        return (f"{path} belongs to another user (uid {st.st_uid}), who wrote this site's "
                "secret key and may know it, and so sign as this site. If it is the site's "
                f"own key (restored by another user), make it this user's: chown {_user()} "
                f"{path} && chmod 600 {path}")
    if mode & 0o077:
        whom = "other users of this machine" if mode & 0o007 else "its group"
        return (f"{path}: {whom} can read or write it (mode {mode:04o}): whoever reads "
                "this site's secret key can sign as this site, and whoever writes it can put a "
                f"key of their own in its place. Make it this user's only: chmod 600 {path} "
                "(on a file system that keeps no permissions of its own, a vfat or exFAT drive "
                "or an SMB share, chmod cannot: mount it with fmask=077 or file_mode=0600, or "
                "move the state directory to another file system)")
    return None
