"""The ``fedforest`` command: ``server``, ``client``, ``pki``, ``simulate``, ``compare``,
``audit``, ``evaluate``, ``cross-validate``, and for a site ``schema draft``, ``check``,
``jobs``, ``status``, ``model download``."""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.markup import escape

from fedforest_secure import __version__
from fedforest_secure.errors import FedForestError
from fedforest_secure.printable import printable
from fedforest_secure.startup import lasting_imports

from . import data_cli, site_cli
from ._common import MAX_SEED, console, duration, fail
from .audit_cli import audit_app
from .compare_cli import compare_cmd
from .crossval_cli import cross_validate_cmd
from .evaluate_cli import evaluate
from .interrupts import FedforestGroup, Terminated, how_stopped
from .pki_cli import pki_cli
from .server_cli import server_cli

__all__ = ["app"]

# every sub-command stops on SIGTERM and SIGHUP as on Ctrl-C, and says so (FedforestGroup)
app = typer.Typer(help="FedForest Secure: federated random forests over HTTPS.",
                  no_args_is_help=True, pretty_exceptions_enable=False, cls=FedforestGroup)
app.add_typer(server_cli, name="server")
app.add_typer(pki_cli, name="pki")
app.add_typer(audit_app, name="audit")
app.command(context_settings={"allow_extra_args": True})(evaluate)
app.command("cross-validate")(cross_validate_cmd)
data_cli.register(app)
site_cli.register(app)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"fedforest {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option(
        "--version", "-V", is_eager=True, callback=_print_version,
        help="print fedforest-secure's version and exit")] = False,
) -> None:
    """FedForest Secure: federated random forests over HTTPS."""


