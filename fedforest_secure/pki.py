"""A small development PKI for a federation: one CA, a server certificate, client certificates.

Real deployments should use their institutions' own PKI; this module exists so that every
transport in FedForest Secure runs over verified TLS, even on a laptop::

    paths = init_dev_pki(Path("certs"), n_clients=4)
    # certs/ca.pem, certs/server.pem, certs/server.key, certs/client-0.pem, certs/client-0.key, ...
    issue_client_certificates(Path("certs"), ["hospital-d"])  # later, from the same CA
    issue_client_certificates(Path("certs"), ["operator"], operator=True)  # a browser's

Neither replaces a file that is there (``init_dev_pki(..., overwrite=True)`` makes a new CA).

A site's certificate (extended key usage clientAuth) opens the server's API and certifies the
site's identity in secure jobs. An operator's certificate (clientAuth and
:data:`OPERATOR_PURPOSE`) opens TLS connections the same way, for a browser on the operator page,
but certifies no identity: the server operator holds its key, and the sites refuse it in a
job's identity directory (:mod:`fedforest_secure.secagg.directory`). The name
:data:`OPERATOR_NAME` is an operator's only: no site certificate is issued under it.

Keys are EC P-256; the server certificate names ``localhost`` and ``127.0.0.1`` (and any extra
host names given) as subject alternative names. Private keys are written with mode 0600.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ._operator_certs import (
    OPERATOR_NAME,
    OPERATOR_PURPOSE,
    check_renewed_kinds,
    check_site_names,
    is_operator_certificate,
    load_operator_certificate,
)
from ._pem_files import check_validity, load_certificate
from ._pem_files import load_private_key as _load_private_key
from ._pki_core import (
    CertifiedKey,
    certify_key,
    create_ca,
    is_ca,
    issue_certificate,
    load_ca,
    verify_signed_by,
)
from ._pki_core import utc_now as _now
from ._pki_names import check_case_twins, check_names, names_on_disk
from .files import replacing

__all__ = [
    "OPERATOR_NAME",
    "OPERATOR_PURPOSE",
    "CertifiedKey",
    "DevPKI",
    "certify_key",
    "check_validity",
    "create_ca",
    "is_ca",
    "bundled_certificate",
    "export_pkcs12",
    "init_dev_pki",
    "issue_certificate",
    "issue_client_certificates",
    "is_operator_certificate",
    "load_ca",
    "load_certificate",
    "load_operator_certificate",
    "verify_signed_by",
]

_DEFAULT_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class DevPKI:
    """Where :func:`init_dev_pki` wrote its files."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_certs: list[Path] = field(default_factory=list)
    client_keys: list[Path] = field(default_factory=list)
    #: with ``overwrite``: where the files of certificates the replaced CA signed went
    #: (``<name>.pem.replaced-<UTC time>``, its key and browser bundle beside it)
    moved_aside: list[Path] = field(default_factory=list)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def _refuse_existing(paths: Sequence[Path], hint: str) -> None:
    there = [p for p in paths if p.exists() or p.is_symlink()]
    if there:
        where = there[0].parent
        raise FileExistsError(f"{where} already holds {', '.join(p.name for p in there)}: "
                              f"nothing was written ({hint})")


def init_dev_pki(out: Path, n_clients: int, *, hosts: tuple[str, ...] = _DEFAULT_HOSTS,
                 client_names: list[str] | None = None, overwrite: bool = False) -> DevPKI:
    """Write a dev CA, a server certificate for ``hosts`` and ``n_clients`` client certificates.
    A missing ``out`` is made its user's only (0700: it holds the CA's and every site's key);
    one that exists keeps its mode.

    With ``overwrite`` a CA already there is replaced, and the files of the other certificates
    it signed (``<name>.pem``, ``.key``, ``.p12``; not CA certificates), which no one trusts
    now, are moved aside to ``<name>.<ext>.replaced-<UTC time>`` (:attr:`DevPKI.moved_aside`):
    a certificate left in place would look like one of the new CA's.

    Raises
    ------
    FileExistsError
        ``out`` already holds one of the files (a federation's CA among them) and
        ``overwrite`` is False: nothing is written.
    """
    if n_clients < 0:
        raise ValueError("n_clients must be >= 0")
    names = client_names if client_names is not None else [f"client-{k}" for k in range(n_clients)]
    if len(names) != n_clients:
        raise ValueError("client_names must have n_clients entries")
    check_names(names)
    out = Path(out)
    check_site_names(names, out, init=True)
    if not overwrite:
        targets = [out / f for f in ("ca.pem", "ca.key", "server.pem", "server.key")]
        targets += [out / f"{n}.{ext}" for n in names for ext in ("pem", "key")]
        _refuse_existing(targets, "`fedforest pki issue` adds client certificates signed by "
                                  "the CA that is there; `--force` replaces it and every "
                                  "certificate it signed")
    ca = create_ca()
    server = issue_certificate(ca, hosts[0], server=True, hosts=hosts)  # checks the hosts
    stale = _signed_by_old_ca(out, names) if overwrite else []
    _refuse_existing([kept for _, kept in stale], "replaced within the same second: run it "
                                                  "again in a second")
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca.write(out / "ca.pem", out / "ca.key")
    server.write(out / "server.pem", out / "server.key")
    certs, keys = _write_clients(ca, out, names)
    for path, kept in stale:
        path.rename(kept)
    return DevPKI(out / "ca.pem", out / "ca.key", out / "server.pem", out / "server.key",
                  certs, keys, [kept for _, kept in stale])



