"""``fedforest server``: run the federation server, register institutions, create and cancel
jobs."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.markup import escape

from fedforest_secure.errors import FedForestError
from fedforest_secure.printable import printable
from fedforest_secure.startup import lasting_imports

from ._common import check_output, console, duration, fail
from ._db_locked import locks_named

if TYPE_CHECKING:
    from fedforest_secure.protocol.api import JobStatus
    from server_app.admin import ServerAdmin
    from server_app.settings import ServerSettings

_T = TypeVar("_T")

__all__ = ["server_cli"]

server_cli = typer.Typer(help="Run the federation server and manage clients and jobs.",
                         invoke_without_command=True)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="server.toml")]


@server_cli.callback()
def server(ctx: typer.Context,
           config: Annotated[Path | None, typer.Option("--config", "-c",
                                                       help="server.toml")] = None,
           insecure_dev: Annotated[bool, typer.Option(
               "--insecure-dev", help="plain HTTP, allowed on 127.0.0.1 only")] = False,
           port: Annotated[int | None, typer.Option(
               min=1, max=65535, help="override the port")] = None) -> None:
    """Start the server (without a sub-command)."""
    if ctx.invoked_subcommand is not None:
        if config is not None:  # `server -c server.toml status`: the sub-command's --config
            ctx.default_map = {**(ctx.default_map or {}),
                               ctx.invoked_subcommand: {"config": str(config)}}
        return
    if config is None:
        fail(ValueError("--config server.toml is required"))
    # the server's own modules (FastAPI, SQLAlchemy, uvicorn) live as long as the process,
    # like the command line's (fedforest_cli.__main__)
    with lasting_imports():
        from server_app.serve import run_server
        from server_app.settings import load_settings

    try:
        with locks_named(config):
            run_server(load_settings(config), insecure_dev=insecure_dev, port=port,
                       config_file=config)
    except FedForestError as exc:
        fail(exc)
    except KeyboardInterrupt:  # Ctrl-C: the server stopped as on SIGTERM, and says so in its log
        raise typer.Exit(130) from None


def _existing(settings: ServerSettings) -> ServerSettings:
    """``settings``, for a command that only reads or trims what the server keeps: a SQLite
    database that is not there is a mistyped ``database`` (it would be created empty), not a
    server without jobs."""
    from fedforest_secure.dburl import sqlite_file

    path = sqlite_file(settings.database) if "://" in settings.database else None
    if path is not None and not path.exists():
        fail(FileNotFoundError(f"no database at {path} (`database` in the server config): is "
                               "the path right? The server creates it when it first starts"))
    return settings


def _admin_does(config: Path, action: Callable[[ServerAdmin], _T], *,
                existing: bool = False) -> _T:
    """``action`` on the server's database (the CLI's one-line error, exit 2, on failure);
    ``existing``: an action on what the database holds already (a token to rotate or
    revoke), for which a SQLite file that is not there is a mistyped ``database``."""
    from server_app.admin import ServerAdmin
    from server_app.auth import TokenError
    from server_app.settings import load_settings

    try:
        settings = load_settings(config)
        with locks_named(config), ServerAdmin.from_settings(
                _existing(settings) if existing else settings) as admin:
            return action(admin)
    except (FedForestError, TokenError) as exc:
        fail(exc)


@server_cli.command("add-client")
def add_client_cmd(name: str, config: ConfigOpt) -> None:
    """Register an institution and print its token (shown once; stored hashed)."""
    token = _admin_does(config, lambda admin: admin.add_client(name))
    console.print(f"client [bold]{name}[/bold] registered; give it this token "
                  "(it is not stored and cannot be shown again):")
    print(token)


@server_cli.command("rotate-token")
def rotate_token_cmd(name: str, config: ConfigOpt) -> None:
    """Give a client a new token (a leaked or lost one); the old one stops working."""
    token = _admin_does(config, lambda admin: admin.rotate_token(name), existing=True)
    console.print(f"client [bold]{name}[/bold] has a new token (the old one stops working; a "
                  "running server forgets it within 30 s); give it this one (it is not stored "
                  "and cannot be shown again):")
    print(token)


@server_cli.command("revoke-client")
def revoke_client_cmd(name: str, config: ConfigOpt) -> None:
    """Revoke a client's token: it can no longer authenticate (its jobs' records stay)."""
    _admin_does(config, lambda admin: admin.revoke_client(name), existing=True)
    console.print(f"client [bold]{name}[/bold] revoked: its token no longer authenticates (a "
                  "running server forgets it within 30 s, and refuses its joins at once); "
                  f"`fedforest server rotate-token {name}` gives it a new one")


@server_cli.command("add-operator")
def add_operator_cmd(name: str, config: ConfigOpt) -> None:
    """Register someone who may read the operator page /ui; prints the token once."""
    token = _admin_does(config, lambda admin: admin.add_operator(name))
    console.print(f"operator [bold]{escape(name)}[/bold] registered; this token opens "
                  "https://<server>/ui (it is not stored and cannot be shown again):")
    print(token)


@server_cli.command("remove-operator")
def remove_operator_cmd(name: str, config: ConfigOpt) -> None:
    """Remove an operator (a leaked or lost token): its token no longer opens /ui."""
    _admin_does(config, lambda admin: admin.remove_operator(name), existing=True)
    console.print(f"operator [bold]{escape(name)}[/bold] removed: its token no longer opens "
                  f"/ui; `fedforest server add-operator {escape(name)}` gives the name a new "
                  "one")


@server_cli.command("create-job")
def create_job_cmd(config: ConfigOpt,
                   job: Annotated[Path, typer.Option("--job", "-j", help="job.toml")]) -> None:
    """Create a job from job.toml (clients, schema, hyper-parameters, profile, deadline)."""
    from server_app.admin import ServerAdmin
    from server_app.jobspec import load_job_spec
    from server_app.settings import load_settings

    try:
        settings = load_settings(config)
        spec = load_job_spec(job)
        with locks_named(config), ServerAdmin.from_settings(settings) as admin:
            row = admin.create_job(spec)
    except FedForestError as exc:
        fail(exc)
    for note in row.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    console.print(f"job [bold]{row.job_id}[/bold] created for {len(spec.clients)} clients "
                  f"(min_clients = {row.min_clients}, round deadline "
                  f"{row.round_deadline_s:.0f}s)")


@server_cli.command("model")
def model_cmd(config: ConfigOpt,
              job: Annotated[str, typer.Option("--job", "-j", help="the job's id")],
              out: Annotated[Path, typer.Option(help="where to write the model")],
              force: Annotated[bool, typer.Option(
                  help="replace an existing --out file")] = False) -> None:
    """Write a done job's model from the server's database (for `fedforest evaluate
    --models`): the bytes a site downloads with `fedforest model download`, whose SHA-256 the
    audit log's model entry holds; an existing --out file is kept unless --force."""
    from client_app.downloads import is_evaluation
    from fedforest_secure.files import write_atomic
    from server_app.settings import load_settings

    try:
        settings = load_settings(config)
    except FedForestError as exc:
        fail(exc)
    _not_the_servers(out, settings, config)
    check_output(out, force=force, inputs=[("--config", config)])
    body, digest = _admin_does(config, lambda admin: admin.model(job), existing=True)
    try:
        write_atomic(out, body)
    except OSError as exc:
        fail(exc)
    what = ("evaluation result (its models' scores, not a model to load)"
            if is_evaluation(body) else "model")
    console.print(f"{what} of job {job} written to {out} (sha256 {digest})",
                  soft_wrap=True, markup=False)  # the digest on one line, to copy whole


