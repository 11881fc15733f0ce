"""The benchmark scripts' command lines: options out of range are usage errors that say the
valid values before anything runs, a failing child process is named with what it said, and
tables printed to a file keep every column readable."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from rich.table import Table

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _script(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module (its folder on ``sys.path``, as when it
    runs, for its ``_cli`` and ``_common`` imports)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _usage_error(capsys: pytest.CaptureFixture[str], main: object, argv: list[str]) -> str:
    """The message of the usage error (exit 2) ``main(argv)`` stops with."""
    assert callable(main)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    return err


# ------------------------------------------------------------------------------ --repeat
@pytest.mark.parametrize("name", ["secagg", "speed", "predict", "read_csv"])
def test_repeat_zero_is_a_usage_error(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, _script(name).main, ["--repeat", "0"])
    assert "--repeat" in err and "0: at least 1" in err


# ------------------------------------------------------------------------------ startup.py
def test_startup_runs_zero_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, _script("startup").main, ["--runs", "0"])
    assert "--runs" in err and "0: at least 1" in err


def test_startup_names_a_base_that_is_not_a_commit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        _script("startup").main(["--base", "no-such-branch", "--runs", "1"])
    assert stop.value.code == (f"error: --base no-such-branch: not a commit of the repository "
                               f"in {BENCH.parent}")


def test_startup_runs_write_bytecode_where_the_environment_says_not_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The untimed run compiles each version once: a timed run that compiled the modules
    again would count that against it."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = _script("startup").env_for(tmp_path)
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPATH"] == str(tmp_path)


# ------------------------------------------------------------------------------ speed.py
def test_speed_reads_the_jobs_suffix_from_the_right() -> None:
    speed = _script("speed")
    assert speed._split("secure-plain-2") == ("secure-plain", 2)
    assert speed._split("secure-plain") == ("secure-plain", 1)
    assert speed._split("open-2") == ("open", 2)
    assert speed._split("sklearn") == ("sklearn", 1)


def test_speed_refuses_an_unknown_contender_before_running_any(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, _script("speed").main,
                       ["--sizes", "1000", "--contenders", "open", "sklern", "--trees", "1"])
    assert "--contenders: unknown contender 'sklern'" in err
    assert "sklearn" in err and "secure-plain" in err and "-numpy" in err
    assert capsys.readouterr().out == ""  # nothing measured, not even the header


@pytest.mark.parametrize("name", ["open-numpy-2", "secure-plain-2", "sklearn-3", "secure"])
def test_speed_accepts_the_documented_contender_names(name: str) -> None:
    assert _script("speed")._contender(name) == name


def test_speed_says_what_a_failing_child_printed() -> None:
    with pytest.raises(SystemExit) as stop:  # a name the parent would refuse: the child fails
        _script("speed")._measure("nosuch", 100, 1, 2, False)
    message = str(stop.value.code)
    assert "contender nosuch" in message and "KeyError: 'nosuch'" in message


def test_speed_counts_the_fits_own_memory_and_names_the_package_it_measured() -> None:
    """The process's peak RSS holds the interpreter and its imports (about 150 MiB): the fit's
    own memory is its peak less the RSS just before it. The package measured is the one the
    child imported, which the environment decides, not the script's checkout."""
    import fedforest_secure

    speed = _script("speed")
    tree = speed._measure("sklearn", 500, 2, 3, False)
    assert tree["package"] is None  # scikit-learn's child never imports FedForest
    assert 0 <= tree["fit_mib"] < tree["peak_mib"] / 2
    forest = speed._measure("open", 500, 2, 3, True)
    assert forest["package"] == os.path.dirname(os.path.abspath(fedforest_secure.__file__))
    assert 0 <= forest["fit_mib"] < forest["peak_mib"] / 2


# ------------------------------------------------------------------------------ transport.py
@pytest.mark.parametrize(("argv", "said"), [
    (["--trees", "0"], "argument --trees: 0: at least 1"),
    (["--dataset", "nope"], "unknown dataset 'nope'"),
    (["--clients", "2"], "--clients 2: profile 'secure' uses secure aggregation"),
])
def test_transport_refuses_bad_options_with_a_usage_error(
        argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, _script("transport").main, [*argv, "--out", str(tmp_path / "x")])
    assert said in err


