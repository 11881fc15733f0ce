"""``fedforest pki request`` / ``pki sign``: a site keeps its own TLS key. The site makes the
key and a request, the CA's keeper signs the request; the certificate is the one ``pki issue``
gives a site, and the CA's side never holds the site's key. ``pki fingerprint`` prints what the
sites compare out of band."""

from __future__ import annotations

import datetime as _dt
import re
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from nacl.signing import SigningKey
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_secure.pki import load_certificate, verify_signed_by
from fedforest_secure.secagg.directory import certify_identity, verify_directory


def _pki(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["pki", *args])
    return res.exit_code, " ".join(res.output.split())  # the console wraps long paths


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    """The coordinator's CA directory, as `pki init` makes it (no site's key in it)."""
    code, out = _pki("init", "--out", str(tmp_path / "ca"), "--host", "127.0.0.1")
    assert code == 0, out
    return tmp_path / "ca"


def _request(tmp_path: Path, name: str, where: str = "site") -> Path:
    code, out = _pki("request", "--name", name, "--out", str(tmp_path / where))
    assert code == 0, out
    return tmp_path / where / f"{name}.csr"


def _extensions(cert: x509.Certificate) -> list[tuple[str, bool, object]]:
    """Every extension of the certificate (OID, critical, value), in its order: what two leaf
    certificates of one CA share whatever their keys and dates (a leaf names its CA's key
    identifier, not its own)."""
    return [(e.oid.dotted_string, e.critical, e.value) for e in cert.extensions]


def test_a_site_keeps_its_key_and_the_ca_signs_its_request(tmp_path: Path, ca: Path) -> None:
    """The site's key is written 0600 at the site only; the certificate written beside the CA
    is for that key, signed by ca.pem, with the subject, extensions and validity `pki issue`
    gives a site; the identity it certifies passes every site's directory check."""
    code, out = _pki("request", "--name", "hospital-a", "--out", str(tmp_path / "site"))
    assert code == 0, out
    key_path = tmp_path / "site" / "hospital-a.key"
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "site").stat().st_mode) == 0o700
    said = re.search(r"its key's SHA-256: ((?:[0-9A-F]{2}:){31}[0-9A-F]{2})", out)
    assert said, out
    code, out = _pki("sign", "--csr", str(tmp_path / "site" / "hospital-a.csr"), "--ca-dir",
                     str(ca))
    assert code == 0, out
    assert f"{ca / 'hospital-a.pem'} signed by {ca / 'ca.pem'}" in out
    assert said.group(1) in out  # the same key fingerprint on both sides
    assert not (ca / "hospital-a.key").exists()
    assert sorted(p.name for p in ca.iterdir()) == ["ca.key", "ca.pem", "hospital-a.pem",
                                                    "server.key", "server.pem"]
    cert = load_certificate(ca / "hospital-a.pem")
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki)
    assert verify_signed_by(cert, load_certificate(ca / "ca.pem"))
    # what `pki issue` gives a site, from the same CA
    assert _pki("issue", "--ca-dir", str(ca), "--name", "hospital-b")[0] == 0
    issued = load_certificate(ca / "hospital-b.pem")
    assert cert.subject == x509.Name([
        x509.NameAttribute(a.oid, "hospital-a" if a.oid == NameOID.COMMON_NAME else a.value)
        for a in issued.subject])
    assert _extensions(cert) == _extensions(issued)
    assert cert.issuer == issued.issuer
    # the same validity as `pki issue` gives, issued moments apart (a second boundary between
    # them, and a leaf's end capped at its CA's, move either end by a second)
    for ours, theirs in ((cert.not_valid_before_utc, issued.not_valid_before_utc),
                         (cert.not_valid_after_utc, issued.not_valid_after_utc)):
        assert abs(ours - theirs) < _dt.timedelta(minutes=1)
    identity = bytes(SigningKey.generate().verify_key)
    certification = certify_identity("job", identity, (ca / "hospital-a.pem").read_bytes(),
                                     key_path.read_bytes())
    assert verify_directory("job", {0: identity}, {0: certification},
                            (ca / "ca.pem").read_bytes()) == {0: "hospital-a"}


