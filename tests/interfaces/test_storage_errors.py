"""A repo the filesystem refuses to write: every writing command is one line (or one JSON error),
``StorageError``, exit 8; reading it still works and writes nothing."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import torch
from child_process import PYTHON, subprocess_env
from torch import nn

import modulelens
from modulelens.errors import StorageError
from modulelens.interfaces._errors import as_modulelens_error, error_message

# As root, chmod alone does not stop writes: drop the capabilities that override permissions (the
# stress suite's storage row does the same).
NO_OVERRIDE = ["setpriv", "--inh-caps=-dac_override,-dac_read_search,-fowner",
               "--bounding-set=-dac_override,-dac_read_search,-fowner"] if os.geteuid() == 0 else []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM])
def test_a_refusing_filesystem_is_a_storage_error_naming_the_path(code: int) -> None:
    converted = as_modulelens_error(OSError(code, os.strerror(code), "/data/repo/blobs/ab/x"))
    assert isinstance(converted, StorageError) and converted.exit_code == 8 and converted.errno == code
    assert error_message(converted) == f"/data/repo/blobs/ab/x: {os.strerror(code)}"


@pytest.fixture
def read_only_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    repo = modulelens.Repo(root)
    module = nn.Linear(4, 4)
    with modulelens.capture(module, targets="Linear", repo=repo, name="lin") as cap:
        module(torch.randn(2, 4))
    assert cap.saved
    source = modulelens.Repo(tmp_path / "source")
    with modulelens.capture(module, targets="Linear", repo=source, name="other"):
        module(torch.randn(2, 4))
    for path in sorted(root.rglob("*"), reverse=True):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    root.chmod(0o555)
    yield root
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    shutil.rmtree(root)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NO_OVERRIDE, PYTHON, "-m", "modulelens", *args], capture_output=True, text=True,
                          env=subprocess_env(), timeout=120)


def _tree(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p): (p.lstat().st_mtime_ns, p.read_bytes() if p.is_file() else b"") for p in sorted(root.rglob("*"))}


def test_writing_commands_on_a_read_only_repo_exit_8(read_only_repo: Path) -> None:
    repo = str(read_only_repo)
    before = _tree(read_only_repo)
    source = str(read_only_repo.parent / "source")
    for args in (["alias", "lin:v1", "best"], ["rm", "lin:v1"], ["gc"], ["pull", source, "other"]):
        ran = _cli(*args, "--repo", repo, "--json")
        assert ran.returncode == 8, (args, ran.stdout, ran.stderr[-2000:])
        error = json.loads(ran.stdout)["error"]
        assert error["type"] == "StorageError" and error["exit_code"] == 8
        assert repo in error["message"] and "Permission denied" in error["message"]
        plain = _cli(*args, "--repo", repo)
        assert plain.returncode == 8 and "Traceback" not in plain.stderr
        assert len(plain.stderr.strip().splitlines()) == 1, plain.stderr
    listed = _cli("ls", "--repo", repo, "--json")
    assert listed.returncode == 0 and [r["ref"] for r in json.loads(listed.stdout)["result"]] == ["lin:v1"]
    assert _cli("fsck", "--repo", repo).returncode == 0
    assert _tree(read_only_repo) == before  # reading wrote nothing, the refused writes left nothing


def test_listing_and_loading_a_layout_1_repo_writes_nothing(tmp_path: Path) -> None:
    golden = Path(__file__).resolve().parents[1] / "format" / "golden_v1" / "repo"
    root = tmp_path / "golden"
    shutil.copytree(golden, root)
    before = _tree(root)
    repo = modulelens.Repo(root, create=False)
    assert [info.ref for info in repo.list()] == ["golden:v1"]
    modulelens.load("golden:stable", repo=repo).replay()
    assert repo.fsck().clean
    assert _tree(root) == before
