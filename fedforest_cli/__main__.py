"""``python -m fedforest_cli ...`` is the ``fedforest`` command."""

from __future__ import annotations

import gc

from fedforest_cli.cli import app


def main() -> None:
    """Run the ``fedforest`` command in this process (``python -m fedforest_cli`` and the
    installed ``fedforest`` script). The objects its imports made (modules, classes,
    functions) live as long as the process: frozen, the garbage collector no longer walks them
    in each full collection, nor in the collections of the interpreter's exit, which would
    otherwise take a large part of a short-lived client's or server's CPU."""
    gc.freeze()
    app(prog_name="fedforest")


if __name__ == "__main__":
    main()