def _signed_by_old_ca(out: Path, names: Sequence[str]) -> list[tuple[Path, Path]]:
    """``(path, kept)`` for the files of every certificate in ``out`` that its CA (the one a
    new CA replaces) signed, other than the CA's, the server's and those of ``names`` (written
    anew): ``<name>.pem`` and the ``.key`` and ``.p12`` beside it, each to go to
    ``<name>.<ext>.replaced-<UTC time>``. A CA certificate (a kept copy of the old CA's, a
    bundle that starts with it) is no one's certificate to replace: it stays."""
    try:
        old = load_certificate(out / "ca.pem")
    except (OSError, ValueError):  # no CA there, or none readable: no certificate is its
        return []
    stamp = _now().strftime("%Y%m%dT%H%M%SZ")
    moves: list[tuple[Path, Path]] = []
    for cert_path in sorted(out.glob("*.pem")):
        name = cert_path.name.removesuffix(".pem")
        if name in ("ca", "server", *names) or not cert_path.is_file():
            continue
        try:
            cert = load_certificate(cert_path)
        except (OSError, ValueError):
            continue
        if verify_signed_by(cert, old) and not is_ca(cert):  # a copy of the old CA stays
            moves += [(path, path.with_name(f"{path.name}.replaced-{stamp}"))
                      for path in (out / f"{name}.{ext}" for ext in ("pem", "key", "p12"))
                      if path.is_file()]
    return moves


def issue_client_certificates(ca_dir: Path, names: Sequence[str], *, renew: bool = False,
                              operator: bool = False, from_site: bool = False) -> list[Path]:
    """Client certificates for ``names``, signed by the CA in ``ca_dir`` (``ca.pem`` and
    ``ca.key``), written beside it as ``<name>.pem`` and ``<name>.key`` (mode 0600): a site
    that joins later, or with ``operator`` an operator's browser (:data:`OPERATOR_PURPOSE`:
    it certifies no site). Returns the certificates' paths.

    With ``renew`` every name must have its pair there already, or half of it (the
    certificate or the key alone, as a renewal cut short leaves it): what is there is moved
    aside (to ``<name>.pem.replaced-<UTC time>`` and ``<name>.key.replaced-<UTC time>``, kept;
    a ``<name>.p12`` too) and a new pair with the same name is written, so the site's token,
    bound to that name, goes on working. The old certificate stays valid until its end (there
    is no revocation list). A renewal keeps a certificate's kind: an operator's is renewed with
    ``operator`` only, and a site's (one not named :data:`OPERATOR_NAME`) becomes an operator's
    only with ``from_site`` too (a browser's certificate issued as a site's). An old
    ``<name>.pem`` that holds no certificate of that name (damaged, a key, another name's:
    files mixed up) is replaced by the kind ``operator`` says.

    Raises
    ------
    FileNotFoundError
        ``ca.pem`` or ``ca.key`` is missing; with ``renew``, a name has neither file of a pair
        to renew.
    FileExistsError
        Without ``renew``, a ``<name>.pem`` or ``<name>.key`` is there already: nothing is
        written.
    ValueError
        A name is not usable as a file name (or is :data:`OPERATOR_NAME` for a site), the key
        is not the CA's, the CA's certificate has expired (or is not valid yet), or with
        ``renew`` an operator's certificate would be renewed as a site's, or a site's as an
        operator's without ``from_site``.
    """
    ca_dir = Path(ca_dir)
    names = list(names)
    ca, moves = _prepare_issue(ca_dir, names, renew=renew, operator=operator,
                               from_site=from_site)
    return _write_clients(ca, ca_dir, names, operator, moves=moves)[0]


