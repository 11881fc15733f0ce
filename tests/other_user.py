"""Another user of the machine, for the tests of what one local user can do to another's
files: commands run as uid and gid 65534 ("nobody"), in a shared folder both can reach.
Playing another user needs root (the tests run as root here and in CI); elsewhere the tests
that need it are skipped when they first ask for the other user."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

NOBODY = 65534

def as_other_user(*cmd: str) -> None:
    """Run ``cmd`` as the other user (no supplementary groups); it must succeed. The test is
    skipped where this process cannot take another user's id (not root)."""
    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip("playing another user of the machine (setuid) needs root")
    subprocess.run(list(cmd), user=NOBODY, group=NOBODY, extra_groups=[], check=True,
                   cwd="/")


def plant_file(path: Path, data: bytes, mode: int) -> None:
    """The other user writes ``path`` (``data``, ``mode``)."""
    as_other_user("python3", "-c", "import os, sys; p = sys.argv[1]; "
                  "open(p, 'wb').write(bytes.fromhex(sys.argv[2])); "
                  "os.chmod(p, int(sys.argv[3], 8))", str(path), data.hex(), f"{mode:o}")


@pytest.fixture
def shared_folder() -> Iterator[Path]:
    """A folder every user of the machine may write (0777), outside pytest's owner-only
    temporary directories."""
    folder = Path(tempfile.mkdtemp(prefix="fedforest-shared-"))
    os.chmod(folder, 0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
