"""``python -m client_app ...`` is the ``fedforest`` command."""

from __future__ import annotations

from client_app.cli import app

app(prog_name="fedforest")
