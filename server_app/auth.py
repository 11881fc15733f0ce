"""Per-institution bearer tokens: issued once, stored hashed, compared in constant time.

A token reads ``ffs_<token_id>_<secret>``: the id finds the row, the secret is checked against
the stored SHA-256 with :func:`hmac.compare_digest`. Tokens carry 256 bits of entropy, so a fast
hash is enough (no password stretching is needed for random secrets).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable

from sqlalchemy import select

from fedforest_secure.protocol.api import NAME_PATTERN

from .db import ClientRow, Database, OperatorRow, lost_race

__all__ = ["REVOKED", "TokenCache", "TokenError", "add_client", "add_operator", "authenticate",
           "authenticate_operator", "hash_secret", "is_revoked", "new_token", "refusal",
           "revoke_client", "rotate_token"]

_TOKEN_RE = re.compile(r"^ffs_([A-Za-z0-9]{16})_([A-Za-z0-9_-]{43})$")
_OPERATOR_RE = re.compile(r"^ffo_([A-Za-z0-9]{16})_([A-Za-z0-9_-]{43})$")
_NAME_RE = re.compile(NAME_PATTERN)

#: the stored token hash of a revoked client: no SHA-256 hex digest equals it
REVOKED = "revoked"


class TokenError(ValueError):
    """A client name that is taken or malformed."""


def hash_secret(secret: str) -> str:
    return hashlib.sha256(b"fedforest/v1/token|" + secret.encode()).hexdigest()


def new_token() -> tuple[str, str, str]:
    """Return ``(token, token_id, secret)`` with fresh randomness from :mod:`secrets`."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    token_id = "".join(secrets.choice(alphabet) for _ in range(16))
    secret = secrets.token_urlsafe(32)
    return f"ffs_{token_id}_{secret}", token_id, secret


def add_client(db: Database, name: str) -> str:
    """Register institution ``name`` and return its token (shown once, never stored)."""
    if not _NAME_RE.fullmatch(name):
        raise TokenError("client names are 1-64 characters: letters, digits, '_', '.', '-'")
    token, token_id, secret = new_token()
    taken = TokenError(f"client {name!r} already exists (its token was shown once, when it was "
                       f"added): `fedforest server rotate-token {name}` gives it a new one, and "
                       "the old one stops working (a job the site is in then stops at its "
                       "next request: rotate between its jobs)")
    with lost_race(db, select(ClientRow.id).where(ClientRow.name == name), taken), \
            db.session() as sess:
        if sess.scalar(select(ClientRow).where(ClientRow.name == name)) is not None:
            raise taken
        sess.add(ClientRow(name=name, token_id=token_id, token_hash=hash_secret(secret)))
    return token



def rotate_token(db: Database, name: str) -> str:
    """A new token for client ``name`` (shown once): its old token stops authenticating (a
    running server that accepted it within the last ``TokenCache.ttl`` seconds forgets it
    then). The client keeps its memberships."""
    token, token_id, secret = new_token()
    _set_token(db, name, token_id, hash_secret(secret))
    return token


def revoke_client(db: Database, name: str) -> None:
    """Client ``name`` keeps no token that authenticates (its memberships and audit entries
    stay); :func:`rotate_token` gives it one again."""
    _, token_id, _ = new_token()
    _set_token(db, name, token_id, REVOKED)


def is_revoked(row: ClientRow) -> bool:
    """Whether client ``row`` was revoked (and not given a token since)."""
    return row.token_hash == REVOKED


def _set_token(db: Database, name: str, token_id: str, token_hash: str) -> None:
    with db.session() as sess:
        row = sess.scalar(select(ClientRow).where(ClientRow.name == name))
        if row is None:
            raise TokenError(f"no client {name!r}")
        row.token_id, row.token_hash = token_id, token_hash


def add_operator(db: Database, name: str) -> str:
    """Register an operator of the ``/ui`` page; returns its ``ffo_`` token (shown once)."""
    if not _NAME_RE.fullmatch(name):
        raise TokenError("operator names are 1-64 characters: letters, digits, '_', '.', '-'")
    token, token_id, secret = new_token()
    taken = TokenError(f"operator {name!r} already exists (its token was shown once, when it "
                       f"was added): `fedforest server remove-operator {name}` then "
                       f"`fedforest server add-operator {name}` give the name a new one (the "
                       "old one then stops working)")
    with lost_race(db, select(OperatorRow.id).where(OperatorRow.name == name), taken), \
            db.session() as sess:
        if sess.scalar(select(OperatorRow).where(OperatorRow.name == name)) is not None:
            raise taken
        sess.add(OperatorRow(name=name, token_id=token_id, token_hash=hash_secret(secret)))
    return "ffo_" + token.removeprefix("ffs_")


