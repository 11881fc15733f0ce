"""A job's identity directory, certified by the federation's CA.

Each client of a secure job has a long-term Ed25519 identity (it signs key adverts and survivor
sets). The server relays the directory ``{client index: identity key}``, so a malicious server
could add identities of its own (Sybils) and play them. A certified directory closes that door
to anyone but the CA: at join a client signs ``job | name | identity key`` with the private key
of its TLS client certificate (:func:`certify_identity`), and sends the certificate and the
signature along; every client checks every entry of the directory against the federation CA it
already pins for TLS (:func:`verify_directory`): a site's certificate the CA issued (not a CA's,
its extended key usage holding clientAuth: the server's own certificate, serverAuth only,
certifies nothing; and not an operator's, whose extended key usage also holds
:data:`~fedforest_secure.pki.OPERATOR_PURPOSE` or whose name is
:data:`~fedforest_secure.pki.OPERATOR_NAME`: the server operator holds its key for a browser),
a name that is the certificate's common name and appears once, a valid signature on the entry's
identity key.

What is left: a CA that issues site certificates (clientAuth without the operator purpose) at
the server's request registers Sybils (the coordinator, the CA and the directory are often run
by one party; institutions that want more compare the audit log's ``client_joined`` keys out of
band), and so does a server whose own certificate holds clientAuth besides serverAuth (an
institution's PKI may issue one; the federation CA of ``fedforest pki`` does not).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..errors import InvalidMessage, RefusedRequest
from ..pki import OPERATOR_NAME, OPERATOR_PURPOSE, is_ca, verify_signed_by
from ._rounds import check_job_id

__all__ = ["NOT_YET_VALID_LEEWAY", "SITE_CERTIFICATE", "Certification", "certificate_name",
           "certify_identity", "federation_ca", "identity_payload", "site_certificate_problem",
           "verify_directory"]

#: What certifies a site's identity, as a refusal of another certificate says it.
SITE_CERTIFICATE = ("a site certifies its identity with its own client certificate, whose "
                    "extended key usage holds clientAuth and not the operator purpose, as "
                    "those `fedforest pki sign` (and `pki issue` without --operator) write")

#: how long before its start a peer's certificate is accepted. A certificate that is not valid
#: yet on this machine's clock says that this clock is behind the CA's (which backdates its
#: certificates by 5 min only) and the server's (whose mutual TLS checked the certificate on
#: its own clock at each of that site's connections), not that the peer is at fault: a site
#: just certified (a new one, or one renewed) meets a site whose clock is behind at the next
#: round. An hour covers the skew seen on machines that lost NTP (a VM restored from a
#: snapshot, a drifting RTC), as Let's Encrypt's hour of backdating does for its clients; a
#: clock off by hours (an RTC on local time) is this machine's to fix, and the refusal says so.
NOT_YET_VALID_LEEWAY = _dt.timedelta(hours=1)
_LEEWAY_TEXT = f"{NOT_YET_VALID_LEEWAY.total_seconds() / 3600:g} h"

_MAX_PEM = 8192
_USAGE_NAMES = {ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth",
                ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth",
                ExtendedKeyUsageOID.CODE_SIGNING: "codeSigning",
                ExtendedKeyUsageOID.EMAIL_PROTECTION: "emailProtection",
                ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE: "anyExtendedKeyUsage",
                OPERATOR_PURPOSE: "the FedForest operator purpose"}


@dataclass(frozen=True)
class Certification:
    """A client's TLS certificate (PEM) and its signature over ``job | name | identity key``."""

    cert_pem: str
    signature: bytes

    def to_json(self) -> dict[str, str]:
        return {"cert": self.cert_pem, "sig": self.signature.hex()}

    @classmethod
    def from_json(cls, obj: object) -> Certification:
        """Parse ``{"cert": PEM, "sig": hex}``; :class:`InvalidMessage` otherwise."""
        if not isinstance(obj, Mapping) or set(obj) != {"cert", "sig"}:
            raise InvalidMessage("a certification is {\"cert\": PEM, \"sig\": hex}")
        cert, sig = obj["cert"], obj["sig"]
        if not isinstance(cert, str) or not 0 < len(cert) <= _MAX_PEM \
                or not isinstance(sig, str) or len(sig) > 1024:
            raise InvalidMessage("malformed certification")
        try:
            return cls(cert, bytes.fromhex(sig))
        except ValueError as exc:
            raise InvalidMessage("malformed certification signature") from exc


