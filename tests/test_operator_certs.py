"""`fedforest pki` keeps a site's certificate and an operator's apart
(``fedforest_secure/_operator_certs.py``): a renewal keeps a certificate's kind unless told
otherwise, a file that holds no certificate of its name is renewed as the flag given says, and
every command an error names does what the user wants when run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from test_pki_cli import _pki
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_secure.pki import (
    is_operator_certificate,
    issue_certificate,
    load_ca,
    load_certificate,
)


def _run_hint(out: str, which: int = 0) -> tuple[int, str]:
    """Run the ``which``-th `fedforest ...` command an error names (between backquotes)."""
    commands = re.findall(r"`(fedforest pki [^`]+)`", out)
    assert len(commands) > which, out
    res = CliRunner().invoke(app, shlex.split(commands[which])[1:])
    return res.exit_code, res.output.replace("\n", "")


def _files(certs: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in certs.iterdir()}


@pytest.fixture
def certs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FEDFOREST_P12_PASSWORD", "pw")
    where = tmp_path / "certs"
    assert _pki("init", "--out", str(where), "--name", "hospital-a", "--name",
                "hospital-b")[0] == 0
    return where


def test_a_sites_certificate_becomes_an_operators_only_when_asked(certs: Path) -> None:
    """`--renew --operator` on a site's certificate would leave that site unable to take part
    in a secure job: refused, nothing moves, naming the command that renews it as a site's;
    with --from-site it becomes an operator's (a browser's certificate issued as a site's)."""
    before = _files(certs)
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "hospital-a", "--renew",
                     "--operator", "--p12")
    assert code == 2, out
    assert out == (
        f"error: {certs / 'hospital-a.pem'} is a site's certificate: renewed with --operator "
        "it would certify no site, and that site could take part in no secure job. "
        f"`fedforest pki issue --ca-dir {certs} --name hospital-a --renew` renews it as a "
        "site's; a browser's certificate issued as a site's (without --operator) becomes an "
        "operator's with --from-site added (nothing was written)")
    assert _files(certs) == before
    code, out = _run_hint(out)
    assert code == 0 and "1 client certificate(s) signed by" in out, out
    assert not is_operator_certificate(load_certificate(certs / "hospital-a.pem"))
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "hospital-b", "--from-site")
    assert code == 2 and out == (
        "error: --from-site goes with --renew --operator: it makes a certificate issued as a "
        "site's an operator's (nothing was written)"), out
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "hospital-b", "--renew",
                     "--operator", "--from-site", "--p12")
    assert code == 0, out
    assert is_operator_certificate(load_certificate(certs / "hospital-b.pem"))
    assert (certs / "hospital-b.p12").exists()


def test_every_command_a_p12_refusal_names_gives_the_browser_its_bundle(certs: Path) -> None:
    """`pki p12 --name <site>` names the command that gives the operator's browser its
    bundle, whatever the directory holds already (nothing; the operator's certificate without
    its bundle; both), and never one that turns the site's certificate into an operator's
    unasked."""
    site = certs / "hospital-a.pem"
    said = (f"error: {site} is not an operator's certificate: a browser's bundle holds an "
            "operator's only (a site's would certify an identity in secure jobs); {}; a "
            "browser's certificate issued as a site's (without --operator) becomes an "
            f"operator's with `fedforest pki issue --ca-dir {certs} --name hospital-a --renew "
            "--operator --from-site --p12`, and no longer certifies a site")
    code, out = _pki("p12", "--ca-dir", str(certs), "--name", "hospital-a")
    assert code == 2 and out == said.format(
        f"`fedforest pki issue --ca-dir {certs} --name operator --operator --p12` issues the "
        "operator's certificate and its bundle"), out
    assert _run_hint(out)[0] == 0
    assert is_operator_certificate(load_certificate(certs / "operator.pem"))
    assert (certs / "operator.p12").exists()
    assert not is_operator_certificate(load_certificate(site))
    code, out = _pki("p12", "--ca-dir", str(certs), "--name", "hospital-a")
    assert code == 2 and out == said.format(
        f"{certs / 'operator.p12'} is the operator's browser bundle"), out
    (certs / "operator.p12").unlink()
    code, out = _pki("p12", "--ca-dir", str(certs), "--name", "hospital-a")
    assert code == 2 and out == said.format(
        f"`fedforest pki p12 --ca-dir {certs} --name operator` bundles the operator's "
        "certificate"), out
    assert _run_hint(out)[0] == 0 and (certs / "operator.p12").exists()