def _not_the_servers(out: Path, settings: ServerSettings, config: Path) -> None:
    """Exit with an error (code 2), even with ``--force``, when ``out`` names a file the server
    keeps: its SQLite database or audit log, or the journal SQLite keeps beside either
    (``-wal``, ``-shm``, ``-journal``), however it is named (a symlink, a relative path)."""
    from fedforest_secure.dburl import sqlite_file

    where = printable(str(config))
    for what, key, url in (("database", "database", settings.database),
                           ("audit log", "audit_database", settings.audit_database)):
        kept = sqlite_file(url) if url else None
        if kept is None:
            continue
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = kept.with_name(kept.name + suffix)
            if _same_file(out, path):
                which = (f"the server's {what}" if not suffix else
                         f"{path}, a file SQLite keeps beside the server's {what}")
                fail(ValueError(f"{out} is {which} (`{key}` in {where}): nothing was "
                                "written; write the model elsewhere"))


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (through symlinks and relative paths), or would
    when neither exists yet."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)
    except OSError:  # unreadable: no file of the server's that the command could replace
        return False


@server_cli.command("cancel-job")
def cancel_job_cmd(config: ConfigOpt,
                   job: Annotated[str, typer.Option("--job", "-j", help="the job's id")],
                   wait: Annotated[float, typer.Option(
                       help="seconds to wait for the running server to cancel it",
                       callback=duration("seconds"))] = 60.0) -> None:
    """Cancel a waiting or running job: it fails with the reason "cancelled by the operator".

    The command records the request in the database and the running server fails the job at
    its next check (every 5 ticks): its audit chain ends with its job_failed entry, its sites
    are told at their next poll, and `prune --job` may then delete its rounds. With no server
    running the command fails the job itself (the config's audit_database must hold the job's
    chain)."""
    from server_app.cancel import CANCELLED, CancelError

    out = _admin_does(config, lambda admin: admin.cancel_job(job, wait_s=wait), existing=True)
    if out.reason != CANCELLED:  # it finished on its own meanwhile
        fail(CancelError(f"job {job!r} finished before it was cancelled: it is {out.status}"
                         + (f" ({out.reason})" if out.reason else "")))
    console.print(f"job [bold]{escape(job)}[/bold] cancelled: it failed with the reason "
                  f"{escape(repr(out.reason))}; its sites are told at their next poll")