@pytest.mark.integration
def test_transport_times_the_same_forest_and_counts_bytes_to_the_jobs_end(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The HTTPS run and the in-process run (its workers built before its timing, as each
    HTTPS client builds its own before it joins) grow the same forest; a client's received
    bytes stop at the job's end, before the model's download."""
    out, numbers = tmp_path / "run", tmp_path / "numbers.json"
    _script("transport").main(["--dataset", "wine", "--clients", "3", "--trees", "2",
                               "--depth", "2", "--out", str(out), "--json", str(numbers)])
    got = json.loads(numbers.read_text())
    assert got["same_model"] is True and got["in_process_s"] > 0
    stats = [json.loads(p.read_text()) for p in (out / "clients").glob("*/stats-*.json")
             if "-eval" not in p.name]
    assert len(stats) == 3
    model = (out / "model.json").stat().st_size
    assert got["received_bytes_per_client"] == max(s["bytes_received_training"] for s in stats)
    assert all(s["bytes_received"] - s["bytes_received_training"] >= model for s in stats)
    capsys.readouterr()


# ------------------------------------------------------------------------------ paper.py
def test_paper_refuses_secure_x_without_the_secure_profile(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, _script("paper").main,
                       ["heart", "--reps", "1", "--methods", "cent_x,secure_x"])
    assert "--methods secure_x needs --profiles secure" in err


def test_paper_refuses_open_methods_without_the_open_profile(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, _script("paper").main,
                       ["heart", "--profiles", "secure", "--methods", "quant_x,avg_xh"])
    assert "--methods quant_x, avg_xh needs --profiles open" in err


def test_paper_names_unknown_methods(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, _script("paper").main, ["heart", "--methods", "quant"])
    assert "unknown --methods ['quant']" in err and "quant_x" in err


# ------------------------------------------------------------------------------ scale.py
def test_scale_protocol_needs_a_counted_round(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    err = _usage_error(capsys, _script("scale").main,
                       ["protocol", "--rounds", "1", "--out", str(tmp_path / "out")])
    assert "--rounds" in err and "1: at least 2 (the first round is not counted)" in err
    assert not (tmp_path / "out").exists()


def test_scale_protocol_needs_three_clients(capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    err = _usage_error(capsys, _script("scale").main,
                       ["protocol", "--clients", "10", "2", "--out", str(tmp_path / "out")])
    assert "--clients 2: at least 3" in err
    assert not (tmp_path / "out").exists()


def test_scale_gives_a_client_group_its_sites_tokens_in_a_file_only_its_user_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The group file holds each site's token: it is readable by the user only (0600), whatever
    the umask lets other files be."""
    import stat
    from types import SimpleNamespace

    scale = _script("scale")
    started: list[list[str]] = []
    monkeypatch.setattr(subprocess, "Popen", lambda args, **_kw: started.append(args))
    site = SimpleNamespace(name="site-0", token="t0k3n", csv=tmp_path / "s.csv",
                           schema=tmp_path / "schema.toml")
    old = os.umask(0o022)
    try:
        scale._start_client_group([site], "https://127.0.0.1:1", "job", tmp_path, "secure", 3)
    finally:
        os.umask(old)
    group = tmp_path / "group-site-0.json"
    assert started and started[0][-1] == str(group)
    assert stat.S_IMODE(group.stat().st_mode) == 0o600
    assert json.loads(group.read_text())[0]["token"] == "t0k3n"


# ------------------------------------------------------------------------------ tables
def test_a_table_printed_to_a_file_keeps_its_headers_whole() -> None:
    table = Table(title="transport benchmark")
    headers = ("HTTPS training s", "training CPU s: server + clients / in-proc",
               "max aggregation rounds per level", "requests per client", "same model")
    for col in headers:
        table.add_column(col, justify="right")
    table.add_row("12.3", "10.0 + 20.0 / 5.0", "3", "300", "True")
    out = io.StringIO()
    _script("_cli").print_table(table, out)
    text = out.getvalue()
    assert "…" not in text
    assert all(col in text for col in headers) and "10.0 + 20.0 / 5.0" in text


# ------------------------------------------------------------------ evaluation_walkthrough.py
Started = list[subprocess.Popen[bytes]]


@pytest.fixture
def started() -> Iterator[Started]:
    """The processes a test starts, killed at its end if they still run."""
    procs: Started = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _proc(tmp_path: Path, started: Started, name: str, code: str
          ) -> tuple[str, subprocess.Popen[bytes], Path]:
    """A stand-in client ``name`` running ``code``, its output in ``<name>.log``."""
    log = tmp_path / f"{name}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=fh,
                                stderr=subprocess.STDOUT)
    started.append(proc)
    return name, proc, log


def test_the_walkthrough_stops_the_clients_when_one_fails(tmp_path: Path, started: Started) -> None:
    walk = _script("evaluation_walkthrough")
    ok = _proc(tmp_path, started, "train-secure.site-0", "print('done')")
    bad = _proc(tmp_path, started, "train-dp.site-0", "import sys, time; time.sleep(0.5); "
                "print('error: another client process is using --state-dir'); sys.exit(2)")
    stuck = _proc(tmp_path, started, "train-dp.site-1",
                  "import time; print('joined'); time.sleep(60)")
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as stop:
        walk._wait_all([ok, bad, stuck], timeout=60, what="training")
    assert time.monotonic() - t0 < 20
    message = str(stop.value.code)
    assert "training failed: train-dp.site-0 exited with 2" in message
    assert "error: another client process is using --state-dir" in message
    assert "stopped the others still running: train-dp.site-1" in message
    assert stuck[1].poll() is not None  # killed, not left behind


