"""The ``modulelens`` command line (typer + rich; ``--json`` on every command, see docs/cli-json.md).

Layout: ``app.py`` assembles the command modules (``core``, ``tools``, ``kernel``, ``agents``);
``_options.py`` declares the shared options, ``_command.py`` the ``command`` decorator,
``_errors.py`` how a failure is printed.
"""

from modulelens.interfaces.cli.app import app, main

__all__ = ["app", "main"]
