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


def _default(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return str(value)


def emit_json(command: str, *, result: Any = None, error: BaseException | None = None, exit_code: int = 0) -> None:
    payload: dict[str, Any] = {"schema": JSON_SCHEMA, "command": command, "ok": error is None}
    if error is None:
        payload["result"] = result
    else:
        payload["error"] = {"type": type(error).__name__, "message": str(error), "exit_code": exit_code}
    sys.stdout.write(json.dumps(payload, default=_default, indent=1) + "\n")
    sys.stdout.flush()


def emit(command: str, as_json: bool, result: Any, render: Callable[[Any], None]) -> None:
    if as_json:
        emit_json(command, result=result)
    else:
        render(result)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
