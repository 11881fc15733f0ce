"""The certified identity directory: what a server that does not hold the CA key cannot forge."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from nacl.signing import SigningKey
from two_tier_pki import write_two_tier_pki

from fedforest_secure.errors import InvalidMessage, RefusedRequest
from fedforest_secure.pki import init_dev_pki
from fedforest_secure.secagg.directory import (
    Certification,
    certify_identity,
    verify_directory,
)

JOB = "job-d"


@pytest.fixture(scope="module")
def pkis(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    a = tmp_path_factory.mktemp("ca-a")
    b = tmp_path_factory.mktemp("ca-b")
    init_dev_pki(a, 3)
    init_dev_pki(b, 3)
    return a, b


def _entries(certs: Path, n: int = 3) -> tuple[dict[int, bytes], dict[int, Certification]]:
    keys, certifications = {}, {}
    for k in range(n):
        ident = bytes(SigningKey.generate().verify_key)
        keys[k] = ident
        certifications[k] = certify_identity(JOB, ident, (certs / f"client-{k}.pem").read_bytes(),
                                             (certs / f"client-{k}.key").read_bytes())
    return keys, certifications


def test_a_directory_of_ca_certified_identities_verifies(pkis: tuple[Path, Path]) -> None:
    a, _ = pkis
    keys, certs = _entries(a)
    names = verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes())
    assert names == {0: "client-0", 1: "client-1", 2: "client-2"}
    again = {k: Certification.from_json(c.to_json()) for k, c in certs.items()}
    assert verify_directory(JOB, keys, again, (a / "ca.pem").read_bytes()) == names


@pytest.mark.parametrize("attack", ["sybil_key", "other_ca", "missing", "duplicate_name",
                                    "other_job"])
def test_a_server_cannot_add_or_swap_an_identity(pkis: tuple[Path, Path], attack: str) -> None:
    a, b = pkis
    keys, certs = _entries(a)
    if attack == "sybil_key":  # the server swaps in its own identity key for client 2
        keys[2] = bytes(SigningKey.generate().verify_key)
    elif attack == "other_ca":  # a certificate from a CA the federation does not trust
        other_keys, other_certs = _entries(b)
        keys[2], certs[2] = other_keys[2], other_certs[2]
    elif attack == "missing":
        del certs[1]
    elif attack == "duplicate_name":  # client 0's genuine entry, a second time
        keys[3], certs[3] = keys[0], certs[0]
    else:  # client 1's certification of the same key for another job
        certs[1] = certify_identity("job-other", keys[1], (a / "client-1.pem").read_bytes(),
                                    (a / "client-1.key").read_bytes())
    with pytest.raises(InvalidMessage):
        verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes())


def test_the_server_cannot_certify_an_identity_with_its_own_tls_certificate(
        pkis: tuple[Path, Path]) -> None:
    """The federation CA issued the server's certificate (an EC key, like the sites'): an
    identity the server plays, signed with ``server.key``, is refused as not a site's."""
    a, _ = pkis
    keys, certs = _entries(a, 2)
    keys[2] = bytes(SigningKey.generate().verify_key)
    certs[2] = certify_identity(JOB, keys[2], (a / "server.pem").read_bytes(),
                                (a / "server.key").read_bytes())
    with pytest.raises(InvalidMessage) as exc:
        verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes())
    assert str(exc.value) == (
        "directory entry 2 ('localhost'): not a site's certificate (its extended key usage "
        "holds serverAuth, no clientAuth); a site certifies its identity with its own client "
        "certificate, whose extended key usage holds clientAuth and not the operator purpose, "
        "as those `fedforest pki sign` (and `pki issue` without --operator) write")
    assert exc.value.peer == 2


