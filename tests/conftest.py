from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import modulelens

TESTS_DIR = Path(__file__).parent
REPO_ROOT = TESTS_DIR.parent

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _tracking():
    """Constructor tracking on for the whole test session, as `modulelens run` would do."""
    handle = modulelens.track_init()
    yield
    handle.stop()


@pytest.fixture
def repo(tmp_path: Path) -> modulelens.Repo:
    return modulelens.Repo(tmp_path / "repo")


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: this checkout and the test helpers importable."""
    env = dict(os.environ)
    paths = [str(REPO_ROOT), str(TESTS_DIR)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


PYTHON = sys.executable
