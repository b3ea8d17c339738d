"""``ls`` read straight from a local repo's index files (interfaces/cli/_quick_ls.py, issue 37): on a
repo in its plain state it prints exactly what the ``Repo`` path prints (``browse.list_captures``),
and on anything unusual (damaged, forged, a write in progress, edited notes, links, odd text, a
terminal, a URL) it declines, so that the ``Repo`` path answers as it always has."""

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
from torch import nn

import modulelens
from modulelens.interfaces import output
from modulelens.interfaces.cli import _quick_ls, browse
from modulelens.interfaces.cli._quick_ls import listing_text
from modulelens.repo import index, layout, names


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repo as people's repos are: several names, aliases, tags, a removed version (an ``rm``
    line in its log), a version of a name saved after another name's."""
    path = tmp_path_factory.mktemp("quick-ls") / "repo"
    module = nn.Linear(4, 3)
    for name, tags in (("team/mlp", ["nightly"]), ("team/mlp", ["nightly", "b"]), ("team/mlp", []),
                       ("other", ["x"]), ("team/mlp2", ["y"])):
        with modulelens.capture(module, targets="Linear", repo=path, name=name, tags=tags):
            module(torch.randn(2, 4))
    repo = modulelens.Repo(path)
    repo.set_alias("team/mlp:v1", "golden")
    repo.set_alias("team/mlp:v1", "baseline")
    repo.remove("team/mlp:v2")
    return path


def _full_path(capsys: pytest.CaptureFixture[str], **keywords: Any) -> str:
    browse.list_captures(**keywords)
    return capsys.readouterr().out