def _leaf(a: Path, name: str, usages: list[x509.ObjectIdentifier] | None, *,
          ca: bool = False) -> tuple[bytes, bytes]:
    """A certificate (PEM) and key (PEM) for ``name`` signed by the CA in ``a``, with the
    extended key usages ``usages`` (None: no such extension) and BasicConstraints ``ca``."""
    import datetime as dt

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from fedforest_secure.pki import CertifiedKey, load_ca

    issuer = load_ca(a / "ca.pem", a / "ca.key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(issuer.cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(hours=1))
               .not_valid_after(now + dt.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if usages is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    leaf = CertifiedKey(key, builder.sign(issuer.key, hashes.SHA256()))
    return leaf.cert_pem(), leaf.key_pem()


@pytest.mark.parametrize(("case", "what"), [
    ("the_ca_itself", "a CA certificate"),
    ("a_ca_with_client_auth", "a CA certificate"),
    ("no_usage", "it has no extended key usage"),
    ("any_usage", "its extended key usage holds anyExtendedKeyUsage, no clientAuth"),
])
def test_an_entry_whose_certificate_is_no_site_certificate_is_refused_and_accused(
        pkis: tuple[Path, Path], case: str, what: str) -> None:
    """Only a certificate that is not a CA's and whose extended key usage holds clientAuth
    certifies an identity."""
    a, _ = pkis
    keys, certs = _entries(a)
    if case == "the_ca_itself":
        cert_pem, key_pem = (a / "ca.pem").read_bytes(), (a / "ca.key").read_bytes()
        name = "FedForest dev CA"
    else:
        usages = {"a_ca_with_client_auth": [ExtendedKeyUsageOID.CLIENT_AUTH], "no_usage": None,
                  "any_usage": [ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE]}[case]
        name = "hospital-x"
        cert_pem, key_pem = _leaf(a, name, usages, ca=case == "a_ca_with_client_auth")
    keys[1] = bytes(SigningKey.generate().verify_key)
    certs[1] = certify_identity(JOB, keys[1], cert_pem, key_pem)
    with pytest.raises(InvalidMessage,
                       match=re.escape(f"directory entry 1 ({name!r}): not a site's "
                                       f"certificate ({what}); a site certifies")) as exc:
        verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes())
    assert exc.value.peer == 1


def test_a_site_certificate_with_client_and_server_auth_certifies_an_identity(
        pkis: tuple[Path, Path]) -> None:
    """clientAuth is what makes a site's certificate (an institution's PKI may add serverAuth):
    hence a server certificate must not hold clientAuth (docs/deployment.md)."""
    a, _ = pkis
    keys, certs = _entries(a, 2)
    cert_pem, key_pem = _leaf(a, "hospital-x", [ExtendedKeyUsageOID.SERVER_AUTH,
                                                ExtendedKeyUsageOID.CLIENT_AUTH])
    keys[2] = bytes(SigningKey.generate().verify_key)
    certs[2] = certify_identity(JOB, keys[2], cert_pem, key_pem)
    names = verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes())
    assert names == {0: "client-0", 1: "client-1", 2: "hospital-x"}


def test_an_entry_whose_certificate_expired_is_named_with_its_dates_and_accused(
        pkis: tuple[Path, Path]) -> None:
    """A certificate valid when its site joined and expired since: the entry is named (index
    and name), with its validity and this machine's time, as that site's (``peer``) to
    renew."""
    import datetime as dt

    a, _ = pkis
    keys, certs = _entries(a)
    cert = x509.load_pem_x509_certificate(certs[0].cert_pem.encode())
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    now = end + dt.timedelta(days=1)
    with pytest.raises(InvalidMessage) as exc:
        verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes(), now=now)
    assert str(exc.value) == (
        f"directory entry 0 ('client-0'): the certificate has expired (valid "
        f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC; this machine's clock says "
        f"{now:%Y-%m-%d %H:%M} UTC); that site needs a new one")
    assert exc.value.peer == 0


def _certified_at(a: Path, *ages: datetime.timedelta
                  ) -> tuple[dict[int, bytes], dict[int, Certification], datetime.datetime]:
    """A directory whose entry k holds a certificate issued ``ages[k]`` ago (the CA of ``a``),
    and the present."""
    from fedforest_secure.pki import issue_certificate, load_ca

    ca = load_ca(a / "ca.pem", a / "ca.key")
    real = datetime.datetime.now(datetime.UTC)
    keys, certs = {}, {}
    for k, age in enumerate(ages):
        made = issue_certificate(ca, f"client-{k}", server=False, now=real - age)
        keys[k] = bytes(SigningKey.generate().verify_key)
        certs[k] = certify_identity(JOB, keys[k], made.cert_pem(), made.key_pem())
    return keys, certs, real