def _prepare_issue(ca_dir: Path, names: list[str], *, renew: bool, operator: bool,
                   from_site: bool, signing: bool = False
                   ) -> tuple[CertifiedKey, list[tuple[Path, Path]]]:
    """The CA of ``ca_dir`` that issues certificates for ``names``, and the files a renewal
    moves aside (``(path, kept)``), once the names, the CA and the files there allow it, by
    the rules :func:`issue_client_certificates` states (``signing``: for keys the sites made,
    ``fedforest pki sign``, whose refusals name that command)."""
    if not names:
        raise ValueError("no site name given")
    known = names_on_disk(ca_dir, names)  # a renewal keeps the name the files have
    check_names(names, known)
    check_case_twins(ca_dir, names, known, operator)
    if not operator:
        check_site_names(names, ca_dir, renew=renew, known=known)
    for part in ("ca.pem", "ca.key"):
        if not (ca_dir / part).is_file():
            raise FileNotFoundError(f"{ca_dir / part} not found: issuing needs the federation "
                                    "CA's certificate and private key")
    ca = load_ca(ca_dir / "ca.pem", ca_dir / "ca.key")
    try:  # a certificate a CA outside its validity signs does not verify
        check_validity(ca_dir / "ca.pem")
    except ValueError as exc:
        if _now() < ca.cert.not_valid_after_utc:  # not valid yet: a clock, not the CA
            raise ValueError(f"{exc}: certificates it signs would not verify yet") from None
        raise ValueError(f"{exc}: certificates it signs would not verify; the federation needs "
                         "a new CA (`fedforest pki init --force`), and every site a new "
                         "certificate from it") from None
    pairs = [ca_dir / f"{n}.{ext}" for n in names for ext in ("pem", "key")]
    if not renew:
        _refuse_existing(pairs, _replaced_only_with_renew(ca_dir, names, operator, signing))
        return ca, []
    # half a pair (a renewal cut short between its renames, a file deleted; a certificate
    # signed for a site's own key): renewed too
    missing = [n for n in names
               if not (ca_dir / f"{n}.pem").is_file() and not (ca_dir / f"{n}.key").is_file()]
    if missing:
        first = "a new site's request" if signing else "a new site's"
        raise FileNotFoundError(f"{ca_dir / (missing[0] + '.pem')} not found: --renew replaces "
                                "a site's existing certificate (without --renew, "
                                f"`pki {'sign' if signing else 'issue'}` makes {first})")
    pairs = [p for p in pairs if p.is_file()]
    check_renewed_kinds(ca_dir, names, operator=operator, from_site=from_site)
    stamp = _now().strftime("%Y%m%dT%H%M%SZ")
    bundles = [ca_dir / f"{n}.p12" for n in names if (ca_dir / f"{n}.p12").is_file()]
    moves = [(path, path.with_name(f"{path.name}.replaced-{stamp}"))
             for path in pairs + bundles]  # a browser bundle of the old pair goes aside too
    # every target checked before anything moves
    _refuse_existing([kept for _, kept in moves], "renewed within the same second: run it "
                                                  "again in a second")
    return ca, moves


def _replaced_only_with_renew(ca_dir: Path, names: Sequence[str], operator: bool,
                              signing: bool) -> str:
    """Why a certificate already issued under one of ``names`` is not replaced, and how."""
    if signing:
        return ("a site's certificate is replaced only with --renew: the site makes a new "
                "request, and `fedforest pki sign --renew` signs it and keeps the old files "
                "beside it; a site's token works only with a certificate of its own name")
    halves = [n for n in names if (ca_dir / f"{n}.pem").is_file()
              != (ca_dir / f"{n}.key").is_file()]
    if not halves:
        return ("a site's certificate is replaced only with --renew, which keeps the old files "
                "beside it; a site's token works only with a certificate of its own name")
    renewal = (f"`fedforest pki issue --ca-dir {ca_dir} --name {halves[0]}"
               + (" --operator" if operator else "") + " --renew`")
    own_key = ("; a certificate `fedforest pki sign` signed for a site's own key is renewed "
               "from the site's new request with `pki sign --renew`"
               if (ca_dir / f"{halves[0]}.pem").is_file() else "")
    return (f"{halves[0]} has half a pair, as a renewal cut short leaves it: {renewal} writes "
            f"a new pair and keeps what is there beside it{own_key}")


