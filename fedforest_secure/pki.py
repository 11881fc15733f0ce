"""A small development PKI for a federation: one CA, a server certificate, client certificates.

Real deployments should use their institutions' own PKI; this module exists so that every
transport in FedForest Secure runs over verified TLS, even on a laptop::

    paths = init_dev_pki(Path("certs"), n_clients=4)
    # certs/ca.pem, certs/server.pem, certs/server.key, certs/client-0.pem, certs/client-0.key, ...
    issue_client_certificates(Path("certs"), ["hospital-d"])  # later, from the same CA
    issue_client_certificates(Path("certs"), ["operator"], operator=True)  # a browser's

Neither replaces a file that is there (``init_dev_pki(..., overwrite=True)`` makes a new CA).

A site's certificate (extended key usage clientAuth) opens the server's API and certifies the
site's identity in secure jobs. An operator's certificate (clientAuth and
:data:`OPERATOR_PURPOSE`) opens TLS connections the same way, for a browser on the operator page,
but certifies no identity: the server operator holds its key, and the sites refuse it in a
job's identity directory (:mod:`fedforest_secure.secagg.directory`). The name
:data:`OPERATOR_NAME` is an operator's only: no site certificate is issued under it.

Keys are EC P-256; the server certificate names ``localhost`` and ``127.0.0.1`` (and any extra
host names given) as subject alternative names. Private keys are written with mode 0600.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ._operator_certs import (
    OPERATOR_NAME,
    OPERATOR_PURPOSE,
    check_renewed_kinds,
    check_site_names,
    is_operator_certificate,
    load_operator_certificate,
)
from ._pem_files import check_validity, load_certificate
from ._pem_files import load_private_key as _load_private_key
from ._pki_names import check_case_twins, check_names, names_on_disk
from .files import replacing, write_atomic

__all__ = [
    "OPERATOR_NAME",
    "OPERATOR_PURPOSE",
    "CertifiedKey",
    "DevPKI",
    "check_validity",
    "create_ca",
    "export_pkcs12",
    "init_dev_pki",
    "issue_certificate",
    "issue_client_certificates",
    "is_operator_certificate",
    "load_ca",
    "load_certificate",
    "load_operator_certificate",
    "verify_signed_by",
]

_VALIDITY_DAYS = 365
_DEFAULT_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class CertifiedKey:
    """A private key with its certificate."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write(self, cert_path: Path, key_path: Path) -> None:
        """Write the pair, each file whole or not at all: the certificate 0644 less the umask
        (anyone may read it, only its user replace it: a CA's is the federation's trust
        anchor), the key 0600."""
        write_atomic(cert_path, self.cert_pem(), mode=0o644)
        write_atomic(key_path, self.key_pem(), mode=0o600)


@dataclass(frozen=True)
class DevPKI:
    """Where :func:`init_dev_pki` wrote its files."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_certs: list[Path] = field(default_factory=list)
    client_keys: list[Path] = field(default_factory=list)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def _name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "FedForest Secure federation"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def create_ca(common_name: str = "FedForest dev CA", *, days: int = _VALIDITY_DAYS,
              now: _dt.datetime | None = None) -> CertifiedKey:
    """A self-signed certificate authority (path length 0: it signs leaves only)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = (now or _now()) - _dt.timedelta(minutes=5)
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + _dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertifiedKey(key, cert)


_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _check_host(host: str) -> None:
    """An IP address, or a DNS host name (RFC 1123 labels; a ``*`` first label for a
    wildcard): what a client can match the server certificate against."""
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if labels and labels[0] == "*" and len(labels) > 1:
        labels = labels[1:]
    if not (0 < len(name) <= 253 and all(_LABEL.fullmatch(lab) for lab in labels)):
        raise ValueError(f"server host {host!r} is neither an IP address nor a DNS host name "
                         "(letters, digits and '-' between dots)")


