"""Command output: rich for people, one versioned JSON object for scripts and agents.

Every command run with ``--json`` prints exactly one JSON object on stdout (see docs/cli-json.md)::

    {"schema": "modulelens.cli/1", "command": "ls", "ok": true, "result": ...}
    {"schema": "modulelens.cli/1", "command": "ls", "ok": false,
     "error": {"type": "CaptureNotFoundError", "message": "...", "exit_code": 2}}

rich is imported on first use: ``--json`` output, ``ls`` and ``show`` (plain aligned text,
:func:`text_table`) start without it (importing it is about a third of a bare ``typer`` start).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

JSON_SCHEMA = "modulelens.cli/1"


class _DeferredConsole:
    """A :class:`rich.console.Console` made (and rich imported) when first used."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr)
        return getattr(self._console, name)


console: Console = _DeferredConsole()  # type: ignore[assignment]
err_console: Console = _DeferredConsole(stderr=True)  # type: ignore[assignment]


def rich_table(*args: Any, **kwargs: Any) -> Table:
    """A :class:`rich.table.Table` (rich imported on first use, see the module docstring)."""
    from rich.table import Table

    return Table(*args, **kwargs)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, fit: bool = True) -> list[str]:
    """``rows`` under ``header`` as lines of left-aligned columns, two spaces apart.

    The first column is never cut (it holds what people copy into the next command: a ref). When
    ``fit`` and stdout is a terminal, the last columns are dropped until a line fits its width;
    piped output keeps every column.

    Example::

        for line in text_table(["ref", "size"], [["mlp:v1", "4.0 KiB"]]):
            print(line)
    """
    count = len(header)
    if fit and sys.stdout.isatty():
        import shutil

        width = shutil.get_terminal_size().columns
        while count > 1 and _line_width(header, rows, count) > width:
            count -= 1
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(count)]
    return [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row[:count], widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def _line_width(header: Sequence[str], rows: Sequence[Sequence[str]], count: int) -> int:
    return sum(max(len(str(row[i])) for row in (header, *rows)) for i in range(count)) + 2 * (count - 1)


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data, shared by ``--json`` and the MCP server.

    Objects with ``to_dict()`` (reports) become their dicts, paths and other objects their
    ``str``, and non-finite floats the strings ``"nan"``/``"inf"`` (strict JSON has no NaN).
    """
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def emit_json(command: str, *, result: Any = None, error_type: str | None = None, message: str = "",
              exit_code: int = 0) -> None:
    """Print the one JSON object of a ``--json`` run: the result, or the error when ``error_type`` is set."""
    payload: dict[str, Any] = {"schema": JSON_SCHEMA, "command": command, "ok": error_type is None}
    if error_type is None:
        payload["result"] = result
    else:
        payload["error"] = {"type": error_type, "message": message, "exit_code": exit_code}
    sys.stdout.write(json.dumps(jsonable(payload), indent=1) + "\n")
    sys.stdout.flush()


def emit(command: str, as_json: bool, result: Any, render: Callable[[Any], None]) -> None:
    """``--json``: print ``result`` in the JSON envelope; otherwise ``render(result)`` for people."""
    if as_json:
        emit_json(command, result=result)
    else:
        render(result)
