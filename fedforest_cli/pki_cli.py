"""``fedforest pki``: the federation's certificates. ``init`` makes a CA and the server's
certificate; a site makes its own key and a request (``request``), which the CA's keeper signs
(``sign``); ``issue`` makes a key and certificate on the CA's side (an operator's browser or
health probe, or a site in a test set-up), ``p12`` bundles an operator's for a browser, and
``fingerprint`` prints what the sites compare out of band."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from ._common import console, fail

__all__ = ["pki_cli"]

pki_cli = typer.Typer(help="The federation's certificates: a CA, the server's certificate, "
                           "sites' certificates from their own keys' requests.",
                      no_args_is_help=True)


@pki_cli.command("init")
def pki_init(out: Annotated[Path, typer.Option(help="output directory")] = Path("certs"),
             clients: Annotated[int, typer.Option(help="number of client certificates")] = 0,
             host: Annotated[list[str] | None, typer.Option(
                 help="server host names / IPs (default localhost, 127.0.0.1)")] = None,
             name: Annotated[list[str] | None, typer.Option(
                 help="a site's name: writes <name>.pem and <name>.key, the site's key made "
                      "here (repeat for each site; default client-0, client-1, ...; for a "
                      "test or development set-up)")] = None,
             force: Annotated[bool, typer.Option(
                 help="replace a CA (and certificates) already in --out: every certificate "
                      "the old CA signed stops being trusted, and the files of those it "
                      "leaves are moved aside to <name>.pem.replaced-<time> (.key, .p12 "
                      "too)")] = False) -> None:
    """Create the federation CA (ca.pem, ca.key) and the server's certificate, never over an
    existing CA without --force. Each site then makes its own key and request (`fedforest pki
    request`), which `fedforest pki sign` signs with this CA.

    --name and --clients also make sites' keys and certificates here, for a test or
    development set-up: this side then holds the sites' private keys, and must send each
    site its pair over a secure channel, then delete its copies (and <name>.key.replaced-*):
    whoever holds a site's key can play that site in a secure job."""
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
    if paths.moved_aside:
        console.print(
            f"moved aside, as the old CA signed them and no one trusts them now: "
            f"{', '.join(p.name for p in paths.moved_aside)}. Each gets a certificate of the "
            f"new CA: a site from its new request (`fedforest pki sign --ca-dir {out}`), an "
            f"operator's with `fedforest pki issue --ca-dir {out} --name <name> --operator`",
            markup=False, soft_wrap=True)
    _say_site_keys_held(paths.client_keys)


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
    """A key and a certificate signed by the existing CA, both made here: an operator's
    browser or health probe (--operator), or a site of a test or development set-up. Replaces
    a site's files only with --renew, which keeps them aside.

    A site's key made here is held by this side, which must send the site its pair over a
    secure channel, then delete its copies (and <name>.key.replaced-*): whoever holds a
    site's key can play that site in a secure job. A site that keeps its own key makes it
    with `fedforest pki request`, and `fedforest pki sign` signs its request."""
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
    if not operator:
        _say_site_keys_held([p.with_suffix(".key") for p in written])
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
    certificate, nor one that ca.pem did not sign."""
    from fedforest_secure.pki import bundled_certificate, export_pkcs12

    names = list(name or [])
    if not names:
        fail(ValueError("--name: the certificate to bundle (e.g. --name operator)"))
    try:  # before the password is asked
        for n in names:
            if (ca_dir / f"{n}.pem").is_file() and (ca_dir / "ca.pem").is_file():
                bundled_certificate(ca_dir, n)
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


def _say_site_keys_held(keys: list[Path]) -> None:
    """The reminder that the sites' keys ``keys`` were made on the CA's side."""
    if keys:
        console.print(f"these sites' private keys were made here: {', '.join(map(str, keys))}. "
                      "Send each to its site over a secure channel, then delete the copies "
                      "here (and <name>.key.replaced-*): whoever holds a site's key can play "
                      "that site in a secure job. A site that keeps its own key makes it with "
                      "`fedforest pki request`, and `fedforest pki sign` signs its request",
                      markup=False, soft_wrap=True)


@pki_cli.command("request")
def pki_request(name: Annotated[str, typer.Option(
                    help="this site's name, the one its token was made for")],
                out: Annotated[Path, typer.Option(
                    help="where the key and the request go (made 0700 if missing)")
                    ] = Path("certs")) -> None:
    """At a site: make this site's private key (<name>.key, 0600, which never leaves the
    site) and a certificate signing request for it (<name>.csr), to send to whoever keeps the
    federation CA (`fedforest pki sign`). A renewal's request goes into another directory:
    the key in use stays where it is until its new certificate comes back."""
    from fedforest_secure.pki_requests import key_fingerprint, read_request, request_certificate

    if out.exists() and not out.is_dir():
        fail(NotADirectoryError(f"--out {out} is a file: name the directory the key and the "
                                "request go to"))
    try:
        key, csr = request_certificate(out, name)
        _, public = read_request(csr)
    except (ValueError, OSError) as exc:
        fail(exc)
    console.print(f"key {key} (keep it here; it never leaves this site), request {csr}: send "
                  "the request to whoever keeps the federation CA and tell them, out of band "
                  f"(by phone), its key's SHA-256: {key_fingerprint(public)}. Put the "
                  f"certificate that comes back beside the key ({out / (name + '.pem')})",
                  markup=False, soft_wrap=True)


@pki_cli.command("sign")
def pki_sign(csr: Annotated[Path, typer.Option(
                 help="a site's request (<name>.csr, from `fedforest pki request`)")],
             ca_dir: Annotated[Path, typer.Option(
                 help="the directory of the federation CA (ca.pem, ca.key); the certificate "
                      "is written there as <name>.pem")] = Path("certs"),
             renew: Annotated[bool, typer.Option(
                 "--renew", help="sign a new request of a site that has a certificate (a new "
                 "key: a lost or leaked one, a certificate near its end); the old files are "
                 "kept as <name>.pem.replaced-<time> (and a key the CA's side made, "
                 "<name>.key.replaced-<time>)")] = False) -> None:
    """Where the CA is kept: sign a site's request with the federation CA. Checks the
    request's signature and its name by the rules of `pki issue` (a name already issued only
    with --renew) and writes <name>.pem only, the certificate `pki issue` gives a site, for the
    site's own key."""
    from fedforest_secure.pki_requests import key_fingerprint, read_request, sign_request

    try:
        _, public = read_request(csr)
        cert, kept = sign_request(ca_dir, csr, renew=renew)
    except (ValueError, OSError) as exc:
        fail(exc)
    console.print(f"{cert} signed by {ca_dir / 'ca.pem'} for the key of {csr}, whose SHA-256 "
                  f"is {key_fingerprint(public)}: check with the site, out of band, that it "
                  "is its key's, then send it the certificate (and ca.pem)", markup=False,
                  soft_wrap=True)
    keys = [p for p in kept if p.name.startswith(f"{cert.stem}.key.")]
    if kept:
        console.print(f"kept aside: {', '.join(str(p) for p in kept)}"
                      + (f"; {keys[0]} is a key the CA's side made for the site: delete it"
                         if keys else ""), markup=False,
                  soft_wrap=True)


@pki_cli.command("fingerprint")
def pki_fingerprint(files: Annotated[list[Path], typer.Argument(
                        help="PEM files of certificates (ca.pem, a site's <name>.pem, a "
                             "bundle)")]) -> None:
    """Print each certificate's SHA-256 fingerprint (as `openssl x509 -fingerprint -sha256`
    does) and common name: what the sites compare out of band, ca.pem's first of all."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    from fedforest_secure.pki import load_certificate
    from fedforest_secure.pki_requests import certificate_fingerprint

    for path in files:
        try:
            load_certificate(path)  # names what the file holds instead
            certs = x509.load_pem_x509_certificates(path.read_bytes())
        except (ValueError, OSError) as exc:
            fail(exc)
        for cert in certs:
            names = [str(a.value) for a in
                     cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
            typer.echo(f"{path}: {', '.join(names) or '(no common name)'}  SHA-256 "
                       f"{certificate_fingerprint(cert)}")
