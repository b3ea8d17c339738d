"""Command output: rich for people, one versioned JSON object for scripts and agents.

Every command run with ``--json`` prints exactly one JSON object on stdout (see docs/cli-json.md)::

    {"schema": "modulelens.cli/1", "command": "ls", "ok": true, "result": ...}
    {"schema": "modulelens.cli/1", "command": "ls", "ok": false,
     "error": {"type": "CaptureNotFoundError", "message": "...", "exit_code": 2}}

rich is imported on first use: ``--json`` output, ``ls`` and ``show`` (plain aligned text,
:func:`text_table`) start without it (importing it is about a third of a bare ``typer`` start).

Everything printed for people goes through :func:`safe_text` (issue 21): names, tags, metadata,
messages and source come from captures that someone else may have made, and a raw escape sequence
in them would reach the terminal: OSC 52 writes the clipboard, others set the title, clear the
screen or hide text. :data:`console`, :data:`err_console`, :func:`rich_table`, :func:`text_table`,
:func:`echo` and the human path of :func:`emit` all apply it, so a renderer cannot forget it.
``--json`` needs none: ``json.dumps`` writes every control character as ``\\u00XX``.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import cache

_TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~2 ms of a fresh `show`, issue 37)
if _TYPE_CHECKING:
    from typing import Any, TypeVar

    from rich.console import Console
    from rich.table import Table

    T = TypeVar("T")

JSON_SCHEMA = "modulelens.cli/1"

# Characters a terminal may act on instead of showing: C0 controls, DEL, C1 controls (U+0080-U+009F:
# 8-bit CSI, OSC...), and the Unicode format characters that reorder or hide text (bidi overrides
# and isolates, "Trojan Source"), line and paragraph separators, zero-width joiners and the BOM.
# A tab (U+0009) and a newline (U+000A) are kept in running text and escaped in one-line cells.
# Searched for by a regex, in C: a loop over the characters in Python took 60 ms of an `ls` of
# 2,000 versions (its table is one running text of 2,000 lines).
_OTHER_UNSAFE = "\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ufeff"
_UNSAFE_IN_RUNNING_TEXT = re.compile(f"[\x00-\x08{_OTHER_UNSAFE}]")
_UNSAFE_IN_ONE_LINE = re.compile(f"[\x00-\x0a{_OTHER_UNSAFE}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_text(text: object, *, one_line: bool = False) -> str:
    """``text`` with every character a terminal could act on written out as an escape: ``\\x1b``, ``\\u202e``.

    The one function every human output uses (the module docstring says where). A newline and a
    tab stay in running text; ``one_line`` (table cells, a name on a line) escapes them too, so a
    name cannot fake a row.

    Example::

        >>> safe_text("mlp\\x1b]52;c;aGk=\\x07")
        'mlp\\\\x1b]52;c;aGk=\\\\x07'
    """
    text = text if isinstance(text, str) else str(text)
    if text.isprintable():  # the common case (False for any control, format or separator character)
        return text
    return (_UNSAFE_IN_ONE_LINE if one_line else _UNSAFE_IN_RUNNING_TEXT).sub(_escape, text)


def safe_tree(value: Any) -> Any:
    """``value`` (a command's result: dicts, lists, strings) with :func:`safe_text` applied to every
    string, keys included; other values are kept. What :func:`emit` gives a renderer."""
    if _nothing_to_escape(value):  # the usual result, checked in C (`ls` of 2,000 versions: 48,000 strings)
        return value
    return _escaped_tree(value)


def _nothing_to_escape(value: object) -> bool:
    """Whether no string in ``value`` holds a character :func:`safe_text` would escape, in one pass in C.

    JSON without ``ensure_ascii`` writes a string's characters as they are, except the quote, the
    backslash and the C0 controls, which it escapes with a backslash. So text that is printable and
    has no backslash had none of them and none of the other characters safe_text escapes (none of
    them is printable). Anything else (a backslash in a path, a non-breaking space, a value JSON
    cannot write) takes the slow path, which escapes only what it must."""
    try:
        text = json.dumps(value, ensure_ascii=False, check_circular=False)
    except (TypeError, ValueError, RecursionError):
        return False
    return text.isprintable() and "\\" not in text


def _escaped_tree(value: object) -> object:
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {_escaped_tree(k): _escaped_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escaped_tree(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_escaped_tree(v) for v in value)
    return value


@cache
def _safe_classes() -> tuple[type, type]:
    """rich's ``Console`` and ``Table`` with :func:`safe_text` applied to the text they are given."""
    from rich.console import Console
    from rich.table import Table

    class SafeConsole(Console):
        def print(self, *objects: Any, **kwargs: Any) -> None:
            super().print(*(safe_text(o) if isinstance(o, str) else o for o in objects), **kwargs)

        def status(self, status: Any, **kwargs: Any) -> Any:
            return super().status(safe_text(status, one_line=True) if isinstance(status, str) else status, **kwargs)

    class SafeTable(Table):
        def __init__(self, *headers: Any, **kwargs: Any) -> None:
            for key in ("title", "caption"):
                if isinstance(kwargs.get(key), str):
                    kwargs[key] = safe_text(kwargs[key], one_line=True)
            super().__init__(*headers, **kwargs)

        def add_row(self, *renderables: Any, **kwargs: Any) -> None:
            super().add_row(*(safe_text(r, one_line=True) if isinstance(r, str) else r for r in renderables), **kwargs)

    return SafeConsole, SafeTable


class _DeferredConsole:
    """A :class:`rich.console.Console` made (and rich imported) when first used; what it prints
    goes through :func:`safe_text`."""

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> object:
        if self._console is None:
            self._console = _safe_classes()[0](stderr=self._stderr)
        return getattr(self._console, name)


console: Console = _DeferredConsole()  # type: ignore[assignment]
err_console: Console = _DeferredConsole(stderr=True)  # type: ignore[assignment]


def rich_table(*args: object, **kwargs: object) -> Table:
    """A :class:`rich.table.Table` whose title and cells go through :func:`safe_text` (rich
    imported on first use, see the module docstring)."""
    return _safe_classes()[1](*args, **kwargs)


@contextlib.contextmanager
def steps(enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """Show which step of a long command is running: a spinner, the step and its seconds on stderr.

    Yields ``step(text)``, called as each step starts. Only on a terminal: with ``--json``
    (``enabled=False``) or when stderr is a pipe or a file, nothing is shown and ``step`` does
    nothing, so scripts and logs see exactly the command's output. The line goes away when the
    block ends (the result is printed after it).

    Example::

        with steps(not as_json) as step:
            step(f"loading {ref}")
            capture = load(ref)
            step(f"replaying {len(capture.calls)} recorded calls")
            report = capture.replay()
    """
    if not enabled or not sys.stderr.isatty():
        yield lambda text: None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    live = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                    console=_safe_classes()[0](stderr=True), transient=True)
    current: list[Any] = []

    def step(text: str) -> None:
        if current:
            live.remove_task(current.pop())
        current.append(live.add_task(safe_text(text, one_line=True), total=None))

    with live:
        yield step


def echo(text: str = "", *, err: bool = False, bold: bool = False, fg: str | None = None) -> None:
    """Print a line of plain text (no rich) through :func:`safe_text`, styled only on a terminal."""
    stream = sys.stderr if err else sys.stdout
    if (bold or fg) and stream.isatty():
        import typer  # its own copy of click's secho (importing click itself took 6 ms of `ls`)

        typer.secho(safe_text(text), err=err, bold=bold or None, fg=fg)
        return
    # Unstyled, or to a pipe (where secho writes no style either): no typer, whose import took a
    # third of a piped `ls` (cli/_direct.py). Flushed at once as secho does, so a reader that left
    # the pipe is a BrokenPipeError inside the command, which ends it quietly (cli/_command.py).
    stream.write(safe_text(text) + "\n")
    stream.flush()


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
    header = [safe_text(cell, one_line=True) for cell in header]
    rows = [[safe_text(cell, one_line=True) for cell in row] for row in rows]
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(count)]
    return [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row[:count], widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]


def _line_width(header: Sequence[str], rows: Sequence[Sequence[str]], count: int) -> int:
    return sum(max(len(str(row[i])) for row in (header, *rows)) for i in range(count)) + 2 * (count - 1)


def jsonable(value: object) -> object:
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


def emit_json(command: str, *, result: object = None, error_type: str | None = None, message: str = "",
              exit_code: int = 0) -> None:
    """Print the one JSON object of a ``--json`` run: the result, or the error when ``error_type`` is set."""
    payload: dict[str, Any] = {"schema": JSON_SCHEMA, "command": command, "ok": error_type is None}
    if error_type is None:
        payload["result"] = result
    else:
        payload["error"] = {"type": error_type, "message": message, "exit_code": exit_code}
    sys.stdout.write(json.dumps(jsonable(payload), indent=1) + "\n")
    sys.stdout.flush()


def emit(command: str, as_json: bool, result: T, render: Callable[[T], None]) -> None:
    """``--json``: print ``result`` in the JSON envelope; otherwise ``render(result)`` for people,
    every string of ``result`` through :func:`safe_text` (see the module docstring)."""
    if as_json:
        emit_json(command, result=result)
    else:
        render(safe_tree(result))
