"""A site's TLS files as its client reads them: the context that checks the server, and what
a certificate's dates say when a server refuses it (the clocks, how the site renews it)."""

from __future__ import annotations

import datetime as _dt
import ssl
from pathlib import Path

from cryptography.x509.oid import NameOID

from fedforest_secure.pki import check_validity, load_certificate

__all__ = ["clock_hint", "tls_context"]


def tls_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """Verify the server against ``ca`` only (hostname checked); present ``cert`` if given.

    Raises
    ------
    ValueError
        A file is missing or unreadable, is not PEM, or the key is not the certificate's; the
        message names the option and the file.
    """
    for option, path in (("--ca", ca), ("--cert", cert), ("--key", key)):
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{option} {path}: not found (or not a file)")
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"--ca {ca}: not a PEM certificate file ({exc})") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        try:
            ctx.load_cert_chain(str(cert), str(key) if key is not None else None)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(f"--cert {cert} / --key {key or cert}: not a PEM certificate and "
                             f"its private key, or the key does not match the certificate "
                             f"({exc})") from None
        try:  # the server would refuse it, with no reason a client can see
            check_validity(cert)
        except ValueError as exc:
            raise ValueError(f"--cert {exc}; the server refuses it: ask the federation's "
                             "coordinator for a new certificate of this site's name "
                             f"({_renewal(cert)}; if the federation's CA has expired too, a "
                             "new CA and a certificate from it)") from None
    return ctx


def _renewal(cert_path: Path) -> str:
    """How a site gets a new certificate for a new key of its own: its request, signed where
    the CA is kept (the site's name from the certificate at ``cert_path`` if it has one)."""
    try:
        names = load_certificate(cert_path).subject.get_attributes_for_oid(
            NameOID.COMMON_NAME)
    except (OSError, ValueError):
        names = []
    name = str(names[0].value) if len(names) == 1 else "<site>"
    return (f"a new key and request made here, `fedforest pki request --name {name} --out "
            f"<new directory>`, signed where the CA is kept, `fedforest pki sign --csr "
            f"{name}.csr --ca-dir <CA directory> --renew`")


def _utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


#: a certificate whose start (or end) lies this close to this machine's clock may be refused by
#: a server whose clock differs by that much
_CLOSE = _dt.timedelta(hours=1)


def clock_hint(cert_path: Path) -> str:
    """What this machine's clock says of ``cert_path``, when a server whose clock differs from
    it by less than an hour would refuse the certificate (not valid yet, or expired); else
    nothing."""
    try:
        cert = load_certificate(cert_path)
    except (OSError, ValueError):
        return ""
    now, start, end = _utcnow(), cert.not_valid_before_utc, cert.not_valid_after_utc
    period = (f"This certificate is valid from {start:%Y-%m-%d %H:%M:%S} to "
              f"{end:%Y-%m-%d %H:%M:%S} UTC, and this machine's clock says "
              f"{now:%Y-%m-%d %H:%M:%S} UTC")
    compare = "compare the server's clock with this machine's (NTP)"
    if now < start:  # (checked before it connects: a clock that stepped back since)
        return (f". {period}: it is not valid yet on this machine's clock either; {compare}, "
                "or wait until its start")
    if now - start < _CLOSE:
        by = f"{int((now - start).total_seconds() // 60)} min"
        return (f". {period}: a server whose clock is more than {by} behind this one takes "
                "it for not valid yet (its log says `certificate is not yet valid`); "
                f"{compare}, or wait until the server's clock has passed its start")
    if end - now < _CLOSE:
        by = f"{max(0, int((end - now).total_seconds() // 60))} min"
        return (f". {period}: a server whose clock is more than {by} ahead of this one "
                "takes it for expired: ask the federation's coordinator for a new one "
                f"({_renewal(cert_path)}), and {compare}")
    return ""
