"""The server processes of ``fedforest simulate``, the integration tests and the benchmarks."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from ports import free_port

from fedforest_cli.sim_processes import one_site_server
from fedforest_secure.errors import FedForestError


@pytest.mark.integration
def test_a_server_that_cannot_start_is_reported_with_the_end_of_its_log(tmp_path: Path) -> None:
    """The port is taken: the server exits at start-up, and the error carries the reason from
    its log (which lives in a directory the caller may delete)."""
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(FedForestError) as err:
            with one_site_server(tmp_path, port, timeout=60.0):
                pytest.fail("the server started on a port that is taken")
    assert "the server exited with code" in str(err.value)
    assert f"cannot listen on 127.0.0.1 port {port}: Address already in use" in str(err.value)
    log = (tmp_path / "server.log").read_text()
    assert "event=startup" not in log  # it never served
    assert "Traceback" not in log
