"""Hostile text for the terminal (issue 21, defect 6): captures whose tags, metadata, class names,
constructor arguments, parameter names, output keys and repo files hold escape sequences, shown
through ``ls``, ``show``, ``diff``, ``replay`` and ``fsck`` in fresh processes.

A raw control character in what a command prints is a failure: OSC 52 writes the user's clipboard,
OSC 0 sets the window title, CSI 2J clears the screen, C1 controls (U+009B, U+009D) do the same on
terminals that take 8-bit controls, a carriage return or a bidi override hides or reorders text.
Each command runs piped (no styling, so any escape came from the data) and, in the full run, with
``FORCE_COLOR=1`` (rich's own colour codes, ``ESC[...m``, are removed before the check, anything
else stays a failure). "wrong" counts outputs with a raw control; "survived" commands that ended
without a traceback.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import modulelens
from stress.table import Row

# OSC 52 (clipboard), OSC 0 (title), CSI clear screen + home, C1 CSI, C1 OSC ... ST, BEL, CR, bidi override
HOSTILE = "\x1b]52;c;aGFja2Vk\x07\x1b]0;pwned\x07\x1b[2J\x1b[H\x9b2J\x9d0;t\x9c\r\u202e"
_SGR = re.compile(rb"\x1b\[[0-9;]*m")  # rich's colours and bold: the only escapes a command may emit itself
_ROOT = Path(__file__).resolve().parent.parent


class Echo(nn.Module):
    """A module whose parameter names and output keys are hostile, and whose output changes with
    the clock, so that a replay fails and prints the output's path."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label
        self.weights = nn.ParameterDict({f"w{HOSTILE}": nn.Parameter(torch.ones(3))})

    def forward(self, x: torch.Tensor, tag: str = "") -> dict[str, torch.Tensor]:
        weight = next(iter(self.weights.values()))
        return {f"out{HOSTILE}": x * weight + time.perf_counter()}


class EchoModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.echo = Echo(f"label{HOSTILE}")

    def forward(self, x: torch.Tensor, tag: str = "") -> dict[str, torch.Tensor]:
        return self.echo(x, tag=tag)


def _capture(repo: Path, module: nn.Module, target: str, name: str, *args: Any, **kwargs: Any) -> None:
    with modulelens.capture(module, targets=[target], repo=repo, name=name, tags=["nightly", f"tag{HOSTILE}"],
                            metadata={f"note{HOSTILE}": f"value{HOSTILE}"}):
        module(*args, **kwargs)


def build_repo(root: Path) -> Path:
    """A repo of captures full of hostile text (through the API, and edited as a hostile sender would)."""
    repo = root / "repo"
    tracking = modulelens.track_init()
    try:
        holder = EchoModel()
        mlp = nn.Sequential(nn.Linear(3, 3))
    finally:
        tracking.stop()
    _capture(repo, holder, "echo", "term", torch.ones(2, 3), tag=f"in{HOSTILE}")
    for _ in range(2):
        _capture(repo, mlp, "0", "term", torch.ones(2, 3))
    # what a received repo could hold that the API would never write: hostile class, qualified name,
    # host and constructor argument in the metadata, and a stray file with a hostile name
    version = repo / "names" / "term%2F0" / "versions" / "2" / "capture.json"
    meta = json.loads(version.read_text())
    meta["module"]["qualified_name"] = f"blocks{HOSTILE}"
    meta["environment"]["host"] = f"host{HOSTILE}"
    construction = meta["constructions"][meta["module"]["construction"]]
    construction["kwargs"]["device"] = f"cpu{HOSTILE}"
    version.write_text(json.dumps(meta))
    (repo / "names" / "term%2F0" / f"stray{HOSTILE}").write_text("x")
    return repo


COMMANDS = (
    ["ls"], ["ls", "--tag", f"tag{HOSTILE}"], ["ls", "--json"],
    ["show", "term/echo"], ["show", "term/0:v2"], ["show", "term/0:v2", "--json"],
    ["diff", "term/0:v1", "term/0:v2"], ["replay", "term/echo"], ["replay", "term/0:v2"], ["fsck"],
)


def raw_controls(output: bytes) -> list[str]:
    """The control characters in ``output`` that a terminal would act on (C0 but newline and tab,
    DEL, C1 as UTF-8 or as raw bytes), each as its escape."""
    text = output.decode("utf-8", errors="surrogateescape")
    found = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDC9F:  # a raw 8-bit C1 byte that is not UTF-8
            code -= 0xDC00
        if (code < 0x20 and ch not in "\n\t") or 0x7F <= code <= 0x9F:
            found.append(f"\\x{code:02x}")
    return sorted(set(found))


def hostile_terminal_row(tmp: Path, *, colour: bool = True) -> Row:
    """Every command of :data:`COMMANDS` piped, and with ``colour`` also with ``FORCE_COLOR=1``."""
    row = Row("hostile text on the terminal (ls, show, diff, replay, fsck)")
    start = time.perf_counter()
    repo = build_repo(tmp / "terminal")
    env = {**os.environ, "MODULELENS_REPO": str(repo), "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    env.pop("NO_COLOR", None)
    for command in COMMANDS:
        for colour_on in (False, True) if colour else (False,):
            row.tried += 1
            run_env = {**env, **({"FORCE_COLOR": "1", "TERM": "xterm-256color"} if colour_on else {})}
            if not colour_on:
                run_env.pop("FORCE_COLOR", None)
            done = subprocess.run([sys.executable, "-m", "modulelens", *command], capture_output=True, env=run_env,
                                  cwd=tmp, timeout=300, check=False)
            label = " ".join(command[:2]) + (" (colour)" if colour_on else "")
            if b"Traceback" not in done.stderr:
                row.survived += 1
            else:
                row.notes.append(f"{label}: traceback: {done.stderr.decode(errors='replace').strip().splitlines()[-1]}")
            output = done.stdout + done.stderr
            leaked = raw_controls(_SGR.sub(b"", output) if colour_on else output)
            if leaked:
                row.wrong += 1
                row.notes.append(f"{label}: raw {' '.join(leaked)} in the output")
    row.seconds = time.perf_counter() - start
    return row
