"""Server configuration, read from a TOML file (``fedforest server --config server.toml``).

Example::

    host = "127.0.0.1"
    port = 8443
    database = "sqlite:///fedforest-server.db"   # any SQLAlchemy URL
    audit_database = "sqlite:///fedforest-audit.db"
    audit_arrays_for_sites = false   # true: members' copy of the log holds every array
    tick_seconds = 0.5
    body_timeout_s = 30.0        # a request body that stalls this long is cut off (408)

    [tls]
    cert = "certs/server.pem"
    key = "certs/server.key"
    client_ca = "certs/ca.pem"    # optional: require client certificates signed by this CA

Relative paths (and relative SQLite files, as ``sqlite:///`` URLs or as ``audit_database``
paths) are resolved against the config file's directory. A SQLite database in memory is
refused: each connection would see a database of its own, gone when it closes.
"""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from fedforest_secure.config_errors import explain
from fedforest_secure.dburl import in_memory, sqlite_file, sqlite_url
from fedforest_secure.errors import FedForestError

__all__ = ["IN_MEMORY", "ConfigError", "ServerSettings", "TLSSettings", "load_settings"]

LOOPBACK = "127.0.0.1"
#: the refusal of SQLite in memory, as a database or an audit log
IN_MEMORY = "an in-memory database keeps nothing; give a file"


class ConfigError(FedForestError, ValueError):
    """A server or job configuration file that does not validate."""


class TLSSettings(BaseModel):
    """The ``[tls]`` table of ``server.toml``."""

    model_config = ConfigDict(extra="forbid")

    cert: Path = Field(description="the server's certificate (PEM), e.g. from `fedforest pki init`")
    key: Path = Field(description="its private key (PEM); keep it readable by the server only")
    client_ca: Path | None = Field(default=None, description=(
        "require client certificates signed by this CA (mutual TLS); absent: tokens only"))


class ServerSettings(BaseModel):
    """``server.toml``."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(default=LOOPBACK, description=(
        'address to listen on ("0.0.0.0": every interface)'))
    port: int = Field(default=8443, ge=1, le=65535,
                      description="TCP port of the HTTPS API")
    database: str = Field(default="sqlite:///fedforest-server.db", description=(
        "SQLAlchemy URL of the server's database (jobs, rounds, tokens); SQLite or "
        "PostgreSQL"))
    audit_database: str | None = Field(default=None, description=(
        "SQLAlchemy URL of the audit log, or a SQLite file's path; absent: no audit log is "
        "kept (the sites finish without model receipts, and say so)"))
    audit_arrays_for_sites: bool = Field(default=False, strict=True, description=(
        "serve the sites the audit log of their job with its arrays (every round's aggregate, "
        "every site's disclosures), so that they can replay the training (`fedforest audit "
        "verify --replay`): n-1 colluding sites then learn the last site's sums, and under "
        "the open profile every site sees the others' disclosures; false: without them (their "
        "SHA-256 digests stay in the chain, so the chain and the receipts verify; the tasks "
        "and an evaluation's result still tell sites what threat_model.md §2.4 lists)"))
    tick_seconds: float = Field(default=0.5, gt=0, le=60, description=(
        "how often round deadlines are checked"))
    max_upload_bytes: int = Field(default=1 << 30, gt=0, description=(
        "largest upload accepted (a bigger one gets 413); each round's uploads are also "
        "capped at the most bytes its task's vector and disclosures can take"))
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600, description=(
        "seconds a request body may stall between two chunks before it is cut off (408)"))
    tls: TLSSettings | None = Field(default=None, description=(
        "the `[tls]` table; required unless the server runs with --insecure-dev on "
        "127.0.0.1"))

    @field_validator("port", "tick_seconds", "max_upload_bytes", "body_timeout_s",
                     mode="before")
    @classmethod
    def _no_bool(cls, v: object) -> object:
        """TOML's ``true`` is no number (pydantic would read it as 1: ``port = true`` was port
        1); a whole float (``max_upload_bytes = 2e9``) is still one."""
        if isinstance(v, bool):
            raise ValueError(f"Input should be a valid number, not {str(v).lower()}")
        return v

    @field_validator("audit_database")
    @classmethod
    def _audit_url_given(cls, value: str | None) -> str | None:
        """An empty URL is a mistake, not "no audit log" (that is leaving the key out); so is
        an audit log in memory (the job `create-job` audited there is gone when it ends)."""
        if value is not None and not value.strip():
            raise ValueError("an empty URL: write the audit log's SQLAlchemy URL, or leave "
                             "audit_database out to keep no audit log")
        if value is not None and in_memory(value):
            raise ValueError(f"{IN_MEMORY}, e.g. sqlite:///fedforest-audit.db, or leave "
                             "audit_database out to keep no audit log")
        return value

    @field_validator("database")
    @classmethod
    def _database_kept(cls, value: str) -> str:
        if in_memory(value):
            raise ValueError(f"{IN_MEMORY}, e.g. sqlite:///fedforest-server.db (each "
                             "connection to SQLite in memory has a database of its own: the "
                             "server would miss its tables, a token printed would be gone)")
        return value

    def resolved(self, base: Path) -> ServerSettings:
        """Resolve relative paths against ``base`` (the config file's directory)."""
        upd: dict[str, object] = {
            "database": _resolve_url(self.database, base),
            "audit_database": (_resolve_url(self.audit_database, base, path_ok=True)
                               if self.audit_database else None),
        }
        if self.tls is not None:
            upd["tls"] = TLSSettings(
                cert=_resolve(self.tls.cert, base), key=_resolve(self.tls.key, base),
                client_ca=_resolve(self.tls.client_ca, base) if self.tls.client_ca else None)
        return self.model_copy(update=upd)


def _resolve(path: Path, base: Path) -> Path:
    return path if path.is_absolute() else (base / path).resolve()


def _resolve_url(url: str, base: Path, *, path_ok: bool = False) -> str:
    """``url`` with a relative SQLite file made absolute against ``base``; with ``path_ok``
    a path (no ``scheme://``, as ``audit_database`` may be) becomes a ``sqlite:///`` URL of
    its file, ``~`` expanded."""
    if path_ok and "://" not in url:
        return sqlite_url(_resolve(Path(url).expanduser(), base))
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError):  # left to the engine's clear error
            return url
        rest = parsed.database or ""
        if rest and rest != ":memory:":
            # the file's path percent-encoded in the URL: a ? or % of base stays its own
            return parsed.set(database=str(_resolve(Path(rest), base))).render_as_string(
                hide_password=False)
    return url


