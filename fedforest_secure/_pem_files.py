"""Reading a certificate or a private key from a PEM file, with errors that name the file and
say what it holds instead (a DER file: the ``openssl`` command that converts it), and checking a
certificate's validity period against the clock."""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

__all__ = ["check_validity", "load_certificate", "load_private_key", "load_request"]


def load_certificate(path: Path) -> x509.Certificate:
    """The (first) certificate in the PEM file ``path``.

    Raises
    ------
    ValueError
        The file holds no PEM certificate; the message starts with ``path`` and says what
        the file holds (DER: how to convert it).
    """
    data = Path(path).read_bytes()
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise _not_pem(path, data, "certificate", "x509") from None


def load_request(path: Path) -> x509.CertificateSigningRequest:
    """The certificate signing request in the PEM file ``path`` (ValueError naming the file
    and what it holds instead, as :func:`load_certificate`)."""
    data = Path(path).read_bytes()
    try:
        return x509.load_pem_x509_csr(data)
    except ValueError:
        raise _not_pem(path, data, "certificate request", "req") from None


def load_private_key(path: Path) -> PrivateKeyTypes:
    """The private key in the PEM file ``path`` (ValueError naming the file, or TypeError
    for an encrypted one)."""
    data = Path(path).read_bytes()
    try:
        return serialization.load_pem_private_key(data, password=None)
    except ValueError:
        raise _not_pem(path, data, "private key", "pkey") from None


def _not_pem(path: Path, data: bytes, what: str, tool: str) -> ValueError:
    """``<path>: not a PEM <what> (...)``, saying what the file holds instead."""
    labels = sorted({m.decode() for m in re.findall(rb"-----BEGIN ([A-Z0-9 ]+)-----", data)})
    wanted = [label for label in labels if label.endswith(what.upper())]
    if wanted:
        why = f"its {wanted[0]} block is damaged"
    elif labels:
        why = f"it holds {' and '.join(labels)}, no {what}"
    elif data[:1] == b"\x30":  # an ASN.1 SEQUENCE: the same object in binary
        why = (f"it is DER: `openssl {tool} -inform der -in {path} -out {path}.new` writes "
               "it as PEM, to put in its place")
    else:
        why = "it holds no -----BEGIN ...----- block"
    return ValueError(f"{path}: not a PEM {what} ({why})")


def _utc(moment: _dt.datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def check_validity(path: Path, *, now: _dt.datetime | None = None) -> x509.Certificate:
    """The (first) certificate in the PEM file ``path``, if ``now`` (default: the present) lies
    within its validity period.

    Raises
    ------
    ValueError
        The file holds no PEM certificate, or the certificate has expired or is not valid
        yet; the message starts with ``path`` and gives the certificate's dates.
    """
    cert = load_certificate(path)
    moment = now or _dt.datetime.now(_dt.UTC)
    before, after = cert.not_valid_before_utc, cert.not_valid_after_utc
    period = f"valid from {_utc(before)} to {_utc(after)}"
    if moment > after:
        raise ValueError(f"{path}: the certificate expired on {_utc(after)} ({period})")
    if moment < before:
        raise ValueError(f"{path}: the certificate is not valid before {_utc(before)} "
                         f"({period}; it is {_utc(moment)} here: is this machine's clock "
                         "right?)")
    return cert