def test_a_peer_certificate_issued_minutes_ago_checks_on_a_site_whose_clock_is_an_hour_behind(
        pkis: tuple[Path, Path]) -> None:
    """Sites 0 and 1 were certified 3 hours ago, site 2 10 minutes ago (its certificate
    starts 5 minutes before that); this machine's clock is 55 minutes behind: site 2's
    certificate starts 50 minutes after this clock's now, within the hour of
    NOT_YET_VALID_LEEWAY, and the entry checks."""
    a, _ = pkis
    old, new = datetime.timedelta(hours=3), datetime.timedelta(minutes=10)
    keys, certs, real = _certified_at(a, old, old, new)
    names = verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes(),
                             now=real - datetime.timedelta(minutes=55))
    assert names == {0: "client-0", 1: "client-1", 2: "client-2"}
    with pytest.raises(RefusedRequest):  # 1 h + 1 min before it starts: beyond the leeway
        verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes(),
                         now=real - datetime.timedelta(minutes=15 + 61))


def test_a_peer_certificate_not_valid_yet_beyond_the_leeway_is_this_clocks_fault_not_the_peers(
        pkis: tuple[Path, Path]) -> None:
    """This machine's clock is 3 h behind: a peer certified 10 minutes ago is not valid yet on
    it (the others, certified 5 hours ago, are). The check refuses the round (RefusedRequest,
    code "other"), accusing nobody, and says this machine's time beside the certificate's
    dates and what to check."""
    a, _ = pkis
    old, new = datetime.timedelta(hours=5), datetime.timedelta(minutes=10)
    keys, certs, real = _certified_at(a, old, old, new)
    cert = x509.load_pem_x509_certificate(certs[2].cert_pem.encode())
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    now = real - datetime.timedelta(hours=3)
    with pytest.raises(RefusedRequest) as exc:
        verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes(), now=now)
    assert not isinstance(exc.value, InvalidMessage)
    assert exc.value.code == "other"
    assert str(exc.value) == (
        f"directory entry 2 ('client-2'): the certificate is not valid yet on this machine's "
        f"clock (valid {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC; this machine's "
        f"clock says {now:%Y-%m-%d %H:%M} UTC, more than 1 h before the certificate starts); "
        "this machine's clock is likely behind: check its time (NTP, time zone) before this "
        "site's next job (this site leaves this one: it cannot take part in its rounds)")


@pytest.mark.parametrize(("attack", "peer"), [("sybil_key", 2), ("other_ca", 2),
                                              ("missing", 1), ("other_job", 1)])
def test_the_entry_that_does_not_check_is_the_accused_peer(pkis: tuple[Path, Path],
                                                           attack: str, peer: int) -> None:
    a, b = pkis
    keys, certs = _entries(a)
    if attack == "sybil_key":
        keys[2] = bytes(SigningKey.generate().verify_key)
    elif attack == "other_ca":
        other_keys, other_certs = _entries(b)
        keys[2], certs[2] = other_keys[2], other_certs[2]
    elif attack == "missing":
        del certs[1]
    else:
        certs[1] = certify_identity("job-other", keys[1], (a / "client-1.pem").read_bytes(),
                                    (a / "client-1.key").read_bytes())
    with pytest.raises(InvalidMessage) as exc:
        verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes())
    assert exc.value.peer == peer


def _connect_as_site_0(a: Path, cert_pem: bytes, key_pem: bytes) -> None:
    """Site 0's secure session, with its own identity certified by ``cert_pem``/``key_pem``,
    checking the directory of the job (sites 1 and 2 certified by their own certificates)."""
    from types import SimpleNamespace

    from client_app.secagg_session import SecAggSession
    from fedforest_secure.config import JobConfig

    keys, certs = _entries(a)
    own = SigningKey.generate()
    keys[0] = bytes(own.verify_key)
    certs[0] = certify_identity(JOB, keys[0], cert_pem, key_pem)
    listing = {"complete": True, "keys": {str(k): v.hex() for k, v in keys.items()},
               "certs": {str(k): c.to_json() for k, c in certs.items()}}
    config = JobConfig(job_id=JOB, task="regression", n_features=1, n_clients=3,
                       n_estimators=1, max_depth=1, max_features=1, n_bins=2)
    session = SecAggSession(config, SimpleNamespace(get_json=lambda path: listing),  # type: ignore[arg-type]
                            JOB, 0, own, ca_pem=(a / "ca.pem").read_bytes())
    session.connect()


