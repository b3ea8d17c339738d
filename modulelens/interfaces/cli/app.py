"""The root ``modulelens`` app, assembled from the command modules.

Each command module owns a ``typer.Typer`` and imports only ``_command``, ``_options``,
``session`` and ``output``; this module is the only one that imports them all, so there is no
cycle. Top-level commands are merged in without a group name; groups (``kernel``, ``agent``) keep
theirs. Command modules import torch only inside commands: ``--help``, ``--version``, ``ls`` and
``show`` start without it.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from modulelens.interfaces.cli import agents, core, kernel, remote, tools
from modulelens.interfaces.cli._errors import DebugState
from modulelens.interfaces.output import err_console

app = typer.Typer(
    name="modulelens",
    help="Capture submodules of a real PyTorch job, store them versioned, rebuild and replay them anywhere.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.add_typer(core.app)      # ls, show, replay, alias, rm, gc, run, demo
app.add_typer(tools.app)     # profile, verify, diff
app.add_typer(kernel.app)    # export
app.add_typer(agents.app)    # shell, mcp
app.add_typer(remote.app)    # push, pull
app.add_typer(kernel.kernel_app, name="kernel")
app.add_typer(agents.agent_app, name="agent")


def _version(value: bool) -> None:
    if value:
        from modulelens import __version__

        print(f"modulelens {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    del version  # handled by its eager callback
    DebugState.enabled = debug


def main() -> None:
    """The ``modulelens`` console script."""
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
