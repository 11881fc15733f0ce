"""The federation PKI's building blocks: a CA, a leaf certificate for a key, a CA read from
its files, a signature check. :mod:`fedforest_secure.pki` (a directory of certificates) and
:mod:`fedforest_secure.pki_requests` (a site's request) build on them.

Keys are EC P-256; every certificate's subject is the federation's organisation and one
common name.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ._operator_certs import OPERATOR_PURPOSE
from ._pem_files import load_certificate
from ._pem_files import load_private_key as _load_private_key
from .files import write_atomic

__all__ = ["VALIDITY_DAYS", "CertifiedKey", "certify_key", "create_ca", "is_ca",
           "issue_certificate", "load_ca", "subject_name", "utc_now", "verify_signed_by"]

#: how long `fedforest pki` certificates last (a leaf never outlasts its CA)
VALIDITY_DAYS = 365


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


def subject_name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "FedForest Secure federation"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def create_ca(common_name: str = "FedForest dev CA", *, days: int = VALIDITY_DAYS,
              now: _dt.datetime | None = None) -> CertifiedKey:
    """A self-signed certificate authority (path length 0: it signs leaves only)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = (now or utc_now()) - _dt.timedelta(minutes=5)
    name = subject_name(common_name)
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
                      days: int = VALIDITY_DAYS,
                      now: _dt.datetime | None = None) -> CertifiedKey:
    """A new key and a leaf certificate for it signed by ``ca``: TLS server auth (with SANs
    ``hosts``) or client auth; an ``operator``'s client certificate also holds
    :data:`OPERATOR_PURPOSE`."""
    key = ec.generate_private_key(ec.SECP256R1())
    return CertifiedKey(key, certify_key(ca, common_name, key.public_key(), server=server,
                                         operator=operator, hosts=hosts, days=days, now=now))


def certify_key(ca: CertifiedKey, common_name: str, public_key: ec.EllipticCurvePublicKey, *,
                server: bool, operator: bool = False, hosts: tuple[str, ...] = (),
                days: int = VALIDITY_DAYS, now: _dt.datetime | None = None
                ) -> x509.Certificate:
    """A leaf certificate for ``public_key`` signed by ``ca`` (what :func:`issue_certificate`
    gives a key it makes, and ``fedforest pki sign`` the key of a site's request)."""
    if server and not hosts:
        raise ValueError("a server certificate needs at least one host name or IP address")
    if server and operator:
        raise ValueError("an operator's certificate is a client certificate, not a server's")
    for host in hosts:
        _check_host(host)
    start = (now or utc_now()) - _dt.timedelta(minutes=5)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server
              else [ExtendedKeyUsageOID.CLIENT_AUTH, OPERATOR_PURPOSE] if operator
              else [ExtendedKeyUsageOID.CLIENT_AUTH])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject_name(common_name))
        .issuer_name(ca.cert.subject)
        .public_key(public_key)
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
    return builder.sign(ca.key, hashes.SHA256())


def is_ca(cert: x509.Certificate) -> bool:
    """Whether ``cert`` is a CA's (its basic constraints say so)."""
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def verify_signed_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    """True if ``cert`` carries a valid signature by ``ca_cert`` (no chain or time checks)."""
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


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
    if not is_ca(cert):
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
