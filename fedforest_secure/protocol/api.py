"""The JSON shapes of the HTTPS API: request bodies the server validates, responses the client
reads.

Request bodies forbid unknown fields. Response models ignore fields they do not name, so a
server that adds a field to a response does not break a client that does not read it; what a
client reads is typed and validated here instead of picked out of a dict.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from ..errors import REFUSAL_CODES

__all__ = [
    "LOCK_WAIT_S",
    "MAX_WAIT_S",
    "NAME_PATTERN",
    "Directory",
    "ErrorBody",
    "Health",
    "JoinBody",
    "JobListEntry",
    "JobStatus",
    "JoinResponse",
    "Me",
    "MemberStatus",
    "RefuseBody",
    "RoundInfo",
    "SecAggStep",
]


#: The longest long poll a request may ask for, in seconds (``?wait=``, ``?next_wait=``): the
#: server answers within the seconds asked, and a client's read timeout is that wait plus a
#: margin for the server's work.
MAX_WAIT_S = 30.0

#: The longest the server waits for a database lock another transaction holds before it fails
#: the statement, in seconds: a PostgreSQL statement's ``lock_timeout``, a SQLite connection's
#: busy timeout. A request that met such a lock may be answered that much later; a client waits
#: for an answer longer than this beyond the long poll it asked for.
LOCK_WAIT_S = 30

#: a site's, an operator's or a job's name: it names files (a site's certificate and key) and
#: appears in URLs
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


class JoinBody(_Request):
    """``POST /v1/jobs/{job}/join``."""

    identity_key: str | None = None  # Ed25519 verify key, 64 hex characters
    #: ``{"cert": PEM, "sig": hex}``: the client's TLS certificate and its signature over
    #: ``job | name | identity key`` (:mod:`fedforest_secure.secagg.directory`)
    identity_cert: dict[str, Annotated[str, Field(max_length=8192)]] | None = None


class _CodedReason(_Request):
    """A body whose only field is a reason code from the class's fixed list ``CODES``."""

    CODES: ClassVar[tuple[str, ...]] = ()
    reason: str

    @field_validator("reason")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in cls.CODES:
            raise ValueError(f"reason must be one of {', '.join(cls.CODES)}")
        return v


class RefuseBody(_CodedReason):
    """``POST /v1/jobs/{job}/rounds/{r}/secagg/refuse``: why the client refuses the round, as a
    code from the fixed list :data:`~fedforest_secure.errors.REFUSAL_CODES` (the client keeps
    the full message in its own log), and, with code ``invalid_message`` only, the client index
    of the peer whose relayed message did not authenticate (``accused``; the server checks it
    is another participant of the round). No free text."""

    CODES = REFUSAL_CODES
    accused: StrictInt | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _accuses_only_on_invalid_message(self) -> RefuseBody:
        if self.accused is not None and self.reason != "invalid_message":
            raise ValueError("accused names a peer only with reason invalid_message")
        return self


#: Why a site declines a job before joining it (the only words of it that reach the server):
#: its table does not fit the job's schema; its schema file is not the job's; the job's
#: privacy profile is not the one it pinned; the job's configuration disagrees with its own;
#: an evaluation job on held-out rows this site already answered another evaluation on; the
#: server runs another version of fedforest-secure than the site.
DECLINE_CODES = ("table", "schema", "profile", "job_config", "evaluated_before", "version")


class DeclineBody(_CodedReason):
    """``POST /v1/jobs/{job}/decline``: why the site will not join the job, as a code from
    :data:`DECLINE_CODES` (the site keeps the full message, which may name its data, in its
    own log)."""

    CODES = DECLINE_CODES


class Health(BaseModel):
    """``GET /health``."""

    model_config = ConfigDict(extra="forbid")
    status: str
    version: str


class Me(BaseModel):
    """``GET /v1/me``."""

    model_config = ConfigDict(extra="forbid")
    name: str


class ErrorBody(BaseModel):
    """Every 4xx: ``{"error": code, "detail": ...}`` plus fields particular to the code (an
    upload refused because its round closed says whether it was ``counted``)."""

    model_config = ConfigDict(extra="allow")
    error: str = ""
    detail: str = ""


