"""The server's ``[tls]`` files, checked before it starts (:func:`check_tls_files`).

What every client or site would refuse at its handshake, what would make OpenSSL prompt for a
passphrase, and a private key other users can read are :class:`ConfigError` naming the option
and the file; what may be right after all (a certificate that does not name the configured
host, which clients may reach by another name; a key its group can read) is a warning, which
the server logs at start-up.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from fedforest_secure.files import readable_by
from fedforest_secure.pki import check_validity

from .settings import ConfigError, TLSSettings

__all__ = ["check_tls_files"]

#: listening on every interface: clients may reach the server by any of its names
_ANY_ADDRESS = ("0.0.0.0", "::", "")


def check_tls_files(tls: TLSSettings, host: str) -> list[str]:
    """Refuse (:class:`ConfigError`) ``[tls]`` files the server cannot serve with; return
    the warnings to log.

    Refused: a file missing or a directory; an encrypted key; a
    certificate and key that are not PEM or not a pair; a certificate outside its validity
    period or without the serverAuth extended key usage; a ``client_ca`` that is not PEM, not
    a CA certificate, or no CA in it valid now. Warned: a key others or its group can read; a
    certificate whose subject alternative names do not cover ``host``; a ``client_ca`` bundle's
    CA that is not valid now (beside a current one).
    """
    for option, path in (("cert", tls.cert), ("key", tls.key), ("client_ca", tls.client_ca)):
        if path is None:
            continue
        if path.is_dir():
            raise ConfigError(f"[tls] {option} {path}: a directory, not a file: name the PEM "
                              "file")
        if not path.is_file():
            raise ConfigError(f"[tls] {option} {path}: file not found")
    warnings = _check_key(tls.key)
    # what uvicorn will load, loaded here first: a key that is not the certificate's, or a
    # file that is not PEM, is a configuration error, not a traceback at start-up
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:  # the password is never asked for: an encrypted key was refused above
        ctx.load_cert_chain(str(tls.cert), str(tls.key), password=b"")
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"[tls] cert {tls.cert} and key {tls.key}: not a PEM certificate "
                          f"and its private key, or the key does not match the certificate "
                          f"({exc})") from None
    try:  # clients refuse a certificate outside its dates, each with a TLS error of its own
        cert = check_validity(tls.cert)
    except ValueError as exc:
        raise ConfigError(f"[tls] cert {exc}: clients refuse it; put a current certificate "
                          "there (signed by the CA the clients trust) and start again") from None
    if not _serves_tls(cert):
        raise ConfigError(f"[tls] cert {tls.cert}: not a TLS server certificate (its extended "
                          "key usage has no serverAuth: a site's certificate?); every client "
                          "would refuse it ('unsuitable certificate purpose'): give the "
                          "server's certificate, e.g. server.pem of `fedforest pki init`")
    if tls.client_ca is not None:
        warnings += _check_client_ca(ctx, tls.client_ca)
    named = _unnamed_host(cert, host)
    if named is not None:
        url_host = f"[{host}]" if ":" in host else host
        warnings.append(f"[tls] cert {tls.cert} names {named}, not {host}: a client that "
                        f"connects to https://{url_host} refuses it (one that uses a name the "
                        "certificate holds does not)")
    return warnings


def _check_key(path: Path) -> list[str]:
    """Refuse an encrypted key (OpenSSL would prompt for its passphrase, at start and again
    in the server) or one other users can read; a warning for one its group can read."""
    try:
        serialization.load_pem_private_key(path.read_bytes(), password=None)
    except TypeError:  # encrypted with a password
        raise ConfigError(f"[tls] key {path}: the key is encrypted; give it without a "
                          "password (readable by the server only)") from None
    except (ValueError, OSError):  # not PEM, or unreadable: the pair's check below names it
        pass
    readers = readable_by(path)
    if readers is None:
        return []
    who, mode = readers
    if who == "others":  # a warning: a container's secret volume mounts keys 0644 or 0444
        return [f"[tls] key {path}: other users of this machine can read it (mode "
                f"{mode:04o}); make it readable by the server only: chmod 600 {path} (or the "
                "secret volume's defaultMode 0400)"]
    return [f"[tls] key {path}: its group can read it (mode {mode:04o}); unless that "
            f"group is meant to, make it readable by the server only: chmod 600 {path}"]


def _check_client_ca(ctx: ssl.SSLContext, path: Path) -> list[str]:
    """Every certificate in ``client_ca`` is a CA's, and one at least is current: a site's own
    certificate, or only expired CAs, there make every site's handshake fail. The warnings: a
    bundle's CAs that are not current (a changeover's old CA)."""
    try:
        ctx.load_verify_locations(cafile=str(path))
        certs = x509.load_pem_x509_certificates(path.read_bytes())
    except (ssl.SSLError, ValueError, OSError) as exc:
        raise ConfigError(f"[tls] client_ca {path}: not a PEM certificate file ({exc})"
                          ) from None
    for cert in certs:
        if not _is_ca(cert):
            which = "" if len(certs) == 1 else f" ({cert.subject.rfc4514_string()})"
            raise ConfigError(f"[tls] client_ca {path}: not a CA certificate{which} (a site's "
                              "or the server's own?): give the CA that signed the sites' "
                              "certificates, e.g. ca.pem of `fedforest pki init`")
    refused = ": every site's certificate would be refused; give the federation's current CA"
    if len(certs) == 1:
        try:
            check_validity(path)
        except ValueError as exc:
            raise ConfigError(f"[tls] client_ca {exc}{refused}") from None
        return []
    now = _dt.datetime.now(_dt.UTC)
    stale = [c for c in certs if not c.not_valid_before_utc <= now <= c.not_valid_after_utc]
    if len(stale) < len(certs):  # a CA changeover: the current CA verifies, OpenSSL skips
        return [f"[tls] client_ca {path}: the certificate of {c.subject.rfc4514_string()} is "
                f"valid from {c.not_valid_before_utc:%Y-%m-%d %H:%M} to "
                f"{c.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, not now: sites it signed are "
                "refused (the others' CA is current)" for c in stale]
    raise ConfigError(f"[tls] client_ca {path}: no certificate in it is valid now (e.g. "
                      f"{stale[0].subject.rfc4514_string()}: "
                      f"{stale[0].not_valid_before_utc:%Y-%m-%d %H:%M} to "
                      f"{stale[0].not_valid_after_utc:%Y-%m-%d %H:%M} UTC){refused}")


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _serves_tls(cert: x509.Certificate) -> bool:
    """No extended key usage (any purpose), or one that includes serverAuth."""
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True
    return (ExtendedKeyUsageOID.SERVER_AUTH in usages
            or ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE in usages)


def _unnamed_host(cert: x509.Certificate, host: str) -> str | None:
    """None if ``cert`` names ``host`` (or the server listens on every interface); else the
    names it holds, as said in a warning."""
    if host in _ANY_ADDRESS:
        return None
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "no host (it has no subject alternative names)"
    dns = sans.get_values_for_type(x509.DNSName)
    ips = sans.get_values_for_type(x509.IPAddress)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if any(_dns_matches(name, host) for name in dns):
            return None
    else:
        if address in ips:
            return None
    held = [*dns, *(str(ip) for ip in ips)]
    return ", ".join(held) if held else "no host"


def _dns_matches(pattern: str, host: str) -> bool:
    """RFC 6125 matching as clients do it: case-insensitive, a ``*`` only as the whole
    leftmost label, standing for exactly one label."""
    pattern, host = pattern.lower().rstrip("."), host.lower().rstrip(".")
    if pattern.startswith("*."):
        first, _, rest = host.partition(".")
        return bool(first) and rest == pattern[2:]
    return pattern == host
