"""Start the server with uvicorn: TLS always, plain HTTP only with ``insecure_dev`` on loopback."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import socket
import ssl
import threading
from pathlib import Path

import uvicorn
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from fedforest_secure.audit.log import to_url
from fedforest_secure.dburl import carries_secret, shown_url
from fedforest_secure.errors import AuditError
from fedforest_secure.files import readable_by

from .app import create_app
from .audit_hook import AuditSink, open_audit
from .audit_outbox import AuditPending, first_queued
from .db import AuditedJobRow, AuditMarkRow, Database, JobRow
from .event_loop import LOOP
from .head_limit import MAX_HEAD_BYTES, http_protocol
from .idle import protocol_with_idle_limit
from .lease import LeaseLost, ServerLease
from .logs import configure, event
from .phases import JobStatus
from .settings import LOOPBACK, ConfigError, ServerSettings
from .tls_files import check_tls_files
from .tls_identity import PeerNames, log_refused_handshakes, protocol_with_peer_names

__all__ = ["check_transport", "run_server", "spool_dir"]


def spool_dir(database: str) -> Path | None:
    """``<database file>.spool`` beside a SQLite database file: where the masked uploads of an
    open secure round wait for its close (see :class:`server_app.runtime.ServerState`). Other
    databases keep them in a table."""
    url = make_url(database)
    if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
        return None
    return Path(url.database + ".spool")


def check_transport(settings: ServerSettings, *, insecure_dev: bool) -> list[str]:
    """Refuse any configuration that would serve plain HTTP beyond 127.0.0.1, and TLS files
    that cannot serve (:func:`~server_app.tls_files.check_tls_files`); return the warnings
    to log at start-up."""
    if insecure_dev:
        if settings.host != LOOPBACK:
            raise ConfigError("--insecure-dev serves plain HTTP and is allowed on 127.0.0.1 only")
        return []
    if settings.tls is None:
        raise ConfigError("the server needs [tls] cert and key (or --insecure-dev on 127.0.0.1)")
    return check_tls_files(settings.tls, settings.host)


def config_warnings(config: Path, settings: ServerSettings) -> list[str]:
    """A warning when ``config`` (the server.toml ``settings`` were read from) gives a
    database URL with its password and other users of the machine, or its group, can read
    the file."""
    secret = [name for name, url in (("database", settings.database),
                                     ("audit_database", settings.audit_database))
              if url is not None and carries_secret(url)]
    readers = readable_by(config) if secret else None
    if readers is None:
        return []
    who, mode = readers
    whom = "other users of this machine" if who == "others" else "its group"
    return [f"{config}: {' and '.join(secret)} holds a password and {whom} can read the file "
            f"(mode {mode:04o}); make it readable by the server only (chmod 600 {config}), or "
            "give the password in ~/.pgpass or PGPASSWORD instead"]


def run_server(settings: ServerSettings, *, insecure_dev: bool = False,
               port: int | None = None, config_file: Path | None = None) -> None:
    """Serve ``settings`` (read from ``config_file``, if given: a password it gives others can
    read is a warning in the log) until stopped."""
    warnings = check_transport(settings, insecure_dev=insecure_dev)
    configure()
    for warning in warnings:
        event("tls_warning", logging.WARNING, reason=warning)
    for warning in config_warnings(config_file, settings) if config_file is not None else []:
        event("config_warning", logging.WARNING, reason=warning)
    db = Database(settings.database)
    bound = settings.port if port is None else port
    # the port and the audit log first, the database's claim last: a start that fails a
    # check leaves the claim as it found it (had it taken a stalled server's claim and given
    # it back, that server would stop when it resumed, and neither would serve)
    listener = _listen(settings.host, bound)
    lease = ServerLease(db, bound)
    try:
        audit = open_audit(settings.audit_database,
                           arrays_for_sites=settings.audit_arrays_for_sites)
        check_audit_chains(db, audit, settings.audit_database)
        lease.acquire()  # a second server on this database refuses to start
    except BaseException:
        listener.close()
        raise
    try:
        flush_waiting_entries(db, audit, settings.audit_database)
    except BaseException:
        lease.release()
        listener.close()
        raise
    tls = None if insecure_dev else settings.tls
    client_ca = tls.client_ca if tls is not None else None
    peer_names: PeerNames | None = None
    # a connection that asks nothing (no request, or headers stopped half-way) is closed too,
    # not only one idle after a response, and so is one whose client takes none of its answer:
    # a site cannot hold the server's descriptors (a slow reader keeps its own); and a
    # request line and headers, or a chunked body's trailer fields, past MAX_HEAD_BYTES get a
    # 431 (server_app/head_limit.py)
    http: type[asyncio.Protocol] = protocol_with_idle_limit(http_protocol(), KEEP_ALIVE_S)
    if client_ca is not None:
        # mutual TLS: every token is bound to the client its connection's certificate names
        peer_names = PeerNames()
        http = protocol_with_peer_names(http, peer_names)
    server: uvicorn.Server | None = None
    app = create_app(db, audit, tick_seconds=settings.tick_seconds,
                     max_upload_bytes=settings.max_upload_bytes,
                     spool=spool_dir(settings.database),
                     body_timeout_s=settings.body_timeout_s, peer_names=peer_names,
                     stopping=lambda: server is not None and server.should_exit, lease=lease)
    event("startup", host=settings.host, port=bound,
          tls=tls is not None, mtls=client_ca is not None,
          database=shown_url(settings.database),
          audit=settings.audit_database is not None, pid=os.getpid())
    # SIGTERM / SIGINT / SIGHUP: uvicorn stops accepting, long polls answer within _POLL_SLICE, the
    # requests in flight finish (at most 5 s), then the lifespan logs the shutdown
    config = uvicorn.Config(
        app, host=settings.host, port=bound,
        log_level="warning", access_log=False, timeout_graceful_shutdown=5, log_config=None,
        timeout_keep_alive=KEEP_ALIVE_S,
        # the peer is the TCP connection's, never a header's: a token is bound to the
        # certificate of the connection it came on (uvicorn would take X-Forwarded-For from
        # 127.0.0.1 as the client's address, and with it another connection's certificate)
        proxy_headers=False,
        http=http,
        # no WebSocket: the server has no such route, and a connection uvicorn handed to a
        # WebSocket protocol would skip the connection bookkeeping of the HTTP protocol above
        # (its certificate name, its idle watch); an Upgrade request is an ordinary request
        ws="none",
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,  # where httptools is missing
        # uvloop (or asyncio) with a TLS handshake timeout: a connection that does not finish
        # its handshake, which the idle watch above does not see yet, is closed after
        # TLS_HANDSHAKE_S (server_app/event_loop.py), not the loop's default 60 s
        loop=LOOP,
        ssl_certfile=str(tls.cert) if tls is not None else None,
        ssl_keyfile=str(tls.key) if tls is not None else None,
        ssl_ca_certs=str(client_ca) if client_ca is not None else None,
        ssl_cert_reqs=ssl.CERT_REQUIRED if client_ca is not None else ssl.CERT_NONE)
    config.load()  # the TLS context exists from here: its refused handshakes are logged
    if config.ssl is not None:
        log_refused_handshakes(config.ssl)
    server = uvicorn.Server(config)

    def lost(err: LeaseLost) -> None:  # another process took the lease: stop serving
        event("lease_lost", logging.ERROR, reason=str(err))
        if server is not None:
            server.should_exit = True

    hung_up = False

    def hang_up(signum: int, frame: object) -> None:  # the terminal closed: as on SIGTERM
        nonlocal hung_up
        hung_up = True
        if server is not None:
            server.should_exit = True

    lease.keep(lost)
    # uvicorn shuts down gracefully on SIGTERM, restores the handler it found and raises the
    # signal again: with the default handler the process died there, before the lease was
    # given back. This handler turns it into SystemExit (status 128 + 15), so it is given back.
    # SIGHUP, which uvicorn leaves alone (the default killed the process at once), stops the
    # server the same way, with status 128 + 1; under nohup it stays ignored.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            signal.signal(signal.SIGHUP, hang_up)
    try:
        server.run(sockets=[listener])
    finally:
        listener.close()
        lease.release()
        db.dispose()  # the engine's pooled connections closed, not left to the process's end
    if lease.lost is not None:  # an error (exit status 2), though the stop itself went well
        raise lease.lost
    if hung_up:
        raise SystemExit(128 + signal.SIGHUP)


#: seconds the server keeps an idle connection open (no request begun or in progress since
#: its last response, or since it was made): longer than a client's pool keeps one (5 s), so
#: the client, not the server, ends an idle connection, and a request never meets the
#: server's close
KEEP_ALIVE_S = 30


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (uvicorn listens on it), or :class:`ConfigError`
    saying why it cannot be (the port is taken, the address is not this machine's)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"host {host!r}: not an address to listen on ({exc.strerror})"
                          ) from None
    # a name with an IPv4 address (localhost) listens there, as uvicorn's own binding did
    family, kind, proto, _, address = min(found, key=lambda a: a[0] != socket.AF_INET)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # a second server binding the same port fails here, not silently
    except OSError as exc:
        sock.close()
        hint = {errno.EADDRINUSE: "is another server using that port? set another port in "
                                  "the config or with --port",
                errno.EACCES: "ports below 1024 need privileges: use a higher port, or give "
                              "the process the right to bind low ports"
                }.get(exc.errno or 0, "host must be an address of this machine")
        raise ConfigError(f"cannot listen on {host} port {port}: {exc.strerror or exc} "
                          f"({hint})") from None
    return sock


def check_audit_chains(db: Database, audit: AuditSink, url: str | None) -> None:
    """Refuse (:class:`ConfigError`) to serve an unfinished job whose audit chain is not in
    the configured audit log: it was created on another audit database, and going on here
    would split its chain between two logs, neither of which verifies; or it was created
    with an audit log and this server keeps none, so its rounds would go unaudited while its
    log, verified, says nothing is wrong."""
    unfinished_q = select(JobRow.id).where(
        JobRow.status.in_((JobStatus.WAITING, JobStatus.RUNNING)))
    if not audit.enabled:
        with db.session() as sess:
            audited = sess.scalars(unfinished_q.join(
                AuditedJobRow, AuditedJobRow.job_id == JobRow.id)).all()
        if audited:
            raise ConfigError(
                f"job {audited[0]!r} is not finished and was created with an audit log, but "
                "this server config has no audit_database: its rounds would go unaudited. "
                "Start the server with the audit_database the job began with")
        return
    with db.session() as sess:
        unfinished = sess.scalars(unfinished_q).all()
        waiting = first_queued(sess)
        for job_id in unfinished:
            _check_not_behind(db, audit, job_id, url)
            # a job whose creation committed but whose job_created entry was not appended yet
            # (its create-job was stopped in between) has its chain's first entry waiting
            if audit.tip(job_id)[0] == 0 and waiting.get(job_id) != 1:
                shown = shown_url(to_url(url)) if url else "?"
                raise ConfigError(
                    f"job {job_id!r} is not finished and the audit log at {shown} has none of "
                    "its entries: it was created with another audit_database (or none). Start "
                    "the server with the audit_database the job began with (its chain must "
                    "stay in one log)")
            # a job created before jobs were marked (its chain is here): marked now
            if sess.get(AuditedJobRow, job_id) is None:
                sess.add(AuditedJobRow(job_id=job_id))


def _check_not_behind(db: Database, audit: AuditSink, job_id: str, url: str | None) -> None:
    """Refuse an unfinished job whose audit chain goes beyond the last entry its database
    queued: the database lost steps it had committed (a power loss on a disk that did not
    keep its flushes, a restore from an older copy), and serving it from there would log its
    rounds again and answer its sites from an older state than their receipts.

    The log's tip is read first, then the database in a transaction of its own: a step
    commits in the database before its entries are appended, so a server already serving the
    job (this one is refused by the lease next) only moves the second read further ahead."""
    tip = audit.tip(job_id)[0]
    with db.session() as sess:
        queued = sess.scalar(select(func.max(AuditMarkRow.seq))
                             .where(AuditMarkRow.job_id == job_id))
    if queued is None or tip <= queued:  # None: no step marked (a database made before)
        return
    shown = shown_url(to_url(url)) if url else "?"
    raise ConfigError(
        f"job {job_id!r}: the audit log at {shown} holds its entries up to seq {tip}, but "
        f"the server database knows only those up to seq {queued}: the database lost steps "
        "it had saved (a power loss, or a restore from an older copy), and serving the job "
        "from there would log its rounds again. Restore the server database that belongs "
        "to this audit log, or cancel the job (`fedforest server cancel-job --config "
        f"<server.toml> --job {job_id}`) and start the server again")


def flush_waiting_entries(db: Database, audit: AuditSink, url: str | None) -> None:
    """Append the entries of steps that committed before a server (or a create-job, a
    cancel-job) stopped and that the log lacks, before anything is served: called once this
    server holds the database's lease (a second server, refused, writes nothing)."""
    try:
        audit.flush_all(db.engine)
    except AuditPending as exc:  # the log's database failed: the entries keep waiting
        raise ConfigError(f"{exc}. Check that the audit database answers, then start the "
                          "server again") from None
    except AuditError as exc:  # another log's chain: the entries would split it
        shown = shown_url(to_url(url)) if url else "?"
        raise ConfigError(f"the audit log at {shown} cannot take the entries the server "
                          f"database holds for it: {exc}. Start the server with the "
                          "audit_database its jobs began with") from None


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
