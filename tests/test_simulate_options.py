"""``fedforest simulate`` refuses bad options before it creates anything, and never deletes a
directory it did not write."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedforest_cli.cli import app
from fedforest_cli.sim_data import SimulateOptions
from fedforest_cli.simulate import RUN_MARKER, _clear_earlier_run, run_simulation
from fedforest_secure.errors import FedForestError


@pytest.mark.parametrize(("change", "message"), [
    ({"dataset": "no-such-data"}, "unknown dataset 'no-such-data'"),
    ({"dataset": "synthetic-0"}, "synthetic-<rows> needs at least"),
    ({"clients": 0}, "--clients must be at least 1"),
    ({"trees": 0}, "--trees must be at least 1"),
    ({"depth": 0}, "--depth must be at least 1"),
    ({"bins": 1}, "--bins must be at least 2"),
    ({"max_rows": 0}, "--max-rows must be at least"),
    ({"alpha": 0.0}, "--alpha must be a positive number"),
    ({"alpha": float("nan")}, "--alpha must be a positive number"),
    ({"round_deadline": -1.0}, "--round-deadline must be a positive number"),
])
def test_bad_options_are_refused_before_anything_is_created(tmp_path: Path,
                                                            change: dict[str, object],
                                                            message: str) -> None:
    out = tmp_path / "run"
    opts = SimulateOptions(out=out, **change)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("<", "<")):
        run_simulation(opts)
    assert not out.exists()


def test_a_directory_simulate_did_not_write_is_not_deleted(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    precious = out / "thesis.tex"
    precious.write_text("years of work")
    with pytest.raises(FedForestError, match="not the output of an earlier"):
        run_simulation(SimulateOptions(out=out))
    assert precious.read_text() == "years of work"


def test_the_command_prints_a_bad_dataset_as_an_error_without_a_traceback(
        tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["simulate", "--dataset", "no-such-data", "--out",
                                   str(tmp_path / "run")])
    assert res.exit_code == 2
    assert "unknown dataset 'no-such-data'" in res.output.replace("\n", "")
    assert "Traceback" not in res.output
    assert not (tmp_path / "run").exists()


def test_the_output_of_an_earlier_simulation_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "certs").mkdir(parents=True)
    (out / RUN_MARKER).write_text("")
    (out / "model.json").write_text("{}")
    _clear_earlier_run(out)
    assert not out.exists()


def test_a_deployment_directory_without_the_marker_is_not_deleted(tmp_path: Path) -> None:
    out = tmp_path / "deployment"
    (out / "certs").mkdir(parents=True)
    for part in ("server.toml", "job.toml", "certs/ca.pem", "certs/ca.key", "server.db"):
        (out / part).write_text("real")
    with pytest.raises(FedForestError, match="not the output of an earlier"):
        _clear_earlier_run(out)
    assert (out / "certs" / "ca.key").read_text() == "real"


def test_a_file_given_as_the_output_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    with pytest.raises(FedForestError, match="is a file"):
        _clear_earlier_run(path)
    assert path.read_text() == "mine"


def test_a_server_that_exits_during_training_ends_the_simulation_at_once(
        tmp_path: Path) -> None:
    """Its clients would wait out their retry budget (two minutes) for a server that is gone:
    the simulation stops as soon as the server process has exited, naming its exit code."""
    import subprocess
    import sys
    import time

    from fedforest_cli.simulate import _watch
    from server_app.db import Database

    Database(f"sqlite:///{tmp_path / 'server.db'}").dispose()
    client = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    server = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    try:
        start = time.monotonic()
        with pytest.raises(FedForestError, match="the server exited with code 3 during "
                                                 "training"):
            _watch(tmp_path / "server.db", "job", 3, [client], server)
        assert time.monotonic() - start < 20
        assert client.poll() is None  # simulate's own cleanup stops the clients
    finally:
        client.kill()
        client.wait()


def test_a_dataset_whose_files_are_missing_stops_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared data directory is not where it is looked for: the simulation says so before
    it writes certificates or a server configuration."""
    from fedforest_secure.experiments.loaders import DATA_DIR_ENV

    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "no-data-here"))
    out = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="shared data directory not found"):
        run_simulation(SimulateOptions(out=out, dataset="heart"))
    assert not out.exists()