def issue_certificate(ca: CertifiedKey, common_name: str, *, server: bool,
                      operator: bool = False, hosts: tuple[str, ...] = (),
                      days: int = _VALIDITY_DAYS,
                      now: _dt.datetime | None = None) -> CertifiedKey:
    """A leaf certificate signed by ``ca``: TLS server auth (with SANs ``hosts``) or client
    auth; an ``operator``'s client certificate also holds :data:`OPERATOR_PURPOSE`."""
    if server and not hosts:
        raise ValueError("a server certificate needs at least one host name or IP address")
    if server and operator:
        raise ValueError("an operator's certificate is a client certificate, not a server's")
    for host in hosts:
        _check_host(host)
    key = ec.generate_private_key(ec.SECP256R1())
    start = (now or _now()) - _dt.timedelta(minutes=5)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server
              else [ExtendedKeyUsageOID.CLIENT_AUTH, OPERATOR_PURPOSE] if operator
              else [ExtendedKeyUsageOID.CLIENT_AUTH])
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        # never beyond the CA's own end: a chain is valid only while every link is
        .not_valid_after(min(start + _dt.timedelta(days=days), ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=True, key_cert_sign=False, crl_sign=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
                       critical=False)
    )
    if hosts:
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return CertifiedKey(key, builder.sign(ca.key, hashes.SHA256()))


def verify_signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    """True if ``cert`` carries a valid signature by ``ca_cert`` (no chain or time checks)."""
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def _refuse_existing(paths: Sequence[Path], hint: str) -> None:
    there = [p for p in paths if p.exists() or p.is_symlink()]
    if there:
        where = there[0].parent
        raise FileExistsError(f"{where} already holds {', '.join(p.name for p in there)}: "
                              f"nothing was written ({hint})")


def init_dev_pki(out: Path, n_clients: int, *, hosts: tuple[str, ...] = _DEFAULT_HOSTS,
                 client_names: list[str] | None = None, overwrite: bool = False) -> DevPKI:
    """Write a dev CA, a server certificate for ``hosts`` and ``n_clients`` client certificates.
    A missing ``out`` is made its user's only (0700: it holds the CA's and every site's key);
    one that exists keeps its mode.

    Raises
    ------
    FileExistsError
        ``out`` already holds one of the files (a federation's CA among them) and
        ``overwrite`` is False: nothing is written.
    """
    if n_clients < 0:
        raise ValueError("n_clients must be >= 0")
    names = client_names if client_names is not None else [f"client-{k}" for k in range(n_clients)]
    if len(names) != n_clients:
        raise ValueError("client_names must have n_clients entries")
    check_names(names)
    out = Path(out)
    check_site_names(names, out, init=True)
    if not overwrite:
        targets = [out / f for f in ("ca.pem", "ca.key", "server.pem", "server.key")]
        targets += [out / f"{n}.{ext}" for n in names for ext in ("pem", "key")]
        _refuse_existing(targets, "`fedforest pki issue` adds client certificates signed by "
                                  "the CA that is there; `--force` replaces it and every "
                                  "certificate it signed")
    ca = create_ca()
    server = issue_certificate(ca, hosts[0], server=True, hosts=hosts)  # checks the hosts
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca.write(out / "ca.pem", out / "ca.key")
    server.write(out / "server.pem", out / "server.key")
    certs, keys = _write_clients(ca, out, names)
    return DevPKI(out / "ca.pem", out / "ca.key", out / "server.pem", out / "server.key",
                  certs, keys)


def load_ca(cert_path: Path, key_path: Path) -> CertifiedKey:
    """The CA whose certificate and private key (PEM) are at ``cert_path`` and ``key_path``.

    Raises
    ------
    FileNotFoundError
        Either file is missing.
    ValueError
        Either file is not PEM, the certificate is not a CA's, the key is not an EC key, or
        the key is not its key.
    """
    cert = load_certificate(cert_path)
    try:
        key = _load_private_key(key_path)
    except TypeError:  # encrypted with a password
        raise ValueError(f"{key_path} is encrypted; give the CA's key without a password "
                         "(keep it offline)") from None
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise ValueError(f"{cert_path} is not a CA certificate")
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        kind = "an RSA key" if isinstance(key, rsa.RSAPrivateKey) else "not an EC key"
        raise ValueError(f"{key_path}: {kind}; `fedforest pki issue` signs with EC CA keys "
                         "only (P-256, as `fedforest pki init` makes): issue this site's "
                         "certificate with the PKI that made this CA")
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise ValueError(f"{key_path} does not match the CA certificate {cert_path}")
    return CertifiedKey(key, cert)


