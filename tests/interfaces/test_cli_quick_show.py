"""A plain ``show`` read without the repo package (interfaces/cli/_quick_show.py, issue 37): on a
version in its plain state it prints exactly what the ``Repo`` path prints (``browse.show_capture``),
on a pipe and on a terminal, hostile strings escaped alike; anything unusual (a damaged, forged or
linked ``capture.json``, reports, edited notes, a moving alias, a running UI, options, a URL) is
declined, so that the ``Repo`` path refuses or explains as it always has."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from child_process import FRESH_CLI, PYTHON, on_terminal, subprocess_env
from modules_for_tests import DictToTuple

import modulelens
from modulelens.interfaces.cli import _quick_show, browse
from modulelens.interfaces.cli._quick_show import printer
from modulelens.interfaces.ui import discovery
from modulelens.repo import layout

HOSTILE = "\x1b]52;c;aGk=\x07\x1b[2J\x9b2J\r\u202e"
THROUGH_TYPER = "import sys\nfrom modulelens.interfaces.cli import app\napp(sys.argv[1:], prog_name='modulelens')"


@pytest.fixture(autouse=True)
def _no_ui_announced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``modulelens ui`` of anyone else's on this machine decides which path runs."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Versions as people's are: constructor arguments recorded, several calls and values, aliases,
    tags and metadata with terminal escapes in them, a removed version, a second name."""
    root = tmp_path_factory.mktemp("quick-show") / "repo"
    tracking = modulelens.track_init()
    try:
        mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(8, 2))
    finally:
        tracking.stop()
    for tags in (["nightly"], ["nightly", f"evil{HOSTILE}"], []):
        with modulelens.capture(mlp, targets=["."], repo=root, name="team/mlp", tags=tags,
                                metadata={"run": f"r{HOSTILE}", "lr": 0.1}):
            for _ in range(3):
                mlp(torch.randn(2, 4))
    ranker = DictToTuple(8)
    with modulelens.capture(ranker, targets="DictToTuple", repo=root, name="ranker/attn"):
        ranker({"q": torch.randn(3, 8), "k": torch.randn(5, 8)})
    repo = modulelens.Repo(root)
    repo.set_alias("team/mlp:v2", "golden")
    repo.set_alias("team/mlp:v2", "baseline")
    repo.remove("team/mlp:v1")
    return root


def _full_path(capsys: pytest.CaptureFixture[str], ref: str, repo: Path) -> str:
    browse.show_capture(ref, repo=str(repo))
    return capsys.readouterr().out


def _quick(capsys: pytest.CaptureFixture[str], ref: str, repo: Path) -> str | None:
    show = printer({"ref": ref, "repo": str(repo)})
    if show is None:
        return None
    assert capsys.readouterr().out == ""  # nothing printed before it is all read and checked
    show()
    return capsys.readouterr().out


