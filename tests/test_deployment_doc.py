"""docs/deployment.md's command lines: each is a command of the ``fedforest`` CLI with options
that command has, and each one a site runs against the page's server (whose ``server.toml``
asks for client certificates) carries the federation CA and the site's certificate and key."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
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


def test_every_pki_init_of_the_page_makes_the_server_certificate_for_the_servers_host() -> None:
    """Each `pki init` the page gives to run (its code blocks and inline: the first CA,
    a new one after a key leak or before the CA's end) names the server's host: without
    --host the new server.pem covers localhost and 127.0.0.1 only, and every site refuses
    the server by its name."""
    inline = [" ".join(c.split()) for c in
              re.findall(r"`((?:fedforest )?pki init --[^`]*)`", DOC.read_text())
              if "--out" in c or "--force" in c]  # not a mention of an option (`--name`)
    blocks = [line for line in command_lines() if line.startswith("fedforest pki init ")]
    assert len(blocks) >= 2 and len(inline) >= 2, (blocks, inline)
    for line in blocks + inline:
        assert "--out" in line.split() and "--host fedforest.example.org" in line, line


@pytest.mark.integration
def test_the_documented_health_probe_certificate_opens_health_and_certifies_no_site(
        tmp_path: Path) -> None:
    """§4: a health probe of a server with ``client_ca`` presents a certificate of the
    federation CA, the coordinator's own. Issued as §1 says (`--operator`), a real server
    answers the probe's `curl` line, and every site refuses an identity certified with its key
    (the server operator holds it), naming the entry."""
    from nacl.signing import SigningKey
    from test_integration_https import provision, stop
    from typer.testing import CliRunner

    from fedforest_secure.errors import InvalidMessage
    from fedforest_secure.secagg.directory import certify_identity, verify_directory

    issue = [line for line in command_lines() if " --name probe " in f"{line} "]
    assert issue == ["fedforest pki issue --ca-dir ca/ --name probe --operator"]
    curl = [shlex.split(c) for c in re.findall(r"`(curl\s[^`]*probe\.pem[^`]*)`",
                                                 DOC.read_text())]
    assert len(curl) == 1 and curl[0][-1].endswith("/health"), curl
    if shutil.which("curl") is None:
        pytest.skip("the documented probe runs curl, which this machine lacks")
    server = provision(tmp_path, ["client-0"], [])
    words = [str(server.certs) if w == "ca/" else w for w in shlex.split(issue[0])]
    res = CliRunner().invoke(app, words[1:])
    assert res.exit_code == 0, res.output
    # the documented options, against this server's URL, from the certificates' directory
    probe = ["curl", "-sS", "--max-time", "20", *curl[0][1:-1], f"{server.url}/health"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server.launch(tmp_path / "server.log", procs)
        answer = subprocess.run(probe, cwd=server.certs, capture_output=True, text=True,
                                timeout=60, check=False)
        assert answer.returncode == 0, answer.stderr
        assert json.loads(answer.stdout)["status"] == "ok"
        without = [w for w in probe if w not in ("--cert", "probe.pem", "--key", "probe.key")]
        refused = subprocess.run(without, cwd=server.certs, capture_output=True, text=True,
                                 timeout=60, check=False)
        assert refused.returncode != 0, refused.stdout  # the server asks for a certificate
    finally:
        for proc in procs:
            stop(proc)
    site = bytes(SigningKey.generate().verify_key)
    played = bytes(SigningKey.generate().verify_key)
    keys = {0: site, 1: played}
    certs = {k: certify_identity("job-a", key, (server.certs / f"{who}.pem").read_bytes(),
                                 (server.certs / f"{who}.key").read_bytes())
             for k, key, who in ((0, site, "client-0"), (1, played, "probe"))}
    with pytest.raises(InvalidMessage) as exc:
        verify_directory("job-a", keys, certs, (server.certs / "ca.pem").read_bytes())
    assert str(exc.value).startswith(
        "directory entry 1 ('probe'): not a site's certificate (an operator's certificate: "
        "its extended key usage holds the FedForest operator purpose ")
    assert exc.value.peer == 1
