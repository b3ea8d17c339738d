"""The direct path of ``ls`` and ``show`` (issue 37: a fresh ``modulelens ls`` within 1.5x of plain
Python printing the index): a plain command line runs without typer, prints exactly what the typer
command prints, and declines every command line that is typer's to answer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import typer
from child_process import FRESH_CLI, PYTHON, subprocess_env
from modules_for_tests import DictToTuple

import modulelens
from modulelens.interfaces.cli import app
from modulelens.interfaces.cli._direct import COMMANDS, parse


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli-direct") / "repo"
    module = DictToTuple(8)
    for tag in ("first", "second"):
        with modulelens.capture(module, targets="DictToTuple", repo=path, name="ranker/attn", tags=[tag]):
            module({"q": torch.randn(3, 8), "k": torch.randn(5, 8)})
    return path


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_direct_table_matches_the_typer_command(name: str) -> None:
    """Every option and argument of the typer command, and nothing else, in the direct path's table
    (a new option on ``ls`` without a row here would send that command line to typer: still right,
    but slow; a row typer lacks would accept what typer refuses)."""
    command = typer.main.get_command(app).get_command(None, name)  # type: ignore[attr-defined]
    options, positionals, required = COMMANDS[name]
    typer_options = {}
    typer_arguments = []
    for param in command.params:
        if param.param_type_name == "argument":
            typer_arguments.append((param.name, param.required))
            continue
        takes = "flag" if param.is_flag else "values" if param.multiple else "value"
        for spelling in [*param.opts, *param.secondary_opts]:
            typer_options[spelling] = (param.name, takes)
    typer_options.pop("--help", None)  # declined by the direct path: typer prints the help
    assert typer_options == options
    assert typer_arguments == [(keyword, index < required) for index, keyword in enumerate(positionals)]


@pytest.mark.parametrize("argv", [
    ["ls", "--help"], ["ls", "-h"], ["show"], ["show", "a", "b"], ["ls", "a", "b"], ["ls", "--repo"],
    ["ls", "--json=yes"], ["ls", "--", "x"], ["ls", "--no-such-option"], ["ls", "-1"], ["ls", "--rep", "r"],
    ["--debug", "ls"], ["replay", "x"], ["lss"], [],
])
def test_the_direct_path_declines_what_typer_answers(argv: list[str]) -> None:
    assert parse(argv) is None


def test_the_direct_path_reads_options_as_click_does() -> None:
    assert parse(["ls", "team/", "--tag", "a", "--tag=b", "--repo", "r", "--json", "--sort=created"]) == (
        "ls", {"name": "team/", "tag": ["a", "b"], "repo": "r", "as_json": True, "sort": "created"})
    assert parse(["ls", "--repo", "--json"]) is None  # click takes `--json` as the value: typer runs it, as click reads it
    assert parse(["show", "--all", "m:v2", "--ops", "--json", "--repo", "r1", "--repo", "r2"]) == (
        "show", {"show_all": True, "ref": "m:v2", "ops": True, "as_json": True, "repo": "r2"})  # the last one wins


_HEAVY = {"torch", "numpy", "typer", "click", "rich", "pydantic"}


def _heavy(report_line: str) -> dict[str, object]:
    """The exit code and the heavy packages a FRESH_CLI run imported, from its last line."""
    report = json.loads(report_line)
    return {"code": report["code"], "heavy": sorted({m.split(".")[0] for m in report["modules"]} & _HEAVY)}


@pytest.mark.parametrize("args", ["ls", "ls ranker --tag second --sort created", "ls --json", "show ranker/attn",
                                  "show ranker/attn:v1 --json --all"])
def test_ls_and_show_in_a_fresh_process_import_no_torch_and_no_typer(populated: Path, args: str) -> None:
    result = subprocess.run([PYTHON, "-c", FRESH_CLI, *args.split(), "--repo", str(populated)], capture_output=True,
                            text=True, env=subprocess_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ranker/attn:v" in result.stdout
    assert _heavy(result.stdout.strip().splitlines()[-1]) == {"code": 0, "heavy": []}


THROUGH_TYPER = """
import sys
from modulelens.interfaces.cli import app
app(sys.argv[1:], prog_name="modulelens")
"""


@pytest.mark.parametrize("args", [
    "ls", "ls ranker", "ls rank", "ls --tag second", "ls --class DictToTuple --sort size", "ls --since 2d --json",
    "ls --sort nonsense", "ls --since yesterday-ish --json", "show ranker/attn", "show ranker/attn:v1 --all --ops",
    "show ranker/attn --json", "show nothing-here", "show nothing-here --json", "show ../escape",
])
def test_the_direct_path_prints_what_the_typer_command_prints(populated: Path, args: str) -> None:
    """The same stdout, stderr and exit code from ``python -m modulelens`` (the direct path) and from
    the typer app, for listings, JSON, and one-line errors."""
    argv = [*args.split(), "--repo", str(populated)]
    direct = subprocess.run([PYTHON, "-m", "modulelens", *argv], capture_output=True, text=True,
                            env=subprocess_env(), timeout=120)
    assert parse(argv) is not None
    through_typer = subprocess.run([PYTHON, "-c", THROUGH_TYPER, *argv], capture_output=True, text=True,
                                   env=subprocess_env(), timeout=120)
    assert (direct.returncode, direct.stdout, direct.stderr) == (
        through_typer.returncode, through_typer.stdout, through_typer.stderr)
    assert direct.stdout or direct.stderr


def test_version_alone_is_answered_without_typer() -> None:
    """``modulelens --version`` prints what the root callback prints, importing no typer; with
    anything beside it, typer answers."""
    direct = subprocess.run([PYTHON, "-c", FRESH_CLI, "--version"], capture_output=True, text=True, env=subprocess_env(),
                            timeout=120)
    through_typer = subprocess.run([PYTHON, "-c", THROUGH_TYPER, "--version"], capture_output=True, text=True,
                                   env=subprocess_env(), timeout=120)
    version_line, report = direct.stdout.splitlines()
    assert (version_line + "\n", through_typer.stdout, through_typer.returncode) == (
        f"modulelens {modulelens.__version__}\n", f"modulelens {modulelens.__version__}\n", 0)
    assert _heavy(report) == {"code": 0, "heavy": []}
    assert parse(["--version", "ls"]) is None


@pytest.mark.parametrize("through_typer", [False, True])
def test_a_reader_that_left_the_pipe_ends_ls_quietly(populated: Path, through_typer: bool) -> None:
    """``modulelens ls | head`` after head left: exit 1 and nothing on stderr (no traceback, no
    "Exception ignored" at the interpreter's last flush), on both paths."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        launcher = [PYTHON, "-c", THROUGH_TYPER] if through_typer else [PYTHON, "-m", "modulelens"]
        result = subprocess.run([*launcher, "ls", "--repo", str(populated)], stdout=write_end, stderr=subprocess.PIPE,
                                text=True, env=subprocess_env(), timeout=120)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (1, "")