def remove_operator(db: Database, name: str) -> None:
    """Delete operator ``name``: its token opens ``/ui`` no more (every request looks the
    token up); :func:`add_operator` registers the name again with a new token."""
    with db.session() as sess:
        row = sess.scalar(select(OperatorRow).where(OperatorRow.name == name))
        if row is None:
            raise TokenError(f"no operator {name!r}")
        sess.delete(row)


def authenticate_operator(db: Database, token: str) -> OperatorRow | None:
    """The operator owning ``token`` (an ``ffo_`` token; a client's never matches), or None.
    Constant-time in the secret."""
    match = _OPERATOR_RE.fullmatch(token)
    if match is None:
        hmac.compare_digest(hash_secret("x"), hash_secret("y"))
        return None
    token_id, secret = match.groups()
    with db.session() as sess:
        row = sess.scalar(select(OperatorRow).where(OperatorRow.token_id == token_id))
    expected = row.token_hash if row is not None else hash_secret("no such token")
    ok = hmac.compare_digest(expected, hash_secret(secret))
    return row if (ok and row is not None) else None


def refusal(token: str) -> str:
    """Why the sites' API refused ``token`` (:func:`authenticate` found no client owning it):
    a token of an operator's form is named as one, by its form alone (whether it is a valid
    operator token is not looked up, so the answer tells its holder nothing more)."""
    if token.startswith("ffo_"):
        return ("an operator token (ffo_...) opens the operator page /ui only; the sites' "
                "requests take a site's token (ffs_...)")
    return "unknown or revoked token"


def authenticate(db: Database, token: str) -> ClientRow | None:
    """The client owning ``token``, or None. Constant-time in the secret."""
    match = _TOKEN_RE.fullmatch(token)
    if match is None:
        hmac.compare_digest(hash_secret("x"), hash_secret("y"))  # keep timing uniform
        return None
    token_id, secret = match.groups()
    with db.session() as sess:
        row = sess.scalar(select(ClientRow).where(ClientRow.token_id == token_id))
    expected = row.token_hash if row is not None else hash_secret("no such token")
    ok = hmac.compare_digest(expected, hash_secret(secret))
    return row if (ok and row is not None) else None


class TokenCache:
    """:func:`authenticate` that keeps the row of a token it accepted for ``ttl`` seconds.

    Every request carries the token: the secret is still hashed and compared in constant time
    against the stored hash on every call, only the database lookup of the row is skipped
    while the entry is fresh (clients are never deleted by the server itself; a row removed
    from the database stops authenticating after at most ``ttl`` seconds). Unknown or wrong
    tokens are never cached. :meth:`lookup` answers from the cache only, without I/O, so the
    server can call it on its event loop. The cache holds one entry per site at most, and
    none past its ``ttl`` once another token is looked up: a site's new token (rotated)
    replaces its old one's entry, and a token the database no longer accepts (revoked,
    rotated) loses its entry when it is refused, so a server running for weeks keeps no
    entry of every token it ever accepted.
    """

    def __init__(self, db: Database, ttl: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.db, self.ttl, self.clock = db, ttl, clock
        self._rows: dict[str, tuple[ClientRow, float]] = {}
        self._mu = threading.Lock()

    def lookup(self, token: str) -> tuple[bool, ClientRow | None]:
        """``(True, row or None)`` if the cache can answer, ``(False, None)`` if not."""
        match = _TOKEN_RE.fullmatch(token)
        if match is None:
            return False, None
        token_id, secret = match.groups()
        with self._mu:
            hit = self._rows.get(token_id)
        if hit is None or self.clock() - hit[1] >= self.ttl:
            return False, None
        row = hit[0]
        ok = hmac.compare_digest(row.token_hash, hash_secret(secret))
        return True, (row if ok else None)

    def still_holds(self, row: ClientRow) -> bool:
        """Whether the client of ``row`` (as a request authenticated it) still holds that
        token in the database: not revoked, rotated or removed since (a database read, for
        an answer that a long poll gives after waiting, when the cache may be stale)."""
        with self.db.session() as sess:
            now = sess.get(ClientRow, row.id)
            return now is not None and (now.token_id, now.token_hash) == (row.token_id,
                                                                          row.token_hash)

    def __call__(self, token: str) -> ClientRow | None:
        known, row = self.lookup(token)
        if known:
            return row
        row = authenticate(self.db, token)
        match = _TOKEN_RE.fullmatch(token)
        if match is None:
            return row
        now = self.clock()
        with self._mu:
            self._rows.pop(match.group(1), None)  # refused now, or read again below
            for token_id, (held, since) in list(self._rows.items()):
                if now - since >= self.ttl or (row is not None and held.id == row.id):
                    del self._rows[token_id]  # stale, or the site's earlier token
            if row is not None:
                self._rows[match.group(1)] = (row, now)
        return row
