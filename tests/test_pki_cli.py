"""``fedforest pki``: a second ``init`` never replaces a federation's CA, and ``issue`` adds
certificates signed by the CA that is already there."""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_secure.pki import (
    create_ca,
    issue_certificate,
    load_certificate,
    verify_signed_by,
)


def _pki(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["pki", *args])
    return res.exit_code, res.output.replace("\n", "")  # the console wraps long paths


def test_a_second_init_leaves_the_federation_ca_alone(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    before = {p.name: p.read_bytes() for p in certs.iterdir()}
    code, out = _pki("init", "--out", str(certs), "--name", "hospital-b")
    assert code == 2
    assert "already holds" in out and "ca.pem" in out and "pki issue" in out
    assert {p.name: p.read_bytes() for p in certs.iterdir()} == before


def test_init_with_force_makes_a_new_ca(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--clients", "1")[0] == 0
    old = (certs / "ca.pem").read_bytes()
    assert _pki("init", "--out", str(certs), "--clients", "1", "--force")[0] == 0
    assert (certs / "ca.pem").read_bytes() != old


def test_issue_adds_a_client_certificate_signed_by_the_existing_ca(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    ca_before = (certs / "ca.pem").read_bytes(), (certs / "ca.key").read_bytes()
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "hospital-b", "--name",
                     "hospital-c")
    assert code == 0, out
    assert "2 client certificate(s) signed by" in out
    ca = load_certificate(certs / "ca.pem")
    for name in ("hospital-b", "hospital-c"):
        cert = load_certificate(certs / f"{name}.pem")
        assert verify_signed_by(cert, ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == name
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
        assert (certs / f"{name}.key").stat().st_mode & 0o777 == 0o600
    assert ((certs / "ca.pem").read_bytes(), (certs / "ca.key").read_bytes()) == ca_before


def test_issue_never_replaces_a_site_certificate(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    before = (certs / "hospital-a.key").read_bytes()
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "hospital-a")
    assert code == 2 and "hospital-a.pem" in out
    assert "replaced only with --renew" in " ".join(out.split())
    assert (certs / "hospital-a.key").read_bytes() == before


def test_issue_needs_the_ca_key_that_matches_the_ca_certificate(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    assert _pki("init", "--out", str(one))[0] == 0
    assert _pki("init", "--out", str(two))[0] == 0
    (one / "ca.key").write_bytes((two / "ca.key").read_bytes())
    code, out = _pki("issue", "--ca-dir", str(one), "--name", "operator", "--operator")
    assert code == 2 and "does not match" in out
    assert not (one / "operator.pem").exists()
    (one / "ca.key").unlink()
    code, out = _pki("issue", "--ca-dir", str(one), "--name", "operator", "--operator")
    assert code == 2 and "ca.key" in out


def test_issue_refuses_an_expired_ca_and_caps_a_leaf_at_the_cas_end(tmp_path: Path) -> None:
    """A certificate an expired CA signs never verifies: issuing from one is an error naming
    its dates and what to do, and nothing is written. A live CA's leaf ends no later than
    the CA does."""
    now = _dt.datetime.now(_dt.UTC)
    old = create_ca(now=now - _dt.timedelta(days=400))  # 365 days: expired 35 days ago
    old.write(tmp_path / "ca.pem", tmp_path / "ca.key")
    code, out = _pki("issue", "--ca-dir", str(tmp_path), "--name", "hospital-d")
    assert code != 0 and "the certificate expired on" in out and "pki init --force" in out, out
    assert not (tmp_path / "hospital-d.pem").exists()
    ending = create_ca(now=now - _dt.timedelta(days=300))  # 65 days left
    leaf = issue_certificate(ending, "hospital-e", server=False)
    assert leaf.cert.not_valid_after_utc == ending.cert.not_valid_after_utc


def test_init_into_a_file_says_out_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("a file")
    code, out = _pki("init", "--out", str(tmp_path / "ca.pem"))
    assert code == 2 and f"--out {tmp_path / 'ca.pem'} is a file" in out, out


def test_issue_from_a_ca_not_valid_yet_points_at_the_clock_not_a_new_ca(tmp_path: Path) -> None:
    future = create_ca(now=_dt.datetime.now(_dt.UTC) + _dt.timedelta(hours=2))
    future.write(tmp_path / "ca.pem", tmp_path / "ca.key")
    code, out = _pki("issue", "--ca-dir", str(tmp_path), "--name", "hospital-d")
    assert code != 0 and "is this machine's clock right?" in out, out
    assert "would not verify yet" in out and "pki init --force" not in out


def test_issue_p12_writes_what_a_browser_imports_with_the_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pki issue --name operator --operator --p12`: operator.p12 holds the certificate, its
    key and the CA, opens with the password only, and is private; without a password, or over
    an existing .p12, nothing is written."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    monkeypatch.setenv("FEDFOREST_P12_PASSWORD", "s3cret")
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "operator", "--operator",
                     "--p12")
    assert code == 0, out
    assert f"to import into a browser: {certs / 'operator.p12'}" in out
    data = (certs / "operator.p12").read_bytes()
    assert (certs / "operator.p12").stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValueError):
        pkcs12.load_key_and_certificates(data, b"wrong")
    key, cert, extra = pkcs12.load_key_and_certificates(data, b"s3cret")
    assert cert is not None and cert == load_certificate(certs / "operator.pem")
    assert key is not None and key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()) == serialization.load_pem_private_key(
        (certs / "operator.key").read_bytes(), None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    assert extra == [load_certificate(certs / "ca.pem")]
    # a .p12 already there: refused before the certificate is issued
    (certs / "alice.p12").write_bytes(b"mine")
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "alice", "--operator", "--p12")
    assert code == 2 and "alice.p12 exists: nothing was written" in out
    assert not (certs / "alice.pem").exists()
    monkeypatch.delenv("FEDFOREST_P12_PASSWORD")
    res = CliRunner().invoke(app, ["pki", "issue", "--ca-dir", str(certs), "--name", "bob",
                                   "--operator", "--p12"], input="\n\n")
    assert res.exit_code == 2 and "needs a password" in res.output
    assert not (certs / "bob.pem").exists()


def test_p12_bundles_a_certificate_issued_before(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`pki p12 --name operator` for an operator's certificate `pki issue --operator` wrote
    without --p12: the bundle opens with the password and holds that certificate; a missing
    certificate is an error."""
    from cryptography.hazmat.primitives.serialization import pkcs12

    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    assert _pki("issue", "--ca-dir", str(certs), "--name", "operator", "--operator")[0] == 0
    monkeypatch.setenv("FEDFOREST_P12_PASSWORD", "pw")
    code, out = _pki("p12", "--ca-dir", str(certs), "--name", "operator")
    assert code == 0, out
    _, cert, _ = pkcs12.load_key_and_certificates((certs / "operator.p12").read_bytes(), b"pw")
    assert cert == load_certificate(certs / "operator.pem")
    code, out = _pki("p12", "--ca-dir", str(certs), "--name", "operator")
    assert code == 2 and "operator.p12 exists" in out
    code, out = _pki("p12", "--ca-dir", str(certs), "--name", "nobody")
    assert code == 2 and "nobody.pem not found" in out


def _rsa_ca(root: Path) -> None:
    """``root/ca.pem`` and ``root/ca.key``: a self-signed RSA CA (an institution's own)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "RSA CA")])
    now = _dt.datetime.now(_dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(hours=1))
            .not_valid_after(now + _dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    (root / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (root / "ca.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))


def test_issue_from_an_rsa_ca_says_only_ec_ca_keys_are_supported(tmp_path: Path) -> None:
    """Not "ca.key does not match the CA certificate": it does."""
    _rsa_ca(tmp_path)
    code, out = _pki("issue", "--ca-dir", str(tmp_path), "--name", "hospital-d")
    assert code == 2, out
    assert f"{tmp_path / 'ca.key'}: an RSA key; `fedforest pki issue` signs with EC CA keys " \
           "only (P-256, as `fedforest pki init` makes)" in out, out
    assert "does not match" not in out
    assert not (tmp_path / "hospital-d.pem").exists()


@pytest.mark.parametrize("part", ["ca.pem", "ca.key"])
@pytest.mark.parametrize("form", ["garbage", "DER"])
def test_issue_names_a_ca_file_that_is_not_pem(tmp_path: Path, part: str, form: str) -> None:
    """Not cryptography's "Unable to load PEM file ... MalformedFraming", which names no
    file: the file, what it holds, and for DER how to convert it."""
    from cryptography.hazmat.primitives import serialization

    ca = create_ca()
    ca.write(tmp_path / "ca.pem", tmp_path / "ca.key")
    if form == "garbage":
        (tmp_path / part).write_text("not a certificate\n")
    elif part == "ca.pem":
        (tmp_path / part).write_bytes(ca.cert.public_bytes(serialization.Encoding.DER))
    else:
        (tmp_path / part).write_bytes(ca.key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    code, out = _pki("issue", "--ca-dir", str(tmp_path), "--name", "hospital-d")
    assert code == 2, out
    what = "certificate" if part == "ca.pem" else "private key"
    assert f"error: {tmp_path / part}: not a PEM {what}" in out, out
    assert "MalformedFraming" not in out and "Unable to load" not in out
    if form == "DER":
        tool = "x509" if part == "ca.pem" else "pkey"
        assert f"it is DER: `openssl {tool} -inform der -in {tmp_path / part}" in out, out
    assert not (tmp_path / "hospital-d.pem").exists()


@pytest.mark.parametrize("command", ["issue", "p12"])
def test_a_p12_password_with_no_terminal_to_ask_on_names_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    """Run from a script (stdin at its end) without $FEDFOREST_P12_PASSWORD: the error says
    to set it, not just "Aborted.", and nothing is written."""
    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    monkeypatch.delenv("FEDFOREST_P12_PASSWORD", raising=False)
    if command == "p12":
        assert _pki("issue", "--ca-dir", str(certs), "--name", "alice", "--operator")[0] == 0
    args = (["issue", "--operator", "--p12", "--name", "operator"] if command == "issue"
            else ["p12", "--name", "alice"])
    res = CliRunner().invoke(app, ["pki", *args, "--ca-dir", str(certs)], input="")
    out = res.output.replace("\n", "")
    assert res.exit_code == 2, out
    assert "error: no terminal to ask for the .p12 file's password on: set " \
           "FEDFOREST_P12_PASSWORD" in out, out
    assert not list(certs.glob("*.p12")) and not (certs / "operator.pem").exists()


def test_issue_renew_gives_a_site_a_new_certificate_of_its_name_and_keeps_the_old(
        tmp_path: Path) -> None:
    """A site's certificate near its end: `--renew` writes a new pair with the same name (the
    site's token is bound to that name) and keeps the old files beside it; a name with no
    pair has nothing to renew."""
    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    old_cert, old_key = (certs / "hospital-a.pem").read_bytes(), \
        (certs / "hospital-a.key").read_bytes()
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "hospital-a", "--renew")
    assert code == 0, out
    new = load_certificate(certs / "hospital-a.pem")
    assert new.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "hospital-a"
    assert verify_signed_by(new, load_certificate(certs / "ca.pem"))
    assert (certs / "hospital-a.pem").read_bytes() != old_cert
    assert (certs / "hospital-a.key").stat().st_mode & 0o777 == 0o600
    kept = sorted(p.name for p in certs.glob("hospital-a.*.replaced-*"))
    assert [k.split(".replaced-")[0] for k in kept] == ["hospital-a.key", "hospital-a.pem"]
    assert (certs / kept[0]).read_bytes() == old_key and (certs / kept[1]).read_bytes() == \
        old_cert
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "hospital-z", "--renew")
    assert code == 2 and "hospital-z.pem not found: --renew replaces a site's existing" in \
        " ".join(out.split())
    assert not (certs / "hospital-z.pem").exists()


def test_renew_with_p12_replaces_the_browser_bundle_and_keeps_the_old(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator's certificate renewed with its browser bundle: the new .p12 holds the new
    certificate, the old one is kept beside it."""
    from cryptography.hazmat.primitives.serialization import pkcs12

    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    monkeypatch.setenv("FEDFOREST_P12_PASSWORD", "s3cret")
    assert _pki("issue", "--ca-dir", str(certs), "--name", "operator", "--operator",
                "--p12")[0] == 0
    old = (certs / "operator.p12").read_bytes()
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "operator", "--operator",
                     "--p12", "--renew")
    assert code == 0, out
    _, cert, _ = pkcs12.load_key_and_certificates((certs / "operator.p12").read_bytes(),
                                                  b"s3cret")
    assert cert == load_certificate(certs / "operator.pem")
    (kept,) = certs.glob("operator.p12.replaced-*")
    assert kept.read_bytes() == old


def test_a_renewal_refused_for_one_name_moves_nothing(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sites renewed in the same second as a renewal of one of them (the clock held
    still): refused before any file moves (every target is checked first), so both pairs stay
    where they were."""
    import datetime as dt

    import fedforest_secure.pki as pki
    from fedforest_secure.pki import issue_client_certificates

    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a", "--name",
                "hospital-b")[0] == 0
    still = dt.datetime.now(dt.UTC)
    monkeypatch.setattr(pki, "_now", lambda: still)
    issue_client_certificates(certs, ["hospital-b"], renew=True)
    before = {p.name: p.read_bytes() for p in certs.iterdir()}
    with pytest.raises(FileExistsError, match="renewed within the same second"):
        issue_client_certificates(certs, ["hospital-a", "hospital-b"], renew=True)
    assert {p.name: p.read_bytes() for p in certs.iterdir()} == before


def test_issue_operator_writes_a_browser_certificate_that_is_no_sites(tmp_path: Path) -> None:
    """`pki issue --operator`: a client certificate (clientAuth, for the browser's TLS) that
    also holds the FedForest operator purpose, under X.667's 2.25 arc."""
    from fedforest_secure.pki import OPERATOR_PURPOSE, is_operator_certificate

    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "operator", "--operator")
    assert code == 0, out
    assert f"1 operator certificate(s) signed by {certs / 'ca.pem'}: {certs / 'operator.pem'}" \
        in out, out
    cert = load_certificate(certs / "operator.pem")
    assert verify_signed_by(cert, load_certificate(certs / "ca.pem"))
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH, OPERATOR_PURPOSE]
    assert OPERATOR_PURPOSE.dotted_string == "2.25.261349397304297363440624600421328525869.1"
    assert is_operator_certificate(cert)
    assert not is_operator_certificate(load_certificate(certs / "hospital-a.pem"))


