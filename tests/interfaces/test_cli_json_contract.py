"""docs/cli-json.md covers every command; the envelope and exit codes behave as documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import agents_support as support
import pytest
import typer
from typer.testing import CliRunner

from modulelens.interfaces.cli import app
from modulelens.interfaces.output import JSON_SCHEMA

DOC = (support.WORKTREE / "docs" / "cli-json.md").read_text()
TOOL_COMMANDS = {"profile", "verify", "diff", "export", "kernel"}  # documented in docs/tools.md, docs/kernels.md


def command_names() -> set[str]:
    """Every command of the assembled CLI, groups as ``"kernel verify"``."""
    root = typer.main.get_command(app)  # commands are found on demand: ask the group, as click does
    names = set()
    for name in root.list_commands(None):  # type: ignore[attr-defined]
        sub = getattr(root.get_command(None, name), "commands", None)  # type: ignore[attr-defined]
        names |= {f"{name} {s}" for s in sub} if sub else {name}
    return names


def test_every_command_is_documented() -> None:
    names = command_names()
    assert {"ls", "show", "replay", "alias", "rm", "gc", "run", "demo", "shell", "mcp", "agent install"} <= names
    documented = set(re.findall(r"^### `([a-z]+(?: [a-z]+)?)", DOC, re.M))
    missing = {n for n in names if n.split()[0] not in TOOL_COMMANDS and n not in documented}
    assert not missing, f"commands missing from docs/cli-json.md: {missing}"
    assert JSON_SCHEMA in DOC
    for code in ("| 1 |", "| 2 |", "| 3 |", "| 4 |", "| 5 |"):
        assert code in DOC


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return support.make_repo(tmp_path_factory.mktemp("repo"))


@pytest.mark.parametrize(("args", "code", "error_type"), [
    (["show", "toy/nope"], 2, "CaptureNotFoundError"),
    (["show", "Bad Name!"], 2, "InvalidNameError"),
    (["replay", "toy/gate:v9"], 2, "CaptureNotFoundError"),
])
def test_error_envelope_and_exit_codes(repo: Path, args: list[str], code: int, error_type: str) -> None:
    result = CliRunner().invoke(app, [*args, "--repo", str(repo), "--json"])
    assert result.exit_code == code
    envelope = json.loads(result.stdout)
    assert envelope == {"schema": JSON_SCHEMA, "command": args[0], "ok": False,
                        "error": {"type": error_type, "message": envelope["error"]["message"], "exit_code": code}}


def test_result_envelopes(repo: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["ls", "--repo", str(repo), "--json"])
    envelope = json.loads(result.stdout)
    assert envelope["ok"] and {"name", "version", "ref", "path", "created", "tags", "aliases", "payload_bytes",
                               "module_class", "calls", "problem"} == set(envelope["result"][0])
    result = runner.invoke(app, ["replay", "toy/gate", "--repo", str(repo), "--json"])
    assert result.exit_code == 0
    replay = json.loads(result.stdout)["result"]
    assert {"ref", "passed", "status", "unverified", "mode", "device", "dtype", "weights", "notes",
            "calls"} == set(replay)
    assert {"call", "index", "passed", "status", "error", "unverified", "seconds", "leaves", "grad_leaves",
            "divergence"} == set(replay["calls"][0])
    assert replay["status"] == "PASS" and replay["unverified"] == [] == replay["calls"][0]["unverified"]
    assert replay["calls"][0]["divergence"] is None  # a passing call (docs/cli-json.md, "Divergence")