def identity_payload(job_id: str, name: str, identity_key: bytes) -> bytes:
    """The bytes a client's TLS key signs to certify its identity key for a job."""
    check_job_id(job_id)
    if len(identity_key) != 32:
        raise ValueError("an identity key is 32 bytes")
    return (b"fedforest/v1/identity|" + job_id.encode() + b"|" + name.encode("utf-8") + b"|"
            + identity_key)


def certificate_name(cert: x509.Certificate) -> str:
    """The certificate's subject common name (exactly one), else :class:`InvalidMessage`."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1 or not isinstance(names[0].value, str):
        raise InvalidMessage("the certificate does not carry exactly one common name")
    return names[0].value


def certify_identity(job_id: str, identity_key: bytes, cert_pem: bytes,
                     key_pem: bytes) -> Certification:
    """Sign ``job | name | identity key`` with the TLS client key (the name is the certificate's
    common name)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("identity certification needs an EC client key")
    payload = identity_payload(job_id, certificate_name(cert), identity_key)
    return Certification(cert_pem.decode("ascii"), key.sign(payload, ec.ECDSA(hashes.SHA256())))


def _not_a_site_certificate(cert: x509.Certificate, name: str) -> str | None:
    """None for a site's (TLS client) certificate: not a CA's, an extended key usage that
    holds clientAuth and not the operator purpose, a name that is not the operator's; else
    what it is instead. The CA also issues the server's certificate (serverAuth) and operators'
    browser certificates (clientAuth and the operator purpose), whose keys the server operator
    holds: those certify no identity."""
    if is_ca(cert):
        return "a CA certificate"
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return "it has no extended key usage"
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
        held = ", ".join(_USAGE_NAMES.get(u, u.dotted_string) for u in usages) or "nothing"
        return f"its extended key usage holds {held}, no clientAuth"
    if OPERATOR_PURPOSE in usages:
        return ("an operator's certificate: its extended key usage holds the FedForest "
                f"operator purpose {OPERATOR_PURPOSE.dotted_string}")
    if name == OPERATOR_NAME:  # `fedforest pki` issues no site certificate of that name
        return f"an operator's certificate: its name is {OPERATOR_NAME!r}"
    return None


def site_certificate_problem(cert: x509.Certificate) -> str | None:
    """None if ``cert`` is a site's certificate by the rule :func:`verify_directory` applies
    to every entry (one common name; not a CA's; clientAuth and not the operator purpose; not
    named :data:`~fedforest_secure.pki.OPERATOR_NAME`), else what it is instead: a site
    checks its own with it before it joins a secure job."""
    try:
        name = certificate_name(cert)
    except InvalidMessage as exc:
        return str(exc)
    return _not_a_site_certificate(cert, name)