def issue_client_certificates(ca_dir: Path, names: Sequence[str], *, renew: bool = False,
                              operator: bool = False, from_site: bool = False) -> list[Path]:
    """Client certificates for ``names``, signed by the CA in ``ca_dir`` (``ca.pem`` and
    ``ca.key``), written beside it as ``<name>.pem`` and ``<name>.key`` (mode 0600): a site
    that joins later, or with ``operator`` an operator's browser (:data:`OPERATOR_PURPOSE`:
    it certifies no site). Returns the certificates' paths.

    With ``renew`` every name must have its pair there already, or half of it (the
    certificate or the key alone, as a renewal cut short leaves it): what is there is moved
    aside (to ``<name>.pem.replaced-<UTC time>`` and ``<name>.key.replaced-<UTC time>``, kept;
    a ``<name>.p12`` too) and a new pair with the same name is written, so the site's token,
    bound to that name, goes on working. The old certificate stays valid until its end (there
    is no revocation list). A renewal keeps a certificate's kind: an operator's is renewed with
    ``operator`` only, and a site's (one not named :data:`OPERATOR_NAME`) becomes an operator's
    only with ``from_site`` too (a browser's certificate issued as a site's). An old
    ``<name>.pem`` that holds no certificate of that name (damaged, a key, another name's:
    files mixed up) is replaced by the kind ``operator`` says.

    Raises
    ------
    FileNotFoundError
        ``ca.pem`` or ``ca.key`` is missing; with ``renew``, a name has neither file of a pair
        to renew.
    FileExistsError
        Without ``renew``, a ``<name>.pem`` or ``<name>.key`` is there already: nothing is
        written.
    ValueError
        A name is not usable as a file name (or is :data:`OPERATOR_NAME` for a site), the key
        is not the CA's, the CA's certificate has expired (or is not valid yet), or with
        ``renew`` an operator's certificate would be renewed as a site's, or a site's as an
        operator's without ``from_site``.
    """
    ca_dir = Path(ca_dir)
    names = list(names)
    if not names:
        raise ValueError("no site name given")
    known = names_on_disk(ca_dir, names)  # a renewal keeps the name the files have
    check_names(names, known)
    check_case_twins(ca_dir, names, known, operator)
    if not operator:
        check_site_names(names, ca_dir, renew=renew, known=known)
    for part in ("ca.pem", "ca.key"):
        if not (ca_dir / part).is_file():
            raise FileNotFoundError(f"{ca_dir / part} not found: issuing needs the federation "
                                    "CA's certificate and private key")
    ca = load_ca(ca_dir / "ca.pem", ca_dir / "ca.key")
    try:  # a certificate a CA outside its validity signs does not verify
        check_validity(ca_dir / "ca.pem")
    except ValueError as exc:
        if _now() < ca.cert.not_valid_after_utc:  # not valid yet: a clock, not the CA
            raise ValueError(f"{exc}: certificates it signs would not verify yet") from None
        raise ValueError(f"{exc}: certificates it signs would not verify; the federation needs "
                         "a new CA (`fedforest pki init --force`), and every site a new "
                         "certificate from it") from None
    pairs = [ca_dir / f"{n}.{ext}" for n in names for ext in ("pem", "key")]
    if not renew:
        halves = [n for n in names if (ca_dir / f"{n}.pem").is_file()
                  != (ca_dir / f"{n}.key").is_file()]
        renewal = (f"`fedforest pki issue --ca-dir {ca_dir} --name {halves[0]}"
                   + (" --operator" if operator else "") + " --renew`" if halves else "")
        _refuse_existing(pairs, "a site's certificate is replaced only with --renew, which "
                                "keeps the old files beside it; a site's token works only with "
                                "a certificate of its own name" if not halves else
                                f"{halves[0]} has half a pair, as a renewal cut short leaves "
                                f"it: {renewal} writes a new pair and keeps what is there "
                                "beside it")
        return _write_clients(ca, ca_dir, names, operator)[0]
    # half a pair (a renewal cut short between its renames, a file deleted): renewed too
    missing = [n for n in names
               if not (ca_dir / f"{n}.pem").is_file() and not (ca_dir / f"{n}.key").is_file()]
    if missing:
        raise FileNotFoundError(f"{ca_dir / (missing[0] + '.pem')} not found: --renew replaces "
                                "a site's existing certificate and key (without --renew, "
                                "`pki issue` makes a new site's)")
    pairs = [p for p in pairs if p.is_file()]
    check_renewed_kinds(ca_dir, names, operator=operator, from_site=from_site)
    stamp = _now().strftime("%Y%m%dT%H%M%SZ")
    bundles = [ca_dir / f"{n}.p12" for n in names if (ca_dir / f"{n}.p12").is_file()]
    moves = [(path, path.with_name(f"{path.name}.replaced-{stamp}"))
             for path in pairs + bundles]  # a browser bundle of the old pair goes aside too
    # every target checked before anything moves
    _refuse_existing([kept for _, kept in moves], "renewed within the same second: run it "
                                                  "again in a second")
    return _write_clients(ca, ca_dir, names, operator, moves=moves)[0]