def _copy(healthy: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(healthy, copy, symlinks=True)
    return copy


def test_what_it_knows_of_the_layout_is_the_repos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (_quick_show.CAPTURE_FILE, _quick_show.REPORTS, _quick_show.NOTES_FILE) == (
        layout.CAPTURE_FILE, layout.REPORTS, layout.NOTES_FILE)
    assert _quick_show.REPORT_BYTES == layout.read_limit(layout.reports_key("a", 1) + "/verify-1.json")[0]
    assert _quick_show.UI_PREFIX == discovery._PREFIX
    for runtime in (None, tmp_path / "run"):  # where discovery.py looks, with and without a runtime folder
        if runtime is not None:
            runtime.mkdir()
            monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        assert not _quick_show._ui_announced()
        discovery.discovery_dir().mkdir(parents=True, exist_ok=True)
        (discovery.discovery_dir() / f"{discovery._PREFIX}1.json").write_text("{}")
        assert _quick_show._ui_announced()


@pytest.mark.parametrize("ref", ["team/mlp", "team/mlp:latest", "team/mlp:v2", "team/mlp:v3", "team/mlp:golden",
                                 "team/mlp:baseline", "ranker/attn"])
def test_a_plain_version_shows_exactly_as_through_repo(healthy: Path, capsys: pytest.CaptureFixture[str],
                                                       ref: str) -> None:
    quick = _quick(capsys, ref, healthy)
    assert quick is not None
    assert quick == _full_path(capsys, ref, healthy)
    assert quick.splitlines()[0].startswith(ref.split(":")[0] + ":v")


@pytest.mark.parametrize("ref", ["team/mlp", "team/mlp:golden", "ranker/attn:v1"])
def test_json_is_exactly_as_through_repo(healthy: Path, capsys: pytest.CaptureFixture[str], ref: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    show = printer({"ref": ref, "repo": str(healthy), "as_json": True})
    assert show is not None
    show()
    quick = capsys.readouterr().out
    browse.show_capture(ref, repo=str(healthy), as_json=True)
    assert quick == capsys.readouterr().out
    assert json.loads(quick)["result"]["ref"].startswith(ref.split(":")[0] + ":v")
    _ui_running(healthy)  # JSON prints no browser address: a running UI changes nothing
    assert printer({"ref": ref, "repo": str(healthy), "as_json": True}) is not None


def test_what_it_shows_is_the_version_named(healthy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = _quick(capsys, "team/mlp:golden", healthy) or ""
    assert text.startswith("team/mlp:v2\naliases: baseline, golden   tags: nightly, evil\\x1b]52;c;aGk=\\x07")
    assert "constructor: Sequential(Linear(4, 8), GELU(approximate='tanh'), Linear(8, 2))" in text
    assert f"stored at: {healthy}/names/team%2Fmlp/versions/2\n" in text
    assert "metadata: run='r\\x1b]52" in text and "\x1b" not in text and "\u202e" not in text
    assert (_quick(capsys, "team/mlp", healthy) or "").startswith("team/mlp:v3\naliases: latest ")


def test_on_a_terminal_it_is_styled_and_escaped_alike(healthy: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    quick = _quick(capsys, "team/mlp:v2", healthy)
    assert quick is not None and quick.startswith("\x1b[1mteam/mlp:v2\x1b[0m\n")
    assert quick == _full_path(capsys, "team/mlp:v2", healthy)


def test_on_a_real_terminal_both_paths_print_the_same_bytes(healthy: Path, tmp_path: Path) -> None:
    """Through a pseudo-terminal: the quick path (a fresh ``python -m modulelens``) and the typer command."""
    env = subprocess_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("XDG_RUNTIME_DIR", None)
    args = ["show", "team/mlp:golden", "--repo", str(healthy)]
    quick, imports = on_terminal([PYTHON, "-X", "importtime", "-m", "modulelens", *args], env)
    through_typer, _ = on_terminal([PYTHON, "-c", THROUGH_TYPER, *args], env)
    assert b"\x1b[1mteam/mlp:v2\x1b[0m" in quick and b"\\x1b]52;c;aGk=\\x07" in quick
    assert b"modulelens.interfaces.cli._quick_show" in imports and b"modulelens.repo" not in imports  # the quick path
    assert quick == through_typer


def _capture_file(root: Path, version: int = 2) -> Path:
    return root / "names" / "team%2Fmlp" / "versions" / str(version) / "capture.json"


def _edit_document(change: Any) -> Any:
    def edit(root: Path) -> None:
        path = _capture_file(root)
        document = json.loads(path.read_bytes())
        change(document)
        path.write_text(json.dumps(document))
    edit.__name__ = change.__name__
    return edit


def _truncated(root: Path) -> None:
    path = _capture_file(root)
    path.write_bytes(path.read_bytes()[:-40])


def _emptied(root: Path) -> None:
    _capture_file(root).write_bytes(b"")


def _not_an_object(root: Path) -> None:
    _capture_file(root).write_bytes(b"[1, 2]")


def _negative_shape(document: dict[str, Any]) -> None:
    next(iter(document["tensors"].values()))["shape"] = [-1, 4]


def _unknown_dtype(document: dict[str, Any]) -> None:
    next(iter(document["tensors"].values()))["dtype"] = "float99"


def _call_without_inputs(document: dict[str, Any]) -> None:
    del document["calls"][0]["inputs"]


def _other_format(document: dict[str, Any]) -> None:
    document["format"] = "not-modulelens"


def _version_as_text(document: dict[str, Any]) -> None:
    document["format_version"] = "3"


def _linked_capture(root: Path) -> None:
    path = _capture_file(root)
    moved = path.with_name("elsewhere.json")
    path.rename(moved)
    path.symlink_to(moved)


def _missing_capture(root: Path) -> None:
    _capture_file(root).unlink()


def _linked_version_folder(root: Path) -> None:
    folder = _capture_file(root).parent
    moved = folder.with_name("moved")
    folder.rename(moved)
    folder.symlink_to(moved, target_is_directory=True)


@pytest.mark.parametrize("change", [
    _truncated, _emptied, _not_an_object, _edit_document(_negative_shape), _edit_document(_unknown_dtype),
    _edit_document(_call_without_inputs), _edit_document(_other_format), _edit_document(_version_as_text),
    _linked_capture, _missing_capture, _linked_version_folder,
], ids=lambda change: change.__name__)
def test_a_damaged_or_forged_capture_file_is_refused_as_before(healthy: Path, tmp_path: Path, change: Any) -> None:
    """Declined by the quick reader, so the whole command (``python -m modulelens show``) refuses it
    with the ``Repo`` path's error and exit code, exactly as the typer command does."""
    root = _copy(healthy, tmp_path)
    assert printer({"ref": "team/mlp:golden", "repo": str(root)}) is not None
    change(root)
    assert printer({"ref": "team/mlp:golden", "repo": str(root)}) is None
    env = subprocess_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    argv = ["show", "team/mlp:golden", "--repo", str(root)]
    direct = subprocess.run([PYTHON, "-m", "modulelens", *argv], capture_output=True, text=True, env=env, timeout=120)
    through_typer = subprocess.run([PYTHON, "-c", THROUGH_TYPER, *argv], capture_output=True, text=True, env=env,
                                   timeout=120)
    assert (direct.returncode, direct.stdout, direct.stderr) == (
        through_typer.returncode, through_typer.stdout, through_typer.stderr)
    assert direct.returncode != 0 and direct.stdout == "" and direct.stderr.startswith("error: ")


def test_an_edited_document_that_is_still_valid_shows_as_through_repo(healthy: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A ``capture.json`` changed by hand into another valid document: both paths read the same file
    and check it the same way, so both print the edit (with its odd text escaped)."""
    root = _copy(healthy, tmp_path)
    path = _capture_file(root)
    document = json.loads(path.read_bytes())
    document["tags"] = [f"forged{HOSTILE}"]
    document["module"]["class"] = f"evil.module:Class{HOSTILE}"
    path.write_text(json.dumps(document))
    quick = _quick(capsys, "team/mlp:v2", root)
    assert quick is not None and "tags: forged\\x1b]52" in quick and "Class\\x1b]52" in quick
    assert quick == _full_path(capsys, "team/mlp:v2", root)


def test_stored_reports_show_as_through_repo(healthy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _copy(healthy, tmp_path)
    repo = modulelens.Repo(root)
    for passed in (True, False):
        repo.add_report("team/mlp:v2", "verify", {"passed": passed, "note": HOSTILE})
    repo.add_report("team/mlp:v2", "profile", {"median_ms": 1.5})
    quick = _quick(capsys, "team/mlp:golden", root)
    assert quick is not None and quick.count("report: verify ") == 2 and "report: profile " in quick
    assert quick == _full_path(capsys, "team/mlp:golden", root)


def _report_file(root: Path) -> Path:
    modulelens.Repo(root).add_report("team/mlp:v2", "verify", {"passed": True})
    return next((_capture_file(root).parent / "reports").glob("*.json"))


def _damaged_report(root: Path) -> None:
    _report_file(root).write_text("{not json")


def _not_a_report(root: Path) -> None:
    _report_file(root).write_text('{"passed": "yes"}')


def _linked_report(root: Path) -> None:
    path = _report_file(root)
    moved = path.with_name("elsewhere")
    path.rename(moved)
    path.symlink_to(moved)


def _reports_not_a_folder(root: Path) -> None:
    (_capture_file(root).parent / "reports").write_text("")


def _notes(root: Path) -> None:
    modulelens.Repo(root).tag("team/mlp:v2", "edited")


def _moving_alias(root: Path) -> None:
    (root / "names" / "team%2Fmlp" / "aliases" / "golden").write_text("3")


def _torn_head(root: Path) -> None:
    path = root / "names" / "team%2Fmlp" / "summary.json"
    path.write_bytes(path.read_bytes().replace(b'"latest":3', b'"latest":2'))  # its checksum no longer matches


def _latest_not_logged(root: Path) -> None:
    """A head naming a latest version its log does not hold (as if v4 were being written)."""
    path = root / "names" / "team%2Fmlp" / "summary.json"
    head = json.loads(path.read_bytes())
    body = json.dumps({**{k: v for k, v in head.items() if k != "check"}, "latest": 4, "used": 4},
                      separators=(",", ":")).encode()[1:]
    path.write_bytes(b'{"check":"' + xxhash.xxh3_64_hexdigest(body).encode() + b'",' + body)


def _old_marker(root: Path) -> None:
    (root / "modulelens-repo.json").write_text('{"layout_version": 2}')


def _ui_running(root: Path) -> None:
    folder = discovery.discovery_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{discovery._PREFIX}{os.getpid()}.json").write_text(json.dumps({"url": "http://x", "pid": 1}))


@pytest.mark.parametrize("change", [_damaged_report, _not_a_report, _linked_report, _reports_not_a_folder,
                                    _notes, _moving_alias, _torn_head, _latest_not_logged, _old_marker, _ui_running],
                         ids=lambda change: change.__name__)
def test_anything_unusual_is_declined_to_the_repo_path(healthy: Path, tmp_path: Path, change: Any) -> None:
    root = _copy(healthy, tmp_path)
    assert printer({"ref": "team/mlp:golden", "repo": str(root)}) is not None
    change(root)
    assert printer({"ref": "team/mlp:golden", "repo": str(root)}) is None


@pytest.mark.parametrize("keywords", [
    {"ops": True}, {"show_all": True}, {"ops": True, "as_json": True},
    {"ref": "team/mlp:v1"}, {"ref": "team/mlp:v9"}, {"ref": "team/mlp:v02"}, {"ref": "team/mlp:nothing"},
    {"ref": "team/mlp:"}, {"ref": "nothing"}, {"ref": "../escape"}, {"ref": "team//mlp"}, {"ref": "team/mlp:v"},
    {"ref": "wandb://entity/project/collection:v1"}, {"repo": "s3://bucket/repo"}, {"repo": "/nonexistent/repo"},
])
def test_options_errors_and_other_repos_are_the_repo_paths(healthy: Path, keywords: dict[str, Any]) -> None:
    assert printer({"ref": "team/mlp:golden", "repo": str(healthy), **keywords}) is None


def test_a_size_limit_is_the_repo_paths(healthy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODULELENS_MAX_METADATA_MIB", "1")
    assert printer({"ref": "team/mlp", "repo": str(healthy)}) is None


def test_a_plain_show_imports_neither_the_repo_nor_typing(healthy: Path, tmp_path: Path) -> None:
    """What makes a fresh ``show`` fast (benchmarks/bench_cli.py): no repo package, no typer, no
    typing (nor the spec's TypedDicts, which need it), no difflib, no torch; the capture file still
    checked by the validator."""
    env = subprocess_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("XDG_RUNTIME_DIR", None)
    result = subprocess.run([PYTHON, "-c", FRESH_CLI, "show", "team/mlp", "--repo", str(healthy)], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("team/mlp:v3\n")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    loaded = set(report["modules"])
    assert {"modulelens.interfaces.cli._quick_show", "modulelens.format.validate"} <= loaded
    assert not loaded & {"modulelens.repo", "modulelens.format.spec", "typing", "typing_extensions", "difflib", "typer",
                         "click", "torch", "argparse"}
