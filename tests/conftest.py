from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import modulelens

# The support modules (models, workers, helpers) are imported by their own top-level names, as the
# captures made in the tests record class paths like ``tools_models:MLP``; child processes get the
# same path from ``child_process.subprocess_env``. The distributed tests use the example's model
# (``examples/distributed/shardnet.py``, recorded as ``shardnet:Block``) rather than a copy of it.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "examples" / "distributed"))  # shardnet: one home

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
