"""``fedforest simulate`` refuses bad options before it creates anything, and never deletes a
directory it did not write."""

from __future__ import annotations

import io
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
    ({"seed": -1}, "--seed must be an integer from 0 to 4294967295, got -1"),
    ({"seed": 2**32}, "--seed must be an integer from 0 to 4294967295, got 4294967296"),
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


#: a profile file with secure aggregation, whose name says nothing of it
SECURE_FILE = """name = "ours"
description = "our federation's profile"
secure_aggregation = true
fixed_point = true
frac_bits = 24
threshold = 0.67
sketch = "secure_cdf"
rows_per_sketch_point = 2
abstain_below = 0
h_splits = "off"
min_clients = 3
"""

#: a profile file in the clear, whose name starts with "secure"
OPEN_FILE = """name = "secure-looking"
description = "plaintext statistics"
secure_aggregation = false
fixed_point = false
frac_bits = 24
threshold = 1.0
sketch = "quantiles"
rows_per_sketch_point = 1
abstain_below = 0
h_splits = "clear"
min_clients = 1
"""

TINY = {"trees": 2, "depth": 2, "clients": 3, "max_rows": 200}


@pytest.mark.parametrize(("change", "message"), [
    ({"profile": "nosuch"}, "--profile nosuch: unknown profile 'nosuch'"),
    ({"profile": "missing.toml"}, "--profile missing.toml: cannot read profile file"),
    ({"depth": 100}, "--depth must be at most 60, got 100"),
    ({"bins": 5000}, "--bins must be at most 4096, got 5000"),
    ({"trees": 20000}, "--trees must be at most 10000, got 20000"),
    ({"clients": 1001}, "--clients must be at most 1000, got 1001"),
    ({"round_deadline": 1e9}, "--round-deadline must be at most 604800"),
    ({"clients": 2, "profile": "secure"},
     "--clients 2: profile 'secure' uses secure aggregation, which needs at least 3 sites"),
    ({"clients": 60}, "--clients 60: breast_cancer's 160 training rows .--max-rows 200. cannot "
                      "give 60 sites at least 10 rows each; use at most --clients 16 or a "
                      "larger --max-rows"),
    ({"clients": 1, "profile": "open", "max_rows": 10},  # no fewer clients to advise
     "--clients 1: breast_cancer's 8 training rows .--max-rows 10. cannot give 1 site at least "
     "10 rows each; use a larger --max-rows$"),
])
def test_options_beyond_the_job_file_limits_are_refused_naming_the_option(
        tmp_path: Path, change: dict[str, object], message: str) -> None:
    out = tmp_path / "run"
    opts = SimulateOptions(out=out, **{**TINY, **change})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        run_simulation(opts)
    assert not out.exists()


def test_a_profile_file_without_secure_aggregation_is_refused_under_its_min_clients(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("few.toml").write_text(OPEN_FILE.replace("min_clients = 1", "min_clients = 4"))
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="--clients 3: profile 'secure-looking' refuses sums "
                                         "over fewer than 4 sites"):
        run_simulation(SimulateOptions(out=out, profile="few.toml", **TINY))  # type: ignore[arg-type]
    assert not out.exists()


def test_a_secure_profile_file_with_two_clients_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("ours.toml").write_text(SECURE_FILE)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="--clients 2: profile 'ours' uses secure aggregation"):
        run_simulation(SimulateOptions(out=out, profile="ours.toml",
                                       **{**TINY, "clients": 2}))  # type: ignore[arg-type]
    assert not out.exists()


def test_the_command_names_the_option_over_its_limit_and_writes_nothing(
        tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["simulate", "--depth", "100", "--out",
                                   str(tmp_path / "run")])
    assert res.exit_code == 2
    assert "--depth must be at most 60, got 100" in res.output
    assert "job.toml" not in res.output
    assert not (tmp_path / "run").exists()


def test_a_profile_path_is_resolved_against_the_current_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "ours.toml").write_text(SECURE_FILE)
    assert SimulateOptions(profile="conf/ours.toml").profile_ref() == \
        str(tmp_path / "conf" / "ours.toml")
    for name in ("open", "secure", "secure-dp"):
        assert SimulateOptions(profile=name).profile_ref() == name


def test_the_job_file_names_a_relative_profile_by_its_absolute_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """job.toml lies in --out, and a relative path in it is read relative to --out: simulate
    writes the path the user meant, resolved against the current directory."""
    import tomllib

    from fedforest_cli.sim_data import job_document

    monkeypatch.chdir(tmp_path)
    Path("ours.toml").write_text(SECURE_FILE)
    opts = SimulateOptions(profile="ours.toml", **TINY)  # type: ignore[arg-type]
    doc = job_document(opts, "sim-x", ["a", "b", "c"])
    assert doc["profile"] == str(tmp_path / "ours.toml")
    assert tomllib.loads(__import__("tomli_w").dumps(doc))["profile"] == doc["profile"]


@pytest.mark.parametrize(("file", "text", "sees"), [
    ("ours.toml", SECURE_FILE, "the server sees only masked vectors"),
    ("secure-looking.toml", OPEN_FILE, "the server sees each site's statistics"),
])
def test_the_result_table_says_what_the_server_saw_from_the_loaded_profile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file: str, text: str,
        sees: str) -> None:
    """Not from the profile's name: a file named anything may or may not use secure
    aggregation."""
    from types import SimpleNamespace

    from rich.console import Console

    from fedforest_cli import simulate

    console = Console(width=400, record=True, file=io.StringIO())
    monkeypatch.setattr(simulate, "console", console)
    monkeypatch.chdir(tmp_path)
    Path(file).write_text(text)
    opts = SimulateOptions(profile=file, clients=3)
    scores = {"metric": "accuracy", "fedforest": 0.9, "centralized": 0.9, "local": 0.8}
    simulate._print_table(scores, SimpleNamespace(y_test=[0, 1]), opts, 1.0, 3, "3 sites")
    assert sees in console.export_text()


