"""The ``command`` decorator: registers a function on a typer app with the shared error handling."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import typer
from typer.core import TyperCommand

from modulelens.interfaces._errors import KNOWN_ERRORS
from modulelens.interfaces.cli._errors import DebugState, report_error, silence_stdout

P = ParamSpec("P")
R = TypeVar("R")


def take_as_given(params: list[Any]) -> None:
    """Let flags and plain ``str`` arguments and options of a command keep their value as given
    (a repeatable ``str`` option: the tuple of its values).

    typer converts every value that is not already a bool flag's bool through a pydantic
    ``TypeAdapter`` built on first use, ``--help``'s unset ``None`` included; for
    ``modulelens ls --repo DIR`` that meant importing pydantic and building three adapters, about
    40% of the command's wall time (``python -X importtime``), to turn a string into itself. Other
    types (numbers, lists, choices, paths, parsers) keep typer's conversion. typer has no public
    hook for this: where its internals differ, nothing changes but speed, and
    tests/interfaces/test_cli.py (the modules ``ls`` imports) notices.

    Args:
        params: a typer command's or group's click parameters.
    """
    try:
        from typer._coercion import PassThroughRuntimeParam
    except ImportError:
        return
    strings = _strings_param()
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is None or getattr(param, "_runtime_param", True) is not None:
            continue  # not typer's, or already decided
        custom = descriptor.parameter_info.parser is not None or descriptor.is_choice or descriptor.is_path
        plain = descriptor.annotation is str and not custom
        flag = descriptor.annotation is bool and getattr(param, "is_flag", False)
        # a repeatable str option (--tag, -t): click gives a tuple of str, which the command takes as it is
        repeated = descriptor.annotation == list[str] and getattr(param, "multiple", False) and not custom
        if plain or flag or repeated:
            kind = strings if repeated else PassThroughRuntimeParam
            param._runtime_param = kind(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation)


@functools.cache
def _strings_param() -> type:
    from typer._coercion import PassThroughRuntimeParam

    class Strings(PassThroughRuntimeParam):
        """A repeatable ``str`` option's values as the list of strings click gives (a list or a tuple)."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            return [str(item) for item in value]

    return Strings


class GivenValues:
    """Mixin for a typer command or group whose parameters, ``--help`` included, are
    :func:`take_as_given` (click makes the help option when first asked for the parameters)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        take_as_given(params)
        for param in params:  # `--max-calls MAX_CALLS`, not typer's `--max-calls <int>` (`<list[str]>`...)
            if getattr(param, "metavar", "") is None and not getattr(param, "is_flag", False):
                param.metavar = param.name.upper().rstrip("_")
        return params


class _Command(GivenValues, TyperCommand):
    """typer's command with :func:`take_as_given` parameters."""


def command(group: typer.Typer, name: str, *, json_name: str | None = None,
            context_settings: dict[str, object] | None = None) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Register a command on ``group`` whose known errors become one line (or a JSON error) and an exit code.

    Args:
        group: the typer app of the command's module (assembled into the root app by ``root.py``).
        name: the command name (``modulelens <name>`` or ``modulelens <group> <name>``).
        json_name: the ``command`` field of its JSON envelope (default: ``name``).
        context_settings: passed to ``typer.Typer.command`` (click's settings: extra arguments...).

    Returns:
        A decorator that returns the function unchanged (so it stays callable in tests).

    Example::

        app = typer.Typer()

        @command(app, "ls")
        def ls(as_json: JsonOpt = False) -> None: ...
    """
    label = json_name or name

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return func(*args, **kwargs)
            except BrokenPipeError:  # `modulelens ls | head`: the reader left; end quietly, like other tools
                silence_stdout()
                raise typer.Exit(1) from None
            except KNOWN_ERRORS as error:
                if DebugState.enabled:
                    raise
                raise report_error(label, error, bool(kwargs.get("as_json"))) from None

        group.command(name, cls=_Command, context_settings=context_settings)(wrapper)
        return func

    return decorate
