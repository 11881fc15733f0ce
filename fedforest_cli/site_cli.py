"""What a site asks the server outside training: ``fedforest jobs``, ``fedforest status``,
``fedforest model download``.

Each command takes the same connection options as ``fedforest client`` (``--server``, ``--ca``,
``--cert``, ``--key``, the token in ``FEDFOREST_TOKEN``) and sees only the jobs the site is a
member of.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fedforest_secure.errors import FedForestError, ProtocolError
from fedforest_secure.files import write_atomic
from fedforest_secure.printable import printable

from ._common import check_output, console, fail

if TYPE_CHECKING:
    from client_app.transport import Transport
    from fedforest_secure.protocol.api import JobStatus

# the commands import the client's transport (httpx, cryptography) and the API's models
# (pydantic) when they run: `fedforest --help` and the other commands start without them

__all__ = ["format_eta", "format_status", "model_cli", "register"]

ServerOpt = Annotated[str, typer.Option(help="https://host:port of the federation server")]
TokenOpt = Annotated[str, typer.Option(envvar="FEDFOREST_TOKEN", help="this site's token")]
CaOpt = Annotated[Path | None, typer.Option(help="the federation CA certificate (PEM)")]
CertOpt = Annotated[Path | None, typer.Option(help="client certificate for mTLS")]
KeyOpt = Annotated[Path | None, typer.Option(help="client key for mTLS")]
DevOpt = Annotated[bool, typer.Option("--insecure-dev", help="allow plain http:// to a "
                                      "loopback server run with --insecure-dev")]

model_cli = typer.Typer(help="The trained model of a job.", no_args_is_help=True)


def _transport(server: str, token: str, ca: Path | None, cert: Path | None, key: Path | None,
               insecure_dev: bool) -> Transport:
    from client_app.transport import Transport

    return Transport(server, token, ca, cert, key, retry_budget_s=10.0,
                     insecure_dev=insecure_dev)


def _site_token(token: str, instead: str) -> None:
    """Exit with an error (code 2), before connecting, when ``token`` is an operator's: it
    opens ``/ui`` only, and ``instead`` says what the operator runs for what the command
    does."""
    if token.startswith("ffo_"):
        fail(ValueError("the token (--token or FEDFOREST_TOKEN) is an operator token (ffo_...): "
                        f"it opens the operator page /ui only, not the sites' requests; {instead}"))


_SERVER_STATUS = ("the operator reads every job with `fedforest server status --config "
                  "server.toml`")


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "unknown yet"
    s = int(round(seconds))
    if s < 90:
        return f"about {s} s"
    if s < 5400:
        return f"about {round(s / 60)} min"
    return f"about {s / 3600:.1f} h"


def format_status(st: JobStatus) -> str:
    """The lines ``fedforest status`` prints; what the server sent (a reason, a site's name)
    with its characters that are not printable escaped (``\\x1b``, ``\\r``), each line one."""
    lines = [f"job {st.job_id}: {st.status}" + (f" ({st.reason})" if st.reason else "")
             + (f", profile {st.profile}" if st.profile else "")]
    dropped = st.dropped_clients or sum(m.state == "dropped" for m in st.members)
    what = "training" if st.kind == "train" else "the evaluation"
    lines.append(f"members: {st.joined_clients} of {st.n_clients} joined, {st.active_clients} "
                 f"active, {dropped} dropped ({what} needs at least {st.min_clients})")
    for m in st.members:
        mark = "  (you)" if m.index == st.client_index else ""
        at = f" at round {m.dropped_round}" if m.state == "dropped" and \
            m.dropped_round is not None else ""
        at += f" (declined: {m.declined})" if m.declined else ""
        lines.append(f"  {m.index:>3}  {m.name:<24} {m.state}{at}{mark}")
    if st.status == "running" or st.round_id >= 0:
        level = "?" if st.level is None else str(st.level)
        depth = f" of {st.max_depth}" if st.max_depth is not None else ""
        phase = f", phase {st.phase}" if st.phase else ""
        where = f"level {level}{depth}, " if st.kind == "train" else ""
        lines.append(f"progress: {where}round {max(st.round_id, 0)}"
                     f"{phase}, {st.rounds_done} rounds done")
    if st.status == "running":
        if st.overrun_s is not None:  # a site stalls the level: no honest estimate
            level = "the open level" if st.level is None else f"level {st.level}"
            lines.append(f"ETA: none while {level} waits: it has run {st.overrun_s:.0f} s "
                         "longer than the levels before it took each")
        else:
            lines.append(f"ETA: {format_eta(st.eta_s)}")
        if st.eta_s is None and st.deadline_in_s is not None:
            phase = f"phase {st.phase}" if st.phase else "the open phase"
            lines.append(
                f"deadline: {phase} closes in {format_eta(st.deadline_in_s)} at the latest; "
                "the sites that have not answered it by then are dropped"
                if st.deadline_in_s > 0 else
                f"deadline: {phase}'s deadline has passed; the sites that have not answered "
                "it are dropped at the server's next step")
    if st.model_digest:
        lines.append(f"{'model' if st.kind == 'train' else 'result'} sha256 {st.model_digest}")
    return "\n".join(printable(line) for line in lines)


def register(app: typer.Typer) -> None:
    """Add ``jobs``, ``status`` and ``model`` to the ``fedforest`` command."""

    @app.command("jobs")
    def jobs_cmd(server: ServerOpt, token: TokenOpt, ca: CaOpt = None, cert: CertOpt = None,
                 key: KeyOpt = None, insecure_dev: DevOpt = False) -> None:
        """The jobs this site is a member of."""
        from pydantic import ValidationError

        from fedforest_secure.protocol.api import JobListEntry

        _site_token(token, _SERVER_STATUS)

        try:
            tr = _transport(server, token, ca, cert, key, insecure_dev)
            try:
                raw = tr.get_json("/v1/jobs")
            finally:
                tr.close()
            entries = [JobListEntry.model_validate(e) for e in raw]
        except ValidationError:
            fail(ProtocolError("malformed job list from the server"))
        except (FedForestError, ValueError, OSError) as exc:
            fail(exc)
        if not entries:
            console.print("this site is not a member of any job")
            return
        print(f"{'JOB':<28} {'STATUS':<10} {'INDEX':>5}  YOUR STATE")
        for e in entries:
            print(printable(f"{e.job_id:<28} {e.status:<10} {e.client_index:>5}  "
                            f"{e.member_state}"))

    @app.command("status")
    def status_cmd(job: Annotated[str, typer.Option(help="the job id")], server: ServerOpt,
                   token: TokenOpt, ca: CaOpt = None, cert: CertOpt = None,
                   key: KeyOpt = None, insecure_dev: DevOpt = False) -> None:
        """Members (joined, active, dropped), level, round, phase and ETA of a job."""
        from pydantic import ValidationError

        from fedforest_secure.protocol.api import JobStatus

        _site_token(token, _SERVER_STATUS)

        try:
            tr = _transport(server, token, ca, cert, key, insecure_dev)
            try:
                st = JobStatus.model_validate(tr.get_json(f"/v1/jobs/{job}"))
            finally:
                tr.close()
        except ValidationError:
            fail(ProtocolError("malformed job status from the server"))
        except (FedForestError, ValueError, OSError) as exc:
            fail(exc)
        print(format_status(st))

    @model_cli.command("download")
    def download_cmd(job: Annotated[str, typer.Option(help="the job id")],
                     out: Annotated[Path, typer.Option(help="where to write the model")],
                     server: ServerOpt, token: TokenOpt, ca: CaOpt = None,
                     cert: CertOpt = None, key: KeyOpt = None,
                     insecure_dev: DevOpt = False,
                     force: Annotated[bool, typer.Option(
                         help="replace an existing --out file")] = False) -> None:
        """Download a finished job's model (what FedForestClassifier/Regressor.load read);
        an existing --out file is kept unless --force."""
        from client_app.downloads import fetch_result

        _site_token(token, "the operator writes a job's model from the server's database "
                    f"with `fedforest server model --config server.toml --job {job} --out "
                    f"{out}`")
        check_output(out, force=force)
        try:
            tr = _transport(server, token, ca, cert, key, insecure_dev)
            try:
                got = fetch_result(tr, job)  # checked against the job's digest, parsed
            finally:
                tr.close()
            write_atomic(out, got.body)
        except (FedForestError, ValueError, OSError) as exc:
            fail(exc)
        what = "model"
        if got.kind == "evaluation":
            what = "evaluation result (its models' scores, not a model to load)"
        console.print(f"{what} of job {job} written to {out} (sha256 {got.digest})",
                      soft_wrap=True, markup=False)  # the digest on one line, to copy whole

    app.add_typer(model_cli, name="model")

    from .audit_cli import audit_app

    @audit_app.command("download")
    def audit_download_cmd(job: Annotated[str, typer.Option(help="the job id")],
                           out: Annotated[Path, typer.Option(
                               help="where to write the job's log (JSON lines: .jsonl, or "
                                    ".jsonl.gz compressed)")],
                           server: ServerOpt, token: TokenOpt, ca: CaOpt = None,
                           cert: CertOpt = None, key: KeyOpt = None,
                           insecure_dev: DevOpt = False,
                           force: Annotated[bool, typer.Option(
                               help="replace an existing --out file")] = False) -> None:
        """Download the audit log of a job this site is a member of (a site's own check:
        `fedforest audit verify --db <out> --receipts <state dir>/receipts --job <job>`). The
        server serves it without the rounds' arrays (their digests are in the chain) unless
        its server.toml sets audit_arrays_for_sites = true."""
        from client_app.answers import FILE_MAX

        _site_token(token, "the operator exports a job's log from the audit database with "
                    f"`fedforest audit export --db AUDIT_DATABASE --format jsonl --job {job} "
                    f"--out {out}`")
        check_output(out, force=force)
        try:
            tr = _transport(server, token, ca, cert, key, insecure_dev)
            try:
                body = tr.request("GET", f"/v1/jobs/{job}/audit", limit=FILE_MAX).content
            finally:
                tr.close()
            # `audit verify --db` reads a .jsonl.gz compressed, as `audit export` writes it
            write_atomic(out, gzip.compress(body) if out.name.endswith(".gz") else body)
        except (FedForestError, ValueError, OSError) as exc:
            fail(exc)
        entries = body.count(b"\n")
        note = "" if _holds_arrays(body) else (
            "; without the rounds' arrays, which the server keeps for its operator: their "
            "digests are in the chain, so `fedforest audit verify --receipts` checks it, and "
            "`--replay` needs the whole log the operator exports")
        console.print(f"audit log of job {job} written to {out} ({entries} entries{note})",
                      soft_wrap=True, markup=False)


def _holds_arrays(body: bytes) -> bool:
    """Whether a downloaded audit log holds its entries' arrays (``data`` on every line)."""
    for line in body.splitlines():
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            continue  # not for this message to judge: `audit verify` names a damaged line
        if isinstance(doc, dict) and "data" not in doc:
            return False
    return True
