from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import re
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from client_app.transport import tls_context
from fedforest_secure.pki import (
    DevPKI,
    check_validity,
    create_ca,
    init_dev_pki,
    issue_certificate,
    load_certificate,
    verify_signed_by,
)


def test_dev_pki_files_and_sans(dev_pki: DevPKI) -> None:
    ca = load_certificate(dev_pki.ca_cert)
    server = load_certificate(dev_pki.server_cert)
    assert verify_signed_by(server, ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert len(dev_pki.client_certs) == 5
    assert all(verify_signed_by(load_certificate(p), ca) for p in dev_pki.client_certs)
    assert (dev_pki.server_key.stat().st_mode & 0o777) == 0o600


def test_the_server_certificate_serves_tls_only_and_site_certificates_are_clients(
        dev_pki: DevPKI) -> None:
    """A site's certificate is a client's (clientAuth: what certifies a secure-aggregation
    identity); the server's holds serverAuth only, so the server cannot certify one."""
    def usage(path: Path) -> list[x509.ObjectIdentifier]:
        cert = load_certificate(path)
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)

    assert usage(dev_pki.server_cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert all(usage(p) == [ExtendedKeyUsageOID.CLIENT_AUTH] for p in dev_pki.client_certs)


def test_foreign_certificate_is_not_signed_by_ca(dev_pki: DevPKI) -> None:
    rogue = issue_certificate(create_ca("rogue"), "127.0.0.1", server=True, hosts=("127.0.0.1",))
    assert not verify_signed_by(rogue.cert, load_certificate(dev_pki.ca_cert))


def test_server_certificate_needs_hosts() -> None:
    with pytest.raises(ValueError):
        issue_certificate(create_ca(), "srv", server=True)


@pytest.mark.parametrize("host", ["not a host!", "fed_server.example", "-lead.example", "a..b",
                                  "x" * 64 + ".example", ""])
def test_a_host_that_is_neither_an_address_nor_a_dns_name_is_refused(
        host: str, tmp_path: Path) -> None:
    # a typo would make a certificate no client accepts, found only at the first connection
    with pytest.raises(ValueError, match="is neither an IP address nor a DNS host name"):
        init_dev_pki(tmp_path / "certs", 1, hosts=("localhost", host))
    assert not (tmp_path / "certs").exists()


@pytest.mark.parametrize("host", ["fed.hospital-a.example", "localhost", "::1", "10.0.0.7",
                                  "*.fed.example", "Fed-Server.Example."])
def test_dns_names_and_addresses_are_accepted_as_hosts(host: str) -> None:
    issue_certificate(create_ca(), host, server=True, hosts=(host,))


def _tls_server(cert: Path, key: Path) -> tuple[int, threading.Thread]:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    port = sock.getsockname()[1]

    def serve() -> None:
        conn, _ = sock.accept()
        try:
            ctx.wrap_socket(conn, server_side=True).close()
        except (ssl.SSLError, OSError):
            pass
        finally:
            sock.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    return port, th


def _handshake(port: int, ctx: ssl.SSLContext) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
        pass


def test_client_refuses_server_cert_from_another_ca(dev_pki: DevPKI, tmp_path: Path) -> None:
    rogue = init_dev_pki(tmp_path / "rogue", 0)
    port, th = _tls_server(rogue.server_cert, rogue.server_key)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(port, tls_context(dev_pki.ca_cert))
    th.join(5)


def test_client_accepts_server_cert_from_federation_ca(dev_pki: DevPKI) -> None:
    port, th = _tls_server(dev_pki.server_cert, dev_pki.server_key)
    _handshake(port, tls_context(dev_pki.ca_cert))
    th.join(5)


def test_a_missing_or_unreadable_tls_file_is_named(dev_pki: DevPKI, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--ca .*nowhere\.pem.*not found"):
        tls_context(tmp_path / "nowhere.pem")
    with pytest.raises(ValueError, match=r"--key .*nowhere\.key.*not found"):
        tls_context(dev_pki.ca_cert, dev_pki.client_certs[0], tmp_path / "nowhere.key")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(ValueError, match=r"--ca .*junk\.pem.*PEM"):
        tls_context(junk)
    with pytest.raises(ValueError, match=r"--cert .*does not match|--cert .*PEM"):
        tls_context(dev_pki.ca_cert, dev_pki.client_certs[0], dev_pki.client_keys[1])


def _dated_client(tmp_path: Path, name: str, *, start_days: float, days: int) -> Path:
    """``tmp_path/<name>.pem`` (and ``.key``): a client certificate of a fresh CA whose
    validity starts ``start_days`` from now (negative: in the past) and lasts ``days``."""
    ca = create_ca()
    start = _dt.datetime.now(_dt.UTC) + _dt.timedelta(days=start_days)
    issue_certificate(ca, name, server=False, days=days, now=start).write(
        tmp_path / f"{name}.pem", tmp_path / f"{name}.key")
    return tmp_path / f"{name}.pem"


def test_an_expired_client_certificate_is_refused_naming_the_file_and_its_dates(
        dev_pki: DevPKI, tmp_path: Path) -> None:
    cert = _dated_client(tmp_path, "old", start_days=-30, days=10)
    with pytest.raises(ValueError) as err:
        tls_context(dev_pki.ca_cert, cert, tmp_path / "old.key")
    after = load_certificate(cert).not_valid_after_utc
    text = str(err.value)
    assert text.startswith(f"--cert {cert}: the certificate expired on "
                           f"{after:%Y-%m-%d %H:%M} UTC"), text
    assert "valid from" in text
    assert text.endswith(
        "; the server refuses it: ask the federation's coordinator for a new certificate of "
        "this site's name (a new key and request made here, `fedforest pki request --name old "
        "--out <new directory>`, signed where the CA is kept, `fedforest pki sign --csr "
        "old.csr --ca-dir <CA directory> --renew`; if the federation's CA has expired too, a "
        "new CA and a certificate from it)"), text


def test_a_client_certificate_not_valid_yet_is_refused_naming_the_file_and_its_dates(
        dev_pki: DevPKI, tmp_path: Path) -> None:
    cert = _dated_client(tmp_path, "early", start_days=2, days=10)
    with pytest.raises(ValueError) as err:
        tls_context(dev_pki.ca_cert, cert, tmp_path / "early.key")
    before = load_certificate(cert).not_valid_before_utc
    text = str(err.value)
    assert text.startswith(f"--cert {cert}: the certificate is not valid before "
                           f"{before:%Y-%m-%d %H:%M} UTC"), text
    assert "clock" in text


def test_check_validity_names_the_dates_of_a_certificate_outside_them(tmp_path: Path) -> None:
    cert = _dated_client(tmp_path, "c", start_days=0, days=10)
    assert check_validity(cert).subject == load_certificate(cert).subject
    later = _dt.datetime.now(_dt.UTC) + _dt.timedelta(days=11)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(cert))}: the certificate expired"):
        check_validity(cert, now=later)
    earlier = _dt.datetime.now(_dt.UTC) - _dt.timedelta(days=1)
    with pytest.raises(ValueError, match="is not valid before"):
        check_validity(cert, now=earlier)


