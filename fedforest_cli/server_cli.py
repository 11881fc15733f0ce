"""``fedforest server``: run the federation server, register institutions, create jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedforest_secure.errors import FedForestError

from ._common import console, fail

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
           port: Annotated[int | None, typer.Option(help="override the port")] = None) -> None:
    """Start the server (without a sub-command)."""
    if ctx.invoked_subcommand is not None:
        return
    if config is None:
        fail(ValueError("--config server.toml is required"))
    from server_app.serve import run_server
    from server_app.settings import load_settings

    try:
        run_server(load_settings(config), insecure_dev=insecure_dev, port=port)
    except FedForestError as exc:
        fail(exc)


@server_cli.command("add-client")
def add_client_cmd(name: str, config: ConfigOpt) -> None:
    """Register an institution and print its token (shown once; stored hashed)."""
    from server_app.admin import ServerAdmin
    from server_app.auth import TokenError
    from server_app.settings import load_settings

    try:
        with ServerAdmin.from_settings(load_settings(config)) as admin:
            token = admin.add_client(name)
    except (FedForestError, TokenError) as exc:
        fail(exc)
    console.print(f"client [bold]{name}[/bold] registered; give it this token "
                  "(it is not stored and cannot be shown again):")
    print(token)


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
        with ServerAdmin.from_settings(settings) as admin:
            row = admin.create_job(spec)
    except FedForestError as exc:
        fail(exc)
    console.print(f"job [bold]{row.job_id}[/bold] created for {len(spec.clients)} clients "
                  f"(t = {row.min_clients}, round deadline {row.round_deadline_s:.0f}s)")


@server_cli.command("status")
def status_cmd(config: ConfigOpt) -> None:
    """List jobs and their status."""
    from server_app.admin import ServerAdmin
    from server_app.settings import load_settings

    with ServerAdmin.from_settings(load_settings(config)) as admin:
        for job in admin.jobs():
            print(f"{job.job_id}\t{job.status}\tround {job.round_id}\t{job.reason}")