def _check_entry(job_id: str, index: int, key: bytes, cert_text: Certification,
                 ca: x509.Certificate, now: _dt.datetime) -> str:
    """The entry's certified name; :class:`InvalidMessage` naming entry ``index`` (its
    ``peer``) otherwise."""
    try:
        cert = x509.load_pem_x509_certificate(cert_text.cert_pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise InvalidMessage(f"directory entry {index}: unreadable certificate",
                             peer=index) from exc
    if not verify_signed_by(cert, ca):
        raise InvalidMessage(f"directory entry {index}: the certificate was not issued by the "
                             "federation CA", peer=index)
    try:
        name = certificate_name(cert)
    except InvalidMessage as exc:
        raise InvalidMessage(f"directory entry {index}: {exc}", peer=index) from None
    unfit = _not_a_site_certificate(cert, name)
    if unfit is not None:
        raise InvalidMessage(f"directory entry {index} ({name!r}): not a site's certificate "
                             f"({unfit}); {SITE_CERTIFICATE}", peer=index)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    window = (f"valid {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC; this machine's "
              f"clock says {now:%Y-%m-%d %H:%M} UTC")
    if now > end:
        raise InvalidMessage(f"directory entry {index} ({name!r}): the certificate has "
                             f"expired ({window}); that site needs a new one", peer=index)
    if now < start - NOT_YET_VALID_LEEWAY:
        # the server checked this certificate on its own clock at each of the site's
        # connections: "not valid yet" here says this machine's clock is behind
        raise RefusedRequest(
            f"directory entry {index} ({name!r}): the certificate is not valid yet on this "
            f"machine's clock ({window}, more than {_LEEWAY_TEXT} before the certificate "
            "starts); this machine's clock is likely behind: check its time (NTP, time zone) "
            "before this site's next job (this site leaves this one: it cannot take part in "
            "its rounds)", code="other")
    public = cert.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise InvalidMessage(f"directory entry {index}: not an EC certificate", peer=index)
    try:
        public.verify(cert_text.signature, identity_payload(job_id, name, key),
                      ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError) as exc:
        raise InvalidMessage(f"directory entry {index}: the identity key is not signed by the "
                             f"certificate of {name!r}", peer=index) from exc
    return name


def federation_ca(ca_pem: bytes) -> x509.Certificate:
    """The federation CA of the PEM text ``ca_pem`` (a site's ``--ca``): its first certificate,
    which certifies every identity of a secure job. The file holds that CA alone, or one chain
    from it: the CA, then the CAs above it (an institution's issuing CA, then its root, for
    TLS), each signed by the next and nothing after a self-signed root. ValueError for anything
    else, e.g. two unrelated CAs: TLS would trust each of them, and a directory checked against
    one would accuse the sites of the others, one checked against all would take identities
    from any of them (an old CA a new one replaced because a key leaked, another institution's
    CA): a site trusts exactly one federation CA."""
    try:
        certs = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        raise ValueError("not a PEM certificate") from None
    for k, cert in enumerate(certs, start=1):
        if not is_ca(cert):
            raise ValueError(
                f"certificate {k} of {len(certs)} ({_subject(cert)}) is not a CA (a server's "
                "or a site's certificate): it certifies no site's identity. A site's --ca "
                "holds the federation CA (ca.pem), optionally followed by the CAs above it "
                "up to a root, each signed by the next; a \"full chain\" file that begins "
                "with the server's certificate is not one")
    for k, (lower, upper) in enumerate(zip(certs, certs[1:], strict=False), start=1):
        signed = verify_signed_by(lower, upper)
        if signed and not _self_signed(lower):
            continue
        what = "follows a self-signed root" if signed else \
            f"did not sign certificate {k} ({_subject(lower)})"
        raise ValueError(
            f"certificate {k + 1} of {len(certs)} ({_subject(upper)}) {what}: the file "
            "holds more than the federation CA and the CAs above it. A site trusts one "
            "federation CA, whose certificates certify every site's identity in a secure "
            "job; its --ca holds that CA, optionally followed by the CAs above it up to a "
            "root, each signed by the next")
    return certs[0]


def _self_signed(cert: x509.Certificate) -> bool:
    return cert.issuer == cert.subject and verify_signed_by(cert, cert)


def _subject(cert: x509.Certificate) -> str:
    return repr(cert.subject.rfc4514_string())


def verify_directory(job_id: str, keys: Mapping[int, bytes],
                     certifications: Mapping[int, Certification], ca_pem: bytes, *,
                     now: _dt.datetime | None = None) -> dict[int, str]:
    """Check every identity key of a job against the federation CA; return ``{index: name}``.

    Raises :class:`InvalidMessage` naming the first entry that has no certification, a
    certificate the CA did not issue (or expired), one that is not a site's (a CA
    certificate, an extended key usage without clientAuth, as the server's has, or an
    operator's), a signature that does not cover its key, or a name that another entry already
    has. A certificate that starts more than :data:`NOT_YET_VALID_LEEWAY` after ``now`` is
    this machine's clock problem, not the peer's: :class:`RefusedRequest` (code ``other``,
    accusing nobody) says so, with this machine's time and the certificate's dates; one that
    starts within the leeway is accepted. ValueError (accusing nobody) for a ``ca_pem`` that
    holds more than the federation CA and the CAs above it (:func:`federation_ca`).
    """
    ca = federation_ca(ca_pem)
    when = now or _dt.datetime.now(_dt.UTC)
    names: dict[int, str] = {}
    for index in sorted(keys):
        cert = certifications.get(index)
        if cert is None:
            raise InvalidMessage(f"directory entry {index} carries no certification",
                                 peer=index)
        names[index] = _check_entry(job_id, index, keys[index], cert, ca, when)
    if len(set(names.values())) != len(names):
        raise InvalidMessage("two directory entries carry certificates of the same client")
    return names
