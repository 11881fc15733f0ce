"""Every ``fedforest`` command stops on SIGTERM and SIGHUP as on Ctrl-C: what it was writing is
rolled back (``pki issue --renew`` puts the old pairs back, no ``.part`` file stays) and it
ends with one line and 128 + the signal's number. ``simulate`` stops every process it started,
whenever the signal lands; a registration whose token was lost says how to get a new one;
``Schema.dump`` writes a file whole or not at all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from fedforest_cli import interrupts
from fedforest_cli.cli import app
from fedforest_cli.sim_processes import child_env
from fedforest_secure import schema_draft

STOPPED = "the command stopped before it finished; a file it was writing is left as it was"

#: runs ``fedforest ARGS`` in this process, which sends itself signal SIG right after the
#: second ``Path.rename`` (the renewal has moved an old pair aside)
DRIVER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    sig = int(sys.argv[1])
    real, done = Path.rename, []
    def rename(self, target):
        out = real(self, target)
        done.append(target)
        if len(done) == 2:
            os.kill(os.getpid(), sig)
        return out
    Path.rename = rename
    sys.argv = ["fedforest", *sys.argv[2:]]
    from fedforest_cli.__main__ import main
    main()
""")


@pytest.mark.parametrize(("sig", "code", "how"), [(signal.SIGTERM, 143, "terminated"),
                                                  (signal.SIGHUP, 129, "hung up"),
                                                  (signal.SIGINT, 130, "interrupted")])
def test_a_pki_renewal_stopped_by_a_signal_puts_the_old_pairs_back_and_says_so(
        tmp_path: Path, sig: int, code: int, how: str) -> None:
    from fedforest_secure.pki import init_dev_pki

    certs = tmp_path / "certs"
    names = [f"s{k}" for k in range(4)]
    init_dev_pki(certs, len(names), client_names=names)
    before = {p.name: p.read_bytes() for p in certs.iterdir()}
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    args = ["pki", "issue", "--ca-dir", str(certs), "--renew",
            *[a for n in names for a in ("--name", n)]]
    res = subprocess.run([sys.executable, str(driver), str(int(sig)), *args], cwd=tmp_path,
                         env={**child_env(), "COLUMNS": "80"}, capture_output=True, text=True,
                         timeout=120, check=False)
    assert (res.returncode, res.stderr.splitlines()) == (code, [f"{how}: {STOPPED}"]), res
    assert res.stdout == ""
    assert {p.name: p.read_bytes() for p in certs.iterdir()} == before  # no .part, no .replaced


def test_every_command_stops_on_sigterm_and_sighup_and_gets_its_handlers_back(
        tmp_path: Path) -> None:
    """In-process (the tests' CliRunner): the handlers found are back once the command ends."""
    seen: dict[str, Any] = {}

    def drafted(*_args: object, **_kw: object) -> None:
        seen.update(term=signal.getsignal(signal.SIGTERM), hup=signal.getsignal(signal.SIGHUP))
        raise interrupts.Terminated(signal.SIGTERM)

    hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    term = signal.getsignal(signal.SIGTERM)
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(schema_draft, "draft_schema", drafted)  # what `schema draft` calls
        data = tmp_path / "d.csv"
        data.write_text("a,y\n1,0\n2,1\n")
        res = CliRunner().invoke(app, ["schema", "draft", "--data", str(data), "--target", "y",
                                       "--out", str(tmp_path / "s.toml")],
                                 env={"COLUMNS": "1000"})
        assert signal.getsignal(signal.SIGTERM) is term
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL
    finally:
        mp.undo()
        signal.signal(signal.SIGHUP, hup)
    assert seen == {"term": interrupts.terminated, "hup": interrupts.terminated}
    assert (res.exit_code, res.output.strip()) == (143, f"terminated: {STOPPED}")