class JoinResponse(_Response):
    """The answer to a join: the job's configuration and this client's place in it."""

    client_index: int
    config: dict[str, Any]
    #: the site's name (its certificate's): it names the site's receipts file
    client_name: str | None = Field(default=None, pattern=NAME_PATTERN)
    #: SHA-256 of the job's schema file: the client refuses a different local schema.
    schema_sha256: str | None = None
    #: the server's version of fedforest-secure: a site of another version declines the job
    #: (``None``: a server that does not say)
    server_version: str | None = None


class Directory(_Response):
    """``GET /v1/jobs/{job}/directory``: the clients' Ed25519 identity keys (hex), by index."""

    complete: bool = False
    keys: dict[str, str] = {}
    #: ``{index: {"cert": PEM, "sig": hex}}``: each identity certified with its TLS certificate
    certs: dict[str, dict[str, str]] = {}


class RoundInfo(_Response):
    """One entry of ``GET /v1/jobs/{job}/rounds``."""

    round_id: int
    kind: str
    status: str
    task_digest: str


class SecAggStep(_Response):
    """``GET /v1/jobs/{job}/secagg``: what the client must do now in a secure round.

    ``status`` is ``"task"`` (do ``action`` for ``round_id``), ``"wait"``, or the end of the
    client's part: ``"done"``, ``"failed"``, ``"dropped"`` (``detail`` says why).
    """

    status: str
    detail: str | None = ""
    action: str | None = None
    round_id: int | None = None
    task_digest: str | None = None
    message: str | None = None
    audit_seq: int = 0
    audit_head: str = ""


class JobListEntry(_Response):
    """One entry of ``GET /v1/jobs``: a job this client is invited to."""

    job_id: str
    status: str
    client_index: int
    member_state: str


class MemberStatus(_Response):
    """A member of a job as ``GET /v1/jobs/{job}`` lists it (members see each other's names
    and states, as the audit log's ``client_joined`` and ``client_dropped`` entries do)."""

    name: str
    index: int
    state: str  # "invited" (not joined yet) | "active" | "dropped"
    dropped_round: int | None = None
    #: an invited site that declined the job: why (:data:`DECLINE_CODES`), until it joins;
    #: shown to the operator and to that site only (None to the other sites)
    declined: str | None = None
    #: an invited site whose client the operator revoked (it cannot join until it has a new
    #: token); in the operator's view only (False in a site's)
    revoked: bool = False


class JobStatus(_Response):
    """``GET /v1/jobs/{job}``: where a job is, for ``fedforest status`` and the client's log.

    ``kind`` is ``"train"`` or ``"evaluate"`` (one round, no tree levels: ``level`` and
    ``max_depth`` are None); ``level`` is the depth the trees are being grown at (0 = the
    roots), ``phase`` the step of the open round, ``eta_s`` the server's estimate of the seconds
    left (from the rounds so far; None before there is anything to estimate from, and while the
    open level has overrun the time per level so far: a site stalls it). ``overrun_s`` is how
    long that level has run beyond it, ``deadline_in_s`` the seconds until the open phase's
    deadline, when the sites that have not answered it are dropped (None: no open phase, or a
    server older than these fields).
    """

    job_id: str
    status: str
    kind: str = "train"
    reason: str | None = ""
    round_id: int = -1
    client_index: int | None = None
    member_state: str | None = None
    min_clients: int = 0
    n_clients: int = 0
    joined_clients: int = 0
    active_clients: int = 0
    dropped_clients: int = 0
    members: list[MemberStatus] = []
    profile: str | None = None
    level: int | None = None
    max_depth: int | None = None
    phase: str | None = None
    rounds_done: int = 0
    eta_s: float | None = None
    overrun_s: float | None = None
    deadline_in_s: float | None = None
    model_digest: str | None = None
    #: the job's audit-chain tip when the status was read (0 and "": no audit log)
    audit_seq: int = 0
    audit_head: str = ""
