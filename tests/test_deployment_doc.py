"""docs/deployment.md's command lines: each is a command of the ``fedforest`` CLI with options
that command has, and each one a site runs against the page's server (whose ``server.toml``
asks for client certificates) carries the federation CA and the site's certificate and key."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import typer

from fedforest_cli.cli import app

DOC = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"


def command_lines() -> list[str]:
    """The ``fedforest ...`` lines of the page's indented code blocks (continuation lines
    joined, comments and a leading ``VAR=value`` dropped)."""
    lines: list[str] = []
    pending = ""
    for raw in DOC.read_text().splitlines():
        if not raw.startswith("    ") and not pending:
            continue
        line = pending + " " + raw.strip() if pending else raw.strip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        pending = ""
        line = line.split(" #", 1)[0].strip()
        line = re.sub(r"^[A-Z_]+=\S+ ", "", line)
        if line.startswith("fedforest "):
            lines.append(line)
    return lines


def _command(words: list[str]) -> tuple[Any, list[str]]:
    """The (click) command a ``fedforest`` line runs, and the words after its name."""
    cmd: Any = typer.main.get_command(app)
    rest = words[1:]
    while rest and rest[0] in getattr(cmd, "commands", {}):  # a group: its sub-command
        cmd, rest = cmd.commands[rest[0]], rest[1:]
    return cmd, rest


def _server_toml() -> dict[str, object]:
    text = DOC.read_text()
    block = text.split("## 2. Server configuration", 1)[1].split("\n## ", 1)[0]
    toml = "\n".join(line[4:] for line in block.splitlines() if line.startswith("    "))
    return tomllib.loads(toml)


def test_every_command_line_names_options_its_command_has() -> None:
    lines = command_lines()
    assert len(lines) > 15
    for line in lines:
        cmd, rest = _command(shlex.split(line))
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        used = {w.split("=", 1)[0] for w in rest if w.startswith("--")}
        assert used <= known, f"{line}: {sorted(used - known)} not options of the command"


def test_every_site_command_carries_the_ca_and_the_site_certificate() -> None:
    tls = _server_toml()["tls"]
    assert isinstance(tls, dict) and "client_ca" in tls  # the page's server asks for them
    site_lines = [line for line in command_lines() if " --server " in f" {line} "]
    commands = {_command(shlex.split(line))[0].name for line in site_lines}
    assert {"client", "jobs", "status", "download"} <= commands, commands
    for line in site_lines:
        words = shlex.split(line)
        assert {"--ca", "--cert", "--key"} <= set(words), \
            f"{line}: the page's server refuses a site without --cert and --key"