@pytest.mark.parametrize(("args", "how"), [
    (["issue", "--name", "operator"], "`fedforest pki issue --ca-dir {} --name operator "
                                      "--operator` issues one"),
    (["issue", "--name", "operator", "--name", "hospital-b"],
     "`fedforest pki issue --ca-dir {} --name operator --operator` issues one"),
    (["issue", "--name", "operator", "--renew"],
     "`fedforest pki issue --ca-dir {} --name operator --operator --renew` renews it as one"),
    (["init", "--name", "hospital-b", "--name", "operator", "--force"],
     "run `pki init` without it, then `fedforest pki issue --ca-dir {} --name operator "
     "--operator` issues one"),
])
def test_the_name_operator_is_issued_as_an_operators_certificate_only(
        tmp_path: Path, args: list[str], how: str) -> None:
    """The documented operator flow without --operator would give the coordinator a
    certificate that certifies a site: refused, naming the command that issues (or renews)
    it as an operator's, and nothing is written."""
    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    before = {p.name: p.read_bytes() for p in certs.iterdir()}
    where = "--out" if args[0] == "init" else "--ca-dir"
    code, out = _pki(*args, where, str(certs))
    assert code == 2, out
    assert "error: 'operator' names an operator's certificate, never a site's: " \
           f"{how.format(certs)} (for a browser on the operator page; it certifies no site)" \
           in out, out
    assert {p.name: p.read_bytes() for p in certs.iterdir()} == before


