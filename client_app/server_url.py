"""The server URL a client is given, checked before anything is sent to it: ``https://`` always;
plain ``http://`` only towards a loopback host (``localhost``, 127.0.0.0/8, ``::1``) and only with
the client's explicit ``--insecure-dev``. The URL is parsed, never prefix-matched."""

from __future__ import annotations

import ipaddress
import urllib.parse

import httpx

__all__ = ["check_server_url", "is_loopback_host"]


def is_loopback_host(host: str) -> bool:
    """``localhost`` or a literal loopback address (127.0.0.0/8, ::1); never a name that
    merely starts like one (``127.0.0.1.evil.example``, ``localhost.example.org``)."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_server_url(url: str, *, insecure_dev: bool = False) -> str:
    """Check a server URL before anything is sent to it; returns its scheme.

    ``https://host[:port][/path]`` always; ``http://`` only with ``insecure_dev`` (the
    client's ``--insecure-dev``) and a loopback host. The URL is parsed (by ``urllib`` and by
    ``httpx``, which connects; both must agree on the host), never prefix-matched, and
    user-info (``http://127.0.0.1@evil.example``) is refused outright.
    """
    if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 for c in url) or "\\" in url:
        raise ValueError("the server URL must be a plain https://host:port URL")
    try:
        parts = urllib.parse.urlsplit(url)
        parsed = httpx.URL(url)
        _ = parts.port  # raises ValueError on a malformed port
    except (ValueError, httpx.InvalidURL) as exc:
        raise ValueError(f"the server URL {url!r} does not parse: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise ValueError("the server URL must be https:// (http:// only for a loopback server "
                         "with --insecure-dev)")
    if "@" in parts.netloc or parts.username is not None or parsed.userinfo:
        raise ValueError("the server URL must not contain user-info ('user@host'): it hides "
                         "the real host")
    host = (parts.hostname or "").lower()
    if not host or host != parsed.host.lower().strip("[]") or parts.query or parts.fragment:
        raise ValueError(f"the server URL {url!r} is ambiguous or has no host")
    if scheme == "http":
        if not is_loopback_host(host):
            raise ValueError(f"plain http:// is refused for {host!r}: the server URL must be "
                             "https:// (http:// only for a loopback host with --insecure-dev)")
        if not insecure_dev:
            raise ValueError("plain http:// sends the token and every upload unencrypted: use "
                             "https://, or pass --insecure-dev for a loopback development "
                             "server run with --insecure-dev")
    return scheme
