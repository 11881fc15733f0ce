"""A site that will not join a job tells the server why, as a code from a fixed list
(:data:`~fedforest_secure.protocol.api.DECLINE_CODES`); the words stay in its own log."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fedforest_secure import __version__
from fedforest_secure.errors import FedForestError

from .context import ClientOptions
from .log import SiteLog
from .transport import Transport

__all__ = ["check_server_version", "decline", "decline_alone", "declining"]


def check_server_version(tr: Transport, job: str, server: str | None, log: SiteLog) -> None:
    """Decline a job whose server says it runs another version of fedforest-secure: a task's
    question key, the secure-aggregation messages and the model file may differ between
    versions. A server that does not say its version is let through (the round setup's check
    of the question key still stops a job whose tasks this site reads otherwise)."""
    if server is None or server == __version__:
        return
    decline(tr, job, "version", log)
    raise FedForestError(f"the server runs fedforest-secure {server[:64]!r} and this "
                         f"site {__version__!r}: this site did not join job {job}. Run one "
                         "version on the server and every site (fedforest --version), "
                         "upgraded together between jobs")


def decline(tr: Transport, job: str, reason: str, log: SiteLog) -> None:
    """Tell the server why this site will not join ``job`` (a code; the message stays in the
    site's log), so the operator sees it beside the member; best effort."""
    try:
        tr.post_json(f"/v1/jobs/{job}/decline", {"reason": reason})
        log.warn(f"job {job}: the server was told this site declines it ({reason}); it waits "
                 "for this site until it joins")
    except (FedForestError, OSError, ValueError) as exc:
        log.info(f"job {job}: the server was not told this site declines it: {exc}")


@contextlib.contextmanager
def declining(tr: Transport, job: str, reason: str, log: SiteLog) -> Iterator[None]:
    """A check whose failure (a :class:`FedForestError`) this site declines the job for."""
    try:
        yield
    except FedForestError:
        decline(tr, job, reason, log)
        raise


def decline_alone(opts: ClientOptions, reason: str, log: SiteLog | None) -> None:
    """:func:`decline` before the client's transport exists (its table failed to load)."""
    if not opts.job:
        return
    try:
        tr = Transport(opts.server, opts.token, opts.ca, opts.cert, opts.key,
                       retry_budget_s=min(opts.retry_budget_s, 10.0),
                       insecure_dev=opts.insecure_dev)
    except (FedForestError, OSError, ValueError):
        return
    try:
        decline(tr, opts.job, reason, log or SiteLog())
    finally:
        tr.close()
