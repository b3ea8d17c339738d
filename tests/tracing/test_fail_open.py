"""Storage failures during capture never break the job (docs/security.md, "Fail-open").

Each test runs a real training job in a child process against a repo the filesystem refuses:
read-only / permission denied (as root, with the capability that overrides permissions dropped,
so the bits apply), or disk full (``RLIMIT_FSIZE``: every write past the limit fails with EFBIG).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.child_process import PYTHON, SUPPORT_DIR, subprocess_env

import modulelens

NO_DAC_OVERRIDE = ["setpriv", "--inh-caps=-dac_override,-dac_read_search,-fowner",
                   "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def run_job(repo: Path, tmp: Path, *, file_size_limit: int | None = None) -> dict[str, Any]:
    def limit() -> None:
        if file_size_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    prefix = NO_DAC_OVERRIDE if os.geteuid() == 0 else []
    env = subprocess_env(TMPDIR=str(tmp))
    ran = subprocess.run([*prefix, PYTHON, str(SUPPORT_DIR / "fail_open_job.py"), str(repo)], env=env,
                         capture_output=True, text=True, timeout=180, preexec_fn=limit)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.strip().splitlines()[-1])


@pytest.fixture
def temp_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tmp"
    folder.mkdir()
    return folder


def test_read_only_repo_falls_back_and_the_job_finishes(tmp_path: Path, temp_dir: Path) -> None:
    repo = modulelens.Repo(tmp_path / "repo")
    for folder in (repo.root, *repo.root.iterdir()):
        if folder.is_dir():
            folder.chmod(0o555)
    try:
        out = run_job(repo.root, temp_dir)
    finally:
        for folder in (repo.root, *repo.root.iterdir()):
            folder.chmod(0o755)
    assert out["steps"] == 6
    [warning] = [w for w in out["warnings"] if "cannot write captures" in w]
    assert "permission denied" in warning and "modulelens push" in warning
    fallback = Path(out["paths"][0]).parents[3]
    assert fallback.parent == temp_dir and repo.list() == []
    cap = modulelens.load(out["saved"][0], repo=fallback)  # complete, loadable captures
    assert len(cap.calls) == 2 and cap.replay().passed


def test_permission_denied_on_a_missing_repo_falls_back(tmp_path: Path, temp_dir: Path) -> None:
    parent = tmp_path / "locked"
    parent.mkdir(mode=0o555)
    out = run_job(parent / "repo", temp_dir)
    assert out["steps"] == 6 and len(out["saved"]) == 2
    assert any("permission denied" in w for w in out["warnings"])


def test_disk_full_keeps_the_job_running_and_the_records_in_memory(tmp_path: Path, temp_dir: Path) -> None:
    out = run_job(tmp_path / "repo", temp_dir, file_size_limit=4096)  # payloads of 16 KiB cannot be written
    assert out["steps"] == 6
    assert out["records"] == ["0", "2"] and out["saved"] == []
    warnings = " | ".join(out["warnings"])
    assert "file too large" in warnings and "kept in memory" in warnings


def test_strict_raises_a_storage_error(tmp_path: Path) -> None:
    import torch

    parent = tmp_path / "locked"
    parent.mkdir()
    (parent / "repo").write_text("a file where the repo should be")
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(modulelens.StorageError, match="cannot write captures"), \
            modulelens.capture(model, targets=["0"], repo=parent / "repo", strict=True):
        model(torch.randn(1, 2))
