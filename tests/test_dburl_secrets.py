"""A database URL's secrets never reach a log line or an error message: the password after the
user name, one given as a query parameter (libpq reads ``?password=``), and a password holding
an ``@`` that was not percent-encoded; a malformed URL is a message, not a traceback."""

from __future__ import annotations

import pytest

from fedforest_secure.dburl import DatabaseUrlError, create_db_engine, shown_url

SECRET = "Hunter2Secret"


@pytest.mark.parametrize("url", [
    f"postgresql+psycopg://fed:{SECRET}@127.0.0.1:5432/fedforest",
    f"postgresql+psycopg://fed@127.0.0.1:5432/fedforest?password={SECRET}",
    f"postgresql+psycopg://fed@127.0.0.1/fedforest?sslpassword={SECRET}&connect_timeout=5",
    f"postgresql+psycopg://fed:Ab@{SECRET}@127.0.0.1:5432/fedforest",
    f"postgresql+psycopg://fed@127.0.0.1:5543x/fedforest?password={SECRET}",
])
def test_a_shown_url_holds_no_secret(url: str) -> None:
    shown = shown_url(url)
    assert SECRET not in shown and ":Ab" not in shown, shown


def test_a_query_parameter_that_is_no_secret_stays_readable() -> None:
    shown = shown_url(f"postgresql+psycopg://fed@h/db?password={SECRET}&connect_timeout=5")
    assert "connect_timeout=5" in shown and "password=***" in shown


def test_a_port_that_is_no_number_is_a_message_not_a_traceback() -> None:
    with pytest.raises(DatabaseUrlError, match=r"malformed database URL '127.0.0.1:5543x/db' "
                                               r"\(its port must be a number\)") as err:
        create_db_engine(f"postgresql+psycopg://fed:{SECRET}@127.0.0.1:5543x/db"
                         f"?password={SECRET}")
    assert SECRET not in str(err.value)


def test_an_unencoded_at_in_the_password_is_said_before_any_connection() -> None:
    """psycopg would try the host ``<rest of the password>@127.0.0.1`` and name it in its
    error: the URL is refused first, without the password, with the remedy."""
    with pytest.raises(DatabaseUrlError, match="percent-encoded .@ as %40.") as err:
        create_db_engine(f"postgresql+psycopg://fed:Ab@{SECRET}@127.0.0.1:5432/fedforest")
    assert SECRET not in str(err.value)
