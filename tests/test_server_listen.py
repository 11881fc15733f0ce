"""The socket a server listens on is bound before it logs its start-up: a port that is taken,
or an address that is not this machine's, is a configuration error that says which."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest
from ports import free_port

from server_app.serve import _listen
from server_app.settings import ConfigError


def test_a_taken_port_is_an_error_that_names_it_and_suggests_another() -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1 port {port}: "
                           "Address already in use .*--port"):
            _listen("127.0.0.1", port)


@pytest.mark.parametrize(("code", "says"), [
    (errno.EADDRNOTAVAIL, "Cannot assign requested address .host must be an address of this "
                          "machine"),
    (errno.EACCES, "Permission denied .ports below 1024 need privileges"),
])
def test_a_bind_the_system_refuses_says_why(monkeypatch: pytest.MonkeyPatch, code: int,
                                            says: str) -> None:
    """An address of another machine, or a privileged port: the message says which."""
    def refuse(_self: socket.socket, _address: object) -> None:
        raise OSError(code, os.strerror(code))

    port = free_port()
    monkeypatch.setattr(socket.socket, "bind", refuse)
    with pytest.raises(ConfigError, match=says):
        _listen("127.0.0.1", port)


def test_a_free_port_gives_a_bound_socket() -> None:
    port = free_port()
    sock = _listen("127.0.0.1", port)
    try:
        assert sock.getsockname() == ("127.0.0.1", port)
    finally:
        sock.close()


def test_of_two_servers_binding_one_port_the_later_listen_fails() -> None:
    """Two servers starting at once both bind (SO_REUSEADDR): the one that listens first keeps
    the port, and the other's listen fails (in _listen: a configuration error naming the
    port) instead of it serving nothing."""
    port = free_port()
    first = socket.socket()  # another server between its bind and its listen
    first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    first.bind(("127.0.0.1", port))
    try:
        second = _listen("127.0.0.1", port)  # binds too, and listens first
        try:
            with pytest.raises(OSError):
                first.listen()
        finally:
            second.close()
    finally:
        first.close()


def test_a_name_listens_on_its_ipv4_address() -> None:
    sock = _listen("localhost", free_port())
    try:
        assert sock.family == socket.AF_INET and sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


def test_the_server_keeps_an_idle_connection_open_longer_than_a_client_pool_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client reuses a pooled connection up to KEEPALIVE_S after its last answer; the server
    (uvicorn's keep-alive timeout) keeps it open longer, so a reused connection is never one
    the server is closing at that moment (the request would meet the close)."""
    import uvicorn

    from client_app.transport import KEEPALIVE_S, Transport
    from server_app.serve import run_server
    from server_app.settings import ServerSettings

    seen: list[uvicorn.Config] = []
    monkeypatch.setattr(uvicorn.Server, "run",
                        lambda self, sockets=None: seen.append(self.config))
    run_server(ServerSettings(host="127.0.0.1", database=f"sqlite:///{tmp_path / 's.db'}"),
               insecure_dev=True, port=free_port())
    assert seen and seen[0].timeout_keep_alive >= 2 * KEEPALIVE_S
    tr = Transport("http://127.0.0.1:9", "t", None, insecure_dev=True)
    try:
        assert tr._http._transport._pool._keepalive_expiry == KEEPALIVE_S  # type: ignore
    finally:
        tr.close()