def test_signals_wait_while_the_simulations_processes_are_stopped() -> None:
    """A SIGTERM (or a second Ctrl-C) that arrives while simulate stops its clients and server
    does not cut the stopping short; the handlers are back afterwards."""
    import os
    import signal

    from fedforest_cli.simulate import uninterrupted

    def cut_short(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, cut_short)
    try:
        stopped = []
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
            stopped.append("server")
        assert stopped == ["server"]
        assert signal.getsignal(signal.SIGTERM) is cut_short
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_result_table_says_which_sites_the_model_was_trained_over(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A site dropped on the way: not "their sum over the 5 sites", "5 sites, 9 rounds"."""
    from types import SimpleNamespace

    from rich.console import Console

    from fedforest_cli import simulate

    console = Console(width=400, record=True, file=io.StringIO())
    monkeypatch.setattr(simulate, "console", console)
    opts = SimulateOptions(clients=5)
    scores = {"metric": "accuracy", "fedforest": 0.9, "centralized": 0.9, "local": 0.8}
    over = "5 sites, 4 of them to the end (client-2 dropped at round 4)"
    simulate._print_table(scores, SimpleNamespace(y_test=[0, 1]), opts, 1.0, 9, over)
    text = console.export_text()
    assert f"their sum over the {over}" in text, text
    assert f"B=16 bins, {over}, 9 aggregation rounds" in text, text


def test_the_command_exits_non_zero_and_names_a_client_that_did_not_end_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job finished without client-2 (killed, dropped at round 4): the simulation's last
    line names it and says over how many sites the model was trained, and it exits 3."""
    from fedforest_cli import simulate
    from fedforest_cli.sim_processes import ClientEnd

    def fake_run(opts: SimulateOptions) -> dict[str, object]:
        return {"failed_clients": [ClientEnd("client-2", -9, 4, dropped=True)],
                "trained_over": "5 sites, 4 of them to the end (client-2 dropped at round 4)"}

    monkeypatch.setattr(simulate, "run_simulation", fake_run)
    res = CliRunner().invoke(app, ["simulate", "--clients", "5", "--out", str(tmp_path / "run")],
                             env={"COLUMNS": "1000"})
    assert res.exit_code == 3, res.output
    assert res.output.strip().splitlines()[-1] == (
        "error: 1 of 5 client processes did not end done (client-2): the model was trained "
        "over 5 sites, 4 of them to the end (client-2 dropped at round 4)")


@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_a_seed_out_of_range_is_refused_naming_the_option(tmp_path: Path, seed: str) -> None:
    """simulate and cross-validate refuse a --seed scikit-learn's forests cannot take,
    before anything runs, naming the option as for the command's other options."""
    for args in (["simulate", "--out", str(tmp_path / "run")],
                 ["cross-validate", "--param", "max_depth", "--values", "2"]):
        res = CliRunner().invoke(app, [*args, "--dataset", "wine", "--seed", seed])
        assert res.exit_code == 2, res.output
        assert "Invalid value for '--seed'" in res.output
    assert not (tmp_path / "run").exists()


def test_a_profile_file_inside_the_earlier_run_it_replaces_is_refused_and_kept(
        tmp_path: Path) -> None:
    """The run replaces an earlier run's --out: a --profile file there would be deleted
    before the clients read it. It is refused before anything is removed."""
    from fedforest_secure.privacy import available_profiles

    assert "secure" in available_profiles()
    out = tmp_path / "run"
    out.mkdir()
    (out / RUN_MARKER).write_text("")
    (out / "model.json").write_text("{}")
    profile = out / "mine.toml"
    shipped = Path(__file__).parents[1] / "fedforest_secure" / "privacy" / "profiles"
    profile.write_text((shipped / "secure.toml").read_text())
    with pytest.raises(FedForestError) as exc:
        run_simulation(SimulateOptions(dataset="wine", clients=3, trees=2, depth=2, out=out,
                                       profile=str(profile)))
    assert str(exc.value) == (
        f"--profile {profile} lies in --out {out}, the directory of an earlier `fedforest "
        "simulate` that this run replaces (with the file): move the file out of it, or choose "
        "another --out")
    assert sorted(p.name for p in out.iterdir()) == [RUN_MARKER, "mine.toml", "model.json"]
    res = CliRunner().invoke(app, ["simulate", "--dataset", "wine", "--clients", "3",
                                   "--out", str(out), "--profile", str(profile)])
    assert res.exit_code == 2 and "lies in --out" in res.output and profile.exists()


def test_a_profile_file_named_like_a_shipped_one_is_told_to_rename_it_in_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """simulate writes the job file itself: the fix is the profile file's name."""
    monkeypatch.chdir(tmp_path)
    from fedforest_secure.privacy import load_profile

    text = load_profile("secure-dp").to_toml().replace("epsilon = 1.0", "epsilon = 2.0")
    Path("eps2.toml").write_text(text)
    out = tmp_path / "run"
    with pytest.raises(ValueError) as err:
        run_simulation(SimulateOptions(out=out, profile="eps2.toml",
                                       **TINY))  # type: ignore[arg-type]
    said = str(err.value)
    assert said.startswith(f'the profile file {tmp_path / "eps2.toml"} names itself '
                           '"secure-dp", a shipped profile\'s name, but its settings differ '
                           "from that profile's: epsilon = 2.0 ('secure-dp': 1.0).")
    assert said.endswith(f'give it a name of its own: name = "..." in {tmp_path / "eps2.toml"}')
    assert "[privacy]" not in said
    assert not out.exists()
