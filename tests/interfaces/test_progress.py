"""Long commands say what they are doing on a terminal, and nothing extra with --json or a pipe (issue 23)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest
import torch
from child_process import PYTHON, subprocess_env

import modulelens


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("progress") / "repo"
    tracking = modulelens.track_init()
    try:
        module = torch.nn.Linear(4, 4)
    finally:
        tracking.stop()
    with modulelens.capture(module, targets=["."], repo=root, name="lin"):
        module(torch.randn(2, 4))
    return root


def _stderr_on_a_terminal(*args: str) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal (stdout a pipe); returns (code, stdout, terminal text)."""
    main, side = pty.openpty()
    process = subprocess.Popen([PYTHON, "-m", "modulelens", *args], stdout=subprocess.PIPE, stderr=side,
                               env=subprocess_env(COLUMNS="120", TERM="xterm"))
    os.close(side)
    seen = b""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        elif process.poll() is not None:
            break
    out = process.stdout.read().decode() if process.stdout else ""
    code = process.wait(timeout=60)
    os.close(main)
    return code, out, seen.decode(errors="replace")


def test_replay_shows_its_steps_on_a_terminal_only(repo: Path) -> None:
    code, out, terminal = _stderr_on_a_terminal("replay", "lin", "--repo", str(repo))
    assert code == 0 and "PASS" in out
    assert "loading lin: importing torch" in terminal and "replaying the 1 recorded call(s) of lin:v1" in terminal
    piped = subprocess.run([PYTHON, "-m", "modulelens", "replay", "lin", "--repo", str(repo)], capture_output=True,
                           text=True, env=subprocess_env(), timeout=240)
    assert piped.returncode == 0 and piped.stderr == ""
    code, out, terminal = _stderr_on_a_terminal("replay", "lin", "--repo", str(repo), "--json")
    assert code == 0 and out.startswith("{") and "loading" not in terminal