def test_a_p12_bundles_an_operators_certificate_only(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A browser's bundle never holds a site's certificate: `pki issue --p12` needs --operator,
    and `pki p12` refuses a site's certificate before it asks for a password."""
    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    monkeypatch.setenv("FEDFOREST_P12_PASSWORD", "pw")
    before = {p.name: p.read_bytes() for p in certs.iterdir()}
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "alice", "--p12")
    assert code == 2, out
    assert "error: --p12 bundles an operator's certificate for a browser: add --operator (a " \
           "site's certificate stays a .pem and .key for its client; nothing was written)" \
           in out, out
    monkeypatch.delenv("FEDFOREST_P12_PASSWORD")
    res = CliRunner().invoke(app, ["pki", "p12", "--ca-dir", str(certs), "--name",
                                   "hospital-a"], input="")
    out = res.output.replace("\n", "")
    assert res.exit_code == 2, out
    assert f"error: {certs / 'hospital-a.pem'} is not an operator's certificate: a browser's " \
           "bundle holds an operator's only (a site's would certify an identity in secure " \
           f"jobs); `fedforest pki issue --ca-dir {certs} --name operator --operator --p12` " \
           "issues the operator's certificate and its bundle; a browser's certificate issued " \
           "as a site's (without --operator) becomes an operator's with `fedforest pki issue " \
           f"--ca-dir {certs} --name hospital-a --renew --operator --from-site --p12`, and no " \
           "longer certifies a site" in out, out
    assert "password" not in out
    assert {p.name: p.read_bytes() for p in certs.iterdir()} == before


