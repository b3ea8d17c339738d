"""The ``command`` decorator: registers a function on a typer app with the shared error handling."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from modulelens.interfaces._errors import KNOWN_ERRORS
from modulelens.interfaces.cli._errors import DebugState, report_error

F = TypeVar("F", bound=Callable[..., Any])


def command(group: typer.Typer, name: str, *, json_name: str | None = None, **settings: Any) -> Callable[[F], F]:
    """Register a command on ``group`` whose known errors become one line (or a JSON error) and an exit code.

    Args:
        group: the typer app of the command's module (assembled into the root app by ``app.py``).
        name: the command name (``modulelens <name>`` or ``modulelens <group> <name>``).
        json_name: the ``command`` field of its JSON envelope (default: ``name``).
        **settings: passed to ``typer.Typer.command`` (``context_settings``...).

    Returns:
        A decorator that returns the function unchanged (so it stays callable in tests).

    Example::

        app = typer.Typer()

        @command(app, "ls")
        def ls(as_json: JsonOpt = False) -> None: ...
    """
    label = json_name or name

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except KNOWN_ERRORS as error:
                if DebugState.enabled:
                    raise
                raise report_error(label, error, bool(kwargs.get("as_json"))) from None

        group.command(name, **settings)(wrapper)
        return func

    return decorate
