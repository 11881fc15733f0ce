"""The ``fedforest`` command's own option (``--version``), and the commands it suggests
next, which run the way this one was started (a virtualenv's ``bin/fedforest`` not on PATH,
``python -m fedforest_cli``)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fedforest_cli
import fedforest_secure
import server_app
from fedforest_cli._common import own_command
from fedforest_cli.cli import app
from fedforest_cli.simulate import _print_where
from fedforest_secure.audit import AuditLog

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.mark.parametrize("option", ["--version", "-V"])
def test_version_prints_the_package_version(option: str) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    res = runner.invoke(app, [option])
    assert res.exit_code == 0
    assert res.output == f"fedforest {version}\n"
    assert fedforest_secure.__version__ == server_app.__version__ == version


def _script(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_virtualenvs_fedforest_off_path_is_named_by_its_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _script(tmp_path / ".venv" / "bin" / "fedforest")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(_script(tmp_path / "elsewhere" / "fedforest").parent))
    monkeypatch.setattr(sys, "argv", [".venv/bin/fedforest", "simulate"])
    assert own_command() == ".venv/bin/fedforest"
    started = tmp_path / "my venv" / "bin" / "fedforest"
    monkeypatch.setattr(sys, "argv", [str(_script(started)), "simulate"])
    assert own_command() == shlex.quote(str(started))


def test_the_fedforest_on_path_is_named_by_its_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = _script(tmp_path / "bin" / "fedforest")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/usr/bin")
    monkeypatch.setattr(sys, "argv", [str(started), "simulate"])
    assert own_command() == "fedforest"


def test_python_dash_m_is_named_with_this_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    main = Path(fedforest_cli.__file__).parent / "__main__.py"
    monkeypatch.setattr(sys, "argv", [str(main), "simulate"])
    assert own_command() == f"{shlex.quote(sys.executable)} -m fedforest_cli"


def test_simulates_next_commands_run_as_printed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "a run"  # a space: the printed paths are quoted for the shell
    (out / "receipts").mkdir(parents=True)
    with AuditLog(out / "audit.db"):
        pass
    monkeypatch.setattr(sys, "argv", [str(Path(fedforest_cli.__file__).parent / "__main__.py")])
    _print_where(out, {"ok": True, "entries": 0, "receipts_checked": 0,
                       "plaintext_entries": 0, "problems": []})
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("next, try:")
    fedforest, db = f"{shlex.quote(sys.executable)} -m fedforest_cli", shlex.quote(
        str(out / "audit.db"))
    assert lines[at + 1:] == [
        f"  {fedforest} audit show --db {db}",
        f"  {fedforest} audit verify --db {db} --receipts {shlex.quote(str(out / 'receipts'))}"]
    said = [subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=120)
            for line in lines[at + 1:]]
    assert [(r.returncode, r.stdout.strip()) for r in said] == [
        (0, "the audit log is empty"), (0, "OK: 0 entries in 0 job(s), 0 receipt(s) checked")]


_DURATIONS = {  # every float option that is a duration, in a command that would run with it
    "--retry-budget": (["client", "--server", "https://127.0.0.1:1", "--token", "t", "--job",
                        "j", "--data", "site.csv", "--schema", "schema.toml"], "seconds"),
    "--timeout": (["evaluate", "--config", "server.toml"], "seconds"),
    "--wait": (["server", "cancel-job", "--config", "server.toml", "--job", "j"], "seconds"),
    "--keep-days": (["server", "prune", "--config", "server.toml"], "days"),
}


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-5"])
@pytest.mark.parametrize("option", sorted(_DURATIONS))
def test_a_duration_that_is_not_a_finite_number_0_or_more_is_a_usage_error(
        option: str, value: str, tmp_path: Path) -> None:
    """``--retry-budget nan`` retried forever (no comparison with nan is true), ``-5`` gave
    up at once saying the server did not answer for -5s, ``cancel-job --wait nan`` passed its
    ``min=0``: each is refused before the command does anything, naming the option."""
    args, unit = _DURATIONS[option]
    res = runner.invoke(app, [*args, f"{option}={value}"])
    said = " ".join(res.output.replace("│", " ").split())
    shown = f"{float(value):g}"
    assert res.exit_code == 2, res.output
    assert (f"Invalid value for '{option}': must be a finite number of {unit}, 0 or more; "
            f"got {shown}") in said, res.output
