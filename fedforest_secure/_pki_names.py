"""The names ``fedforest pki`` writes certificates under: each names its files
(``<name>.pem``, ``<name>.key``), so a new one must be a file name of its own on any disk,
letter case aside; a name whose files are there already is kept (a renewal)."""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Sequence
from pathlib import Path

from .protocol.api import NAME_PATTERN

__all__ = ["check_case_twins", "check_names", "names_on_disk", "site_renewal"]

#: a site's name, which names its files: ``<name>.pem``, ``<name>.key``
_SITE_NAME = re.compile(NAME_PATTERN)

#: what a disk that ignores letter case (macOS's and Windows' by default) does with two names
#: that differ in it only
_ONE_FILE = ("a disk that ignores letter case (as macOS's and Windows' do by default) keeps "
             "them in one file")


def check_names(names: Sequence[str], known: Collection[str] = ()) -> None:
    """Refuse a name that is no file name, the CA's or the server's (``ca``, ``server``; a
    name not in ``known`` in any letter case too: ``CA.pem`` is ``ca.pem`` on a disk that
    ignores it), and names that repeat (new ones, letter case aside). ``known`` holds the
    names whose files are in the directory already, in that letter case: a renewal keeps a
    site's name."""
    bad = [n for n in names if not isinstance(n, str) or not _SITE_NAME.fullmatch(n)
           or n in ("ca", "server") or (n not in known and n.casefold() in ("ca", "server"))]
    if bad:
        raise ValueError(f"site names {bad!r} are not usable as file names (letters, digits, "
                         "'.', '_', '-'; not 'ca' or 'server' in any letter case)")
    if len(set(names)) != len(names):
        raise ValueError(f"site names repeat: {sorted(names)!r}")
    new = [n for n in names if n not in known]
    if len({n.casefold() for n in new}) != len(new):
        raise ValueError(f"site names differ in letter case only: {sorted(new)!r}: "
                         f"{_ONE_FILE}; give each site a name of its own")


def names_on_disk(ca_dir: Path, names: Sequence[str]) -> set[str]:
    """The names whose ``<name>.pem`` or ``<name>.key`` is in ``ca_dir``, in exactly that
    letter case (as the directory lists it: a disk that ignores letter case finds
    ``CA.pem`` when ``ca.pem`` is there)."""
    try:
        listed = set(os.listdir(ca_dir))
    except OSError:  # no directory yet (or not one): every name is new
        return set()
    return {n for n in names if f"{n}.pem" in listed or f"{n}.key" in listed}


def check_case_twins(ca_dir: Path, names: Sequence[str], known: Collection[str],
                      operator: bool) -> None:
    """Refuse a name not in ``known`` whose certificate would be another's in ``ca_dir`` but
    for letter case (``Hospital-A`` beside ``hospital-a.pem``), saying how that other one is
    renewed."""
    there = [p.name.removesuffix(".pem") for p in ca_dir.glob("*.pem")]
    for name in names:
        if name in known:
            continue
        twin = next((t for t in there if t != name and t.casefold() == name.casefold()), None)
        if twin is not None:
            raise ValueError(f"{name!r} differs in letter case only from {twin!r}, whose "
                             f"certificate is in {ca_dir}: {_ONE_FILE}; give the site "
                             f"another name ({site_renewal(ca_dir, twin, operator)} renews "
                             "that one)")


def site_renewal(ca_dir: Path, name: str, operator: bool = False) -> str:
    """The command(s) that renew the certificate of ``name`` in ``ca_dir``, with a new key made
    where its key is: on the CA's side (``<name>.key`` beside it: ``pki issue --renew``) or at
    the site (its new request, signed with ``pki sign --renew``)."""
    if (ca_dir / f"{name}.key").is_file():  # the CA's side made this key: it makes the next
        return (f"`fedforest pki issue --ca-dir {ca_dir} --name {name}"
                + (" --operator" if operator else "") + " --renew`")
    return (f"a new request of the site (`fedforest pki request --name {name} --out <new "
            f"directory>` at the site) signed with `fedforest pki sign --csr {name}.csr "
            f"--ca-dir {ca_dir} --renew`")