@pytest.mark.parametrize("command", ["p12", "issue"])
def test_an_operator_certificate_issued_as_a_sites_is_named_with_the_command_that_renews_it(
        certs: Path, command: str) -> None:
    """operator.pem issued without the operator purpose (before it existed): `pki p12` and
    `pki issue --name operator --renew` each name a command that makes it an operator's, and
    running it does."""
    ca = load_ca(certs / "ca.pem", certs / "ca.key")
    issue_certificate(ca, "operator", server=False).write(certs / "operator.pem",
                                                         certs / "operator.key")
    before = _files(certs)
    if command == "p12":
        code, out = _pki("p12", "--ca-dir", str(certs), "--name", "operator")
        how = (f"{certs / 'operator.pem'} is not an operator's certificate: a browser's bundle "
               "holds an operator's only (a site's would certify an identity in secure jobs); "
               f"`fedforest pki issue --ca-dir {certs} --name operator --renew --operator "
               "--p12` makes it one (the old files are kept aside)")
    else:
        code, out = _pki("issue", "--ca-dir", str(certs), "--name", "operator", "--renew")
        how = ("'operator' names an operator's certificate, never a site's: `fedforest pki "
               f"issue --ca-dir {certs} --name operator --operator --renew` renews it as one "
               "(for a browser on the operator page; it certifies no site)")
    assert code == 2 and out == f"error: {how}", out
    assert _files(certs) == before
    code, out = _run_hint(out)
    assert code == 0, out
    assert is_operator_certificate(load_certificate(certs / "operator.pem"))
    assert len(list(certs.glob("operator.pem.replaced-*"))) == 1
    assert (certs / "operator.p12").exists() is (command == "p12")


@pytest.mark.parametrize("held", ["key", "garbage", "other site", "operator's"])
@pytest.mark.parametrize("operator", [False, True])
def test_a_file_that_holds_no_certificate_of_its_name_is_renewed_as_the_flag_says(
        certs: Path, held: str, operator: bool) -> None:
    """Files mixed up or damaged are a reason to renew: a <name>.pem that holds the key, no
    PEM at all, or another name's certificate (a site's or an operator's) is replaced by a
    certificate of the kind the command asks for, the old file kept aside."""
    pem = certs / "hospital-a.pem"
    if held == "key":
        pem.write_bytes((certs / "hospital-a.key").read_bytes())
    elif held == "garbage":
        pem.write_bytes(b"garbage\n")
    elif held == "other site":
        pem.write_bytes((certs / "hospital-b.pem").read_bytes())
    else:
        assert _pki("issue", "--ca-dir", str(certs), "--name", "operator", "--operator")[0] == 0
        pem.write_bytes((certs / "operator.pem").read_bytes())
    old = pem.read_bytes()
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "hospital-a", "--renew",
                     *(["--operator"] if operator else []))
    assert code == 0, out
    kind = "operator" if operator else "client"
    # a site's key made on the CA's side is named, to be sent and deleted there
    made_here = "" if operator else (
        f"these sites' private keys were made here: {certs / 'hospital-a.key'}. Send each to "
        "its site over a secure channel, then delete the copies here (and "
        "<name>.key.replaced-*): whoever holds a site's key can play that site in a secure "
        "job. A site that keeps its own key makes it with `fedforest pki request`, and "
        "`fedforest pki sign` signs its request")
    assert out == f"1 {kind} certificate(s) signed by {certs / 'ca.pem'}: {pem}{made_here}"
    assert is_operator_certificate(load_certificate(pem)) is operator
    (kept,) = certs.glob("hospital-a.pem.replaced-*")
    assert kept.read_bytes() == old