def export_pkcs12(ca_dir: Path, name: str, password: bytes) -> Path:
    """``<name>.p12`` beside the CA in ``ca_dir``: the certificate ``<name>.pem``, its key
    ``<name>.key`` and the CA's certificate in one password-protected PKCS#12 file (mode 0600),
    the form a browser imports (an operator opening ``/ui`` of a server that asks every
    connection for a certificate).

    Raises
    ------
    FileNotFoundError
        ``ca.pem``, ``<name>.pem`` or ``<name>.key`` is missing.
    FileExistsError
        ``<name>.p12`` is there already: nothing is written.
    ValueError
        An empty password, a name not usable as a file name, a certificate that is not an
        operator's (:func:`load_operator_certificate`), or a key that is not the certificate's.
    """
    from cryptography.hazmat.primitives.serialization import pkcs12

    ca_dir = Path(ca_dir)
    check_names([name], names_on_disk(ca_dir, [name]))
    if not password:
        raise ValueError("a PKCS#12 file needs a password (browsers refuse to import one "
                         "without, and the file holds a private key)")
    out = ca_dir / f"{name}.p12"
    _refuse_existing([out], "a certificate file is never replaced")
    for part in ("ca.pem", f"{name}.pem", f"{name}.key"):
        if not (ca_dir / part).is_file():
            raise FileNotFoundError(f"{ca_dir / part} not found")
    cert = load_operator_certificate(ca_dir / f"{name}.pem")
    try:
        key = _load_private_key(ca_dir / f"{name}.key")
    except TypeError:  # encrypted with a password
        raise ValueError(f"{ca_dir / (name + '.key')} is encrypted; give it without a "
                         "password") from None
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if (not isinstance(key, ec.EllipticCurvePrivateKey)
            or key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki)):
        raise ValueError(f"{ca_dir / (name + '.key')} does not match {ca_dir / (name + '.pem')}")
    data = pkcs12.serialize_key_and_certificates(
        name.encode(), key, cert, [load_certificate(ca_dir / "ca.pem")],
        serialization.BestAvailableEncryption(password))
    _write_private(out, data)
    return out


def _write_clients(ca: CertifiedKey, out: Path, names: Sequence[str], operator: bool = False,
                   *, moves: Sequence[tuple[Path, Path]] = ()
                   ) -> tuple[list[Path], list[Path]]:
    """``out/<name>.pem`` and ``out/<name>.key`` for each name, signed by ``ca`` (operators'
    certificates with ``operator``), all written or none: each file is written whole beside
    its place first; then the files ``moves`` names are moved aside (``(path, kept)``: an old
    pair) and the new ones renamed into place. A failure (a full disk) leaves the directory
    as it was, the moved files back in their place."""
    issued = [issue_certificate(ca, name, server=False, operator=operator) for name in names]
    certs = [out / f"{name}.pem" for name in names]
    keys = [out / f"{name}.key" for name in names]
    moved: list[tuple[Path, Path]] = []
    try:
        with contextlib.ExitStack() as stack:
            for ck, cert, key in zip(issued, certs, keys, strict=True):
                _fill(stack.enter_context(replacing(cert, mode=0o644)), ck.cert_pem())
                _fill(stack.enter_context(replacing(key, mode=0o600)), ck.key_pem())
            for path, kept in moves:  # every new file is written: the old ones go aside
                moved.append((path, kept))  # first: an interrupt lands after the rename too
                path.rename(kept)
    except BaseException:
        for path, kept in reversed(moved):
            with contextlib.suppress(FileNotFoundError):  # one interrupted before its rename
                os.replace(kept, path)
        raise
    return certs, keys


def _fill(tmp: Path, data: bytes) -> None:
    """``data`` written to ``tmp`` and flushed to disk, before any old file moves aside."""
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
