"""``python -m fedforest_cli ...`` is the ``fedforest`` command."""

from __future__ import annotations

from fedforest_cli.cli import app

app(prog_name="fedforest")
