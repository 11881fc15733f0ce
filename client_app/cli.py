"""The ``fedforest`` command line: ``server``, ``client``, ``pki``, ``simulate`` (and ``audit``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from client_app.audit_cli import audit_app
from fedforest_secure.errors import FedForestError

__all__ = ["app"]

app = typer.Typer(help="FedForest Secure: federated random forests over HTTPS.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
server_cli = typer.Typer(help="Run the federation server and manage clients and jobs.",
                         invoke_without_command=True)
pki_cli = typer.Typer(help="Development certificates (a CA, a server and client certificates).",
                      no_args_is_help=True)
app.add_typer(server_cli, name="server")
app.add_typer(pki_cli, name="pki")
app.add_typer(audit_app, name="audit")
console = Console(stderr=True)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="server.toml")]


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(2)


# ---------------------------------------------------------------------- server
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
        _fail(ValueError("--config server.toml is required"))
        return
    from server_app.serve import run_server
    from server_app.settings import load_settings

    try:
        run_server(load_settings(config), insecure_dev=insecure_dev, port=port)
    except FedForestError as exc:
        _fail(exc)


@server_cli.command("add-client")
def add_client_cmd(name: str, config: ConfigOpt) -> None:
    """Register an institution and print its token (shown once; stored hashed)."""
    from server_app.auth import TokenError, add_client
    from server_app.db import Database
    from server_app.settings import load_settings

    try:
        db = Database(load_settings(config).database)
        token = add_client(db, name)
    except (FedForestError, TokenError) as exc:
        _fail(exc)
        return
    console.print(f"client [bold]{name}[/bold] registered; give it this token "
                  "(it is not stored and cannot be shown again):")
    print(token)


@server_cli.command("create-job")
def create_job_cmd(config: ConfigOpt,
                   job: Annotated[Path, typer.Option("--job", "-j", help="job.toml")]) -> None:
    """Create a job from job.toml (clients, schema, hyper-parameters, profile, deadline)."""
    from server_app.audit_hook import open_audit
    from server_app.db import Database
    from server_app.jobspec import load_job_spec
    from server_app.runtime import ServerState
    from server_app.settings import load_settings

    try:
        settings = load_settings(config)
        spec = load_job_spec(job)
        state = ServerState(Database(settings.database), open_audit(settings.audit_database))
        row = state.create_job(spec)
    except FedForestError as exc:
        _fail(exc)
        return
    console.print(f"job [bold]{row.id}[/bold] created for {len(spec.clients)} clients "
                  f"(t = {row.min_clients}, round deadline {row.round_deadline_s:.0f}s)")


@server_cli.command("status")
def status_cmd(config: ConfigOpt) -> None:
    """List jobs and their status."""
    from sqlalchemy import select

    from server_app.db import Database, JobRow
    from server_app.settings import load_settings

    db = Database(load_settings(config).database)
    with db.session() as sess:
        for job in sess.scalars(select(JobRow)):
            print(f"{job.id}\t{job.status}\tround {job.current_round}\t{job.reason}")


# ---------------------------------------------------------------------- client
@app.command()
def client(
    server: Annotated[str, typer.Option(help="https://host:port of the federation server")],
    token: Annotated[str, typer.Option(envvar="FEDFOREST_TOKEN", help="this site's token")],
    job: Annotated[str, typer.Option(help="the job id to join")],
    data: Annotated[Path, typer.Option(help="the site's CSV table")],
    schema: Annotated[Path, typer.Option(help="the federation's schema file")],
    ca: Annotated[Path | None, typer.Option(help="the federation CA certificate (PEM)")] = None,
    cert: Annotated[Path | None, typer.Option(help="client certificate for mTLS")] = None,
    key: Annotated[Path | None, typer.Option(help="client key for mTLS")] = None,
    state_dir: Annotated[Path, typer.Option(help="receipts and local state")] = Path(
        ".fedforest-client"),
    out: Annotated[Path | None, typer.Option(help="where to save the model")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
    retry_budget: Annotated[float, typer.Option(help="seconds to keep retrying")] = 300.0,
    profile: Annotated[str | None, typer.Option(
        help="the privacy profile this site accepts (open | secure | secure-dp | path to a "
             "TOML file): the client refuses a job whose profile differs")] = None,
    insecure_dev: Annotated[bool, typer.Option(
        "--insecure-dev", help="allow plain http:// to a loopback server run with "
                               "--insecure-dev (development only)")] = False,
) -> None:
    """Join a job as one institution and train until the job ends."""
    from .runner import ClientOptions, run_client

    try:
        res = run_client(ClientOptions(server=server, token=token, job=job, data=data,
                                       schema=schema, ca=ca, cert=cert, key=key,
                                       state_dir=state_dir, model_out=out, quiet=quiet,
                                       retry_budget_s=retry_budget, profile=profile,
                                       insecure_dev=insecure_dev))
    except (FedForestError, ValueError, OSError) as exc:
        _fail(exc)
        return
    if res.status != "done":
        console.print(f"[yellow]job ended: {res.status}[/yellow] {res.detail}")
        raise typer.Exit(3)


# ---------------------------------------------------------------------- pki
@pki_cli.command("init")
def pki_init(out: Annotated[Path, typer.Option(help="output directory")] = Path("certs"),
             clients: Annotated[int, typer.Option(help="number of client certificates")] = 0,
             host: Annotated[list[str] | None, typer.Option(
                 help="server host names / IPs (default localhost, 127.0.0.1)")] = None) -> None:
    """Create a dev CA, a server certificate and client certificates."""
    from fedforest_secure.pki import init_dev_pki

    hosts = tuple(host) if host else ("localhost", "127.0.0.1")
    paths = init_dev_pki(out, clients, hosts=hosts)
    console.print(f"CA {paths.ca_cert}; server {paths.server_cert} for {', '.join(hosts)}; "
                  f"{len(paths.client_certs)} client certificates in {out}")


# ---------------------------------------------------------------------- simulate
@app.command()
def simulate(
    dataset: Annotated[str, typer.Option(help="dataset name")] = "breast_cancer",
    clients: Annotated[int, typer.Option(help="number of client processes K")] = 4,
    alpha: Annotated[float, typer.Option(help="Dirichlet heterogeneity")] = 0.5,
    profile: Annotated[str, typer.Option(help="open | secure | secure-dp | path")] = "secure",
    out: Annotated[Path, typer.Option(help="output directory")] = Path("fedforest-run"),
    trees: Annotated[int, typer.Option(help="number of trees T")] = 20,
    depth: Annotated[int, typer.Option(help="maximum depth M")] = 6,
    bins: Annotated[int, typer.Option(help="sketch size B")] = 16,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    max_rows: Annotated[int | None, typer.Option(help="subsample the dataset")] = None,
    round_deadline: Annotated[float, typer.Option(
        help="seconds a client has for each step of a round before it is dropped")] = 60.0,
) -> None:
    """Server + K client processes over HTTPS on 127.0.0.1, then a comparison table."""
    from .simulate import SimulateOptions, run_simulation

    try:
        run_simulation(SimulateOptions(dataset=dataset, clients=clients, alpha=alpha,
                                       profile=profile, out=out, trees=trees, depth=depth,
                                       bins=bins, seed=seed, max_rows=max_rows,
                                       round_deadline=round_deadline))
    except FedForestError as exc:
        _fail(exc)


# ---------------------------------------------------------------------- compare
@app.command()
def compare(
    dataset: Annotated[str | None, typer.Option(
        help="dataset name (breast_cancer, wine, diabetes, ...); or use --csv")] = None,
    epsilons: Annotated[str, typer.Option(
        help="comma-separated DP budgets; inf = the column of the methods without DP")
    ] = "0.5,1,2,4,8,inf",
    seeds: Annotated[int, typer.Option(help="repetitions (seeds 0..n-1)")] = 5,
    clients: Annotated[int, typer.Option(help="clients K of the Dirichlet partition")] = 4,
    alpha: Annotated[float, typer.Option(help="Dirichlet concentration")] = 1.0,
    out: Annotated[Path, typer.Option(help="directory for compare_<name>.png / .csv")
                   ] = Path("docs"),
    csv_path: Annotated[Path | None, typer.Option(
        "--csv", help="a CSV table instead of --dataset")] = None,
    target: Annotated[str | None, typer.Option(help="target column of --csv")] = None,
    client_column: Annotated[str | None, typer.Option(
        help="client column of --csv (its clients replace the Dirichlet partition)")] = None,
    task: Annotated[str, typer.Option(
        help="auto | classification | regression (for --csv)")] = "auto",
    quiet: Annotated[bool, typer.Option(help="no per-fit progress lines")] = False,
) -> None:
    """Utility with and without noise: FedForest profiles vs central DP and plain baselines."""
    from rich.console import Console as _Console

    from fedforest_secure.experiments.compare import (
        format_table,
        load_csv_table,
        parse_epsilons,
        plot,
        run_comparison,
        to_csv,
    )

    try:
        eps = parse_epsilons(epsilons)
        if csv_path is not None:
            if target is None:
                raise ValueError("--csv needs --target")
            data = load_csv_table(csv_path, target, client_column, task)
            name = csv_path.stem
            res = run_comparison(data=data, name=name, epsilons=eps, seeds=seeds,
                                 n_clients=clients, alpha=alpha,
                                 progress=None if quiet else console.print)
        else:
            if dataset is None:
                raise ValueError("give --dataset NAME or --csv FILE --target COL")
            name = dataset
            res = run_comparison(dataset, epsilons=eps, seeds=seeds, n_clients=clients,
                                 alpha=alpha, progress=None if quiet else console.print)
        png = plot(res, out / f"compare_{name}.png")
        csv_file = to_csv(res, out / f"compare_{name}.csv")
    except (FedForestError, ValueError, OSError) as exc:
        _fail(exc)
        return
    out_console = _Console()
    out_console.width = max(out_console.width, 132)
    out_console.print(format_table(res))
    for note in res.settings.get("notes", []):
        console.print(f"note: {note}")
    console.print(f"wrote {png} and {csv_file}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
