"""The ``fedforest`` command: ``server``, ``client``, ``pki``, ``simulate``, ``compare``,
``audit``, ``evaluate``, ``cross-validate``, and for a site ``schema draft``, ``check``,
``jobs``, ``status``, ``model download``."""

from __future__ import annotations

import contextlib
import os
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
from .server_cli import server_cli

__all__ = ["app"]

# every sub-command stops on SIGTERM and SIGHUP as on Ctrl-C, and says so (FedforestGroup)
app = typer.Typer(help="FedForest Secure: federated random forests over HTTPS.",
                  no_args_is_help=True, pretty_exceptions_enable=False, cls=FedforestGroup)
pki_cli = typer.Typer(help="Development certificates (a CA, a server and client certificates).",
                      no_args_is_help=True)
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


# ---------------------------------------------------------------------- pki
@pki_cli.command("init")
def pki_init(out: Annotated[Path, typer.Option(help="output directory")] = Path("certs"),
             clients: Annotated[int, typer.Option(help="number of client certificates")] = 0,
             host: Annotated[list[str] | None, typer.Option(
                 help="server host names / IPs (default localhost, 127.0.0.1)")] = None,
             name: Annotated[list[str] | None, typer.Option(
                 help="a site's name: writes <name>.pem and <name>.key (repeat for each "
                      "site; default client-0, client-1, ...)")] = None,
             force: Annotated[bool, typer.Option(
                 help="replace a CA (and certificates) already in --out: every certificate "
                      "the old CA signed stops being trusted")] = False) -> None:
    """Create a dev CA, a server certificate and client certificates (never over an existing
    CA without --force; `fedforest pki issue` adds certificates from it)."""
    from fedforest_secure.pki import init_dev_pki

    hosts = tuple(host) if host else ("localhost", "127.0.0.1")
    names = list(name) if name else None
    if names is not None and clients not in (0, len(names)):
        fail(ValueError(f"--clients {clients} but {len(names)} --name options"))
    if out.exists() and not out.is_dir():
        fail(NotADirectoryError(f"--out {out} is a file: name the directory the certificates "
                                "go to"))
    try:
        paths = init_dev_pki(out, len(names) if names else clients, hosts=hosts,
                             client_names=names, overwrite=force)
    except (ValueError, OSError) as exc:
        fail(exc)
    console.print(f"CA {paths.ca_cert}; server {paths.server_cert} for {', '.join(hosts)}; "
                  f"{len(paths.client_certs)} client certificates in {out}", markup=False)


@pki_cli.command("issue")
def pki_issue(ca_dir: Annotated[Path, typer.Option(
                  help="the directory of the federation CA (ca.pem, ca.key)")] = Path("certs"),
              name: Annotated[list[str] | None, typer.Option(
                  help="a site's (or with --operator an operator's) name: writes <name>.pem "
                       "and <name>.key beside the CA (repeat for each)")] = None,
              operator: Annotated[bool, typer.Option(
                  "--operator", help="an operator's certificate, for a browser on the "
                  "operator page (/ui): it opens TLS connections but certifies no site in "
                  "secure jobs; the name 'operator' is issued with --operator only")] = False,
              p12: Annotated[bool, typer.Option(
                  "--p12", help="with --operator, also write <name>.p12 (certificate, key and "
                  "CA in one password-protected file), what a browser imports; the password "
                  "is asked, or read from $FEDFOREST_P12_PASSWORD")] = False,
              renew: Annotated[bool, typer.Option(
                  "--renew", help="give sites that have a certificate a new key and certificate "
                  "of the same name (a lost or leaked key; it never outlasts ca.pem); the old "
                  "files are kept as <name>.pem.replaced-<time> and <name>.key.replaced-<time>"
                  )] = False,
              from_site: Annotated[bool, typer.Option(
                  "--from-site", help="with --renew --operator: make a certificate issued as "
                  "a site's (a browser's made without --operator) an operator's; the site of "
                  "that name then takes part in no secure job")] = False
              ) -> None:
    """Client certificates signed by the existing CA: a site that joins later, or (--operator)
    an operator's browser. Replaces a site's files only with --renew, which keeps them aside."""
    from fedforest_secure.pki import export_pkcs12, issue_client_certificates

    if p12 and not operator:
        fail(ValueError("--p12 bundles an operator's certificate for a browser: add --operator "
                        "(a site's certificate stays a .pem and .key for its client; nothing "
                        "was written)"))
    if from_site and not (renew and operator):
        fail(ValueError("--from-site goes with --renew --operator: it makes a certificate "
                        "issued as a site's an operator's (nothing was written)"))
    password = _p12_password(ca_dir, list(name or []), renew) if p12 else b""
    try:
        written = issue_client_certificates(ca_dir, list(name or []), renew=renew,
                                            operator=operator, from_site=from_site)
        bundles = [export_pkcs12(ca_dir, n, password) for n in (name or [])] if p12 else []
    except (ValueError, OSError) as exc:
        fail(exc)
    kind = "operator" if operator else "client"
    console.print(f"{len(written)} {kind} certificate(s) signed by {ca_dir / 'ca.pem'}: "
                  f"{', '.join(str(p) for p in written)}", markup=False)
    if bundles:
        console.print(f"to import into a browser: {', '.join(str(p) for p in bundles)}",
                      markup=False)


