"""Command output: rich for people, one versioned JSON object for scripts and agents.

Every command run with ``--json`` prints exactly one JSON object on stdout (see docs/cli-json.md)::

    {"schema": "modulelens.cli/1", "command": "ls", "ok": true, "result": ...}
    {"schema": "modulelens.cli/1", "command": "ls", "ok": false,
     "error": {"type": "CaptureNotFoundError", "message": "...", "exit_code": 2}}
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

JSON_SCHEMA = "modulelens.cli/1"

console = Console()
err_console = Console(stderr=True)


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
