"""The CLI: every command with --json, one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from child_process import PYTHON, subprocess_env
from modules_for_tests import DictToTuple

import modulelens


def cli(*args: str, check_json: bool = True) -> tuple[int, dict | None, str]:
    result = subprocess.run([PYTHON, "-m", "modulelens", *args], capture_output=True, text=True,
                            env=subprocess_env(), timeout=180)
    payload = json.loads(result.stdout) if check_json and "--json" in args else None
    return result.returncode, payload, result.stderr


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "repo"
    module = DictToTuple(8)
    for _ in range(2):
        with modulelens.capture(module, targets="DictToTuple", repo=path, name="ranker/attn"):
            module({"q": torch.randn(3, 8), "k": torch.randn(5, 8)})
    return path


def test_ls_and_show_json(populated: Path) -> None:
    code, out, _ = cli("ls", "--repo", str(populated), "--json")
    assert code == 0 and out["schema"] == "modulelens.cli/1" and out["ok"]
    assert [row["ref"] for row in out["result"]] == ["ranker/attn:v1", "ranker/attn:v2"]
    for prefix, refs in (("ranker", ["ranker/attn:v1", "ranker/attn:v2"]), ("rank", [])):  # whole segments only
        code, out, _ = cli("ls", prefix, "--repo", str(populated), "--json")
        assert code == 0 and [row["ref"] for row in out["result"]] == refs
    code, out, _ = cli("show", "ranker/attn:v1", "--repo", str(populated), "--json")
    shown = out["result"]
    assert shown["module_class"] == "modules_for_tests:DictToTuple"
    assert shown["construction"]["args"] == [8]
    assert shown["calls"][0]["inputs"][0]["shape"] == [3, 8]
    assert shown["parameter_count"] == 2 * (8 * 8 + 8)


def test_show_human_output(populated: Path) -> None:
    code, _, _ = cli("show", "ranker/attn", "--repo", str(populated))
    assert code == 0


def test_replay_json_and_exit_code(populated: Path) -> None:
    code, out, _ = cli("replay", "ranker/attn:v2", "--repo", str(populated), "--json")
    assert code == 0 and out["result"]["passed"] and out["result"]["mode"] == "bit-exact"
    code, out, _ = cli("replay", "ranker/attn:v2", "--repo", str(populated), "--dtype", "float64", "--json")
    assert code == 0 and out["result"]["mode"] == "tolerance"


def test_alias_rm_gc(populated: Path, tmp_path: Path) -> None:
    code, out, _ = cli("alias", "ranker/attn:v1", "golden", "--repo", str(populated), "--json")
    assert code == 0 and out["result"]["ref"] == "ranker/attn:v1"
    code, out, _ = cli("replay", "ranker/attn:golden", "--repo", str(populated), "--json")
    assert code == 0
    code, out, _ = cli("alias", "ranker/attn", "golden", "--delete", "--repo", str(populated), "--json")
    assert code == 0 and out["result"]["deleted"]
    code, out, _ = cli("rm", "ranker/attn:v1", "--repo", str(populated), "--json")
    assert code == 0 and out["result"]["removed"] == ["ranker/attn:v1"]
    code, out, _ = cli("gc", "--repo", str(populated), "--json")
    assert code == 0 and out["result"]["removed_blobs"] >= 1


@pytest.mark.parametrize("args, exit_code, message", [
    (["show", "nothing-here"], 2, "no capture named"),
    (["replay", "../escape"], 2, "invalid capture name"),
    (["show", "ranker/attn:v99"], 2, "has no version v99"),
    (["alias", "ranker/attn:v2", "latest"], 2, "'latest'"),
])
def test_errors_are_one_line_with_exit_codes(populated: Path, args: list[str], exit_code: int, message: str) -> None:
    code, _, stderr = cli(*args, "--repo", str(populated))
    assert code == exit_code
    assert message in stderr and "Traceback" not in stderr
    code, out, _ = cli(*args, "--repo", str(populated), "--json")
    assert code == exit_code and out["ok"] is False and message in out["error"]["message"]


def test_debug_shows_a_traceback(populated: Path) -> None:
    result = subprocess.run([PYTHON, "-m", "modulelens", "--debug", "show", "nothing", "--repo", str(populated)],
                            capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_run_without_a_command_is_an_error(tmp_path: Path) -> None:
    code, _, stderr = cli("run", "-t", "x", "--repo", str(tmp_path))
    assert code == 2 and "nothing to run" in stderr


NO_TORCH = """
import sys
from modulelens.interfaces.cli import app
for args in sys.argv[1:]:
    try:
        app(args.split())
    except SystemExit as exit:
        assert not exit.code, (args, exit.code)
