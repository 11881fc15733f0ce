"""The certified identity directory: what a server that does not hold the CA key cannot forge."""

from __future__ import annotations

from pathlib import Path

import pytest
from nacl.signing import SigningKey

from fedforest_secure.errors import InvalidMessage
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


def test_an_entry_whose_certificate_expired_is_named_with_its_dates_and_accused(
        pkis: tuple[Path, Path]) -> None:
    """A certificate valid when its site joined and expired since: the entry is named (index
    and name), with its validity, as that site's (``peer``) to renew."""
    import datetime as dt

    from cryptography import x509

    a, _ = pkis
    keys, certs = _entries(a)
    end = x509.load_pem_x509_certificate(certs[1].cert_pem.encode()).not_valid_after_utc
    with pytest.raises(InvalidMessage, match=r"directory entry 0 \('client-0'\): the "
                                             r"certificate is not valid now \(valid .* to "
                                             r".* UTC\); that site needs a new one") as exc:
        verify_directory(JOB, keys, certs, (a / "ca.pem").read_bytes(),
                         now=end + dt.timedelta(days=1))
    assert exc.value.peer == 0


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


def test_a_site_whose_own_certificate_expired_is_told_so_and_accuses_no_peer(
        pkis: tuple[Path, Path]) -> None:
    """Its own directory entry does not check (its certificate expired after it joined): the
    site's error says it is its own identity, with the entry's dates, not a peer's."""
    import datetime as dt
    from types import SimpleNamespace

    from client_app.secagg_session import SecAggSession
    from fedforest_secure.config import JobConfig
    from fedforest_secure.errors import FedForestError
    from fedforest_secure.pki import issue_certificate, load_ca

    a, _ = pkis
    keys, certs = _entries(a)
    own = SigningKey.generate()
    ca = load_ca(a / "ca.pem", a / "ca.key")
    past = issue_certificate(ca, "client-0", server=False, days=1,
                             now=dt.datetime.now(dt.UTC) - dt.timedelta(days=30))
    keys[0] = bytes(own.verify_key)
    certs[0] = certify_identity(JOB, keys[0], past.cert_pem(), past.key_pem())
    listing = {"complete": True, "keys": {str(k): v.hex() for k, v in keys.items()},
               "certs": {str(k): c.to_json() for k, c in certs.items()}}
    config = JobConfig(job_id=JOB, task="regression", n_features=1, n_clients=3,
                       n_estimators=1, max_depth=1, max_features=1, n_bins=2)
    session = SecAggSession(config, SimpleNamespace(get_json=lambda path: listing),  # type: ignore[arg-type]
                            JOB, 0, own, ca_pem=(a / "ca.pem").read_bytes())
    with pytest.raises(FedForestError, match=r"this site's own identity in job job-d does not "
                                             r"check: directory entry 0 \('client-0'\): the "
                                             r"certificate is not valid now") as exc:
        session.connect()
    assert not isinstance(exc.value, InvalidMessage)
