"""``fedforest simulate --out`` in a directory whose name holds what TOML, a URL or rich
markup would read otherwise: a double quote, a backslash, a ``?``, ``[/]``."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedforest_cli.cli import app


@pytest.mark.integration
def test_simulate_runs_in_an_out_directory_named_with_quotes_a_query_and_markup(
        tmp_path: Path) -> None:
    """server.toml was written with the path unescaped (`"` ended its string: the server
    did not start), a `?` sent both databases to the path's part before it, outside --out
    (and the rerun failed: `client 'client-0' already exists`), and `[/]` in a printed path
    was a rich MarkupError traceback. The run works, twice, its files all in --out, and the
    paths print as they are."""
    out = tmp_path / 'run?1 "q" \\ [' / "]x"
    args = ["simulate", "--dataset", "wine", "--clients", "3", "--profile", "open",
            "--trees", "2", "--depth", "2", "--out", str(out)]
    for _ in range(2):  # the rerun replaces --out
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, (res.output, res.exception)
        said = res.output
        assert {"server.db", "audit.db", "server.toml"} <= {p.name for p in out.iterdir()}
        assert [p.name for p in tmp_path.iterdir()] == ['run?1 "q" \\ [']
        assert f"client certificates in {out / 'certs'}\n" in said
        assert f"audit log: {out / 'audit.db'}" in said
        assert "OK" in said.split("audit log:")[1]