@pytest.mark.parametrize("name", ["hospital-a\n", "hospital a", "ca", "CA", "Server"])
def test_a_site_name_with_a_trailing_newline_is_refused_as_any_bad_name(
        tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError) as refused:
        init_dev_pki(tmp_path / "certs", 1, client_names=[name])
    assert str(refused.value) == (f"site names {[name]!r} are not usable as file names "
                                  "(letters, digits, '.', '_', '-'; not 'ca' or 'server' in "
                                  "any letter case)")
    assert not (tmp_path / "certs").exists()


def test_a_new_pki_directory_is_its_users_and_no_one_else_can_replace_its_files(
        tmp_path: Path) -> None:
    """Under umask 000: ``pki init``'s new directory is 0700 (it holds the CA's key), every
    certificate 0644 (no one else replaces the CA certificate, the server's and the sites'
    trust anchor) and every key 0600; so is a certificate ``pki issue`` adds."""
    from fedforest_secure.pki import issue_client_certificates

    old = os.umask(0)
    try:
        pki = init_dev_pki(tmp_path / "pki", 1)
        added = issue_client_certificates(tmp_path / "pki", ["hospital-z"])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "pki").stat().st_mode) == 0o700
    for cert in [pki.ca_cert, pki.server_cert, *pki.client_certs, *added]:
        assert stat.S_IMODE(cert.stat().st_mode) == 0o644, cert
    for key in [pki.ca_key, pki.server_key, *pki.client_keys, tmp_path / "pki" / "hospital-z.key"]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_site_names_differing_in_letter_case_only_are_refused(tmp_path: Path) -> None:
    """``CA`` and ``Server`` were accepted as site names, and ``Hospital-A`` beside
    ``hospital-a``: on a disk that ignores letter case (macOS's and Windows' by default) their
    files are the CA's, the server's or the other site's, written over or moved aside."""
    from fedforest_secure.pki import issue_client_certificates

    with pytest.raises(ValueError) as refused:
        init_dev_pki(tmp_path / "certs", 2, client_names=["Hospital-A", "hospital-a"])
    assert str(refused.value) == (
        "site names differ in letter case only: ['Hospital-A', 'hospital-a']: a disk that "
        "ignores letter case (as macOS's and Windows' do by default) keeps them in one file; "
        "give each site a name of its own")
    assert not (tmp_path / "certs").exists()
    certs = tmp_path / "certs"
    init_dev_pki(certs, 1, client_names=["hospital-a"])
    before = sorted(p.name for p in certs.iterdir())
    for renew in (False, True):
        with pytest.raises(ValueError) as refused:
            issue_client_certificates(certs, ["Hospital-A"], renew=renew)
        assert str(refused.value) == (
            f"'Hospital-A' differs in letter case only from 'hospital-a', whose certificate is "
            f"in {certs}: a disk that ignores letter case (as macOS's and Windows' do by "
            f"default) keeps them in one file; give the site another name (`fedforest pki "
            f"issue --ca-dir {certs} --name hospital-a --renew` renews that one)")
    with pytest.raises(ValueError, match="'Operator' is 'operator', the name of an operator's "
                                         "certificate, in other letter case"):
        issue_client_certificates(certs, ["Operator"])
    assert sorted(p.name for p in certs.iterdir()) == before


