"""A server database made unreachable for a while (tests are not a package: imported as a
module, like ``ports``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy import event

from server_app.db import Database


@contextlib.contextmanager
def database_down(db: Database) -> Iterator[None]:
    """The server's database refuses connections (PostgreSQL stopped, say) until the block
    ends: every query fails with an OperationalError, as a driver's refused connection does."""
    dbapi = db.engine.dialect.loaded_dbapi

    def refuse(*_args: object) -> None:
        raise dbapi.OperationalError("connection refused (the test stopped the database)")

    db.engine.dispose()  # the pooled connections go: every query needs a new one
    event.listen(db.engine, "do_connect", refuse)
    try:
        yield
    finally:
        event.remove(db.engine, "do_connect", refuse)
