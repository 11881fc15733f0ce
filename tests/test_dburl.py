"""Database URLs an operator may write: a scheme SQLAlchemy does not know, a driver that is
not installed, a malformed URL: each is a one-line error saying what to write or install,
never a traceback, and never the URL's password."""

from __future__ import annotations

import sys

import pytest

from fedforest_secure.audit import AuditLog
from fedforest_secure.errors import AuditError
from server_app.db import Database
from server_app.settings import ConfigError


@pytest.mark.parametrize("url", ["postgres://fed:s3cret@127.0.0.1:5/fed",
                                 "mysqlx://fed:s3cret@127.0.0.1/fed"])
def test_an_unknown_scheme_names_the_ones_that_work(url: str) -> None:
    with pytest.raises(ConfigError) as server:
        Database(url)
    with pytest.raises(AuditError) as audit:
        AuditLog(url)
    for exc in (server.value, audit.value):
        text = str(exc)
        assert "postgresql+psycopg://" in text and "sqlite:///" in text, text
        assert "s3cret" not in text


def test_a_driver_that_is_not_installed_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as on a machine without the extra
    url = "postgresql+psycopg://fed:s3cret@127.0.0.1:5/fed"
    with pytest.raises(ConfigError) as server:
        Database(url)
    with pytest.raises(AuditError) as audit:
        AuditLog(url)
    for exc in (server.value, audit.value):
        assert "fedforest-secure[postgres]" in str(exc) and "s3cret" not in str(exc)


def test_psycopg2_urls_are_pointed_to_psycopg_3() -> None:
    with pytest.raises(ConfigError, match=r"postgresql\+psycopg://"):
        Database("postgresql+psycopg2://fed@127.0.0.1:5/fed")