print("torch imported:", "torch" in sys.modules)
"""


def test_help_version_ls_show_do_not_import_torch(populated: Path) -> None:
    repo = f"--repo {populated}"
    result = subprocess.run([PYTHON, "-c", NO_TORCH, "--help", "--version", f"ls {repo}", f"show ranker/attn {repo}",
                             f"show ranker/attn {repo} --json"],
                            capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "modulelens 0.1.0" in result.stdout and "ranker/attn:v2" in result.stdout
    assert result.stdout.strip().endswith("torch imported: False")


IMPORTED = """
import json, sys
from modulelens.interfaces.cli import app
try:
    app(sys.argv[1:])
except SystemExit as exit:
    assert not exit.code, exit.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "numpy", "pydantic", "rich", "starlette", "uvicorn",
                                                       "jinja2", "markupsafe", "matplotlib", "selenium"})
heavy += sorted(m for m in sys.modules if m.startswith("modulelens.interfaces.ui.") and m != "modulelens.interfaces.ui.discovery")
commands = sorted(m.rsplit(".", 1)[1] for m in sys.modules
                  if m.startswith("modulelens.interfaces.cli.") and not m.rsplit(".", 1)[1].startswith("_"))
print(json.dumps({"heavy": heavy, "command_modules": commands}))
"""


@pytest.mark.parametrize("args, command_modules", [
    ("--help", ["agents", "browse", "core", "kernel", "remote", "root", "tools", "ui"]),  # lists every command, builds none
    ("--version", ["root"]),
    ("ls", ["browse", "core", "root"]),
    ("show ranker/attn", ["browse", "core", "root"]),
    ("show ranker/attn --json", ["browse", "core", "root"]),
])
def test_fast_commands_import_only_what_they_use(populated: Path, args: str, command_modules: list[str]) -> None:
    """Issue 14: --help, --version, ls and show start without torch, numpy, pydantic (typer's
    coercion of plain strings) or rich (plain text and JSON), importing only their command module;
    issue 26: nor the web UI's stack (starlette, uvicorn, jinja2) or its modules (show reads only
    the running servers' announcements, modulelens.interfaces.ui.discovery)."""
    argv = [*args.split(), *(["--repo", str(populated)] if args.startswith(("ls", "show")) else [])]
    result = subprocess.run([PYTHON, "-c", IMPORTED, *argv], capture_output=True, text=True,
                            env=subprocess_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    imported = json.loads(result.stdout.strip().splitlines()[-1])
    assert imported == {"heavy": [], "command_modules": command_modules}


def test_help_lists_every_command_and_each_resolves() -> None:
    import typer

    from modulelens.interfaces.cli import app

    group = typer.main.get_command(app)
    names = group.list_commands(None)
    assert {"ls", "show", "replay", "gc", "profile", "verify", "export", "push", "kernel", "agent", "ui", "report"} <= set(names)
    result = subprocess.run([PYTHON, "-m", "modulelens", "--help"], capture_output=True, text=True,
                            env=subprocess_env(), timeout=120)
    listed = result.stdout.split("Commands:", 1)[1]
    for name in names:
        command = group.get_command(None, name)
        assert command is not None and command.name == name
        assert f"\n  {name} " in listed, name
    assert group.get_command(None, "no-such-command") is None
    typo = subprocess.run([PYTHON, "-m", "modulelens", "lss"], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120)
    assert typo.returncode == 2 and "No such command 'lss'. Did you mean 'ls'?" in typo.stderr


def test_ls_on_a_narrow_terminal_drops_columns_not_the_ref(tmp_path: Path) -> None:
    import os
    import pty

    repo = tmp_path / "repo"
    module = DictToTuple(4)
    long_name = "a-rather-long-project-name/with/a/nested/module"
    with modulelens.capture(module, targets="DictToTuple", repo=repo, name=long_name):
        module({"q": torch.randn(2, 4), "k": torch.randn(3, 4)})
    ref = f"{long_name}:v1"
    main, terminal = pty.openpty()  # a real terminal: ls fits its columns to the width
    try:
        result = subprocess.run([PYTHON, "-m", "modulelens", "ls", "--repo", str(repo)], stdout=terminal,
                                stderr=subprocess.PIPE, env={**subprocess_env(), "COLUMNS": "80"}, timeout=120)
        os.close(terminal)
        output = b""
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the terminal's other end is closed: everything was read
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(main)
    lines = output.decode().replace("\x1b[1m", "").replace("\x1b[0m", "").splitlines()
    assert result.returncode == 0, result.stderr
    [row] = [line for line in lines if line.startswith(ref)]
    header = lines[lines.index(row) - 1]
    assert header.split() == ["ref", "aliases", "module", "class", "calls"] and len(row) <= 80  # tags... dropped
    assert row.split()[:2] == [ref, "latest"]


def test_did_you_mean_bad_dtype_and_missing_device(populated: Path) -> None:
    code, out, _ = cli("show", "ranker/atn", "--repo", str(populated), "--json")
    assert code == 2 and out["error"]["message"].endswith("did you mean: ranker/attn?")
    code, out, _ = cli("replay", "ranker/attn", "--dtype", "float33", "--repo", str(populated), "--json")
    assert code == 2 and out["error"]["type"] == "UsageError" and "unknown dtype 'float33'" in out["error"]["message"]
    code, _, stderr = cli("replay", "ranker/attn", "--device", "cuda:99", "--repo", str(populated))
    assert code == 2 and stderr.startswith("error: device 'cuda:99': ") and stderr.count("\n") == 1


def test_rm_asks_before_removing_an_aliased_version(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    module = DictToTuple(4)
    with modulelens.capture(module, targets="DictToTuple", repo=repo, name="m"):
        module({"q": torch.randn(2, 4), "k": torch.randn(3, 4)})
    name = modulelens.Repo(repo).names()[0]
    modulelens.Repo(repo).set_alias(f"{name}:v1", "golden")
    code, out, _ = cli("rm", f"{name}:golden", "--repo", str(repo), "--json")
    assert code == 2 and "is golden" in out["error"]["message"] and "--yes" in out["error"]["message"]
    assert modulelens.Repo(repo).version_numbers(name) == [1]
    code, out, _ = cli("rm", f"{name}:golden", "--yes", "--repo", str(repo), "--json")
    assert code == 0 and out["result"]["removed"] == [f"{name}:v1"]


MISSING = """
import sys
sys.modules[sys.argv[1]] = None  # this interpreter has no such package: `import` raises ModuleNotFoundError
from modulelens.interfaces.cli import main
sys.argv = ["modulelens", *sys.argv[2:]]
main()
"""


@pytest.mark.parametrize("package, args, message", [
    ("IPython", ["shell", "ranker/attn"], "error: modulelens shell needs IPython"),
    ("mcp", ["mcp"], "error: the MCP server needs the mcp package: pip install 'modulelens[agents]'"),
    ("starlette", ["ui", "--no-open"], "error: modulelens ui needs starlette: pip install 'modulelens[ui]'"),
    ("jinja2", ["report", "ranker/attn", "-o", "x.html"], "error: modulelens report needs jinja2: pip install 'modulelens[ui]'"),
])
def test_a_missing_optional_package_is_one_line(populated: Path, package: str, args: list[str], message: str) -> None:
    result = subprocess.run([PYTHON, "-c", MISSING, package, *args, "--repo", str(populated)], capture_output=True,
                            text=True, env=subprocess_env(), timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 1 and result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_ls_never_cuts_a_ref(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    module = DictToTuple(4)
    long_name = "a-rather-long-project-name/with/a/deeply/nested/module"
    with modulelens.capture(module, targets="DictToTuple", repo=repo, name=long_name):
        module({"q": torch.randn(2, 4), "k": torch.randn(3, 4)})
    ref = f"{modulelens.Repo(repo).names()[0]}:v1"
    for columns in ("40", "80"):
        result = subprocess.run([PYTHON, "-m", "modulelens", "ls", "--repo", str(repo)], capture_output=True,
                                text=True, env={**subprocess_env(), "COLUMNS": columns}, timeout=120)
        assert result.returncode == 0 and ref in result.stdout, result.stdout