def test_renew_keeps_an_operators_certificate_an_operators(tmp_path: Path) -> None:
    """An operator's certificate renewed without --operator would come back as a site's:
    refused, nothing moves; with --operator it is renewed as an operator's, and a site-style
    certificate of an operator renewed with --operator becomes one."""
    from fedforest_secure.pki import is_operator_certificate, issue_certificate, load_ca

    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    assert _pki("issue", "--ca-dir", str(certs), "--name", "alice", "--operator")[0] == 0
    before = {p.name: p.read_bytes() for p in certs.iterdir()}
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "alice", "--renew")
    assert code == 2, out
    assert f"error: {certs / 'alice.pem'} is an operator's certificate: `fedforest pki " \
           f"issue --ca-dir {certs} --name alice --renew --operator` renews it as one " \
           "(nothing was written)" in out, out
    assert {p.name: p.read_bytes() for p in certs.iterdir()} == before
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "alice", "--renew",
                     "--operator")
    assert code == 0, out
    assert is_operator_certificate(load_certificate(certs / "alice.pem"))
    assert (certs / "alice.pem").read_bytes() != before["alice.pem"]
    # a browser certificate named 'operator' that certifies a site (clientAuth alone)
    ca = load_ca(certs / "ca.pem", certs / "ca.key")
    issue_certificate(ca, "operator", server=False).write(certs / "operator.pem",
                                                         certs / "operator.key")
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "operator", "--renew",
                     "--operator")
    assert code == 0, out
    assert is_operator_certificate(load_certificate(certs / "operator.pem"))


