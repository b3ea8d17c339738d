"""The ``modulelens`` command line (typer + rich; ``--json`` on every command, see docs/cli-json.md).

Layout: ``root.py`` assembles the command modules (``core``, ``tools``, ``kernel``, ``agents``...);
``browse.py`` does ``ls`` and ``show``; ``_direct.py`` runs a plain ``ls`` or ``show`` without
importing typer; ``_options.py`` declares the shared options, ``_command.py`` the ``command``
decorator, ``_errors.py`` how a failure is printed. ``app`` is imported on first use, so the
console script reaches typer only when the direct path declines the command line.
"""

from __future__ import annotations

import sys

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~2 ms of a fresh `ls`)
if _TYPE_CHECKING:
    from typing import Any

    from modulelens.interfaces.cli.root import app

__all__ = ["app", "main"]


def main() -> None:
    """The ``modulelens`` console script: a plain ``ls``/``show`` on the direct path, anything else
    through the typer app."""
    from modulelens.interfaces.cli._direct import run

    try:
        if not run(sys.argv[1:]):
            from modulelens.interfaces.cli.root import app

            app()
    except KeyboardInterrupt:
        from modulelens.interfaces.output import err_console  # here: output.py compiles its patterns on import

        err_console.print("interrupted")
        sys.exit(130)


def __getattr__(name: str) -> Any:
    if name == "app":  # on first use: importing it imports typer, which the direct path skips
        from modulelens.interfaces.cli.root import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
