"""A server database made unreachable for a while (tests are not a package: imported as a
module, like ``ports``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from server_app.db import Database


@contextlib.contextmanager
def database_down(db: Database) -> Iterator[None]:
    """The server's database refuses connections (PostgreSQL stopped, say) until the block
    ends: every query fails with an OperationalError, as a driver's refused connection does.

    The engine's dialect opens every new connection through its ``connect``, looked up at each
    call: the block replaces it on that one dialect object and puts it back, one attribute
    assignment each way, while the server's threads may be connecting (adding and removing a
    ``do_connect`` listener instead changes the list those threads iterate)."""
    dialect = db.engine.dialect
    dbapi = dialect.loaded_dbapi

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise dbapi.OperationalError("connection refused (the test stopped the database)")

    db.engine.dispose()  # the pooled connections go: every query needs a new one
    dialect.connect = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        del dialect.connect
