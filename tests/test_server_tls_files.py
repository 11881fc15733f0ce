"""The server's ``[tls]`` files, checked before it starts: what every client or site would
refuse at the handshake (or what would prompt for a passphrase) is a configuration error naming
the option and the file; a certificate that does not name the configured host is a warning."""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from fedforest_secure.pki import CertifiedKey, DevPKI, create_ca, issue_certificate
from server_app.serve import check_transport
from server_app.settings import ConfigError, ServerSettings, TLSSettings


def _settings(cert: Path, key: Path, client_ca: Path | None = None, *,
              host: str = "127.0.0.1") -> ServerSettings:
    return ServerSettings(host=host, tls=TLSSettings(cert=cert, key=key, client_ca=client_ca))


def _write(pair: CertifiedKey, root: Path, name: str) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    pair.write(root / f"{name}.pem", root / f"{name}.key")
    return root / f"{name}.pem", root / f"{name}.key"


def test_the_dev_pki_passes_without_warnings(dev_pki: DevPKI) -> None:
    assert check_transport(_settings(dev_pki.server_cert, dev_pki.server_key, dev_pki.ca_cert),
                           insecure_dev=False) == []


def test_a_client_ca_that_is_a_sites_certificate_is_refused(dev_pki: DevPKI) -> None:
    """A leaf as client_ca: every site's certificate failed its handshake."""
    leaf = dev_pki.client_certs[0]
    with pytest.raises(ConfigError) as err:
        check_transport(_settings(dev_pki.server_cert, dev_pki.server_key, leaf),
                        insecure_dev=False)
    assert str(err.value).startswith(f"[tls] client_ca {leaf}: not a CA certificate"), err.value
    assert "the CA that signed the sites' certificates" in str(err.value)


def test_an_expired_client_ca_is_refused(dev_pki: DevPKI, tmp_path: Path) -> None:
    start = _dt.datetime.now(_dt.UTC) - _dt.timedelta(days=15)
    old_ca, _ = _write(create_ca(days=10, now=start), tmp_path, "old-ca")
    with pytest.raises(ConfigError) as err:
        check_transport(_settings(dev_pki.server_cert, dev_pki.server_key, old_ca),
                        insecure_dev=False)
    assert str(err.value).startswith(f"[tls] client_ca {old_ca}: the certificate expired on")
    assert "every site's certificate would be refused" in str(err.value)


def test_a_server_certificate_without_server_auth_is_refused(dev_pki: DevPKI) -> None:
    """A site's certificate (clientAuth only) as the server's: every client failed with
    'unsuitable certificate purpose'."""
    cert, key = dev_pki.client_certs[0], dev_pki.client_keys[0]
    with pytest.raises(ConfigError) as err:
        check_transport(_settings(cert, key, dev_pki.ca_cert), insecure_dev=False)
    assert str(err.value).startswith(f"[tls] cert {cert}: not a TLS server certificate "
                                     "(its extended key usage has no serverAuth"), err.value
    assert "unsuitable certificate purpose" in str(err.value)


@pytest.mark.parametrize(("host", "warned"), [
    ("127.0.0.1", False), ("localhost", False), ("LOCALHOST", False), ("0.0.0.0", False),
    ("::", False), ("127.0.0.2", True), ("fed.example.org", True)])
def test_a_certificate_that_does_not_name_the_host_is_a_warning(
        dev_pki: DevPKI, host: str, warned: bool) -> None:
    """The dev PKI's server certificate names localhost and 127.0.0.1; a server listening
    on every interface may be reached by any name, so nothing is said."""
    said = check_transport(_settings(dev_pki.server_cert, dev_pki.server_key, host=host),
                           insecure_dev=False)
    if warned:
        assert len(said) == 1 and said[0].startswith(
            f"[tls] cert {dev_pki.server_cert} names localhost, 127.0.0.1, not {host}"), said
    else:
        assert said == []


def test_a_wildcard_certificate_names_the_hosts_of_its_domain(tmp_path: Path) -> None:
    ca = create_ca()
    cert, key = _write(issue_certificate(ca, "fed", server=True, hosts=("*.fed.example",)),
                       tmp_path, "server")
    assert check_transport(_settings(cert, key, host="a.fed.example"), insecure_dev=False) == []
    assert check_transport(_settings(cert, key, host="a.b.fed.example"), insecure_dev=False)


