"""A site that keeps its own TLS key: it makes the key and a certificate signing request
(:func:`request_certificate`, ``fedforest pki request``), and whoever keeps the federation CA
signs the request (:func:`sign_request`, ``fedforest pki sign``)::

    key, csr = request_certificate(Path("site"), "hospital-d")   # at the site
    cert, _ = sign_request(Path("ca"), Path("hospital-d.csr"))      # where ca.key is kept

The key never leaves the site. The certificate is the one
:func:`~fedforest_secure.pki.issue_client_certificates` gives a site (the same subject,
extensions and validity, the same rules for the name), for the request's key; only
``<name>.pem`` is written beside the CA. The request's own extensions are not copied: the CA
decides what the certificate says. A renewal is a new request (a new key), signed with
``renew``.

A certificate signed so still certifies whatever key the CA's keeper chooses: the coordinator
who keeps the CA can sign a second certificate under a site's name for a key of its own. The
sites compare ``ca.pem``'s and each other's certificates' fingerprints
(:func:`certificate_fingerprint`) out of band, and the certificates of a secure job's
``client_joined`` audit entries with them (threat_model.md, S8).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ._operator_certs import OPERATOR_NAME
from ._pem_files import load_request
from ._pki_core import certify_key, subject_name
from ._pki_names import check_names
from .files import write_atomic
from .pki import _prepare_issue, _refuse_existing, _write_issued

__all__ = ["certificate_fingerprint", "key_fingerprint", "request_certificate",
           "sign_request"]


def _colons(digest: bytes) -> str:
    return ":".join(f"{b:02X}" for b in digest)


def certificate_fingerprint(cert: x509.Certificate) -> str:
    """The certificate's SHA-256 fingerprint as ``openssl x509 -fingerprint -sha256`` writes
    it (upper-case hex pairs between colons)."""
    return _colons(cert.fingerprint(hashes.SHA256()))


def key_fingerprint(key: ec.EllipticCurvePublicKey) -> str:
    """SHA-256 of the public key's DER SubjectPublicKeyInfo, as hex pairs between colons: what
    the site and the CA's keeper compare, out of band, before a request is signed."""
    return _colons(hashlib.sha256(key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).digest())


def request_certificate(out: Path, name: str) -> tuple[Path, Path]:
    """A new EC P-256 key (``out/<name>.key``, mode 0600) and a certificate signing request
    for it naming the site ``name`` (``out/<name>.csr``). A missing ``out`` is made its
    user's only (0700). Returns both paths.

    Raises
    ------
    FileExistsError
        ``out`` holds ``<name>.key`` or ``<name>.csr`` already (the key of a certificate in
        use, or a request not yet signed): nothing is written.
    ValueError
        ``name`` is not usable as a file name, or is a name no site gets (``ca``, ``server``,
        ``operator``, in any letter case).
    """
    out = Path(out)
    check_names([name])
    if name.casefold() == OPERATOR_NAME:
        raise ValueError(f"{name!r} names an operator's certificate, never a site's: give "
                         "this site's name, the one its token was made for")
    key_path, csr_path = out / f"{name}.key", out / f"{name}.csr"
    _refuse_existing([key_path, csr_path],
                     "the key of this site's certificate stays where it is: a renewal's "
                     "request goes into another directory (--out), whose key the client then "
                     "uses with the certificate signed from it")
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder().subject_name(subject_name(name))
           .sign(key, hashes.SHA256()))
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(key_path, key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()), mode=0o600)
    write_atomic(csr_path, csr.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return key_path, csr_path


def read_request(path: Path) -> tuple[str, ec.EllipticCurvePublicKey]:
    """The site's name and public key of the request in the PEM file ``path``, once its
    signature verifies (the key's holder signed exactly this name).

    Raises
    ------
    ValueError
        The file holds no PEM request, its signature does not verify (changed on the way,
        or damaged), it names no site in exactly one common name, or its key is not an EC
        P-256 key; the message starts with ``path``.
    """
    csr = load_request(path)
    if not csr.is_signature_valid:
        raise ValueError(f"{path}: the request's signature does not verify (it was changed on "
                         "its way, or damaged): ask the site for its request again")
    names = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if len(names) != 1 or not isinstance(names[0], str):
        raise ValueError(f"{path}: the request names {len(names)} common names; a site's "
                         "request names the site in exactly one, as `fedforest pki request "
                         "--name <site>` writes it")
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        kind = (f"an EC key on {key.curve.name}" if isinstance(key, ec.EllipticCurvePublicKey)
                else f"a {type(key).__name__.removeprefix('_').replace('PublicKey', '')} key")
        raise ValueError(f"{path}: the request's key is {kind}, not an EC P-256 key (a site "
                         "signs its secure-job identity with it): `fedforest pki request` "
                         "makes one")
    return names[0], key


def sign_request(ca_dir: Path, csr: Path, *, renew: bool = False) -> tuple[Path, list[Path]]:
    """Sign the site's request ``csr`` with the CA in ``ca_dir`` (``ca.pem``, ``ca.key``):
    ``ca_dir/<name>.pem``, a site's certificate (clientAuth) for the request's key, as
    :func:`~fedforest_secure.pki.issue_client_certificates` gives a site. Returns the
    certificate's path and the files a renewal moved aside.

    With ``renew`` the name must have a certificate there already (or a key, one the CA's
    keeper made): ``<name>.pem``, ``<name>.key`` and ``<name>.p12`` move aside to
    ``<name>.<ext>.replaced-<UTC time>``, as a renewal by ``issue`` moves them.

    Raises
    ------
    FileNotFoundError
        ``csr``, ``ca.pem`` or ``ca.key`` is missing; with ``renew``, the name has no
        certificate there.
    FileExistsError
        Without ``renew``, ``<name>.pem`` or ``<name>.key`` is there already: nothing is
        written.
    ValueError
        The request does not verify or is not a site's (:func:`read_request`), its name
        breaks the rules of ``issue`` (not a file name, ``ca``, ``server``, ``operator``, a
        twin in letter case of a name there), the CA's key is not its certificate's or the
        CA is not valid now, or with ``renew`` the certificate there is an operator's.
    """
    ca_dir = Path(ca_dir)
    name, key = read_request(csr)
    ca, moves = _prepare_issue(ca_dir, [name], renew=renew, operator=False, from_site=False,
                               signing=True)
    cert = certify_key(ca, name, key, server=False)
    written = _write_issued(ca_dir, [(name, cert.public_bytes(serialization.Encoding.PEM),
                                      None)], moves=moves)[0]
    return written[0], [kept for _, kept in moves]