@server_cli.command("prune")
def prune_cmd(config: ConfigOpt,
              keep_days: Annotated[float | None, typer.Option(
                  help="prune finished jobs whose last round closed more than N days ago",
                  callback=duration("days"))] = None,
              job: Annotated[list[str] | None, typer.Option(
                  help="prune this finished job (repeat for several)")] = None,
              dry_run: Annotated[bool, typer.Option(
                  "--dry-run", help="say what would be deleted, delete nothing")] = False
              ) -> None:
    """Delete the rounds, uploads and spooled vectors of finished jobs.

    The job's status and model stay (sites can still download it); the audit log is never
    touched (export it compressed with `fedforest audit export --db AUDIT_DB --format jsonl
    --job JOB --out JOB.jsonl.gz`)."""
    from server_app.admin import ServerAdmin
    from server_app.settings import load_settings

    if keep_days is None and not job:
        fail(ValueError("give --keep-days N or --job J"))
    from server_app.retention import NotFinished

    try:
        with locks_named(config), ServerAdmin.from_settings(
                _existing(load_settings(config))) as admin:
            out = admin.prune(keep_days=keep_days, job_ids=list(job) if job else None,
                              dry_run=dry_run)
    except NotFinished as exc:  # the cancel command it names, with this server's config
        fail(NotFinished(exc.job_id, exc.status, str(config)))
    except FedForestError as exc:
        fail(exc)
    verb = "would delete" if dry_run else "deleted"
    print(f"{verb} the data of {out.rounds} rounds ({out.bytes / 1e6:.1f} MB of tasks, sums "
          f"and aggregates) of {len(out.jobs)} finished job(s)"
          + (f": {', '.join(out.jobs)}" if out.jobs else ""))
    if out.compact_needs is not None:
        temp, chose = out.compact_temp_dir or (Path("/tmp"), "the default")
        temp_dir = printable(str(temp)) + (
            f" (set by {chose})" if chose != "the default"
            else " (SQLite's default: neither SQLITE_TMPDIR nor TMPDIR names a directory)")
        print(f"the database file was not compacted ({printable(out.not_compacted or '')}): "
              "the deleted data is gone, its space stays in the file until a prune compacts "
              "it; compacting copies the file and needs free space about the file's size "
              f"({out.compact_needs / 1e6:.1f} MB) both on its disk and in SQLite's temporary "
              f"directory {temp_dir}: free that much in both (or set SQLITE_TMPDIR to a "
              "directory with room), then run prune again", file=sys.stderr)
    elif out.not_compacted is not None:
        print(f"the database file was not compacted ({printable(out.not_compacted)}): the "
              "deleted data is gone, its space stays in the file until a prune compacts it; "
              "run prune again when the server is less busy", file=sys.stderr)


def format_jobs(jobs: list[JobStatus]) -> str:
    """The operator's table: one line per job, with a header."""
    rows = [f"{'JOB':<24} {'STATUS':<8} {'ROUND':>5} {'LEVEL':>7} {'PHASE':<9} "
            f"{'JOINED':>6} {'ACTIVE':>6} {'DROPPED':>7}  DETAIL"]
    for st in jobs:
        level = "-" if st.level is None else f"{st.level}/{st.max_depth}"
        waiting = [m.name for m in st.members if m.state == "invited" and not m.declined]
        said = [f"{m.name} declined ({m.declined})" for m in st.members
                if m.state == "invited" and m.declined]
        revoked = [m.name for m in st.members if m.state == "invited" and m.revoked]
        waits = [f"waiting for {', '.join(waiting)}"] if waiting else []
        if revoked:  # a job waits for them in vain: say why, and what lets them join
            note = (f"{revoked[0]} is revoked: it cannot join until `fedforest server "
                    f"rotate-token {revoked[0]}`" if len(revoked) == 1 else
                    f"{', '.join(revoked)} are revoked: they cannot join until `fedforest "
                    "server rotate-token NAME`")
            waits = [f"{waits[0]} ({note})"] if waits else [note]
        detail = st.reason or "; ".join(said + waits)
        rows.append(f"{st.job_id:<24} {st.status:<8} "
                    f"{'-' if st.round_id < 0 else st.round_id:>5} {level:>7} "
                    f"{st.phase or '-':<9} {st.joined_clients:>3}/{st.n_clients:<2} "
                    f"{st.active_clients:>6} {st.dropped_clients:>7}  {detail}")
    return "\n".join(rows)


@server_cli.command("status")
def status_cmd(config: ConfigOpt) -> None:
    """Every job: status, round, level, phase, members joined/active/dropped."""
    from server_app.admin import ServerAdmin
    from server_app.settings import load_settings

    try:
        with locks_named(config), ServerAdmin.from_settings(
                _existing(load_settings(config))) as admin:
            jobs = admin.statuses()
    except FedForestError as exc:
        fail(exc)
    if not jobs:
        console.print("no jobs yet: fedforest server create-job --config ... --job job.toml")
        return
    print(format_jobs(jobs))