def test_an_encrypted_key_is_refused_before_anything_asks_for_its_passphrase(
        dev_pki: DevPKI, tmp_path: Path) -> None:
    plain = serialization.load_pem_private_key(dev_pki.server_key.read_bytes(), password=None)
    locked = tmp_path / "server.key"
    locked.write_bytes(plain.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    locked.chmod(0o600)
    with pytest.raises(ConfigError) as err:
        check_transport(_settings(dev_pki.server_cert, locked), insecure_dev=False)
    assert str(err.value).startswith(f"[tls] key {locked}: the key is encrypted; give it "
                                     "without a password"), err.value


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.parametrize("mode", [0o604, 0o644, 0o666], ids=oct)
def test_a_key_other_users_can_read_is_a_warning_with_the_remedy(
        dev_pki: DevPKI, tmp_path: Path, mode: int) -> None:
    """A warning, not a refusal: a container's secret volume mounts keys 0644 or 0444 by
    default, and such a server must still start."""
    key = tmp_path / "server.key"
    key.write_bytes(dev_pki.server_key.read_bytes())
    key.chmod(mode)
    assert check_transport(_settings(dev_pki.server_cert, key), insecure_dev=False) == [
        f"[tls] key {key}: other users of this machine can read it (mode {mode:04o}); make "
        f"it readable by the server only: chmod 600 {key} (or the secret volume's "
        "defaultMode 0400)"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_a_key_its_group_can_read_is_a_warning(dev_pki: DevPKI, tmp_path: Path) -> None:
    """0640 with a group of services that share the key (Debian's ssl-cert) is a deliberate
    set-up: said, not refused."""
    key = tmp_path / "server.key"
    key.write_bytes(dev_pki.server_key.read_bytes())
    key.chmod(0o640)
    said = check_transport(_settings(dev_pki.server_cert, key), insecure_dev=False)
    assert said == [f"[tls] key {key}: its group can read it (mode 0640); unless that group "
                    f"is meant to, make it readable by the server only: chmod 600 {key}"]


@pytest.mark.parametrize("option", ["cert", "key", "client_ca"])
def test_a_tls_option_that_names_a_directory_or_nothing_says_which_option(
        dev_pki: DevPKI, tmp_path: Path, option: str) -> None:
    """`cert = ""` is the config's own directory once resolved."""
    files = {"cert": dev_pki.server_cert, "key": dev_pki.server_key,
             "client_ca": dev_pki.ca_cert}
    with pytest.raises(ConfigError) as err:
        check_transport(_settings(**{**files, option: tmp_path}), insecure_dev=False)
    assert str(err.value) == (f"[tls] {option} {tmp_path}: a directory, not a file: name the "
                              "PEM file"), err.value
    missing = tmp_path / "nope.pem"
    with pytest.raises(ConfigError) as err:
        check_transport(_settings(**{**files, option: missing}), insecure_dev=False)
    assert str(err.value) == f"[tls] {option} {missing}: file not found", err.value


def test_a_client_ca_bundle_takes_several_cas_but_no_leaf(dev_pki: DevPKI,
                                                           tmp_path: Path) -> None:
    other, _ = _write(create_ca("FedForest next CA"), tmp_path, "next-ca")
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(dev_pki.ca_cert.read_bytes() + other.read_bytes())
    assert check_transport(_settings(dev_pki.server_cert, dev_pki.server_key, bundle),
                           insecure_dev=False) == []
    bundle.write_bytes(bundle.read_bytes() + dev_pki.client_certs[1].read_bytes())
    with pytest.raises(ConfigError, match=r"not a CA certificate \(.*CN=client-1"):
        check_transport(_settings(dev_pki.server_cert, dev_pki.server_key, bundle),
                        insecure_dev=False)


def test_a_client_ca_bundle_with_an_expired_ca_beside_a_current_one_is_a_warning(
        dev_pki: DevPKI, tmp_path: Path) -> None:
    """A CA changeover keeps the old CA beside the new one: once the old one expires OpenSSL
    skips it and the sites of the current one are accepted, so the server starts and warns;
    a bundle of expired CAs only is refused."""
    start = _dt.datetime.now(_dt.UTC) - _dt.timedelta(days=15)
    old_ca, _ = _write(create_ca("FedForest old CA", days=10, now=start), tmp_path, "old-ca")
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(dev_pki.ca_cert.read_bytes() + old_ca.read_bytes())
    said = check_transport(_settings(dev_pki.server_cert, dev_pki.server_key, bundle),
                           insecure_dev=False)
    assert len(said) == 1 and "CN=FedForest old CA" in said[0] and "not now" in said[0], said
    older, _ = _write(create_ca("FedForest older CA", days=5, now=start), tmp_path, "older")
    bundle.write_bytes(old_ca.read_bytes() + older.read_bytes())
    with pytest.raises(ConfigError, match="no certificate in it is valid now"):
        check_transport(_settings(dev_pki.server_cert, dev_pki.server_key, bundle),
                        insecure_dev=False)
