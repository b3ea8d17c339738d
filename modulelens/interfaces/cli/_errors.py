"""How the CLI shows a failure: one red line on stderr (or one JSON error object) and an exit code.

The mapping from an exception to a message and an exit code is shared with the MCP server and the
IPython magics (:mod:`modulelens.interfaces._errors`); this module only decides how the CLI prints
it. ``--debug`` re-raises instead, for a traceback.
"""

from __future__ import annotations

from modulelens.interfaces._errors import as_modulelens_error, error_message, exit_code
from modulelens.interfaces.output import emit_json, err_console

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~2 ms of a fresh `show`, issue 37)
if _TYPE_CHECKING:
    import typer


class DebugState:
    """``modulelens --debug``: show tracebacks instead of one-line errors (set by the root callback)."""

    enabled = False


def report_error(label: str, error: BaseException, as_json: bool) -> typer.Exit:
    """Print ``error`` for command ``label`` and return the :class:`typer.Exit` to raise.

    Args:
        label: the command's JSON name (``"ls"``, ``"kernel verify"``).
        error: one of :data:`modulelens.interfaces._errors.KNOWN_ERRORS`.
        as_json: print ``{"ok": false, "error": {...}}`` on stdout instead of a line on stderr.

    Returns:
        ``typer.Exit`` carrying the error's exit code.
    """
    import typer  # here: the direct path (_direct.py) prints errors without importing typer

    return typer.Exit(print_error(label, error, as_json))


def print_error(label: str, error: BaseException, as_json: bool) -> int:
    """Print ``error`` for command ``label`` (one red line on stderr, or one JSON error object on
    stdout) and return its exit code; :func:`report_error` without typer."""
    code = exit_code(error)
    message = error_message(error)
    if as_json:
        # The documented class (an OSError is reported as the error it maps to: StorageError...).
        emit_json(label, error_type=type(as_modulelens_error(error)).__name__, message=message, exit_code=code)
    else:
        from rich.markup import escape  # here: a command that succeeds never imports rich for this

        # escape(): a message such as "pip install 'modulelens[agents]'" must keep its brackets.
        err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return code


def silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit does not fail again
    on the closed pipe (the recipe of Python's ``signal`` documentation, "Note on SIGPIPE")."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