@pki_cli.command("p12")
def pki_p12(ca_dir: Annotated[Path, typer.Option(
                help="the directory of the federation CA and the certificates")] = Path("certs"),
            name: Annotated[list[str] | None, typer.Option(
                help="the name of a certificate issued before (<name>.pem and <name>.key); "
                     "repeat for each")] = None) -> None:
    """Bundle an operator's certificate issued before (`pki issue --operator` without --p12)
    with its key and the CA into <name>.p12, what a browser imports; the password is asked, or
    read from $FEDFOREST_P12_PASSWORD. Never replaces a file; never bundles a site's
    certificate."""
    from fedforest_secure.pki import export_pkcs12, load_operator_certificate

    names = list(name or [])
    if not names:
        fail(ValueError("--name: the certificate to bundle (e.g. --name operator)"))
    try:  # before the password is asked
        for n in names:
            if (ca_dir / f"{n}.pem").is_file():
                load_operator_certificate(ca_dir / f"{n}.pem")
    except ValueError as exc:
        fail(exc)
    password = _p12_password(ca_dir, names)
    try:
        bundles = [export_pkcs12(ca_dir, n, password) for n in names]
    except (ValueError, OSError) as exc:
        fail(exc)
    console.print(f"to import into a browser: {', '.join(str(p) for p in bundles)}",
                  markup=False)


def _p12_password(ca_dir: Path, names: list[str], renew: bool = False) -> bytes:
    """The .p12 files' password (asked, or $FEDFOREST_P12_PASSWORD), before anything is
    written; exits with an error for an empty one or a .p12 already there (unless renewed:
    the renewal moves it aside with the old pair)."""
    there = [ca_dir / f"{n}.p12" for n in names if (ca_dir / f"{n}.p12").exists()]
    if there and not renew:
        fail(FileExistsError(f"{there[0]} exists: nothing was written (a site's files are "
                             "replaced only with --renew, which keeps them aside)"))
    password = os.environ.get("FEDFOREST_P12_PASSWORD", "").encode()
    try:
        password = password or typer.prompt(
            "password of the .p12 file", hide_input=True, confirmation_prompt=True,
            default="", show_default=False).encode()
    except typer.Abort as exc:
        if not isinstance(exc.__context__, EOFError):  # Ctrl-C at the prompt
            raise
        console.print()  # after the prompt's text
        fail(ValueError("no terminal to ask for the .p12 file's password on: set "
                        "FEDFOREST_P12_PASSWORD"))
    if not password:
        fail(ValueError("a .p12 file needs a password"))
    return password


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
