"""Operators' certificates: what marks one, and the rules of ``fedforest pki`` that keep a
site's certificate and an operator's apart (the messages name the command that does what the
user wants).

An operator's certificate (clientAuth and :data:`OPERATOR_PURPOSE`) opens TLS connections like
a site's, for a browser on the operator page or a health probe, but certifies no identity in a
secure job: the server operator holds its key. The name :data:`OPERATOR_NAME` is an
operator's only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from ._pem_files import load_certificate
from ._pki_names import site_renewal

__all__ = ["OPERATOR_NAME", "OPERATOR_PURPOSE", "check_renewed_kinds", "check_site_names",
           "is_operator_certificate", "load_operator_certificate"]

#: FedForest's object identifier arc (ITU-T X.667: 2.25 and a UUID as one integer; the UUID is
#: c49e1022-2ed5-4af7-a169-b75b09989a2d)
_FEDFOREST_ARC = "2.25.261349397304297363440624600421328525869"
#: the extended key usage purpose that marks an operator's certificate (beside clientAuth, for
#: a browser's TLS): it certifies no secure-aggregation identity
OPERATOR_PURPOSE = x509.ObjectIdentifier(f"{_FEDFOREST_ARC}.1")
#: the name `fedforest pki` issues an operator's certificate under, and never a site's
OPERATOR_NAME = "operator"


def is_operator_certificate(cert: x509.Certificate) -> bool:
    """True if the certificate's extended key usage holds :data:`OPERATOR_PURPOSE`."""
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False
    return OPERATOR_PURPOSE in usages


def load_operator_certificate(path: Path) -> x509.Certificate:
    """The certificate in the PEM file ``path`` if it is an operator's (what goes into a
    browser); ValueError naming the file and the command that gives the browser one
    otherwise."""
    cert = load_certificate(path)
    if not is_operator_certificate(cert):
        path = Path(path)
        name, where = path.name.removesuffix(".pem"), path.parent
        if name == OPERATOR_NAME:  # issued without the operator purpose: made one in place
            hint = (f"`fedforest pki issue --ca-dir {where} --name {OPERATOR_NAME} --renew "
                    "--operator --p12` makes it one (the old files are kept aside)")
        else:  # most likely a site's certificate named by mistake
            hint = (f"{_operator_bundle_hint(where)}; a browser's certificate issued as a "
                    f"site's (without --operator) becomes an operator's with `fedforest pki "
                    f"issue --ca-dir {where} --name {name} --renew --operator --from-site "
                    "--p12`, and no longer certifies a site")
        raise ValueError(f"{path} is not an operator's certificate: a browser's bundle holds "
                         "an operator's only (a site's would certify an identity in secure "
                         f"jobs); {hint}")
    return cert


def _operator_bundle_hint(where: Path) -> str:
    """How the operator's browser gets its bundle from the files in ``where``."""
    if (where / f"{OPERATOR_NAME}.p12").exists():
        return f"{where / (OPERATOR_NAME + '.p12')} is the operator's browser bundle"
    if (where / f"{OPERATOR_NAME}.pem").exists():
        return (f"`fedforest pki p12 --ca-dir {where} --name {OPERATOR_NAME}` bundles the "
                "operator's certificate")
    return (f"`fedforest pki issue --ca-dir {where} --name {OPERATOR_NAME} --operator --p12` "
            "issues the operator's certificate and its bundle")


def check_site_names(names: Sequence[str], where: Path, *, renew: bool = False,
                     init: bool = False, known: Collection[str] = ()) -> None:
    """Refuse :data:`OPERATOR_NAME` as a site's name, naming the command that issues it as
    an operator's (with ``renew``, one that renews it), and as a new site's name in any
    letter case (``known`` holds the names whose files are in ``where`` already, in that
    letter case: a renewal keeps a site's name)."""
    twin = next((n for n in names if n != OPERATOR_NAME and n not in known
                 and n.casefold() == OPERATOR_NAME), None)
    if twin is not None:  # operator.pem on a disk that ignores letter case
        raise ValueError(f"{twin!r} is {OPERATOR_NAME!r}, the name of an operator's "
                         "certificate, in other letter case: a disk that ignores letter case "
                         "keeps them in one file; give the site another name")
    if OPERATOR_NAME in names:
        issue = (f"`fedforest pki issue --ca-dir {where} --name {OPERATOR_NAME} --operator"
                 + ("` issues one" if not renew else " --renew` renews it as one"))
        how = f"run `pki init` without it, then {issue}" if init else issue
        raise ValueError(f"{OPERATOR_NAME!r} names an operator's certificate, never a site's: "
                         f"{how} (for a browser on the operator page; it certifies no site)")


def _held_kind(path: Path, name: str) -> bool | None:
    """Whether the PEM file ``path`` holds an operator's certificate of ``name`` (True) or a
    site's (False); None if it holds no certificate of that name (or is not there: half a
    pair, the key alone)."""
    try:
        cert = load_certificate(path)
    except (ValueError, FileNotFoundError):  # damaged, a key in its place, or missing
        return None
    names = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    return is_operator_certificate(cert) if names == [name] else None


def check_renewed_kinds(ca_dir: Path, names: Sequence[str], *, operator: bool,
                        from_site: bool) -> None:
    """Refuse a renewal that would change a certificate's kind unasked: an operator's renewed
    as a site's would certify an identity; a site's renewed as an operator's would leave its
    site unable to take part in a secure job (with ``from_site``: asked for)."""
    kinds = {n: _held_kind(ca_dir / f"{n}.pem", n) for n in names}
    command = f"fedforest pki issue --ca-dir {ca_dir} --name"
    if not operator:
        held = [n for n, kind in kinds.items() if kind is True]
        if held:
            raise ValueError(f"{ca_dir / (held[0] + '.pem')} is an operator's certificate: "
                             f"`{command} {held[0]} --renew --operator` renews it as one "
                             "(nothing was written)")
    elif not from_site:
        sites = [n for n, kind in kinds.items() if kind is False and n != OPERATOR_NAME]
        if sites:
            renewal = site_renewal(ca_dir, sites[0])
            raise ValueError(
                f"{ca_dir / (sites[0] + '.pem')} is a site's certificate: renewed with "
                "--operator it would certify no site, and that site could take part in no "
                f"secure job. {renewal[0].upper()}{renewal[1:]} renews it as a site's; a "
                "browser's certificate issued as a site's (without --operator) becomes an "
                "operator's with --from-site added (nothing was written)")
