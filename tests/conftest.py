from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import modulelens

# The support modules (models, workers, helpers) are imported by their own top-level names, as the
# captures made in the tests record class paths like ``tools_models:MLP``; child processes get the
# same path from ``child_process.subprocess_env``.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

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