def _copy(healthy: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(healthy, copy, symlinks=True)
    return copy


def test_what_it_knows_of_the_layout_is_the_repos() -> None:
    assert _quick_ls.LAYOUT_VERSION == layout.LAYOUT_VERSION
    assert (_quick_ls.MARKER, _quick_ls.SUMMARY_FILE, _quick_ls.NOTES_FILE) == (
        layout.MARKER, layout.SUMMARY_FILE, layout.NOTES_FILE)
    assert _quick_ls.HEAD_FORMAT == index.FORMAT
    assert _quick_ls.MAX_VERSION == layout.MAX_VERSION
    assert _quick_ls.MARKER_BYTES == layout.read_limit(layout.MARKER)[0]
    assert _quick_ls.METADATA_BYTES == layout.max_metadata_bytes()
    assert _quick_ls.JSON_SCHEMA == output.JSON_SCHEMA
    assert _quick_ls.LATEST == names.LATEST


@pytest.mark.parametrize("keywords", [
    {}, {"as_json": True}, {"name": "team"}, {"name": "team/"}, {"name": "team/mlp"}, {"name": "team/mlp", "as_json": True},
    {"name": "nothing"}, {"name": ""}, {"sort": "name"},
])
def test_a_plain_repo_lists_exactly_as_through_repo(healthy: Path, capsys: pytest.CaptureFixture[str],
                                                    keywords: dict[str, Any]) -> None:
    keywords = {**keywords, "repo": str(healthy)}
    quick = listing_text(keywords)
    assert quick is not None
    assert quick == _full_path(capsys, **keywords)


def test_the_listing_holds_what_the_repo_holds(healthy: Path) -> None:
    text = listing_text({"repo": str(healthy)})
    assert text is not None
    lines = text.splitlines()
    assert lines[0] == f"captures in {healthy}"
    assert [line.split()[0] for line in lines[2:]] == ["other:v1", "team/mlp:v1", "team/mlp:v3", "team/mlp2:v1"]
    assert "baseline, golden" in lines[3] and "latest" in lines[4]
    rows = json.loads(listing_text({"repo": str(healthy), "as_json": True}) or "")["result"]
    assert rows == [info.to_dict() for info in sorted(modulelens.Repo(healthy).list(), key=lambda i: (i.name, i.version))]


def test_an_empty_repo_and_the_default_repo(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    modulelens.Repo(empty)
    assert listing_text({"repo": str(empty)}) == _full_path(capsys, repo=str(empty)) == f"no captures in {empty}\n"
    monkeypatch.setenv("MODULELENS_REPO", str(empty))
    assert listing_text({}) == _full_path(capsys) == f"no captures in {empty}\n"


@pytest.mark.parametrize("spelling", ["repo", "./repo", "repo/", "./repo/.", ".//repo//", "sub/../repo", "~/repo",
                                      "~", "", ".", "///abs//x/", "/abs/./x", "a/~/b", "./~/x"])
def test_the_location_is_the_one_repo_names(spelling: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _quick_ls.repo_directory(spelling) == str(Path(spelling).expanduser().absolute())


@pytest.mark.parametrize("spelling", ["//net/x", "s3://bucket/x", "memory://x", "file:///tmp/x"])
def test_urls_and_a_leading_double_slash_are_declined(spelling: str) -> None:
    with pytest.raises(_quick_ls.DeclinedError):
        _quick_ls.repo_directory(spelling)


@pytest.mark.parametrize("quoted", ["a", "team%2Fmlp", "_blocks%2F0", "a.b-c_d", "x" * 128, "A9%2Fb%2Fc"])
def test_a_name_it_accepts_is_the_name_the_repo_reads(quoted: str) -> None:
    assert _quick_ls.capture_name(quoted) == layout.unquote_name(quoted)


@pytest.mark.parametrize("quoted", ["", ".hidden", "-x", "a%2F", "%2Fa", "a%2F%2Fb", "a%20b", "a b", "x" * 129,
                                    "ü", "a%2F..", "tëam", "a%2e"])
def test_a_folder_that_may_not_be_a_name_is_declined(quoted: str) -> None:
    with pytest.raises(_quick_ls.DeclinedError):
        _quick_ls.capture_name(quoted)


def _head(root: Path, name: str) -> tuple[Path, dict[str, Any]]:
    path = root / "names" / name.replace("/", "%2F") / "summary.json"
    raw = path.read_bytes()
    return path, json.loads(raw)


def _write_head(path: Path, head: dict[str, Any]) -> None:
    """A head with a right checksum (so only its fields can make it unusable)."""
    body = json.dumps({k: v for k, v in head.items() if k != "check"}, separators=(",", ":")).encode()[1:]
    path.write_bytes(b'{"check":"' + xxhash.xxh3_64_hexdigest(body).encode() + b'",' + body)


def _forge(**fields: Any) -> Any:
    def change(root: Path) -> None:
        path, head = _head(root, "team/mlp")
        _write_head(path, {**head, **fields})
    return change


def _torn_head(root: Path) -> None:
    path, _ = _head(root, "team/mlp")
    path.write_bytes(path.read_bytes().replace(b'"latest":3', b'"latest":1'))  # checksum no longer matches


def _short_log(root: Path) -> None:
    path, head = _head(root, "team/mlp")
    _write_head(path, {**head, "log_bytes": head["log_bytes"] + 10})


def _log_line(line: bytes) -> Any:
    def change(root: Path) -> None:
        path, head = _head(root, "team/mlp")
        log = path.parent / f"summary-{head['log']}.log"
        data = log.read_bytes()[:head["log_bytes"]] + line + b"\n"
        log.write_bytes(data)
        _write_head(path, {**head, "log_bytes": len(data)})
    return change


def _linked_head(root: Path) -> None:
    path, _ = _head(root, "team/mlp")
    moved = path.with_name("elsewhere.json")
    path.rename(moved)
    path.symlink_to(moved)


def _no_head(root: Path) -> None:
    _head(root, "team/mlp")[0].unlink()


def _notes(root: Path) -> None:
    modulelens.Repo(root).tag("team/mlp:v1", "edited")


def _bad_folder(root: Path) -> None:
    (root / "names" / "not%20a%20name" / "versions").mkdir(parents=True)


def _old_marker(root: Path) -> None:
    (root / "modulelens-repo.json").write_text('{"layout_version": 2}')


def _odd_tag(root: Path) -> None:
    _log_line(b'{"v":3,"created":"","tags":["\\u001b]52;c;aGk=\\u0007"],"nbytes":0,"module_class":"m:C",'
              b'"calls":0,"blobs":[]}')(root)


def _reserved(root: Path) -> None:
    path, head = _head(root, "team/mlp")
    _write_head(path, {**head, "used": 4, "reserved": {"4": {"by": "host:1:x", "at": 0.0}}})


@pytest.mark.parametrize("change", [
    _torn_head, _forge(used=10**30), _forge(latest=99), _forge(aliases={"golden": 99}), _forge(aliases={"golden": "1"}),
    _forge(summary=1), _forge(log_bytes=True), _forge(removing=[1]), _forge(changing={"golden": {"by": "x"}}),
    _reserved, _short_log, _log_line(b"not json"), _log_line(b"[1]"), _log_line(b'{"v":[1]}'), _log_line(b'{"v":99}'),
    _log_line(b'{"x":1}'), _log_line(b'{"v":3,"created":"","tags":"a","nbytes":0,"blobs":[]}'),
    _log_line(b'{"v":3,"created":"","tags":[],"nbytes":1.5,"blobs":[]}'), _log_line(b'{"v":3,"tags":[]}'),
    _linked_head, _no_head, _notes, _bad_folder, _old_marker, _odd_tag,
], ids=lambda change: getattr(change, "__name__", "forged"))
def test_anything_unusual_is_declined_to_the_repo_path(healthy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       change: Any) -> None:
    root = _copy(healthy, tmp_path)
    assert listing_text({"repo": str(root)}) is not None
    change(root)
    assert listing_text({"repo": str(root)}) is None
    # JSON escapes every control character itself (output.py): only odd text is listed as it is
    as_json = listing_text({"repo": str(root), "as_json": True})
    assert as_json is None if change is not _odd_tag else as_json == _full_path(capsys, repo=str(root), as_json=True)


@pytest.mark.parametrize("keywords", [{"class_": "Linear"}, {"tag": ["x"]}, {"since": "2d"}, {"sort": "size"}])
def test_filters_and_orders_are_the_repo_paths(healthy: Path, keywords: dict[str, Any]) -> None:
    assert listing_text({**keywords, "repo": str(healthy)}) is None


def test_a_size_limit_and_a_missing_repo_are_the_repo_paths(healthy: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert listing_text({"repo": str(tmp_path / "nothing")}) is None  # Repo says there is no repo there
    monkeypatch.setenv("MODULELENS_MAX_METADATA_MIB", "1")
    assert listing_text({"repo": str(healthy)}) is None


@pytest.mark.parametrize("columns", ["200", "60", "30", "5"])
def test_on_a_terminal_the_columns_fit_and_the_header_is_bold(healthy: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch, columns: str) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    quick = listing_text({"repo": str(healthy)})
    assert quick is not None and "\x1b[1mref" in quick
    assert quick == _full_path(capsys, repo=str(healthy))


@pytest.mark.parametrize("columns", [200, 40])
def test_on_a_real_terminal_both_paths_print_the_same_bytes(healthy: Path, columns: int) -> None:
    """Through a pseudo-terminal of ``columns`` columns: the quick path and the typer command."""
    args = ["ls", "--repo", str(healthy)]
    quick, imports = on_terminal([PYTHON, "-X", "importtime", "-m", "modulelens", *args], subprocess_env(), columns)
    through_typer, _ = on_terminal([PYTHON, "-c", "import sys\nfrom modulelens.interfaces.cli import app\n"
                                    "app(sys.argv[1:], prog_name='modulelens')", *args], subprocess_env(), columns)
    assert b"\x1b[1mref" in quick and b"team/mlp:v3" in quick
    assert b"modulelens.interfaces.cli._quick_ls" in imports and b"modulelens.repo" not in imports  # the quick path
    assert quick == through_typer




def test_a_plain_ls_imports_neither_the_repo_nor_typing(healthy: Path) -> None:
    """What makes a fresh ``ls`` fast (benchmarks/bench_cli.py): no repo package, no typing, no
    argparse, no pathlib of its own (an editable install's finder may import pathlib at startup)."""
    result = subprocess.run([PYTHON, "-c", FRESH_CLI, "ls", "--repo", str(healthy)], capture_output=True, text=True,
                            env=subprocess_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "team/mlp:v3" in result.stdout
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    loaded = set(report["modules"])
    assert not loaded & {"modulelens.repo", "typing", "argparse", "dataclasses", "modulelens.interfaces.output"}


def test_a_declined_listing_still_prints_what_repo_prints(healthy: Path, tmp_path: Path) -> None:
    """The whole command on a repo the quick reader declines (a torn head): the ``Repo`` path's
    listing, as through typer."""
    root = _copy(healthy, tmp_path)
    _torn_head(root)
    direct = subprocess.run([PYTHON, "-m", "modulelens", "ls", "--repo", str(root)], capture_output=True, text=True,
                            env=subprocess_env(), timeout=120)
    through_typer = subprocess.run([PYTHON, "-c", "import sys\nfrom modulelens.interfaces.cli import app\n"
                                    "app(sys.argv[1:], prog_name='modulelens')", "ls", "--repo", str(root)],
                                   capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert (direct.returncode, direct.stdout, direct.stderr) == (
        through_typer.returncode, through_typer.stdout, through_typer.stderr)
    assert "team/mlp:v3" in direct.stdout
    assert os.path.exists(root / "names" / "team%2Fmlp" / "summary.json")