def test_sign_copies_nothing_of_a_requests_extensions_or_other_subject_fields(
        tmp_path: Path, ca: Path) -> None:
    """A request asking for a CA certificate (CA:TRUE, keyCertSign, name constraints), a
    server's (serverAuth, DNS and IP names), an operator's purpose, more key usages and other
    subject fields: `pki sign` takes its key and its one common name only, and writes exactly
    the certificate `pki issue` gives a site, which certifies a site's identity."""
    import ipaddress

    from fedforest_secure.pki import OPERATOR_PURPOSE

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Another Org"),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "Issuing"),
                         x509.NameAttribute(NameOID.COMMON_NAME, "hospital-e"),
                         x509.NameAttribute(NameOID.EMAIL_ADDRESS, "ca@example.org")])
    usage = x509.KeyUsage(digital_signature=True, content_commitment=True,
                          key_encipherment=True, data_encipherment=True, key_agreement=True,
                          key_cert_sign=True, crl_sign=True, encipher_only=False,
                          decipher_only=False)
    csr = (x509.CertificateSigningRequestBuilder().subject_name(subject)
           .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
           .add_extension(usage, critical=True)
           .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                 x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH,
                                                 OPERATOR_PURPOSE]), critical=False)
           .add_extension(x509.SubjectAlternativeName([
               x509.DNSName("fedforest.example.org"),
               x509.IPAddress(ipaddress.ip_address("10.0.0.1"))]), critical=False)
           .add_extension(x509.NameConstraints(
               permitted_subtrees=[x509.DNSName("example.org")], excluded_subtrees=None),
               critical=True)
           .sign(key, hashes.SHA256()))
    path = tmp_path / "hospital-e.csr"
    path.write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    code, out = _pki("sign", "--csr", str(path), "--ca-dir", str(ca))
    assert code == 0, out
    cert = load_certificate(ca / "hospital-e.pem")
    assert _pki("issue", "--ca-dir", str(ca), "--name", "hospital-f")[0] == 0
    issued = load_certificate(ca / "hospital-f.pem")
    assert cert.subject == x509.Name([
        x509.NameAttribute(a.oid, "hospital-e" if a.oid == NameOID.COMMON_NAME else a.value)
        for a in issued.subject])
    assert cert.subject.rfc4514_string() == "CN=hospital-e,O=FedForest Secure federation"
    assert _extensions(cert) == _extensions(issued)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert not cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
    for absent in (x509.SubjectAlternativeName, x509.NameConstraints):
        with pytest.raises(x509.ExtensionNotFound):
            cert.extensions.get_extension_for_class(absent)
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki)
    identity = bytes(SigningKey.generate().verify_key)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    certification = certify_identity("job", identity, (ca / "hospital-e.pem").read_bytes(),
                                     key_pem)
    assert verify_directory("job", {0: identity}, {0: certification},
                            (ca / "ca.pem").read_bytes()) == {0: "hospital-e"}


def test_sign_refuses_a_name_already_issued_unless_renewing(tmp_path: Path, ca: Path) -> None:
    """A second request under a name the CA signed is refused, the first certificate kept; a
    renewal signs the site's new request and keeps the old certificate aside."""
    first = _request(tmp_path, "hospital-a")
    assert _pki("sign", "--csr", str(first), "--ca-dir", str(ca))[0] == 0
    old = (ca / "hospital-a.pem").read_bytes()
    second = _request(tmp_path, "hospital-a", "renewal")
    code, out = _pki("sign", "--csr", str(second), "--ca-dir", str(ca))
    assert code == 2
    assert out == (f"error: {ca} already holds hospital-a.pem: nothing was written (a site's "
                   "certificate is replaced only with --renew: the site makes a new request, "
                   "and `fedforest pki sign --renew` signs it and keeps the old files beside "
                   "it; a site's token works only with a certificate of its own name)")
    assert (ca / "hospital-a.pem").read_bytes() == old
    code, out = _pki("sign", "--csr", str(second), "--ca-dir", str(ca), "--renew")
    assert code == 0, out
    (kept,) = ca.glob("hospital-a.pem.replaced-*")
    assert kept.read_bytes() == old and f"kept aside: {kept}" in out
    new = load_certificate(ca / "hospital-a.pem")
    site_key = serialization.load_pem_private_key(
        (tmp_path / "renewal" / "hospital-a.key").read_bytes(), password=None)
    assert new.public_key() == site_key.public_key()
    code, out = _pki("sign", "--csr", str(_request(tmp_path, "hospital-z", "z")), "--ca-dir",
                     str(ca), "--renew")
    assert code == 2 and "hospital-z.pem not found: --renew replaces a site's existing" in out