def test_a_renewal_that_cannot_write_the_new_pair_keeps_the_old_pair_in_place(
        tmp_path: Path) -> None:
    """The new pair's files cannot be written (here a file size limit, as a full disk does):
    the error names the file, and the old pair stays where it was, nothing moved aside."""
    import resource
    import subprocess
    import sys

    from fedforest_cli.sim_processes import child_env

    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    before = {p.name: p.read_bytes() for p in certs.iterdir()}

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.RLIM_INFINITY))

    done = subprocess.run([sys.executable, "-m", "fedforest_cli", "pki", "issue", "--ca-dir",
                           str(certs), "--name", "hospital-a", "--renew"],
                          capture_output=True, text=True, env=child_env(), timeout=120,
                          preexec_fn=small_files, cwd=tmp_path)
    assert {p.name: p.read_bytes() for p in certs.iterdir()} == before
    assert done.returncode == 2, done.stderr
    assert " ".join(done.stderr.split()) == (
        f"error: cannot write {certs / 'hospital-a.pem'}: the file would be larger than this "
        "process may write (File too large)")


def test_a_pair_a_renewal_left_half_written_is_renewed_and_named_by_issue(
        tmp_path: Path) -> None:
    """What an interrupted renewal leaves (an empty certificate, no key, the old pair kept
    aside): `issue` names the half pair and the way out; `--renew` writes a new pair."""
    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    (certs / "hospital-a.pem").rename(certs / "hospital-a.pem.replaced-20261207T120000Z")
    (certs / "hospital-a.key").rename(certs / "hospital-a.key.replaced-20261207T120000Z")
    (certs / "hospital-a.pem").write_bytes(b"")
    _half_pair_named_then_renewed(certs, "hospital-a.pem")
    assert (certs / "hospital-a.key").stat().st_size > 0


