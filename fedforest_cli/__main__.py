"""``python -m fedforest_cli ...`` is the ``fedforest`` command."""

from __future__ import annotations

from fedforest_secure.startup import lasting_imports, skip_unused_imports


def main() -> None:
    """Run the ``fedforest`` command in this process (``python -m fedforest_cli`` and the
    installed ``fedforest`` script). The command line's modules are imported here, outside the
    garbage collector's reach (:func:`~fedforest_secure.startup.lasting_imports`); a command
    imports its own modules when it runs (the client's and the server's the same way). The
    optional imports of its libraries that no command uses are skipped
    (:func:`~fedforest_secure.startup.skip_unused_imports`)."""
    skip_unused_imports()
    with lasting_imports():
        from fedforest_cli.cli import app
    app(prog_name="fedforest")


if __name__ == "__main__":
    main()