def test_a_site_whose_own_certificate_expired_is_told_so_and_accuses_no_peer(
        pkis: tuple[Path, Path]) -> None:
    """Its own directory entry does not check (its certificate expired after it joined): the
    site's error says it is its own identity, with the entry's dates, not a peer's."""
    import datetime as dt

    from fedforest_secure.errors import FedForestError
    from fedforest_secure.pki import issue_certificate, load_ca

    a, _ = pkis
    ca = load_ca(a / "ca.pem", a / "ca.key")
    past = issue_certificate(ca, "client-0", server=False, days=1,
                             now=dt.datetime.now(dt.UTC) - dt.timedelta(days=30))
    with pytest.raises(FedForestError, match=r"this site's own identity in job job-d does not "
                                             r"check: directory entry 0 \('client-0'\): the "
                                             r"certificate has expired") as exc:
        _connect_as_site_0(a, past.cert_pem(), past.key_pem())
    assert not isinstance(exc.value, InvalidMessage)


def test_a_site_whose_own_certificate_has_no_client_auth_is_told_so(
        pkis: tuple[Path, Path]) -> None:
    """A site of an institution's PKI whose certificate lacks the extended key usage
    clientAuth: its error names its own entry and what its certificate needs."""
    from fedforest_secure.errors import FedForestError

    a, _ = pkis
    cert_pem, key_pem = _leaf(a, "client-0", None)
    with pytest.raises(FedForestError) as exc:
        _connect_as_site_0(a, cert_pem, key_pem)
    assert not isinstance(exc.value, InvalidMessage)
    assert str(exc.value) == (
        "this site's own identity in job job-d does not check: directory entry 0 ('client-0'): "
        "not a site's certificate (it has no extended key usage); a site certifies its "
        "identity with its own client certificate, whose extended key usage holds clientAuth "
        "and not the operator purpose, as those `fedforest pki sign` (and `pki issue` without "
        "--operator) write (--cert)")


def _operator_directory(root: Path, n_sites: int) -> tuple[dict[int, bytes],
                                                          dict[int, Certification]]:
    """A federation in ``root`` whose server operator was issued its browser certificate the
    way docs/deployment.md §5 says (`fedforest pki issue --name operator --operator --p12`):
    the directory of a job of ``n_sites`` sites plus an identity the coordinator plays,
    certified with ``operator.key`` (entry ``n_sites``), and one certified with its own
    ``server.key`` (entry ``n_sites + 1``)."""
    from typer.testing import CliRunner

    from fedforest_cli.cli import app

    init_dev_pki(root, n_sites)
    res = CliRunner().invoke(app, ["pki", "issue", "--ca-dir", str(root), "--name", "operator",
                                   "--operator", "--p12"], env={"FEDFOREST_P12_PASSWORD": "pw"})
    assert res.exit_code == 0, res.output
    keys, certs = _entries(root, n_sites)
    for index, holder in ((n_sites, "operator"), (n_sites + 1, "server")):
        keys[index] = bytes(SigningKey.generate().verify_key)
        certs[index] = certify_identity(JOB, keys[index], (root / f"{holder}.pem").read_bytes(),
                                        (root / f"{holder}.key").read_bytes())
    return keys, certs


def test_the_operator_certificate_of_the_documented_flow_certifies_no_identity(
        tmp_path: Path) -> None:
    """The coordinator holds the key of the operator's browser certificate: an identity it
    plays, signed with ``operator.key``, is refused, naming the entry."""
    keys, certs = _operator_directory(tmp_path, 2)
    del keys[3], certs[3]  # the operator's entry alone
    with pytest.raises(InvalidMessage) as exc:
        verify_directory(JOB, keys, certs, (tmp_path / "ca.pem").read_bytes())
    assert str(exc.value) == (
        "directory entry 2 ('operator'): not a site's certificate (an operator's certificate: "
        "its extended key usage holds the FedForest operator purpose "
        "2.25.261349397304297363440624600421328525869.1); a site certifies its identity with "
        "its own client certificate, whose extended key usage holds clientAuth and not the "
        "operator purpose, as those `fedforest pki sign` (and `pki issue` without --operator) "
        "write")
    assert exc.value.peer == 2