def _half_pair_named_then_renewed(certs: Path, held: str) -> None:
    """`issue` for hospital-a, whose folder holds only ``held`` of its pair, names the half
    pair and the command that renews it; `--renew` then writes a new certificate."""
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "hospital-a")
    assert code == 2
    # a certificate without its key may also be one signed for a site's own key
    own_key = ("; a certificate `fedforest pki sign` signed for a site's own key is renewed "
               "from the site's new request with `pki sign --renew`"
               if held.endswith(".pem") else "")
    assert " ".join(out.split()) == (
        f"error: {certs} already holds {held}: nothing was written (hospital-a has "
        "half a pair, as a renewal cut short leaves it: `fedforest pki issue --ca-dir "
        f"{certs} --name hospital-a --renew` writes a new pair and keeps what is there beside "
        f"it{own_key})")
    code, out = _pki("issue", "--ca-dir", str(certs), "--name", "hospital-a", "--renew")
    assert code == 0, out
    new = load_certificate(certs / "hospital-a.pem")
    assert new.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "hospital-a"


def test_a_renewal_cut_short_between_its_renames_is_repaired_by_renew(tmp_path: Path) -> None:
    """The power goes after the new key is renamed into place and before the certificate (the
    old pair kept aside): `issue` names the key-only half pair and the command that renews
    it; that command writes a new pair and keeps the lone key beside it."""
    import subprocess
    import sys

    from fedforest_cli.sim_processes import child_env

    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    crash = ("import os, pathlib\n"
             "real = os.replace\n"
             "def replace(src, dst, **kw):\n"
             "    if str(dst).endswith('hospital-a.pem') and '.part' in str(src):\n"
             "        os._exit(137)\n"
             "    return real(src, dst, **kw)\n"
             "os.replace = replace\n"
             "from fedforest_secure.pki import issue_client_certificates\n"
             f"issue_client_certificates(pathlib.Path({str(certs)!r}), ['hospital-a'], "
             "renew=True)\n")
    done = subprocess.run([sys.executable, "-c", crash], env=child_env(), timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 137
    assert (certs / "hospital-a.key").is_file() and not (certs / "hospital-a.pem").exists()
    lone_key = (certs / "hospital-a.key").read_bytes()
    for kept in certs.glob("hospital-a.*.replaced-*"):  # the crash was a while ago
        kept.rename(kept.with_name(kept.name.rsplit("-", 1)[0] + "-20261207T120000Z"))
    _half_pair_named_then_renewed(certs, "hospital-a.key")
    assert [p.read_bytes() for p in certs.glob("hospital-a.key.replaced-*")].count(
        lone_key) == 1


def test_a_renewal_whose_certificate_cannot_be_put_in_place_puts_the_old_pair_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The new certificate's rename into place fails (an I/O error) after the old pair moved
    aside: the old pair is back in its place, byte for byte, and nothing is left aside."""
    import errno
    import os

    from fedforest_secure.pki import issue_client_certificates

    certs = tmp_path / "certs"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    before = {p.name: p.read_bytes() for p in certs.iterdir()}
    real = os.replace

    def replace(src: str, dst: str) -> None:
        if str(dst).endswith("hospital-a.pem") and ".part" in str(src):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(src), None, str(dst))
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError) as exc:
        issue_client_certificates(certs, ["hospital-a"], renew=True)
    assert str(exc.value) == (f"[Errno 5] cannot write {certs / 'hospital-a.pem'}: "
                              "Input/output error")
    assert {p.name: p.read_bytes() for p in certs.iterdir()} == before


def test_p12_refuses_a_certificate_the_ca_did_not_sign(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator's certificate of another CA (an earlier one, which `pki init --force`
    replaced) beside ca.pem: the server would refuse the browser's bundle, so `pki p12`
    refuses it, before it asks for a password, naming the command that issues one of this CA;
    nothing is written."""
    from fedforest_secure.pki import export_pkcs12

    certs, earlier = tmp_path / "certs", tmp_path / "earlier"
    assert _pki("init", "--out", str(certs))[0] == 0
    assert _pki("init", "--out", str(earlier))[0] == 0
    assert _pki("issue", "--ca-dir", str(earlier), "--name", "probe", "--operator")[0] == 0
    for ext in ("pem", "key"):
        (certs / f"probe.{ext}").write_bytes((earlier / f"probe.{ext}").read_bytes())
    monkeypatch.delenv("FEDFOREST_P12_PASSWORD", raising=False)
    res = CliRunner().invoke(app, ["pki", "p12", "--ca-dir", str(certs), "--name", "probe"])
    said = (f"{certs / 'probe.pem'} was not signed by {certs / 'ca.pem'} (a certificate of an "
            "earlier CA, which `pki init --force` replaced, or of another federation): the "
            f"server refuses it. `fedforest pki issue --ca-dir {certs} --name probe --operator "
            "--renew --p12` issues one of this CA and its bundle (the old files are kept "
            "aside); nothing was written")
    assert res.exit_code == 2
    assert " ".join(res.output.split()) == f"error: {said}"  # no password asked
    assert not (certs / "probe.p12").exists()
    with pytest.raises(ValueError) as exc:
        export_pkcs12(certs, "probe", b"pw")
    assert str(exc.value) == said
    assert not (certs / "probe.p12").exists()
    # the command it names gives the browser a bundle of this CA
    monkeypatch.setenv("FEDFOREST_P12_PASSWORD", "pw")
    assert _pki("issue", "--ca-dir", str(certs), "--name", "probe", "--operator", "--renew",
                "--p12")[0] == 0
    assert verify_signed_by(load_certificate(certs / "probe.pem"),
                            load_certificate(certs / "ca.pem"))


def test_init_force_moves_aside_what_the_old_ca_signed_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new CA over an old one: the certificates the old CA signed that `init` does not
    write anew (an operator's with its key and browser bundle, a site's pair, a site's
    certificate signed from its request) go aside to <name>.<ext>.replaced-<time>, named in
    the output; a certificate of another CA stays, and so do copies of the old CA's own
    certificate (alone, or first in a bundle), which are no one's to replace. The names can
    then be issued from the new CA without --renew."""
    certs, other = tmp_path / "certs", tmp_path / "other"
    assert _pki("init", "--out", str(certs), "--name", "hospital-a")[0] == 0
    monkeypatch.setenv("FEDFOREST_P12_PASSWORD", "pw")
    assert _pki("issue", "--ca-dir", str(certs), "--name", "probe", "--operator", "--p12")[0] \
        == 0
    assert _pki("issue", "--ca-dir", str(certs), "--name", "hospital-b")[0] == 0
    assert _pki("request", "--name", "hospital-c", "--out", str(tmp_path / "site"))[0] == 0
    assert _pki("sign", "--csr", str(tmp_path / "site" / "hospital-c.csr"), "--ca-dir",
                str(certs))[0] == 0
    assert _pki("init", "--out", str(other), "--name", "elsewhere")[0] == 0
    (certs / "elsewhere.pem").write_bytes((other / "elsewhere.pem").read_bytes())
    # a kept copy of the old CA's certificate, and a bundle that starts with it: no one's
    # certificate to replace, they stay where they are
    (certs / "ca-2026.pem").write_bytes((certs / "ca.pem").read_bytes())
    (certs / "chain.pem").write_bytes((certs / "ca.pem").read_bytes()
                                      + (other / "ca.pem").read_bytes())
    before = {p.name: p.read_bytes() for p in certs.iterdir()}
    code, out = _pki("init", "--out", str(certs), "--name", "hospital-a", "--force")
    assert code == 0, out
    moved = ["hospital-b.key", "hospital-b.pem", "hospital-c.pem", "probe.key", "probe.p12",
             "probe.pem"]
    kept = {p.name.split(".replaced-")[0]: p for p in certs.glob("*.replaced-*")}
    assert sorted(kept) == moved
    assert all(kept[n].read_bytes() == before[n] for n in moved)
    assert len({p.name.split(".replaced-")[1] for p in kept.values()}) == 1
    assert re.search(r"moved aside, as the old CA signed them and no one trusts them now: "
                     + ", ".join(re.escape(n) + r"\.replaced-\d{8}T\d{6}Z"
                                 for n in ["hospital-b.pem", "hospital-b.key", "hospital-c.pem",
                                           "probe.pem", "probe.key", "probe.p12"]),
                     " ".join(out.split())), out
    assert all((certs / n).read_bytes() == before[n]
               for n in ("elsewhere.pem", "ca-2026.pem", "chain.pem"))
    ca = load_certificate(certs / "ca.pem")
    assert verify_signed_by(load_certificate(certs / "hospital-a.pem"), ca)
    assert _pki("issue", "--ca-dir", str(certs), "--name", "probe", "--operator")[0] == 0
