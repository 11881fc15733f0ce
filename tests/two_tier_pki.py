"""An institution's two-level PKI, as the tests use it: a root CA, an issuing CA it signed, and
the server's and the sites' certificates the issuing CA signed.

:func:`write_two_tier_pki` writes the files a federation on such a PKI holds: ``root.pem``,
``issuing.pem``, ``ca.pem`` (the issuing CA then the root: a site's ``--ca`` and the server's
``client_ca``), ``server.pem`` + ``server.key`` and ``<name>.pem`` + ``<name>.key`` per site.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedforest_secure.pki import CertifiedKey, issue_certificate

__all__ = ["ca_certificate", "write_two_tier_pki"]


def ca_certificate(name: str, issuer: CertifiedKey | None = None) -> CertifiedKey:
    """A CA named ``name`` with a new key, signed by ``issuer`` (None: self-signed, a root),
    valid from an hour ago for 30 days; it may sign CAs below it."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Institution"),
                         x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject if issuer is None else issuer.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key if issuer is None else issuer.key, hashes.SHA256()))
    return CertifiedKey(key, cert)


def write_two_tier_pki(out: Path, names: Sequence[str], *,
                       hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> None:
    """The files of a federation on a two-level PKI in ``out`` (see the module's docstring);
    the server's certificate is for ``hosts``. Files already there are replaced."""
    out.mkdir(parents=True, exist_ok=True)
    root = ca_certificate("Institution Root CA")
    issuing = ca_certificate("Institution Issuing CA", root)
    (out / "root.pem").write_bytes(root.cert_pem())
    (out / "issuing.pem").write_bytes(issuing.cert_pem())
    (out / "ca.pem").write_bytes(issuing.cert_pem() + root.cert_pem())
    issue_certificate(issuing, "server", server=True, hosts=hosts).write(
        out / "server.pem", out / "server.key")
    for name in names:
        issue_certificate(issuing, name, server=False).write(out / f"{name}.pem",
                                                              out / f"{name}.key")