def test_a_four_site_job_refuses_the_coordinators_operator_and_server_identities(
        tmp_path: Path) -> None:
    """n = 4, t = 3: two honest sites and the two identities the coordinator certifies with
    the keys it holds anyway (operator's browser, server TLS). Site 0's real session refuses
    the job's directory, accusing the operator's entry (the first that does not check)."""
    from types import SimpleNamespace

    from client_app.secagg_session import SecAggSession
    from fedforest_secure import load_profile
    from fedforest_secure.config import JobConfig

    keys, certs = _operator_directory(tmp_path, 2)
    own = SigningKey.generate()
    keys[0] = bytes(own.verify_key)
    certs[0] = certify_identity(JOB, keys[0], (tmp_path / "client-0.pem").read_bytes(),
                                (tmp_path / "client-0.key").read_bytes())
    listing = {"complete": True, "keys": {str(k): v.hex() for k, v in keys.items()},
               "certs": {str(k): c.to_json() for k, c in certs.items()}}
    config = JobConfig(job_id=JOB, task="regression", n_features=1, n_clients=4,
                       n_estimators=1, max_depth=1, max_features=1, n_bins=2,
                       profile=load_profile("secure").to_dict())
    session = SecAggSession(config, SimpleNamespace(get_json=lambda path: listing),  # type: ignore[arg-type]
                            JOB, 0, own, ca_pem=(tmp_path / "ca.pem").read_bytes())
    with pytest.raises(InvalidMessage, match=re.escape(
            "directory entry 2 ('operator'): not a site's certificate (an operator's "
            "certificate: its extended key usage holds the FedForest operator purpose")) as exc:
        session.connect()
    assert exc.value.peer == 2 and session.client is None


@pytest.mark.parametrize("case", ["purpose_under_another_name", "name_without_purpose"])
def test_an_operators_certificate_is_known_by_its_purpose_or_its_name(
        pkis: tuple[Path, Path], case: str) -> None:
    """An operator's browser certificate issued under another name (it carries the operator
    purpose), and a client certificate named 'operator' without that purpose (the name
    `fedforest pki` issues no site certificate under): neither certifies an identity."""
    from fedforest_secure.pki import issue_certificate, load_ca

    a, _ = pkis
    ca = load_ca(a / "ca.pem", a / "ca.key")
    if case == "purpose_under_another_name":
        from fedforest_secure.pki import OPERATOR_PURPOSE

        name, leaf = "alice-browser", issue_certificate(ca, "alice-browser", server=False,
                                                        operator=True)
        what = ("its extended key usage holds the FedForest operator purpose "
                f"{OPERATOR_PURPOSE.dotted_string}")
    else:
        name, leaf = "operator", issue_certificate(ca, "operator", server=False)
        what = "its name is 'operator'"
    keys, certs = _entries(a, 2)
    keys[2] = bytes(SigningKey.generate().verify_key)
    certs[2] = certify_identity(JOB, keys[2], leaf.cert_pem(), leaf.key_pem())
    with pytest.raises(InvalidMessage, match=re.escape(
            f"directory entry 2 ({name!r}): not a site's certificate (an operator's "
            f"certificate: {what}); a site certifies")) as exc:
        verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes())
    assert exc.value.peer == 2


def test_a_site_started_with_the_operator_certificate_is_told_so(tmp_path: Path) -> None:
    """The operator's certificate given to a site's client (--cert): its error names its own
    entry and that the certificate is an operator's."""
    from fedforest_secure.errors import FedForestError

    _operator_directory(tmp_path, 3)
    with pytest.raises(FedForestError, match=re.escape(
            "this site's own identity in job job-d does not check: directory entry 0 "
            "('operator'): not a site's certificate (an operator's certificate")) as exc:
        _connect_as_site_0(tmp_path, (tmp_path / "operator.pem").read_bytes(),
                           (tmp_path / "operator.key").read_bytes())
    assert not isinstance(exc.value, InvalidMessage)


@pytest.fixture(scope="module")
def two_tier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An institution's PKI: root CA -> issuing CA -> the server and sites client-0..2."""
    out = tmp_path_factory.mktemp("two-tier")
    write_two_tier_pki(out, [f"client-{k}" for k in range(3)])
    return out


@pytest.mark.parametrize("ca_file", ["ca.pem", "issuing.pem"])
def test_a_directory_certified_by_an_issuing_ca_verifies_with_the_chain_up_to_its_root(
        two_tier: Path, ca_file: str) -> None:
    """--ca holding the issuing CA then the root (what TLS needs to reach a root), or the
    issuing CA alone: the identities are checked against the issuing CA, the file's first."""
    keys, certs = _entries(two_tier)
    names = verify_directory(JOB, keys, certs, (two_tier / ca_file).read_bytes())
    assert names == {0: "client-0", 1: "client-1", 2: "client-2"}