def load_settings(path: Path) -> ServerSettings:
    """Read and validate ``server.toml``; any defect is a :class:`ConfigError`."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark allowed
    except FileNotFoundError as exc:
        raise ConfigError(f"server config not found: {path}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"invalid server config {path}: {exc}") from exc
    except OSError as exc:  # a directory, a file this process may not read
        raise ConfigError(f"cannot read the server config {path}: "
                          f"{exc.strerror or exc}") from exc
    try:
        given = ServerSettings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"invalid server config {path}: "
                          f"{explain(exc, ServerSettings, raw)}") from None
    settings = given.resolved(path.resolve().parent)
    _refuse_moved_files(path, given, settings)
    return settings


def _unquoted_file(url: str, base: Path, *, path_ok: bool = False) -> Path | None:
    """The file a relative SQLite ``url`` (or ``audit_database`` path) named when its
    resolved path was pasted into ``sqlite:///`` as it was, as earlier versions did (no
    percent encoding): a ``?`` of ``base`` started the URL's query, a ``%41`` was read as
    ``A``. None for a URL not resolved against ``base``."""
    if path_ok and "://" not in url:
        pasted = "sqlite:///" + str(_resolve(Path(url).expanduser(), base))
    elif url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        pasted = "sqlite:///" + str(_resolve(Path(url[len("sqlite:///"):]), base))
    else:
        return None
    try:
        database = make_url(pasted).database
    except (ArgumentError, ValueError):
        return None
    return Path(database) if database else None


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(16) == b"SQLite format 3\x00"
    except OSError:  # a directory, gone, unreadable: no database the server kept there
        return False


def _refuse_moved_files(path: Path, given: ServerSettings, settings: ServerSettings) -> None:
    """Refuse a relative SQLite database that earlier versions kept outside the config's
    directory (its name held a ``?`` or ``%xx``; see :func:`_unquoted_file`) when that file is
    there and the one beside server.toml is not: the server would start on a new, empty
    database (its sites' tokens, its jobs, its audit chain left behind)."""
    base = path.resolve().parent
    moved: list[tuple[str, str, Path, Path]] = []
    for key, url, resolved, path_ok in (
            ("database", given.database, settings.database, False),
            ("audit_database", given.audit_database, settings.audit_database, True)):
        if url is None or resolved is None:
            continue
        old, new = _unquoted_file(url, base, path_ok=path_ok), sqlite_file(resolved)
        if (old is not None and new is not None and old != new and _is_sqlite(old)
                and not new.exists()):
            moved.append((key, url, old, new))
    if not moved:
        return
    said = "; ".join(f"{key} {url!r} is {new}, which does not exist, while {old}, the file "
                     "earlier versions opened for it, does" for key, url, old, new in moved)
    olds = [old for _, _, old, _ in moved]
    steps: list[str] = []
    for k, (key, _, old, new) in enumerate(moved):
        # one file kept both databases: copied to the first, moved to the last; with it its
        # write-ahead log (committed steps a server that was stopped hard did not write back)
        # and, for the server's database, the spool of an open secure round's masked uploads
        verb = "cp" if olds[k + 1:].count(old) else "mv"
        pairs = [(old, new)] + [(Path(f"{old}{end}"), Path(f"{new}{end}"))
                                for end in ("-wal", "-shm") if Path(f"{old}{end}").exists()]
        for src, dst in pairs:
            steps.append(f"{verb} {shlex.quote(str(src))} {shlex.quote(str(dst))}")
        spool = Path(f"{old}.spool")
        if key == "database" and spool.is_dir():
            steps.append(f"mv {shlex.quote(str(spool))} {shlex.quote(f'{new}.spool')}")
    commands = " && ".join(steps)
    raise ConfigError(
        f"server config {path}: {said} (earlier versions read a '?' or '%' in the config "
        f"directory's name as part of the URL). Move the file into the config's directory to "
        f"keep the server's data: `{commands}`; if it is another server's, give this one's "
        "as an absolute URL: " + ", ".join(f"{key} = \"{sqlite_url(new)}\""
                                           for key, _, _, new in moved)
        + ". Nothing was opened.")