def test_the_walkthrough_gives_up_after_its_timeout(tmp_path: Path, started: Started) -> None:
    walk = _script("evaluation_walkthrough")
    stuck = _proc(tmp_path, started, "eval.site-3", "import time; print('waiting for round 2', "
                  "flush=True); time.sleep(60)")
    with pytest.raises(SystemExit) as stop:
        walk._wait_all([stuck], timeout=1.0, what="evaluation")
    message = str(stop.value.code)
    assert "evaluation did not end within 1 s (--timeout)" in message
    assert "eval.site-3" in message and "waiting for round 2" in message
    assert stuck[1].poll() is not None


def test_the_walkthrough_stops_when_the_server_exits(tmp_path: Path, started: Started) -> None:
    walk = _script("evaluation_walkthrough")
    server = _proc(tmp_path, started, "server", "import sys; print('address in use'); sys.exit(1)")
    client = _proc(tmp_path, started, "train-secure.site-0", "import time; time.sleep(60)")
    with pytest.raises(SystemExit) as stop:
        walk._wait_all([client], timeout=60, what="training", server=server)
    message = str(stop.value.code)
    assert "training failed: the server exited with 1" in message
    assert "address in use" in message
    assert client[1].poll() is not None


def test_the_walkthrough_waits_for_clients_that_succeed(tmp_path: Path, started: Started) -> None:
    walk = _script("evaluation_walkthrough")
    procs = [_proc(tmp_path, started, f"eval.site-{k}", "import time; time.sleep(0.3)")
             for k in range(3)]
    walk._wait_all(procs, timeout=30, what="evaluation")
    assert [p.returncode for _, p, _ in procs] == [0, 0, 0]


def test_the_walkthrough_says_missing_data_before_writing(tmp_path: Path) -> None:
    from fedforest_cli.sim_processes import child_env

    out = tmp_path / "walk"
    env = dict(child_env(), FEDFOREST_DATA_DIR=str(tmp_path / "no-data"))
    done = subprocess.run([sys.executable, str(BENCH / "evaluation_walkthrough.py"), "--out",
                           str(out), "--dataset", "banknote"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode != 0
    assert "error: --dataset: shared data directory not found" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_the_colluders_table_is_the_one_the_docs_quote(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """docs/privacy.md and threat_model.md §6 quote this table (epsilon 1 at dp.colluders = 0
    against c colluders); colluders at the single-vector bound (4 of 10) or more is a usage
    error naming the largest allowed."""
    bench = _script("dp_colluders")
    bench.main([])
    out = capsys.readouterr().out
    for row in ("| 3 | 3 | 3 | 1 | 1.24 |", "| 5 | 4 | 4 | 2 | 1.45 |",
                "| 10 | 7 | 7 | 1 | 1.09 |", "| 10 | 7 | 7 | 2 | 1.20 |",
                "| 10 | 7 | 7 | 3 | 1.35 |", "| 30 | 21 | 21 | 11 | 1.49 |"):
        assert row in out
    for c in (4, 7):
        with pytest.raises(SystemExit) as err:
            bench.main(["--colluders", str(c), "--sites", "10"])
        assert err.value.code == 2
        assert (f"dp.colluders = {c} is not below min(2t - n, t - 1) = 4 for this job's n = 10 "
                "sites at threshold t = 7") in capsys.readouterr().err


def test_colluders_the_default_sites_do_not_all_allow_are_a_usage_error_naming_sites(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--colluders 2 with the default sites 3,5,10,30 (3 sites allow 1): a usage error before
    any of the table, naming --sites, the given numbers of sites that allow 2 and the fewest
    sites that do; with those sites the table prints."""
    bench = _script("dp_colluders")
    with pytest.raises(SystemExit) as err:
        bench.main(["--colluders", "2"])
    assert err.value.code == 2
    out, errs = capsys.readouterr()
    assert out == ""
    assert "error: --sites: dp.colluders = 2 is not below min(2t - n, t - 1) = 2 for this " \
        "job's n = 3 sites at threshold t = 3" in errs
    assert errs.rstrip().endswith(
        "Pass --sites with numbers of sites that allow 2 colluders: of yours, --sites 5,10,30 "
        "(the fewest that allow 2: 5)")
    bench.main(["--colluders", "2", "--sites", "5,10,30"])
    out = capsys.readouterr().out
    assert out.startswith("secure-dp, epsilon = 1, dp.colluders = 2\n")
    assert "| 5 | 4 | 4 | 2 |" in out and "| 30 | 21 | 21 | 11 |" in out