def test_a_directory_is_not_checked_against_the_root_above_the_issuing_ca(
        two_tier: Path) -> None:
    """Only the file's first CA certifies identities: a root that signed no site's certificate
    itself (it signed the issuing CA) certifies none."""
    keys, certs = _entries(two_tier)
    with pytest.raises(InvalidMessage, match="not issued by the federation CA"):
        verify_directory(JOB, keys, certs, (two_tier / "root.pem").read_bytes())


_MORE = ("the file holds more than the federation CA and the CAs above it. A site trusts one "
         "federation CA, whose certificates certify every site's identity in a secure job; its "
         "--ca holds that CA, optionally followed by the CAs above it up to a root, each "
         "signed by the next")
_ROOT = "'CN=Institution Root CA,O=Institution'"
_ISSUING = "'CN=Institution Issuing CA,O=Institution'"


@pytest.mark.parametrize(("files", "what"), [
    (["root.pem", "issuing.pem"], f"certificate 2 of 2 ({_ISSUING}) did not sign certificate 1 "
                                  f"({_ROOT})"),
    (["ca.pem", "root.pem"], f"certificate 3 of 3 ({_ROOT}) follows a self-signed root"),
])
def test_a_ca_file_that_is_not_one_chain_from_the_federation_ca_is_refused(
        two_tier: Path, files: list[str], what: str) -> None:
    """The root before the issuing CA, or anything after the root: ValueError, no peer named."""
    keys, certs = _entries(two_tier)
    ca_pem = b"".join((two_tier / f).read_bytes() for f in files)
    with pytest.raises(ValueError) as exc:
        verify_directory(JOB, keys, certs, ca_pem)
    assert not isinstance(exc.value, InvalidMessage)  # no peer accused
    assert str(exc.value) == f"{what}: {_MORE}"


def test_a_ca_bundle_is_refused_without_accusing_a_peer(pkis: tuple[Path, Path]) -> None:
    """A site's --ca holding two unrelated CAs (a new one and the one it replaced, as in a CA
    changeover): a directory of sites of both is neither checked against the first CA only
    (the second's sites accused: the job fails over this site's file) nor against both (an
    identity of a CA the federation dropped would be taken): ValueError, no peer named."""
    a, b = pkis
    keys, certs = _entries(a, 2)
    other_keys, other_certs = _entries(b, 3)
    keys[2], certs[2] = other_keys[2], other_certs[2]
    bundle = (a / "ca.pem").read_bytes() + (b / "ca.pem").read_bytes()
    with pytest.raises(ValueError) as exc:
        verify_directory(JOB, keys, certs, bundle)
    assert not isinstance(exc.value, InvalidMessage)  # no peer accused
    ca = "'CN=FedForest dev CA,O=FedForest Secure federation'"
    assert str(exc.value) == f"certificate 2 of 2 ({ca}) did not sign certificate 1 ({ca}): {_MORE}"


def _forged_by(issuer_cert: Path, issuer_key: Path, name: str) -> tuple[bytes, bytes]:
    """A site certificate for ``name`` signed with a key that is no CA's (the server's)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    issuer = x509.load_pem_x509_certificate(issuer_cert.read_bytes())
    signer = serialization.load_pem_private_key(issuer_key.read_bytes(), None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(signer, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def test_a_ca_file_that_begins_with_the_servers_certificate_certifies_no_identity(
        pkis: tuple[Path, Path]) -> None:
    """A "full chain" --ca (server.pem, then ca.pem): its first certificate is no CA, so it
    certifies nothing. Otherwise a server holding only its own TLS key would make site
    certificates that such a site takes for its peers' (it would play every peer)."""
    a, _ = pkis
    keys, certs = {}, {}
    for k in range(3):
        ident = bytes(SigningKey.generate().verify_key)
        cert_pem, key_pem = _forged_by(a / "server.pem", a / "server.key", f"client-{k}")
        keys[k], certs[k] = ident, certify_identity(JOB, ident, cert_pem, key_pem)
    full_chain = (a / "server.pem").read_bytes() + (a / "ca.pem").read_bytes()
    with pytest.raises(ValueError) as exc:
        verify_directory(JOB, keys, certs, full_chain)
    assert not isinstance(exc.value, InvalidMessage)  # no peer accused
    assert str(exc.value).startswith(
        "certificate 1 of 2 ('CN=localhost,O=FedForest Secure federation') is not a CA")
