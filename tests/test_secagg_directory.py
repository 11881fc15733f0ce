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
