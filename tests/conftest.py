from __future__ import annotations

import os
import shutil
import sys
import tempfile
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

import tiers  # tests/support, on the path from the lines above

# The test tiers (docs/architecture.md "Test tiers"): markers from what each test uses, `--tier`,
# and the guard that fails a fast-tier test that starts a process.
from tiers import (  # noqa: F401  (pytest finds hooks by their names in this module)
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_report_collectionfinish,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
)

torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    tiers.configure(config)
    _isolate(config)


def _isolate(config: pytest.Config) -> None:
    """This pytest process's own default repo, cache, signing key and UI announcements: tests never
    touch the user's (~/.modulelens, ~/.config/modulelens/key), and two xdist workers (or two
    people's runs on one machine) never share one. Children inherit them through the environment."""
    home = Path(tempfile.mkdtemp(prefix="modulelens-tests-"))
    runtime = home / "runtime"
    runtime.mkdir(mode=0o700)
    os.environ.update(MODULELENS_REPO=str(home / "repo"), MODULELENS_CACHE=str(home / "cache"),
                      XDG_CONFIG_HOME=str(home / "config"), XDG_RUNTIME_DIR=str(runtime))
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))


@pytest.fixture(scope="session", autouse=True)
def _tracking():
    """Constructor tracking on for the whole test session, as `modulelens run` would do."""
    handle = modulelens.track_init()
    yield
    handle.stop()


@pytest.fixture
def repo(tmp_path: Path) -> modulelens.Repo:
    return modulelens.Repo(tmp_path / "repo")
