"""tests/ports.py: the ports the tests' servers take."""

from __future__ import annotations

import socket

import pytest
from ports import free_port


def test_a_worker_takes_ports_from_its_share_only_and_never_one_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all((p // 2) % 3 == 1 for p in ports)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    assert all((free_port() // 2) % 3 == 2 for _ in range(50))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a server can listen there
        s.bind(("127.0.0.1", ports[-1]))
        s.listen()
