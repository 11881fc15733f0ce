"""A throwaway PostgreSQL cluster for the tests marked ``postgres``.

:class:`Cluster` runs ``initdb`` and ``pg_ctl`` in a fresh temporary directory: the server
listens on a unix socket in that directory only (no TCP port), trusts local connections (the
directory is the only way in: mode 0700, owned by the server's user) and runs with ``fsync``
off. PostgreSQL refuses to run as root, so under root the cluster runs as an unprivileged user
(``$FEDFOREST_PG_USER``, else ``postgres`` if the system has it, else ``nobody``); otherwise as
the current user. Each test gets a database of its own (:meth:`Cluster.new_database`).

The server binaries are looked up in ``$FEDFOREST_PG_BIN``, then on ``PATH``, then in Debian's
``/usr/lib/postgresql/<version>/bin`` (the ``postgresql`` package). Without them the tests
skip, saying how to install them, unless ``FEDFOREST_REQUIRE_POSTGRES=1`` (set by ``.ci/run``)
turns the skip into a failure.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

__all__ = ["Cluster", "PostgresUnavailable", "find_bin_dir"]

INSTALL_HINT = ("install PostgreSQL's server binaries (Debian/Ubuntu: `apt-get install "
                "postgresql`; or set FEDFOREST_PG_BIN to the directory holding initdb and "
                "pg_ctl) and the driver (`pip install -e '.[postgres]'`)")
SUPERUSER = "fedforest"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries or no driver on this machine."""


def find_bin_dir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or None."""
    env = os.environ.get("FEDFOREST_PG_BIN")
    candidates = [Path(env)] if env else []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = sorted((d for d in debian.iterdir() if d.name.isdigit()),
                          key=lambda d: int(d.name), reverse=True)
        candidates += [d / "bin" for d in versions]
    for d in candidates:
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file():
            return d
    return None


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged user the cluster runs as when we are root (None: ourselves)."""
    if os.geteuid() != 0:
        return None
    names = [os.environ.get("FEDFOREST_PG_USER", ""), "postgres", "nobody"]
    for name in names:
        if not name:
            continue
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            if entry.pw_uid != 0:
                return entry
    raise PostgresUnavailable("running as root and found no unprivileged user to run "
                              "PostgreSQL as (set FEDFOREST_PG_USER)")


class Cluster:
    """One running PostgreSQL server in a temporary directory; :meth:`stop` removes it all."""

    def __init__(self) -> None:
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            raise PostgresUnavailable(f"the psycopg driver is missing: {INSTALL_HINT}") from exc
        bindir = find_bin_dir()
        if bindir is None:
            raise PostgresUnavailable(f"no initdb/pg_ctl found: {INSTALL_HINT}")
        self.bindir = bindir
        self.user = _run_as()
        # short: the socket path (<root>/.s.PGSQL.5432) must fit in 107 bytes
        self.root = Path(tempfile.mkdtemp(prefix="ffpg-", dir="/tmp"))
        self.data = self.root / "data"
        self.started = False
        try:
            if self.user is not None:
                os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
            self._pg("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                     "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
            opts = (f"-k {self.root} -c listen_addresses='' -p 5432 -c fsync=off "
                    "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
            self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                     "-w", "-t", "120", "-o", opts, "start")
            self.started = True
        except BaseException:
            self.stop()
            raise

    def _pg(self, tool: str, *args: str) -> None:
        kwargs: dict[str, Any] = {}
        if self.user is not None:
            kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": [],
                      "env": {**os.environ, "HOME": str(self.root)}}
        proc = subprocess.run([str(self.bindir / tool), *args], capture_output=True, text=True,
                              cwd=self.root, check=False, **kwargs)
        if proc.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.is_file() else ""
            raise PostgresUnavailable(f"{tool} failed ({proc.returncode}): {proc.stdout}"
                                      f"{proc.stderr}{tail}")

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of ``database`` (psycopg 3, over the unix socket)."""
        return f"postgresql+psycopg://{SUPERUSER}@/{database}?host={self.root}&port=5432"

    def new_database(self, prefix: str = "t") -> str:
        """Create an empty database and return its SQLAlchemy URL."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(host=str(self.root), port=5432, user=SUPERUSER,
                             dbname="postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.started:
            with contextlib.suppress(PostgresUnavailable):
                self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)