def test_a_site_named_by_an_older_version_in_other_letter_case_is_renewed_under_its_name(
        tmp_path: Path) -> None:
    """Sites named ``CA``, ``Server`` or ``Operator``, and ``Hospital-A`` beside
    ``hospital-a``, made before the letter-case checks: each holds a token bound to its name,
    so ``--renew`` renews its certificate under that name; a new name in other letter case is
    still refused, naming the command that renews the one there."""
    from fedforest_secure.pki import issue_client_certificates, load_ca

    certs = tmp_path / "certs"
    init_dev_pki(certs, 1, client_names=["hospital-a"])
    ca = load_ca(certs / "ca.pem", certs / "ca.key")
    olds = ["CA", "Server", "Operator", "Hospital-A"]
    for name in olds:  # as an older version wrote them
        issue_certificate(ca, name, server=False).write(certs / f"{name}.pem",
                                                        certs / f"{name}.key")
    for name in [*olds, "hospital-a"]:
        old = (certs / f"{name}.pem").read_bytes()
        assert issue_client_certificates(certs, [name], renew=True) == [certs / f"{name}.pem"]
        new = load_certificate(certs / f"{name}.pem")
        assert new.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == name
        assert verify_signed_by(new, ca.cert)
        kept = list(certs.glob(f"{name}.pem.replaced-*"))
        assert len(kept) == 1 and kept[0].read_bytes() == old
    assert load_certificate(certs / "ca.pem").subject == ca.cert.subject  # the CA untouched
    with pytest.raises(FileExistsError, match=re.escape(
            f"{certs} already holds CA.pem, CA.key: nothing was written (a site's certificate "
            "is replaced only with --renew")):
        issue_client_certificates(certs, ["CA"])
    with pytest.raises(ValueError, match=re.escape(
            "site names ['SERVER'] are not usable as file names")):
        issue_client_certificates(certs, ["SERVER"], renew=True)
    with pytest.raises(ValueError, match=re.escape(
            "give the site another name (`fedforest pki issue --ca-dir")):
        issue_client_certificates(certs, ["HOSPITAL-A"], renew=True)