# ---------------------------------------------------------------------- client
@app.command()
def client(
    server: Annotated[str, typer.Option(help="https://host:port of the federation server")],
    token: Annotated[str, typer.Option(envvar="FEDFOREST_TOKEN", help="this site's token")],
    job: Annotated[str, typer.Option(help="the job id to join")],
    schema: Annotated[Path, typer.Option(help="the federation's schema file")],
    data: Annotated[Path | None, typer.Option(
        help="the site's CSV table (training jobs)")] = None,
    eval_data: Annotated[Path | None, typer.Option(
        help="the site's held-out rows, a CSV with the same schema (evaluation jobs)")] = None,
    ca: Annotated[Path | None, typer.Option(help="the federation CA certificate (PEM)")] = None,
    cert: Annotated[Path | None, typer.Option(help="client certificate for mTLS")] = None,
    key: Annotated[Path | None, typer.Option(help="client key for mTLS")] = None,
    state_dir: Annotated[Path, typer.Option(
        help="receipts and local state (the site's identity keys): this user's alone, made "
             "0700 if missing; one others can write is refused")] = Path(".fedforest-client"),
    out: Annotated[Path | None, typer.Option(
        help="where to save the model (an evaluation job: its result)")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
    retry_budget: Annotated[float, typer.Option(
        help="seconds to keep retrying", callback=duration("seconds"))] = 300.0,
    profile: Annotated[str | None, typer.Option(
        help="the privacy profile this site accepts (open | secure | secure-dp | path to a "
             "TOML file): the client refuses a job whose profile differs")] = None,
    clients: Annotated[int | None, typer.Option(
        "--clients", min=1,
        help="the number of clients this site knows the job has (agreed out of band): the "
             "client refuses a job whose configuration says otherwise")] = None,
    insecure_dev: Annotated[bool, typer.Option(
        "--insecure-dev", help="allow plain http:// to a loopback server run with "
                               "--insecure-dev (development only)")] = False,
    evaluate_again: Annotated[bool, typer.Option(
        "--evaluate-again",
        help="take part in another evaluation job on held-out rows this site already answered "
             "one on (by default it declines: evaluated_before). The risk: a server that "
             "sums two evaluations over different sets of sites can subtract them and learn "
             "this site's statistics; use it only with a server you trust. A model this site "
             "already scored on the same rows is still refused")] = False,
) -> None:
    """Join a job as one institution and take part until the job ends: train on --data, or
    score an evaluation job's models on --eval-data.

    Progress goes to stderr: a progress bar on a terminal, one plain line per event otherwise
    (waiting for the server or for other sites, each level, dropped sites)."""
    # the client's modules (imported here, not by the other commands) live as long as the
    # process, like the command line's (fedforest_cli.__main__)
    with lasting_imports():
        from client_app.context import ended
        from client_app.log import SiteLog
        from client_app.runner import ClientOptions, run_client
        from client_app.stop import raise_if_asked

    log = SiteLog()
    # SIGTERM (how a service manager stops it) and SIGHUP (the terminal it runs in closed)
    # are Ctrl-C (FedforestGroup): the site leaves the job the same way
    try:
        try:
            res = run_client(ClientOptions(server=server, token=token, job=job, data=data,
                                           schema=schema, ca=ca, cert=cert, key=key,
                                           state_dir=state_dir, model_out=out, quiet=quiet,
                                           retry_budget_s=retry_budget, profile=profile,
                                           insecure_dev=insecure_dev, n_clients=clients,
                                           eval_data=eval_data,
                                           evaluate_again=evaluate_again), log)
        except (FedForestError, ValueError, OSError) as exc:
            raise_if_asked(exc)  # an error met while stopping is the stop
            fail(exc)
    except KeyboardInterrupt as exc:
        how, code = how_stopped(exc)
        # stopped in the middle of a secure round, the site left the job: the secure loop
        # says so, and what became of the job, in a note of the interrupt
        left = getattr(exc, "__notes__", None)
        said = left[-1] if left else (f"this site stopped taking part in job {job}. The same "
                                      "command resumes it")
        with contextlib.suppress(OSError):  # a terminal that closed (SIGHUP) takes no line
            console.print(f"[yellow]{how}[/yellow]: {escape(printable(said))}",
                          soft_wrap=True)  # one line off a terminal too
        raise typer.Exit(code) from None
    if res.status != "done":
        if not res.detail or res.detail not in (log.last_warning or ""):
            # unless the client's last warning said how the job ended: said once
            # the server's reason: its characters that are not printable escaped
            said = printable(ended(res.status, res.detail))
            console.print(f"[yellow]job ended:[/yellow] {escape(said)}", soft_wrap=True)
        raise typer.Exit(3)


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
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="random seed")] = 0,
    max_rows: Annotated[int | None, typer.Option(help="subsample the dataset")] = None,
    round_deadline: Annotated[float, typer.Option(
        help="seconds a client has for each step of a round before it is dropped")] = 60.0,
) -> None:
    """Server + K client processes over HTTPS on 127.0.0.1, then a comparison table. Exits 3
    when a client process did not end done (killed, dropped, failed), naming it."""
    from .simulate import SimulateOptions, run_simulation

    # SIGTERM (`timeout`, a CI job cancel) is Ctrl-C: the server and clients are stopped
    signal.signal(signal.SIGTERM, _terminated_once)
    try:
        res = run_simulation(SimulateOptions(dataset=dataset, clients=clients, alpha=alpha,
                                             profile=profile, out=out, trees=trees,
                                             depth=depth, bins=bins, seed=seed,
                                             max_rows=max_rows, round_deadline=round_deadline))
    except (FedForestError, ValueError, OSError) as exc:
        fail(exc)
    except KeyboardInterrupt as exc:
        how, code = how_stopped(exc)
        console.print(f"[yellow]{how}[/yellow]: the simulation's server and client processes "
                      f"were stopped; what it wrote so far is in {escape(str(out))}",
                      soft_wrap=True)
        raise typer.Exit(code) from None
    failed = res["failed_clients"]
    if failed:  # the job finished without them: not a run that went as it should
        console.print(f"[red]error:[/red] {len(failed)} of {clients} client processes did not "
                      f"end done ({', '.join(e.name for e in failed)}): the model was trained "
                      f"over {escape(res['trained_over'])}", soft_wrap=True)
        raise typer.Exit(3)


def _terminated_once(_signum: int, _frame: FrameType | None) -> None:
    """The first SIGTERM stops the simulation; later ones are ignored, so that they do not
    cut short the stopping of its processes."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


# ---------------------------------------------------------------------- compare
app.command("compare")(compare_cmd)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