# ---------------------------------------------------------------------- simulate
class Sleepers:
    """Every process the code under test starts is a sleeper instead; while the ``stop_at``-th
    starts, this process receives a SIGTERM (its handler ``interrupts.terminated``): the
    signal lands inside ``Popen``, the child exists and ``Popen`` has not returned."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []
        self.stop_at = 1
        self.real = subprocess.Popen

    def popen(self, *_args: object, **_kw: object) -> subprocess.Popen[bytes]:
        proc = self.real([sys.executable, "-c", "import time; time.sleep(120)"])
        self.started.append(proc)
        if len(self.started) == self.stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return proc


@pytest.fixture()
def sleepers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sleepers]:
    """The :class:`Sleepers` of a test; those left running are killed afterwards."""
    fake = Sleepers()
    monkeypatch.setattr(subprocess, "Popen", fake.popen)
    term = signal.signal(signal.SIGTERM, interrupts.terminated)
    try:
        yield fake
    finally:
        signal.signal(signal.SIGTERM, term)
        for proc in fake.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_simulation_terminated_while_its_server_starts_stops_the_server(
        tmp_path: Path, sleepers: Sleepers) -> None:
    from fedforest_cli.simulate import SimulateOptions, run_simulation

    with pytest.raises(interrupts.Terminated):
        run_simulation(SimulateOptions(dataset="breast_cancer", clients=2, profile="open",
                                       out=tmp_path / "run",
                                       trees=1, depth=2, max_rows=120))
    assert len(sleepers.started) == 1
    assert sleepers.started[0].poll() is not None  # stopped, not left running for good


def test_evaluation_clients_terminated_while_one_starts_are_all_stopped(
        tmp_path: Path, sleepers: Sleepers) -> None:
    from fedforest_cli.sim_data import SiteData
    from fedforest_cli.sim_evaluation import run_eval_clients

    sleepers.stop_at = 2
    sites = [SiteData(f"client-{k}", tmp_path / f"{k}.csv", tmp_path / "schema.toml", "t",
                      np.zeros((1, 1)), np.zeros(1)) for k in range(3)]
    with pytest.raises(interrupts.Terminated):
        run_eval_clients(sites, [tmp_path / f"h{k}.csv" for k in range(3)],
                         "https://127.0.0.1:9", "j", tmp_path, tmp_path, tmp_path / "server.db",
                         profile=None)
    assert len(sleepers.started) == 2  # the third never started
    assert [p.poll() is not None for p in sleepers.started] == [True, True]


def test_signals_held_while_a_process_starts_reach_their_handler_at_the_end() -> None:
    from fedforest_cli.sim_processes import signals_held

    recorded: list[str] = []
    term = signal.signal(signal.SIGTERM, interrupts.terminated)
    try:
        with pytest.raises(interrupts.Terminated), signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            recorded.append("client")
        assert signal.getsignal(signal.SIGTERM) is interrupts.terminated
    finally:
        signal.signal(signal.SIGTERM, term)
    assert recorded == ["client"]


# ---------------------------------------------------------------------- registrations
def test_a_client_whose_token_an_interrupt_lost_is_told_how_to_get_a_new_one(
        tmp_path: Path) -> None:
    """Ctrl-C right after the commit (a slow fsync, a PostgreSQL round trip): the token was
    never printed; the command says it stopped, and running it again names rotate-token."""
    config = tmp_path / "server.toml"
    config.write_text(f'database = "sqlite:///{tmp_path / "server.db"}"\n')
    args = ["server", "add-client", "hosp-b", "--config", str(config)]
    fired: list[int] = []

    def ctrl_c(_sess: Session) -> None:
        if not fired:
            fired.append(1)
            raise KeyboardInterrupt

    event.listen(Session, "after_commit", ctrl_c)
    try:
        first = CliRunner().invoke(app, args, env={"COLUMNS": "1000"})
    finally:
        event.remove(Session, "after_commit", ctrl_c)
    assert fired
    assert (first.exit_code, first.output.strip()) == (130, f"interrupted: {STOPPED}")
    again = CliRunner().invoke(app, args, env={"COLUMNS": "1000"})
    assert (again.exit_code, again.output.strip()) == (
        2, "error: client 'hosp-b' already exists (its token was shown once, when it was "
           "added): `fedforest server rotate-token hosp-b` gives it a new one, and the old "
           "one stops working (a job the site is in then stops at its next request: rotate "
           "between its jobs)")


# ---------------------------------------------------------------------- Schema.dump
@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_a_schema_dump_interrupted_leaves_the_file_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str) -> None:
    from fedforest_secure import files
    from fedforest_secure.schema import Schema

    schema = Schema.infer(np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([0, 1]),
                          feature_names=["a", "b"])
    path = tmp_path / f"schema{suffix}"
    schema.dump(path)
    before = path.read_bytes()

    def cut(fd: int, data: Any) -> None:
        os.write(fd, bytes(data)[:10])
        raise KeyboardInterrupt

    monkeypatch.setattr(files, "_write_all", cut)
    with pytest.raises(KeyboardInterrupt):
        schema.dump(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    assert Schema.load(path) == schema


def test_a_stop_that_surfaces_wrapped_in_another_error_is_taken_for_the_stop() -> None:
    """A signal's interrupt met inside a library's own code (pydantic's JSON serializer turns
    it into "Error serializing to JSON: KeyboardInterrupt") is still the stop: the handlers
    record the interrupt they raise, and the client raises it in place of the error, so the
    site leaves its secure round as stopped (not failed) and exits 143 (or 130, 129)."""
    import signal as signals

    from client_app import stop
    from fedforest_cli.interrupts import Terminated, terminated

    stop.forget()
    try:
        stop.raise_if_asked(ValueError("not while running"))  # nothing asked: nothing raised
        with pytest.raises(Terminated) as raised:
            terminated(signals.SIGTERM, None)
        wrapped = ValueError("Error serializing to JSON: Terminated: 15")
        with pytest.raises(Terminated) as again:
            stop.raise_if_asked(wrapped)
        assert again.value is raised.value and again.value.__cause__ is wrapped
    finally:
        stop.forget()
    assert stop.asked() is None
