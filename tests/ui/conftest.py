"""Fixtures of the UI tests: a repo made with the demo's model, a real headless Chromium, and a
folder for the screenshots CI keeps ($MODULELENS_ARTIFACTS/ui-screenshots, else build/ui-screenshots)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from child_process import REPO_ROOT, subprocess_env
from ui_support import make_demo_repo

from stress.browser import browser_missing, chromium


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``demo/<target>:v1`` for the demo's four targets, ``demo/top_mlp:v2``, reports."""
    return make_demo_repo(tmp_path_factory.mktemp("ui") / "repo")


@pytest.fixture(scope="session")
def runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where servers started by the tests announce themselves (never the user's own folder)."""
    return tmp_path_factory.mktemp("runtime")


@pytest.fixture(scope="session")
def child_env(runtime_dir: Path) -> dict[str, str]:
    return subprocess_env(XDG_RUNTIME_DIR=str(runtime_dir))


@pytest.fixture(scope="session")
def screenshots() -> Path:
    root = Path(os.environ["MODULELENS_ARTIFACTS"]) if os.environ.get("MODULELENS_ARTIFACTS") else REPO_ROOT / "build"
    folder = root / "ui-screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Debian's headless Chromium through Selenium. Missing, it FAILS the test (not a skip): the
    browser tests are the UI's tests, and CI installs it (.ci/run)."""
    missing = browser_missing()
    if missing:
        pytest.fail(missing, pytrace=False)
    with chromium() as driver:
        yield driver