def export_pkcs12(ca_dir: Path, name: str, password: bytes) -> Path:
    """``<name>.p12`` beside the CA in ``ca_dir``: the certificate ``<name>.pem``, its key
    ``<name>.key`` and the CA's certificate in one password-protected PKCS#12 file (mode 0600),
    the form a browser imports (an operator opening ``/ui`` of a server that asks every
    connection for a certificate).

    Raises
    ------
    FileNotFoundError
        ``ca.pem``, ``<name>.pem`` or ``<name>.key`` is missing.
    FileExistsError
        ``<name>.p12`` is there already: nothing is written.
    ValueError
        An empty password, a name not usable as a file name, a certificate that is not an
        operator's (:func:`load_operator_certificate`) or that ``ca.pem`` did not sign
        (:func:`bundled_certificate`), or a key that is not the certificate's.
    """
    from cryptography.hazmat.primitives.serialization import pkcs12

    ca_dir = Path(ca_dir)
    check_names([name], names_on_disk(ca_dir, [name]))
    if not password:
        raise ValueError("a PKCS#12 file needs a password (browsers refuse to import one "
                         "without, and the file holds a private key)")
    out = ca_dir / f"{name}.p12"
    _refuse_existing([out], "a certificate file is never replaced")
    for part in ("ca.pem", f"{name}.pem", f"{name}.key"):
        if not (ca_dir / part).is_file():
            raise FileNotFoundError(f"{ca_dir / part} not found")
    cert = bundled_certificate(ca_dir, name)
    try:
        key = _load_private_key(ca_dir / f"{name}.key")
    except TypeError:  # encrypted with a password
        raise ValueError(f"{ca_dir / (name + '.key')} is encrypted; give it without a "
                         "password") from None
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if (not isinstance(key, ec.EllipticCurvePrivateKey)
            or key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki)):
        raise ValueError(f"{ca_dir / (name + '.key')} does not match {ca_dir / (name + '.pem')}")
    data = pkcs12.serialize_key_and_certificates(
        name.encode(), key, cert, [load_certificate(ca_dir / "ca.pem")],
        serialization.BestAvailableEncryption(password))
    _write_private(out, data)
    return out


def bundled_certificate(ca_dir: Path, name: str) -> x509.Certificate:
    """The operator's certificate ``ca_dir/<name>.pem`` that :func:`export_pkcs12` bundles:
    an operator's (:func:`load_operator_certificate`), signed by ``ca_dir/ca.pem``, the CA the
    server trusts; ValueError naming the file and the command that issues one otherwise."""
    cert = load_operator_certificate(ca_dir / f"{name}.pem")
    if not verify_signed_by(cert, load_certificate(ca_dir / "ca.pem")):
        raise ValueError(
            f"{ca_dir / (name + '.pem')} was not signed by {ca_dir / 'ca.pem'} (a certificate "
            "of an earlier CA, which `pki init --force` replaced, or of another federation): "
            "the server refuses it. `fedforest pki issue --ca-dir "
            f"{ca_dir} --name {name} --operator --renew --p12` issues one of this CA and its "
            "bundle (the old files are kept aside); nothing was written")
    return cert


def _write_clients(ca: CertifiedKey, out: Path, names: Sequence[str], operator: bool = False,
                   *, moves: Sequence[tuple[Path, Path]] = ()
                   ) -> tuple[list[Path], list[Path]]:
    """``out/<name>.pem`` and ``out/<name>.key`` for each name, a new key and its certificate
    signed by ``ca`` (operators' certificates with ``operator``), all written or none, the
    files ``moves`` names moved aside (:func:`_write_issued`)."""
    issued = [(n, issue_certificate(ca, n, server=False, operator=operator)) for n in names]
    return _write_issued(out, [(n, ck.cert_pem(), ck.key_pem()) for n, ck in issued],
                         moves=moves)


def _write_issued(out: Path, issued: Sequence[tuple[str, bytes, bytes | None]], *,
                  moves: Sequence[tuple[Path, Path]] = ()) -> tuple[list[Path], list[Path]]:
    """``out/<name>.pem`` for each ``(name, certificate PEM, key PEM)``, and ``out/<name>.key``
    where the key is given (None: the site keeps its key), all written or none: each file is
    written whole beside its place first; then the files ``moves`` names are moved aside
    (``(path, kept)``: an old pair) and the new ones renamed into place. A failure (a full
    disk) leaves the directory as it was, the moved files back in their place. Returns the
    certificates' and the keys' paths."""
    certs = [out / f"{name}.pem" for name, _, _ in issued]
    keys = [out / f"{name}.key" for name, _, key in issued if key is not None]
    moved: list[tuple[Path, Path]] = []
    try:
        with contextlib.ExitStack() as stack:
            for name, cert_pem, key_pem in issued:
                _fill(stack.enter_context(replacing(out / f"{name}.pem", mode=0o644)),
                      cert_pem)
                if key_pem is not None:
                    _fill(stack.enter_context(replacing(out / f"{name}.key", mode=0o600)),
                          key_pem)
            for path, kept in moves:  # every new file is written: the old ones go aside
                moved.append((path, kept))  # first: an interrupt lands after the rename too
                path.rename(kept)
    except BaseException:
        for path, kept in reversed(moved):
            with contextlib.suppress(FileNotFoundError):  # one interrupted before its rename
                os.replace(kept, path)
        raise
    return certs, keys


def _fill(tmp: Path, data: bytes) -> None:
    """``data`` written to ``tmp`` and flushed to disk, before any old file moves aside."""
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
