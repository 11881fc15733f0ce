"""A site checks its own TLS certificate (``--cert``) before it joins a secure job, by the rule
every other site applies to it at the job's first round
(:func:`fedforest_secure.secagg.directory.site_certificate_problem`): a certificate that is not
a site's stops its client with an error naming it and what to do, before the join, instead of
every site refusing the first round and the job failing for all of them."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nacl.signing import SigningKey
from test_client_responses import JOB, ScriptedTransport, _config, _schema
from test_secagg_directory import _leaf
from two_tier_pki import write_two_tier_pki
from typer.testing import CliRunner

from client_app import runner
from client_app.log import SiteLog
from client_app.runner import ClientOptions
from client_app.state import ClientState
from fedforest_cli.cli import app
from fedforest_secure.errors import FedForestError
from fedforest_secure.pki import init_dev_pki, issue_certificate, load_ca
from fedforest_secure.protocol.api import JoinBody
from fedforest_secure.secagg.directory import Certification, verify_directory


class _Joined(Exception):
    """Raised by the transport at the join: the client went as far as joining."""


class JoiningTransport(ScriptedTransport):
    """Offers the job; records the join's body, then stops the run."""

    bodies: list[Any]

    def post_json(self, path: str, body: Any = None) -> Any:
        self.sent.append(("POST", path))
        if path == f"/v1/jobs/{JOB}/join":
            self.bodies.append(body)
            raise _Joined
        return {}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A federation's certificates: client-0's, an operator's (`pki issue --operator`), one
    without extended key usage (an institution's PKI may issue such), one named 'operator'
    without the operator purpose, and client-0's certificate and key in one file."""
    root = tmp_path_factory.mktemp("certs")
    init_dev_pki(root, 1)
    res = CliRunner().invoke(app, ["pki", "issue", "--ca-dir", str(root), "--name", "probe",
                                   "--operator"])
    assert res.exit_code == 0, res.output
    cert, key = _leaf(root, "hospital-x", None)
    (root / "no-usage.pem").write_bytes(cert)
    (root / "no-usage.key").write_bytes(key)
    issue_certificate(load_ca(root / "ca.pem", root / "ca.key"), "operator",
                      server=False).write(root / "operator.pem", root / "operator.key")
    (root / "both.pem").write_bytes((root / "client-0.pem").read_bytes()
                                    + (root / "client-0.key").read_bytes())
    (root / "rsa-both.pem").write_bytes(_combined(root, "hospital-rsa", rsa=True))
    (root / "no-cn-both.pem").write_bytes(_combined(root, None, rsa=False))
    return root


def _combined(ca_dir: Path, name: str | None, *, rsa: bool) -> bytes:
    """A TLS client certificate (clientAuth) signed by the CA in ``ca_dir`` and its key, in
    one PEM file: an RSA key, or an EC one; subject common name ``name`` (None: the subject
    names an organisation only)."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric import rsa as rsa_keys
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    issuer = load_ca(ca_dir / "ca.pem", ca_dir / "ca.key")
    key = (rsa_keys.generate_private_key(public_exponent=65537, key_size=2048) if rsa
           else ec.generate_private_key(ec.SECP256R1()))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)] if name is not None
                        else [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Hospital")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(issuer.key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())


def _offering(profile: str) -> JoiningTransport:
    """A server that offers a job of ``profile`` and records the join's body."""
    tr = JoiningTransport({"client_index": 0, "config": _config(profile)})
    tr.bodies = []
    return tr


def _run(tmp_path: Path, tr: JoiningTransport, cert: Path, key: Path | None,
         ca: Path | None = None) -> None:
    """The client started with ``--cert cert --key key`` (and ``--ca ca``) against ``tr``,
    until it joins (:class:`_Joined`)."""
    opts = ClientOptions(server="https://fedforest.example.org", token="t", job=JOB,
                         data=tmp_path / "d.csv", schema=_schema(tmp_path), ca=ca, cert=cert,
                         key=key, state_dir=tmp_path / "state", quiet=True)
    runner._run(opts, tr, ClientState(opts.state_dir),  # type: ignore[arg-type]
                np.zeros((4, 2)), np.zeros(4), SiteLog(stream=io.StringIO()))


@pytest.mark.parametrize(("name", "what"), [
    ("probe", "an operator's certificate: its extended key usage holds the FedForest operator "
              "purpose 2.25.261349397304297363440624600421328525869.1"),
    ("no-usage", "it has no extended key usage"),
    ("operator", "an operator's certificate: its name is 'operator'"),
])
def test_a_site_whose_certificate_is_not_a_sites_does_not_join_a_secure_job(
        tmp_path: Path, certs: Path, name: str, what: str) -> None:
    """The operator's probe certificate given to a site's client, one without extended key
    usage, one named 'operator': the error names the file and what it is, and the client
    has sent nothing but the offer's GET (no join, no identity key made)."""
    cert = certs / f"{name}.pem"
    tr = _offering("secure")
    with pytest.raises(FedForestError) as exc:
        _run(tmp_path, tr, cert, certs / f"{name}.key")
    assert str(exc.value) == (
        f"--cert {cert} is not a site's certificate ({what}): every other site of secure job "
        f"{JOB} would refuse this site's identity at the job's first round, and the job would "
        "fail. A site certifies its identity with its own client certificate, whose extended "
        "key usage holds clientAuth and not the operator purpose, as those `fedforest pki "
        "sign` (and `pki issue` without --operator) write: start the client with this site's own "
        "certificate and key (the key this site made with `fedforest pki request`, the "
        "certificate `fedforest pki sign` gave for it where the federation's CA is kept). "
        "This site has not "
        "joined the job")
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer")]
    assert not (tmp_path / "state" / f"identity-{JOB}.ed25519").exists()


@pytest.mark.parametrize("profile", ["secure", "open"])
def test_a_site_whose_ca_file_holds_two_cas_does_not_join_a_secure_job(
        tmp_path: Path, certs: Path, profile: str) -> None:
    """--ca holding the federation CA and another (an old CA beside the new, as in a CA
    changeover): TLS would trust both, the identities of a secure job are checked against one
    CA; the client stops before the join, naming the file and what to give instead. An open
    job certifies no identity: the bundle only verifies the server there."""
    other = tmp_path / "other"
    init_dev_pki(other, 0)
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes((certs / "ca.pem").read_bytes() + (other / "ca.pem").read_bytes())
    tr = _offering(profile)
    if profile == "open":
        with pytest.raises(_Joined):
            _run(tmp_path, tr, certs / "client-0.pem", certs / "client-0.key", bundle)
        return
    with pytest.raises(FedForestError) as exc:
        _run(tmp_path, tr, certs / "client-0.pem", certs / "client-0.key", bundle)
    ca = "'CN=FedForest dev CA,O=FedForest Secure federation'"
    assert str(exc.value) == (
        f"--ca {bundle}: certificate 2 of 2 ({ca}) did not sign certificate 1 ({ca}): the file "
        "holds more than the federation CA and the CAs above it. A site trusts one federation "
        "CA, whose certificates certify every site's identity in a secure job; its --ca holds "
        "that CA, optionally followed by the CAs above it up to a root, each signed by the "
        "next. Give the federation CA's certificate (the ca.pem the coordinator sent, whose "
        "fingerprint the sites compared; on an institution's PKI, the CA that issues the "
        "sites' certificates, then the CAs above it): in a CA changeover the site moves to "
        "the new CA's ca.pem with its certificate from that CA. This site has not joined the "
        "job")
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer")]
    with pytest.raises(_Joined):  # the CA alone: the same site joins
        _run(tmp_path, _offering(profile), certs / "client-0.pem", certs / "client-0.key",
             certs / "ca.pem")


def test_a_site_on_a_two_tier_pki_joins_a_secure_job_with_the_chain_as_its_ca(
        tmp_path: Path) -> None:
    """--ca holding the issuing CA that signed the site's certificate, then the root above it
    (an institution's PKI): the client joins the secure job."""
    pki = tmp_path / "pki"
    write_two_tier_pki(pki, ["hospital-a"])
    tr = _offering("secure")
    with pytest.raises(_Joined):
        _run(tmp_path, tr, pki / "hospital-a.pem", pki / "hospital-a.key", pki / "ca.pem")
    assert tr.sent[-1] == ("POST", f"/v1/jobs/{JOB}/join")


def test_a_job_without_secure_aggregation_takes_any_certificate_of_the_federation(
        tmp_path: Path, certs: Path) -> None:
    """Under the open profile no identity is certified: the same certificate joins."""
    with pytest.raises(_Joined):
        _run(tmp_path, _offering("open"), certs / "no-usage.pem", certs / "no-usage.key")


@pytest.mark.parametrize(("cert", "key"), [("rsa-both.pem", None), ("no-cn-both.pem", None),
                                          ("client-0.pem", "client-0.key")])
def test_an_open_job_is_joined_with_any_certificate_and_no_certification(
        tmp_path: Path, certs: Path, cert: str, key: str | None) -> None:
    """Under the open profile the identity key is not certified (the server keeps no
    certification of an open job): a combined PEM with an RSA key, or a certificate without
    a common name, joins as TLS accepts it, and a site's certificate sends none either."""
    tr = _offering("open")
    with pytest.raises(_Joined):
        _run(tmp_path, tr, certs / cert, certs / key if key is not None else None)
    body = JoinBody.model_validate(tr.bodies[-1])
    assert body.identity_cert is None
    identity = bytes(SigningKey(
        (tmp_path / "state" / f"identity-{JOB}.ed25519").read_bytes()).verify_key)
    assert body.identity_key == identity.hex()


@pytest.mark.parametrize(("cert", "key", "given", "why"), [
    ("rsa-both.pem", None, "--cert {d}/rsa-both.pem",
     "identity certification needs an EC client key"),
    ("client-0.pem", None, "--cert {d}/client-0.pem", "{d}/client-0.pem holds no private key"),
    ("client-0.pem", "rsa-both.pem", "--cert {d}/client-0.pem with --key {d}/rsa-both.pem",
     "identity certification needs an EC client key"),
])
def test_a_certificate_and_key_that_cannot_certify_stop_a_secure_join_naming_cert(
        tmp_path: Path, certs: Path, cert: str, key: str | None, given: str, why: str
        ) -> None:
    """A site's certificate whose key is RSA, or is not given (no --key, none in the --cert
    file): the client stops before the join with an error naming --cert, no traceback."""
    tr = _offering("secure")
    with pytest.raises(FedForestError) as exc:
        _run(tmp_path, tr, certs / cert, certs / key if key is not None else None)
    assert str(exc.value) == (
        f"{given.format(d=certs)} cannot certify this site's identity key for secure job "
        f"{JOB} ({why.format(d=certs)}): a site of a secure job signs its identity with its "
        "certificate's EC private key (in --key, or in the --cert file), and the certificate "
        "names the site in exactly one common name, as those `fedforest pki sign` writes: "
        "start the client with this site's own certificate and key (the key this site made "
        "with `fedforest pki request`, the certificate signed for it). This site has not "
        "joined the job")
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer")]


@pytest.mark.parametrize("key", ["client-0.key", None])
def test_a_sites_certificate_certifies_its_identity_at_the_join(
        tmp_path: Path, certs: Path, key: str | None) -> None:
    """A site's certificate joins the secure job and certifies the identity key it registers,
    as the other sites will check it; its key may be in the same file as the certificate
    (--cert alone, as TLS reads it)."""
    cert = certs / ("client-0.pem" if key is not None else "both.pem")
    tr = _offering("secure")
    with pytest.raises(_Joined):
        _run(tmp_path, tr, cert, certs / key if key is not None else None)
    assert tr.sent == [("GET", f"/v1/jobs/{JOB}/offer"), ("POST", f"/v1/jobs/{JOB}/join")]
    body = JoinBody.model_validate(tr.bodies[-1])
    assert body.identity_cert is not None
    identity = bytes(SigningKey(
        (tmp_path / "state" / f"identity-{JOB}.ed25519").read_bytes()).verify_key)
    assert body.identity_key == identity.hex()
    names = verify_directory(JOB, {0: identity},
                             {0: Certification.from_json(body.identity_cert)},
                             (certs / "ca.pem").read_bytes())
    assert names == {0: "client-0"}