def test_a_site_moved_from_a_key_the_ca_side_made_gets_that_copy_named_for_deletion(
        tmp_path: Path, ca: Path) -> None:
    """A site whose pair `pki issue` made renews from its own request: the CA side's copy of
    its old key goes aside with the old certificate, and the output says to delete it."""
    assert _pki("issue", "--ca-dir", str(ca), "--name", "hospital-a")[0] == 0
    code, out = _pki("sign", "--csr", str(_request(tmp_path, "hospital-a")), "--ca-dir",
                     str(ca), "--renew")
    assert code == 0, out
    (key,) = ca.glob("hospital-a.key.replaced-*")
    assert f"{key} is a key the CA's side made for the site: delete it" in out
    assert not (ca / "hospital-a.key").exists()


def _csr(name_attrs: list[x509.NameAttribute], key: object = None) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    return (x509.CertificateSigningRequestBuilder().subject_name(x509.Name(name_attrs))
            .sign(key, hashes.SHA256())  # type: ignore[arg-type]
            .public_bytes(serialization.Encoding.PEM))


def _cn(name: str) -> x509.NameAttribute:
    return x509.NameAttribute(NameOID.COMMON_NAME, name)


@pytest.mark.parametrize(("csr", "why"), [
    (lambda: _csr([_cn("operator")]),
     "'operator' names an operator's certificate, never a site's"),
    (lambda: _csr([_cn("CA")]), "site names ['CA'] are not usable as file names"),
    (lambda: _csr([_cn("../hospital")]), "site names ['../hospital'] are not usable"),
    (lambda: _csr([_cn("a"), _cn("b")]), "the request names 2 common names; a site's request "
                                         "names the site in exactly one"),
    (lambda: _csr([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Hospital")]),
     "the request names 0 common names"),
    (lambda: _csr([_cn("hospital-r")], rsa.generate_private_key(public_exponent=65537,
                                                                key_size=2048)),
     "the request's key is a RSA key, not an EC P-256 key"),
    (lambda: _csr([_cn("hospital-p")], ec.generate_private_key(ec.SECP384R1())),
     "the request's key is an EC key on secp384r1, not an EC P-256 key"),
    (lambda: b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
     "not a PEM certificate request (its CERTIFICATE REQUEST block is damaged)"),
])
def test_sign_refuses_a_request_that_breaks_the_rules_of_issue(
        tmp_path: Path, ca: Path, csr: object, why: str) -> None:
    """The names `pki issue` refuses, a request naming no site or two, a key no site can
    certify its identity with, a damaged file: refused, naming the request, nothing written."""
    path = tmp_path / "request.csr"
    path.write_bytes(csr())  # type: ignore[operator]
    before = sorted(p.name for p in ca.iterdir())
    code, out = _pki("sign", "--csr", str(path), "--ca-dir", str(ca))
    assert code == 2 and why in out, out
    assert sorted(p.name for p in ca.iterdir()) == before


def test_sign_refuses_a_request_changed_on_its_way(tmp_path: Path, ca: Path) -> None:
    """The name of a site's request changed in transit (another site's, same length): the
    request's signature does not verify, and no certificate binds the site's key to the name
    it did not ask for."""
    csr = _request(tmp_path, "hospital-a")
    der = x509.load_pem_x509_csr(csr.read_bytes()).public_bytes(serialization.Encoding.DER)
    assert der.count(b"hospital-a") == 1
    changed = x509.load_der_x509_csr(der.replace(b"hospital-a", b"hospital-b"))
    csr.write_bytes(changed.public_bytes(serialization.Encoding.PEM))
    code, out = _pki("sign", "--csr", str(csr), "--ca-dir", str(ca))
    assert code == 2
    assert out == (f"error: {csr}: the request's signature does not verify (it was changed on "
                   "its way, or damaged): ask the site for its request again")
    assert not (ca / "hospital-b.pem").exists()


def test_sign_refuses_a_name_in_other_letter_case_than_one_issued(tmp_path: Path,
                                                                  ca: Path) -> None:
    assert _pki("sign", "--csr", str(_request(tmp_path, "hospital-a")), "--ca-dir",
                str(ca))[0] == 0
    """The twin's certificate was signed for its site's own key: the refusal says it is
    renewed from that site's new request, never by a key made on the CA's side."""
    code, out = _pki("sign", "--csr", str(_request(tmp_path, "Hospital-A", "twin")),
                     "--ca-dir", str(ca))
    assert code == 2
    assert out == (f"error: 'Hospital-A' differs in letter case only from 'hospital-a', whose "
                   f"certificate is in {ca}: a disk that ignores letter case (as macOS's and "
                   "Windows' do by default) keeps them in one file; give the site another name "
                   "(a new request of the site (`fedforest pki request --name hospital-a --out "
                   "<new directory>` at the site) signed with `fedforest pki sign --csr "
                   f"hospital-a.csr --ca-dir {ca} --renew` renews that one)")
    assert sorted(p.name for p in ca.iterdir()) == ["ca.key", "ca.pem", "hospital-a.pem",
                                                    "server.key", "server.pem"]


def test_renewing_a_signed_sites_certificate_as_an_operators_names_the_request_path(
        tmp_path: Path, ca: Path) -> None:
    """`pki issue --renew --operator` on a certificate `pki sign` issued for a site's own key:
    refused, and the command that renews it as a site's is the site's new request signed with
    `pki sign --renew` (never a key made on the CA's side)."""
    assert _pki("sign", "--csr", str(_request(tmp_path, "hospital-a")), "--ca-dir",
                str(ca))[0] == 0
    code, out = _pki("issue", "--ca-dir", str(ca), "--name", "hospital-a", "--renew",
                     "--operator")
    assert code == 2
    assert out == (
        f"error: {ca / 'hospital-a.pem'} is a site's certificate: renewed with --operator it "
        "would certify no site, and that site could take part in no secure job. A new request "
        "of the site (`fedforest pki request --name hospital-a --out <new directory>` at the "
        "site) signed with `fedforest pki sign --csr hospital-a.csr --ca-dir "
        f"{ca} --renew` renews it as a site's; a browser's certificate issued as a site's "
        "(without --operator) becomes an operator's with --from-site added (nothing was "
        "written)")
    assert not (ca / "hospital-a.key").exists()


def test_request_never_replaces_the_sites_key(tmp_path: Path) -> None:
    """The key of the certificate in use stays: a second request into the same directory is
    refused and says where a renewal's request goes."""
    _request(tmp_path, "hospital-a")
    key = (tmp_path / "site" / "hospital-a.key").read_bytes()
    code, out = _pki("request", "--name", "hospital-a", "--out", str(tmp_path / "site"))
    assert code == 2
    assert out == (f"error: {tmp_path / 'site'} already holds hospital-a.key, hospital-a.csr: "
                   "nothing was written (the key of this site's certificate stays where it "
                   "is: a renewal's request goes into another directory (--out), whose key the "
                   "client then uses with the certificate signed from it)")
    assert (tmp_path / "site" / "hospital-a.key").read_bytes() == key
    code, out = _pki("request", "--name", "Operator", "--out", str(tmp_path / "op"))
    assert code == 2 and "'Operator' names an operator's certificate, never a site's" in out
    assert not (tmp_path / "op").exists()


def test_fingerprint_prints_each_certificate_as_openssl_does(tmp_path: Path, ca: Path) -> None:
    """ca.pem's SHA-256 fingerprint (upper-case pairs between colons, as `openssl x509
    -fingerprint -sha256`), each certificate of a bundle on a line of its own with its name,
    on stdout; a key given instead is named."""
    cert = load_certificate(ca / "ca.pem")
    want = ":".join(f"{b:02X}" for b in cert.fingerprint(hashes.SHA256()))
    res = CliRunner().invoke(app, ["pki", "fingerprint", str(ca / "ca.pem")])
    assert res.exit_code == 0, res.output
    assert res.stdout == f"{ca / 'ca.pem'}: FedForest dev CA  SHA-256 {want}\n"
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes((ca / "ca.pem").read_bytes() + (ca / "server.pem").read_bytes())
    res = CliRunner().invoke(app, ["pki", "fingerprint", str(bundle)])
    assert [line.split("  SHA-256 ")[0] for line in res.stdout.splitlines()] == [
        f"{bundle}: FedForest dev CA", f"{bundle}: 127.0.0.1"]
    code, out = _pki("fingerprint", str(ca / "ca.key"))
    assert code == 2 and f"{ca / 'ca.key'}: not a PEM certificate (it holds PRIVATE KEY" in out
